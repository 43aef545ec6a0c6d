from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from xiaozhi_site.env import envbool, envchoice, envfloat, envint, envlist, envsecret, envstr


def test_it_uses_defaults_for_missing_and_blank_values() -> None:
    assert envstr("X", "d", {}) == "d"
    assert envint("X", 3, {"X": "  "}) == 3
    assert envbool("X", True, {}) is True
    assert envlist("X", ["a"], {}) == ["a"]


@pytest.mark.parametrize("raw,expected", [("true", True), ("1", True), ("On", True), ("false", False), ("0", False)])
def test_it_reads_booleans(raw: str, expected: bool) -> None:
    assert envbool("FLAG", False, {"FLAG": raw}) is expected


@pytest.mark.parametrize(
    "reader,raw",
    [
        (lambda env: envbool("FLAG", False, env), "maybe"),
        (lambda env: envint("FLAG", 1, env), "ten"),
        (lambda env: envfloat("FLAG", 1.0, env), "fast"),
        (lambda env: envint("FLAG", 1, env, minimum=0), "-5"),
        (lambda env: envfloat("FLAG", 1.0, env, maximum=1.0), "1.5"),
        (lambda env: envchoice("FLAG", "a", ("a", "b"), env), "c"),
    ],
)
def test_it_rejects_bad_values_naming_the_variable(reader, raw: str) -> None:  # noqa: ANN001
    with pytest.raises(ImproperlyConfigured, match="FLAG"):
        reader({"FLAG": raw})


def test_it_splits_lists_and_drops_blanks() -> None:
    assert envlist("L", [], {"L": "a, b,,c "}) == ["a", "b", "c"]


def test_it_reads_secrets_from_files_first(tmp_path) -> None:  # noqa: ANN001
    secret = tmp_path / "secret"
    secret.write_text("from-file\n")
    assert envsecret("KEY", "d", {"KEY_FILE": str(secret), "KEY": "from-env"}) == "from-file"
    assert envsecret("KEY", "d", {"KEY": "from-env"}) == "from-env"
    with pytest.raises(ImproperlyConfigured, match="KEY_FILE"):
        envsecret("KEY", "d", {"KEY_FILE": str(tmp_path / "missing")})


def test_settings_fail_clearly_on_a_bad_value(tmp_path) -> None:  # noqa: ANN001
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={"DJANGO_SETTINGS_MODULE": "xiaozhi_site.settings", "XIAOZHI_WS_AUTH": "maybe",
             "XIAOZHI_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=False,
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured: XIAOZHI_WS_AUTH must be one of token, open" in result.stderr


def test_check_deploy_is_clean_with_production_settings(tmp_path) -> None:  # noqa: ANN001
    import os
    import subprocess
    import sys

    env = {**os.environ, "XIAOZHI_DATA_DIR": str(tmp_path), "DJANGO_DEBUG": "false",
           "DJANGO_SECRET_KEY": "x" * 20 + "-production-secret-key-with-enough-entropy-9f8e7d",
           "DJANGO_ALLOWED_HOSTS": "xz.example.com", "DJANGO_SECURE_SSL_REDIRECT": "true",
           "DJANGO_SECURE_COOKIES": "true", "DJANGO_HSTS_SECONDS": "31536000"}
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
