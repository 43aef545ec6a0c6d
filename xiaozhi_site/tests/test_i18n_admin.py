"""Every admin page of the project, rendered in Simplified Chinese, shows no English label.

The pages are found, not listed: every model admin of the project's apps (changelist, add
form, change form of an object, custom views such as "Bind a device"), every admin action
on a selected object, and a few forms submitted with errors. Any Latin word on them must be
a proper noun of the allow-list below or a word of the test data; anything else is a label
that is not marked for translation or not translated, and the failure lists them exactly,
so whoever added them can run `make messages` and translate (docs/i18n.md).
"""
from __future__ import annotations

import sys

import importlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import models
from django.test import Client
from django.urls import URLPattern, reverse
from django.utils import timezone

from conversations.models import Conversation, Persona, Turn
from conversations.providers.options import OPTIONS
from conversations.providers.registry import REGISTRY
from devices.models import ActivationCode, Device, DeviceKey
from devices.tests.factories import FirmwareReleaseFactory
from tools.models import McpServer, McpTool

pytestmark = pytest.mark.django_db

CHINESE: dict[str, Any] = {"HTTP_ACCEPT_LANGUAGE": "zh-CN,zh;q=0.9,en;q=0.5"}

# Latin words allowed on a Chinese page: product, protocol and format names, units and
# acronyms that Chinese admin UIs keep as they are, and the languages' own names.
ALLOWED_WORDS = frozenset(word.casefold() for word in """
    Xiaozhi MCP OTA LLM ASR TTS VAD Opus Celery HMAC eFuse HMAC_KEY0 CSV JSON MAC IANA SSE HTTP
    HTTPS URL ID IP ESP32 SHA UTF MB KB GB ms Flash Schema Markdown Bearer Authorization Streamable
    token Edge espeak Piper Whisper OpenAI Django Redis WebSocket API
    Control Command Mac
    English Deutsch Français Português Español Italiano
    """.split())

# Whole texts Django itself leaves in English in Simplified Chinese: screen-reader captions
# its zh_Hans catalogue has no translation for yet, and image alt texts it never translates.
# Only Django's own texts belong here, never a label of this project.
DJANGO_UNTRANSLATED = frozenset({
    "Model name", "Add link", "Change or view list link", "Search", "True", "False", "None",
})
# Words typed into the forms below (shown back in their error messages).
TYPED_WORDS = frozenset({"nope"})

_SKIPPED_TAGS = frozenset({"script", "style", "textarea", "code", "pre"})
_VISIBLE_ATTRIBUTES = ("title", "placeholder", "alt", "aria-label")
_IDENTIFIER = re.compile(r"[_./:@=#{}\[\]0-9]")  # tokens with these are names, paths, numbers
_HEADER_NAME = re.compile(r"[A-Z][a-z]+(?:-[A-Z][a-z]+)+")  # HTTP header names: User-Agent
_WORD = re.compile(r"[^\W\d_]+")
_STANDARD_VIEWS = ("_changelist", "_add", "_history", "_delete", "_change")


