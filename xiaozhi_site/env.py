"""Typed readers for environment variables.

Every setting comes from the environment through one of these readers. A bad value fails
at start-up with ImproperlyConfigured naming the variable, instead of surfacing later as an
odd runtime error.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    value = (environ if environ is not None else os.environ).get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def envstr(name: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    value = _raw(name, environ)
    return default if value is None else value


def envbool(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    value = _raw(name, environ)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false/1/0), got {value!r}")


def envint(
    name: str,
    default: int,
    environ: Mapping[str, str] | None = None,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    value = _raw(name, environ)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from None
    _check_range(name, number, minimum, maximum)
    return number


def envfloat(
    name: str,
    default: float,
    environ: Mapping[str, str] | None = None,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    value = _raw(name, environ)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}") from None
    _check_range(name, number, minimum, maximum)
    return number


def envlist(name: str, default: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Comma-separated list; blanks are dropped."""
    value = _raw(name, environ)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def envchoice(
    name: str, default: str, choices: tuple[str, ...], environ: Mapping[str, str] | None = None
) -> str:
    value = envstr(name, default, environ)
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def envsecret(name: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    """Reads NAME_FILE first (Docker secrets), then NAME."""
    path = _raw(f"{name}_FILE", environ)
    if path is not None:
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE points to an unreadable file: {exc}") from None
    return envstr(name, default, environ)


def _check_range(name: str, number: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name} must be <= {maximum}, got {number}")
