"""Admin actions that talk to connected devices, and the device tool list display.

Plain functions with the admin-action signature, listed in DeviceAdmin.actions; the device
change page shows `device_tools_html`.

Each action only calls a service in devices/commands.py. Alert, say and tool calls first
show a small form (the standard intermediate-page pattern), then act on submit.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext_lazy

from devices.commands import (
    DeviceCommandError,
    device_alert,
    device_mcp_call,
    device_reboot,
    device_say,
)
from devices.models import Device
from devices.protocol.messages import EMOTIONS

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

ADMIN_TOOL_TIMEOUT = 10.0  # an admin page should not hang for the full 30 s default
RESULT_PREVIEW_CHARS = 500

ACTION_FORM_TEMPLATE = "admin/devices/device/action_form.html"


# Labels for the firmware's emotion names (the values sent stay the identifiers).
EMOTION_LABELS = {
    "neutral": _("neutral"), "happy": _("happy"), "laughing": _("laughing"), "funny": _("funny"),
    "sad": _("sad"), "angry": _("angry"), "crying": _("crying"), "loving": _("loving"),
    "embarrassed": _("embarrassed"), "surprised": _("surprised"), "shocked": _("shocked"),
    "thinking": _("thinking"), "winking": _("winking"), "cool": _("cool"), "relaxed": _("relaxed"),
    "delicious": _("delicious"), "kissy": _("kissy"), "confident": _("confident"), "sleepy": _("sleepy"),
    "silly": _("silly"), "confused": _("confused"),
}


class AlertForm(forms.Form):
    message = forms.CharField(label=_("Message"), max_length=200)
    status = forms.CharField(label=_("Status"), max_length=50, initial=_("Notice"))
    emotion = forms.ChoiceField(
        label=_("Emotion"), choices=[(e, EMOTION_LABELS.get(e, e)) for e in EMOTIONS], initial="neutral"
    )


class SayForm(forms.Form):
    text = forms.CharField(label=_("Text"), max_length=500, widget=forms.Textarea(attrs={"rows": 3}))


class McpCallForm(forms.Form):
    tool = forms.CharField(label=_("Tool"), max_length=200, help_text=_("e.g. self.get_device_status"))
    arguments = forms.CharField(label=_("Arguments"), required=False, initial="{}",
                                widget=forms.Textarea(attrs={"rows": 3}), help_text=_("A JSON object."))
    timeout = forms.FloatField(label=_("Timeout (s)"), min_value=0.5, max_value=60, initial=ADMIN_TOOL_TIMEOUT)

    def clean_arguments(self) -> dict[str, Any]:
        text = self.cleaned_data.get("arguments") or "{}"
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            text = gettext("Not valid JSON (line %(line)d, column %(column)d).")
            raise forms.ValidationError(text % {"line": exc.lineno, "column": exc.colno}) from None
        if not isinstance(value, dict):
            raise forms.ValidationError(gettext("Arguments must be a JSON object."))
        return value


def _form_page(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Device],
               form: forms.Form, *, action: str, intro: StrOrPromise, submit: StrOrPromise) -> TemplateResponse:
    context = {
        **modeladmin.admin_site.each_context(request), "title": intro, "intro": intro, "form": form,
        "devices": list(queryset), "action": action, "submit": submit, "checkbox": ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, ACTION_FORM_TEMPLATE, context)


def _bound_form(form_class: type[forms.Form], request: HttpRequest) -> forms.Form:
    return form_class(request.POST if "apply" in request.POST else None)


# Whole sentences per command, so each language can word them naturally; plural by "total".
_SENT = {
    "reboot": ngettext_lazy("Reboot sent to %(sent)d of %(total)d device.",
                            "Reboot sent to %(sent)d of %(total)d devices.", "total"),
    "alert": ngettext_lazy("Alert sent to %(sent)d of %(total)d device.",
                           "Alert sent to %(sent)d of %(total)d devices.", "total"),
    "say": ngettext_lazy("Text sent to %(sent)d of %(total)d device.",
                         "Text sent to %(sent)d of %(total)d devices.", "total"),
}
_FAILED = {
    "reboot": ngettext_lazy("Reboot failed for %(count)d device: %(errors)s",
                            "Reboot failed for %(count)d devices: %(errors)s", "count"),
    "alert": ngettext_lazy("Alert failed for %(count)d device: %(errors)s",
                           "Alert failed for %(count)d devices: %(errors)s", "count"),
    "say": ngettext_lazy("Text failed for %(count)d device: %(errors)s",
                         "Text failed for %(count)d devices: %(errors)s", "count"),
}


def _report(modeladmin: admin.ModelAdmin, request: HttpRequest, what: str, sent: int, total: int,
            failed: int = 0) -> None:
    level = messages.SUCCESS if sent == total else messages.WARNING
    text = _SENT[what] % {"sent": sent, "total": total}
    offline = total - sent - failed
    if offline > 0:
        text += " " + ngettext("%(count)d is offline.", "%(count)d are offline.", offline) % {"count": offline}
    modeladmin.message_user(request, text, level)


def _send_to_each(modeladmin: admin.ModelAdmin, request: HttpRequest, what: str, devices: list[Device],
                  send: Callable[[Device], bool]) -> None:
    """Send to every device; a command the channel layer did not take is reported as failed,
    never counted as sent."""
    sent, failures = 0, []
    for device in devices:
        try:
            sent += send(device)
        except DeviceCommandError as exc:
            failures.append(f"{device.mac}: {exc}")
    if failures:
        text = _FAILED[what] % {"count": len(failures), "errors": "; ".join(failures[:5])}
        modeladmin.message_user(request, text, messages.ERROR)
    _report(modeladmin, request, what, sent, len(devices), len(failures))


@admin.action(description=_("Reboot selected devices"))
def reboot_devices(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Device]) -> None:
    _send_to_each(modeladmin, request, "reboot", list(queryset), lambda device: device_reboot(device=device))


@admin.action(description=_("Show an alert on selected devices"))
def alert_devices(modeladmin: admin.ModelAdmin, request: HttpRequest,
                  queryset: QuerySet[Device]) -> TemplateResponse | None:
    form = _bound_form(AlertForm, request)
    if not form.is_bound or not form.is_valid():
        return _form_page(modeladmin, request, queryset, form, action="alert_devices",
                          intro=_("Show an alert on these devices"), submit=_("Send alert"))
    _send_to_each(modeladmin, request, "alert", list(queryset),
                  lambda device: device_alert(device=device, **form.cleaned_data))
    return None


@admin.action(description=_("Say a text on selected devices"))
def say_on_devices(modeladmin: admin.ModelAdmin, request: HttpRequest,
                   queryset: QuerySet[Device]) -> TemplateResponse | None:
    form = _bound_form(SayForm, request)
    if not form.is_bound or not form.is_valid():
        return _form_page(modeladmin, request, queryset, form, action="say_on_devices",
                          intro=_("Speak a text on these devices"), submit=_("Say it"))
    _send_to_each(modeladmin, request, "say", list(queryset),
                  lambda device: device_say(device=device, text=form.cleaned_data["text"]))
    return None


@admin.action(description=_("Call a device tool (MCP) on selected devices"))
def call_device_tool(modeladmin: admin.ModelAdmin, request: HttpRequest,
                     queryset: QuerySet[Device]) -> TemplateResponse | None:
    form = _bound_form(McpCallForm, request)
    if not form.is_bound or not form.is_valid():
        return _form_page(modeladmin, request, queryset, form, action="call_device_tool",
                          intro=_("Call a device tool"), submit=_("Call tool"))
    for device in queryset:
        _call_one(modeladmin, request, device, form.cleaned_data)
    return None


def _call_one(modeladmin: admin.ModelAdmin, request: HttpRequest, device: Device, data: dict[str, Any]) -> None:
    try:
        result = device_mcp_call(device=device, name=data["tool"], arguments=data["arguments"],
                                 timeout=data["timeout"])
    except DeviceCommandError as exc:
        text = gettext("%(mac)s: %(tool)s failed: %(error)s") % {
            "mac": device.mac, "tool": data["tool"], "error": exc}
        modeladmin.message_user(request, text, messages.ERROR)
        return
    preview = result if len(result) <= RESULT_PREVIEW_CHARS else result[:RESULT_PREVIEW_CHARS] + "…"
    modeladmin.message_user(request, f"{device.mac}: {data['tool']} → {preview}", messages.SUCCESS)


def device_tools_html(device: Device) -> SafeString:
    """The stored device tool list as a table; user-only tools (never offered to the LLM) marked."""
    tools = device.mcp_tools if isinstance(device.mcp_tools, list) else []
    if not tools:
        return format_html("<em>{}</em>", gettext("No tools listed yet (the device lists them when it connects)."))
    rows = format_html_join("", "<tr><td><code>{}</code>{}</td><td>{}</td><td><code>{}</code></td></tr>", (
        (tool.get("name", ""), _user_only_badge(tool), tool.get("description", ""), _parameters(tool))
        for tool in tools if isinstance(tool, dict)
    ))
    return format_html(
        "<table><thead><tr><th>{}</th><th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
        gettext("Tool"), gettext("Description"), gettext("Parameters"), rows,
    )


def _user_only_badge(tool: dict[str, Any]) -> SafeString:
    if tool.get("user_only"):
        return format_html(' <strong title="{}">[{}]</strong>', gettext("Not offered to the LLM"), gettext("user only"))
    return SafeString("")


def _parameters(tool: dict[str, Any]) -> str:
    schema = tool.get("parameters")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict) or not properties:
        return "—"
    return ", ".join(f"{name}: {spec.get('type', '?') if isinstance(spec, dict) else '?'}"
                     for name, spec in properties.items())
