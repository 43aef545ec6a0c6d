from __future__ import annotations

import re
from pathlib import Path

BASE = Path(__file__).resolve().parents[2]
READ = re.compile(r"env(?:str|bool|int|float|list|choice|secret)\(\s*\"([A-Z0-9_]+)\"")


def _variables_read_by_settings() -> set[str]:
    return set(READ.findall((BASE / "xiaozhi_site" / "settings.py").read_text()))


def _documented() -> set[str]:
    text = (BASE / ".env.example").read_text()
    return set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", text, flags=re.M))


def test_env_example_lists_every_variable_settings_read() -> None:
    missing = _variables_read_by_settings() - _documented()
    assert not missing, f".env.example lacks {sorted(missing)}"


def test_env_example_lists_nothing_settings_do_not_read() -> None:
    # Variables read outside settings.py (runner, Django's createsuperuser) are listed here.
    elsewhere = {"XIAOZHI_BIND", "XIAOZHI_PORT", "XIAOZHI_WORKERS", "DJANGO_SUPERUSER_USERNAME",
                 "DJANGO_SUPERUSER_PASSWORD", "DJANGO_SUPERUSER_EMAIL", "XIAOZHI_INTEGRATION"}
    stale = _documented() - _variables_read_by_settings() - elsewhere
    assert not stale, f".env.example documents unknown {sorted(stale)}"
