# Two commands on a fresh Debian/Ubuntu machine:  make run  /  make test
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-installed
# fonts-wqy-microhei: CJK glyphs for headless Chromium (screenshots of the Chinese admin);
# fonts-noto-color-emoji: the emotion emoji in screenshots of the review pages.
APT_PACKAGES := libopus0 espeak-ng gettext chromium chromium-driver fonts-wqy-microhei fonts-noto-color-emoji
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-fast lint system-deps deps translations messages bench clean

run: system-deps deps translations
	$(PY) -m xiaozhi_site.runner

# The suite runs in TEST_PROCESSES processes (pytest-xdist; each has its own test database and
# Redis database): most of its time is spent waiting on real-time audio and servers, so two
# processes halve the run on two cores. TEST_PROCESSES=0 runs it in this one process.
TEST_PROCESSES ?= 2
XDIST = $(if $(filter 0,$(TEST_PROCESSES)),,-n $(TEST_PROCESSES) --dist loadfile)
test: system-deps deps translations
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# Unit tier only: no server processes, no Whisper.
test-fast: deps translations
	$(PY) -m pytest $(XDIST) -m "not e2e and not slow" $(PYTEST_ARGS)

# ruff (pyflakes, pycodestyle, bugbear, async rules, ...) and mypy with the django-stubs plugin;
# both are configured in pyproject.toml. `.ci/run` runs this before the tests.
MYPY_PATHS := bench conftest.py conversations dashboard devices manage.py simulator testing tools xiaozhi_site
lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy $(MYPY_PATHS)

system-deps:
	@if ! dpkg -s $(APT_PACKAGES) >/dev/null 2>&1 || ! $(PYTHON) -c "import venv, ensurepip" 2>/dev/null; then \
		echo "Installing system packages: $(APT_PACKAGES) python3-venv"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(APT_PACKAGES) python3-venv >/dev/null; \
	fi

deps: $(STAMP)

# Compiled catalogues (locale/*/LC_MESSAGES/*.mo) are build output, made from the committed
# .po files; compilemessages skips those already up to date (docs/i18n.md).
I18N_IGNORE := --ignore .venv --ignore var --ignore node_modules --ignore .git
translations: deps
	$(PY) manage.py compilemessages $(I18N_IGNORE) -v 0

# After adding or changing translatable strings: update the catalogue, translate the new
# entries in locale/zh_Hans/LC_MESSAGES/django.po, then `make translations` (docs/i18n.md).
messages: deps
	$(PY) manage.py makemessages --locale zh_Hans --add-location file --no-obsolete $(I18N_IGNORE) \
		--ignore bench --ignore docs --ignore testing --ignore '*/tests/*'

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
