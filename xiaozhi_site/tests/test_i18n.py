"""Languages of the admin and the catalogue: complete, current, picked from the browser.

The catalogue tests are what catches strings other people add: a marked string missing from
locale/zh_Hans/LC_MESSAGES/django.po, or there without a Chinese translation (or fuzzy),
fails with the exact strings listed. Fix: `make messages`, translate, commit (docs/i18n.md).
"""
from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import polib
import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import Client
from django.utils import translation

CATALOGUE = Path(settings.BASE_DIR) / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po"
COPY_IGNORE = shutil.ignore_patterns(".venv", "var", ".git", "__pycache__", "*.mo", "node_modules", "*.sqlite3")


def entries(path: Path) -> dict[tuple[str | None, str], polib.POEntry]:
    return {(e.msgctxt, e.msgid): e for e in polib.pofile(str(path)) if not e.obsolete}


def describe(keys: object) -> str:
    return "\n".join(f"  {msgid!r}" + (f" (context {ctx!r})" if ctx else "") for ctx, msgid in sorted(
        keys, key=lambda k: (k[1], k[0] or "")))  # type: ignore[arg-type]


def test_every_catalogue_entry_has_a_chinese_translation() -> None:
    catalogue = entries(CATALOGUE)
    assert len(catalogue) > 200
    untranslated = [key for key, e in catalogue.items() if not e.translated()]  # empty or fuzzy
    assert not untranslated, (
        f"{CATALOGUE.relative_to(settings.BASE_DIR)} has entries without a Chinese translation "
        f"(or marked fuzzy); translate them and remove the fuzzy flag:\n{describe(untranslated)}"
    )


@pytest.mark.slow
def test_the_catalogue_has_every_marked_string_of_the_source(tmp_path: Path) -> None:
    """`make messages` on a copy of the tree must find nothing the committed catalogue lacks."""
    copy = tmp_path / "tree"
    shutil.copytree(settings.BASE_DIR, copy, ignore=COPY_IGNORE, symlinks=True)
    result = subprocess.run(
        ["make", "-s", "-o", "deps", "messages", f"PY={sys.executable}"], cwd=copy, capture_output=True,
        text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "XIAOZHI_DATA_DIR": str(tmp_path / "var")},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    fresh, committed = entries(copy / CATALOGUE.relative_to(settings.BASE_DIR)), entries(CATALOGUE)
    missing, unused = fresh.keys() - committed.keys(), committed.keys() - fresh.keys()
    assert not (missing or unused), (
        "the catalogue is out of date: run `make messages`, translate, commit (docs/i18n.md)\n"
        f"marked in the source, missing from the catalogue:\n{describe(missing)}\n"
        f"in the catalogue, gone from the source:\n{describe(unused)}"
    )


def test_the_compiled_catalogue_is_current() -> None:
    compiled = CATALOGUE.with_suffix(".mo")
    assert compiled.exists() and compiled.stat().st_mtime >= CATALOGUE.stat().st_mtime
    with translation.override("zh-hans"):
        assert translation.gettext("Bind a device") == "绑定设备"


# -- picking the language ----------------------------------------------------------------------


@pytest.mark.parametrize(("header", "language"), [
    ("zh-CN,zh;q=0.9", "zh-hans"), ("zh", "zh-hans"), ("zh-Hans-CN", "zh-hans"), ("zh-SG", "zh-hans"),
    ("en-US,en;q=0.9", "en"), ("fr-FR", "en"), ("", "en"),
])
def test_the_admin_follows_accept_language(client: Client, header: str, language: str) -> None:
    response = client.get("/admin/login/", HTTP_ACCEPT_LANGUAGE=header)
    assert response.headers["Content-Language"] == language
    assert ("小智服务器" in response.content.decode()) == (language == "zh-hans")


def test_the_language_switch_remembers_the_choice_for_a_year(client: Client) -> None:
    response = client.post("/i18n/setlang/", {"language": "en", "next": "/admin/login/"},
                           HTTP_ACCEPT_LANGUAGE="zh-CN")
    assert response.status_code == 302 and response.headers["Location"] == "/admin/login/"
    cookie = response.cookies[settings.LANGUAGE_COOKIE_NAME]
    assert cookie.value == "en" and int(cookie["max-age"]) >= 365 * 24 * 3600 and cookie["httponly"]
    page = client.get("/admin/login/", HTTP_ACCEPT_LANGUAGE="zh-CN")  # the cookie beats the header
    assert page.headers["Content-Language"] == "en" and "Xiaozhi Server" in page.content.decode()


@pytest.mark.parametrize("hostile", ["xx", "../../etc", "zh-hans\r\nSet-Cookie: a=b", "e" * 500])
def test_the_language_switch_ignores_unknown_languages_and_foreign_redirects(client: Client, hostile: str) -> None:
    response = client.post("/i18n/setlang/", {"language": hostile, "next": "https://evil.example/"})
    assert response.status_code == 302 and response.headers["Location"] == "/"
    assert settings.LANGUAGE_COOKIE_NAME not in response.cookies


def test_management_commands_speak_the_configured_language(db: None) -> None:
    out = io.StringIO()
    with translation.override("zh-hans"):
        call_command("devices_startup", stdout=out)  # nothing to mark: prints nothing
        assert out.getvalue() == ""
        from devices.models import Device

        Device.objects.create(mac="02:00:00:00:00:09", is_online=True)
        call_command("devices_startup", stdout=out)
    assert out.getvalue().strip() == "上次运行遗留的 1 台在线设备已标记为离线。"


def test_device_api_errors_stay_english_with_stable_codes_for_a_chinese_client(client: Client) -> None:
    response = client.post("/xiaozhi/ota/", data="{}", content_type="application/json",
                           HTTP_ACCEPT_LANGUAGE="zh-CN", HTTP_CLIENT_ID="c1")
    assert response.status_code == 400
    assert response.json() == {"error": "missing_device_id",
                               "message": "The Device-Id header (the MAC address) is required."}
