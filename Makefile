# Two commands on a fresh Debian/Ubuntu machine:  make run  /  make test
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-installed
APT_PACKAGES := libopus0 espeak-ng gettext chromium chromium-driver fonts-noto-color-emoji
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-fast system-deps deps bench clean

run: system-deps deps
	$(PY) -m xiaozhi_site.runner

test: system-deps deps
	$(PY) -m pytest $(PYTEST_ARGS)

# Unit tier only: no server processes, no Whisper.
test-fast: deps
	$(PY) -m pytest -m "not e2e and not slow" $(PYTEST_ARGS)

system-deps:
	@if ! dpkg -s $(APT_PACKAGES) >/dev/null 2>&1 || ! $(PYTHON) -c "import venv, ensurepip" 2>/dev/null; then \
		echo "Installing system packages: $(APT_PACKAGES) python3-venv"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(APT_PACKAGES) python3-venv >/dev/null; \
	fi

deps: $(STAMP)

$(STAMP): requirements.txt requirements-nodeps.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	touch $(STAMP)

bench: deps
	@ls bench/*.py | sed 's/^/  /'; echo "Run one with: $(PY) bench/<name>.py --help"

clean:
	rm -rf $(VENV) var