class _VisibleText(HTMLParser):
    """Text a person sees: text nodes and a few attributes, minus code and form contents."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.texts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED_TAGS:
            self._skip += 1
        values = dict(attrs)
        self.texts.extend(v for k in _VISIBLE_ATTRIBUTES if (v := values.get(k)))
        if tag == "input" and values.get("type") in ("submit", "button") and values.get("value"):
            self.texts.append(values["value"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED_TAGS and self._skip:
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.texts.append(" ".join(data.split()))


def latin_words(text: str) -> set[str]:
    words: set[str] = set()
    for token in text.split():
        if _IDENTIFIER.search(token) or _HEADER_NAME.fullmatch(token.strip("()（），。,;")):
            continue
        words.update(w for w in _WORD.findall(token) if any("a" <= c <= "z" for c in w.casefold()))
    return words


@dataclass
class Offence:
    page: str
    text: str
    words: list[str]


def english_left(page: str, html: str, data_words: set[str]) -> list[Offence]:
    parser = _VisibleText()
    parser.feed(html)
    offences = []
    for text in parser.texts:
        if text in DJANGO_UNTRANSLATED:
            continue
        bad = sorted(w for w in latin_words(text) if w.casefold() not in ALLOWED_WORDS | data_words)
        if bad:
            offences.append(Offence(page, text[:160], bad))
    return offences


# -- the data the pages show -------------------------------------------------------------------


def chinese_persona() -> Persona:
    """The shipped 小智 persona (re-created if a transactional test flushed the migration's row)."""
    importlib.import_module("conversations.migrations.0007_chinese_default_persona").create_chinese_persona(apps, None)
    return Persona.objects.get(name="小智")


@pytest.fixture
def fleet(settings: Any, tmp_path: Path) -> dict[str, models.Model]:
    """One object of every model, with realistic values, so change pages and lists render."""
    settings.MEDIA_ROOT = tmp_path
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    owner = get_user_model().objects.create_user("operator", "operator@example.com", "pw")
    persona = chinese_persona()
    device = Device.objects.create(
        mac="02:00:00:00:00:01", name="客厅音箱", board_type="bread-compact-wifi", firmware_version="2.4.2",
        owner=owner, persona=persona, bound_at=timezone.now(), location="上海", timezone="Asia/Shanghai",
        mcp_tools=[{"name": "self.audio_speaker.set_volume", "description": "设置音量",
                    "parameters": {"properties": {"volume": {"type": "integer"}}}},
                   {"name": "self.reboot", "description": "重启", "user_only": True}],
    )
    waiting = Device.objects.create(mac="02:00:00:00:00:02", board_type="bread-compact-wifi")
    code = ActivationCode.objects.create(device=waiting, code="032125", challenge="c" * 32,
                                         expires_at=timezone.now() + timedelta(hours=1))
    server = McpServer.objects.create(name="home", url="http://127.0.0.1:9/mcp", last_error="")
    McpTool.objects.create(server=server, name="lights_on", description="打开灯", input_schema={})
    conversation = Conversation.objects.create(session_id="s-1", device=device, persona=persona)
    Turn.objects.create(conversation=conversation, index=0, user_text="今天天气怎么样", reply_text="今天晴。",
                        emotion="happy", tool_calls=[{"name": "get_weather", "success": True, "duration_ms": 12}],
                        providers={"asr": "faster_whisper"}, timings={"asr_done": 120.0})
    release = FirmwareReleaseFactory(version="2.5.0")
    release.allowlist.add(device)
    key = DeviceKey.objects.create(serial_number="SN000001", key_hex="ab" * 32)
    return {"device": device, "waiting": waiting, "code": code, "server": server, "persona": persona,
            "conversation": conversation, "release": release, "key": key}


@pytest.fixture
def zh_admin(client: Client, fleet: dict[str, models.Model]) -> Client:
    superuser = get_user_model().objects.create_superuser("alice", "alice@example.com", "alice-password")
    client.force_login(superuser)
    return client


def data_words() -> set[str]:
    """Words of every stored value (text and JSON): shown on the pages as data, not labels."""
    words: set[str] = set(TYPED_WORDS)
    # Provider kinds ("edge", "piper", the tests' "fail") are names, shown as they are.
    words.update(kind.casefold() for stage in REGISTRY.values() for kind in stage)
    # So are their option names ("connect_timeout, proxy"), listed under a config's options.
    names = [name for schema in OPTIONS.values() for name in schema.model_fields]
    words.update(w.casefold() for name in names for w in _WORD.findall(name))
    kinds = (models.CharField, models.TextField, models.JSONField)
    for model in [*project_models(), get_user_model()]:
        # Fields with choices are shown by their (translated) label, not their stored value.
        fields = [f.name for f in model._meta.concrete_fields if isinstance(f, kinds) and not f.choices]
        for row in model._default_manager.values_list(*fields):
            text = " ".join(json.dumps(value) if not isinstance(value, str) else value for value in row)
            words.update(w.casefold() for w in _WORD.findall(text))
    return words


def project_models() -> list[type[models.Model]]:
    base = Path(settings.BASE_DIR).resolve()
    installed = Path(sys.prefix).resolve()  # the virtualenv may live inside the checkout
    return [m for m in apps.get_models() if (path := Path(m._meta.app_config.path).resolve()).is_relative_to(base)
            and not path.is_relative_to(installed)]


# -- the pages ---------------------------------------------------------------------------------


def admin_pages(client: Client) -> Iterator[tuple[str, Any]]:
    """(label, response) for every admin page of the project's models, found from the registry."""
    yield "index", client.get(reverse("admin:index"), **CHINESE)
    for model in project_models():
        model_admin = admin.site._registry.get(model)
        if model_admin is None:
            continue
        opts = model._meta
        name = f"{opts.app_label}_{opts.model_name}"
        yield f"{opts.app_label} app", client.get(reverse("admin:app_list", args=[opts.app_label]), **CHINESE)
        yield f"{name} list", client.get(reverse(f"admin:{name}_changelist"), **CHINESE)
        add = client.get(reverse(f"admin:{name}_add"), **CHINESE)
        if add.status_code != 403:
            yield f"{name} add", add
        obj = model._default_manager.first()
        if obj is not None:
            # follow: a turn's change page is its place in the conversation's page
            yield f"{name} change", client.get(reverse(f"admin:{name}_change", args=[obj.pk]), follow=True,
                                               **CHINESE)
            yield from _actions(client, model_admin, name, obj)
        for pattern in _custom_views(model_admin):
            yield f"{name} {pattern.name}", client.get(reverse(f"admin:{pattern.name}"), **CHINESE)


def _custom_views(model_admin: admin.ModelAdmin) -> list[URLPattern]:
    return [p for p in model_admin.get_urls() if isinstance(p, URLPattern) and p.name
            and not p.name.endswith(_STANDARD_VIEWS) and not p.pattern.converters]


def _actions(client: Client, model_admin: admin.ModelAdmin, name: str, obj: models.Model) -> Iterator[tuple[str, Any]]:
    """Run every action on one object: its intermediate page or the message it leaves."""
    changelist = reverse(f"admin:{name}_changelist")
    page = client.get(changelist, **CHINESE)
    actions = page.context["cl"].model_admin.get_actions(page.wsgi_request) if page.status_code == 200 else {}
    for action in actions:
        if action == "delete_selected":
            continue  # Django's own confirmation page
        response = client.post(changelist, {"action": action, "_selected_action": [obj.pk]}, follow=True, **CHINESE)
        yield f"{name} action {action}", response


def _empty_inlines(client: Client, url: str) -> dict[str, str]:
    """Management form data for every inline of an add page, each with no rows, so the post
    reaches the form's own validation (the inlines' number changes as the model grows)."""
    page = client.get(url).content.decode()
    prefixes = set(re.findall(r'name="([\w-]+)-TOTAL_FORMS"', page))
    return {f"{prefix}-{field}": "0" for prefix in prefixes for field in ("TOTAL_FORMS", "INITIAL_FORMS")}


def submitted_forms(client: Client, fleet: dict[str, models.Model]) -> Iterator[tuple[str, Any]]:
    """Forms sent with mistakes, so their error messages are on the page."""
    yield "bind: malformed code", client.post(reverse("admin:devices_device_bind"), {"code": "12"}, **CHINESE)
    owner = get_user_model().objects.get(username="operator")
    yield "bind: unknown code", client.post(reverse("admin:devices_device_bind"),
                                            {"code": "999999", "owner": owner.pk}, **CHINESE)
    csv = SimpleUploadedFile("keys.csv", b"SN1,short\nSN2\n", content_type="text/csv")
    yield "key upload: bad rows", client.post(reverse("admin:devices_devicekey_upload"), {"file": csv},
                                              follow=True, **CHINESE)
    persona_add = reverse("admin:conversations_persona_add")
    yield "persona add: empty", client.post(persona_add, {**_empty_inlines(client, persona_add), "vad_threshold": "0.2",
                                                          "vad_threshold_low": "0.5"}, **CHINESE)
    yield "firmware add: not an image", client.post(
        reverse("admin:devices_firmwarerelease_add"),
        {"board_type": "bread-compact-wifi", "version": "v2", "rollout_percent": "100",
         "binary": SimpleUploadedFile("xiaozhi.bin", b"not an image")}, **CHINESE)
    device = fleet["device"]
    yield "alert form: empty", client.post(reverse("admin:devices_device_changelist"),
                                           {"action": "alert_devices", "_selected_action": [device.pk],
                                            "apply": "1"}, **CHINESE)
    yield "tool call form: bad JSON", client.post(reverse("admin:devices_device_changelist"),
                                                  {"action": "call_device_tool", "_selected_action": [device.pk],
                                                   "apply": "1", "tool": "self.reboot", "arguments": "{",
                                                   "timeout": "5"}, **CHINESE)
    yield "say: sent to an offline device", client.post(
        reverse("admin:devices_device_changelist"),
        {"action": "say_on_devices", "_selected_action": [device.pk], "apply": "1", "text": "你好"},
        follow=True, **CHINESE)


def test_every_admin_page_in_chinese_leaves_no_project_label_in_english(zh_admin: Client, fleet: Any) -> None:
    checked: list[str] = []
    offences: list[Offence] = []
    for label, response in [*admin_pages(zh_admin), *submitted_forms(zh_admin, fleet)]:
        assert response.status_code == 200, f"{label}: HTTP {response.status_code}"
        assert response.headers["Content-Language"] == "zh-hans", label
        checked.append(label)
        offences += english_left(label, response.content.decode(), data_words())
    assert {"index", "devices_device list", "devices_device change", "devices_device devices_device_bind",
            "devices_devicekey devices_devicekey_upload", "conversations_persona add",
            "conversations_conversation change", "devices_device action alert_devices"} <= set(checked)
    unique = {(o.text, tuple(o.words)): o for o in offences}
    report = "\n".join(f"  [{o.page}] {o.text!r}  <- {', '.join(o.words)}" for o in unique.values())
    assert not unique, (
        "English left on Chinese admin pages (mark the string for translation, run `make messages`, "
        f"translate it in locale/zh_Hans/LC_MESSAGES/django.po; docs/i18n.md):\n{report}"
    )


def test_the_login_page_follows_the_browser_language(client: Client) -> None:
    page = client.get(reverse("admin:login"), **CHINESE).content.decode()
    assert "小智服务器" in page and "用户名" in page
    assert 'id="language-switch"' in page and 'lang="en">English</button>' in page
    assert english_left("login", page, set()) == []


def test_the_checker_reports_an_unmarked_label() -> None:
    html = ('<div><label>设备名称</label><p title="Reboot now">重启</p><code>self.reboot</code>'
            "<textarea>Hello there</textarea><span>Waiting for activation</span> MCP 2.4.3 Asia/Shanghai</div>")
    found = english_left("sample", html, set())
    assert [o.words for o in found] == [["Reboot", "now"], ["Waiting", "activation", "for"]]
