"""The device page's window on its conversations: a link to them and the last turn.

Conversations live in the conversations app, which imports devices and never the other way;
so the models are looked up through the app registry here, not imported.
"""
from __future__ import annotations

from django.apps import apps
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from devices.models import Device

_SNIPPET_CHARS = 90


def device_history_html(device: Device) -> SafeString | str:
    if device.pk is None:
        return "—"
    conversations = device.conversations.count()  # type: ignore[attr-defined]
    link = format_html(
        '<a href="{}?device={}">{}</a>', reverse("admin:conversations_conversation_changelist"), device.pk,
        ngettext("%(count)d conversation", "%(count)d conversations", conversations) % {"count": conversations},
    )
    turn = _last_turn(device)
    if turn is None:
        return format_html("{}<div class=\"help\">{}</div>", link, _("No turn yet."))
    page = reverse("admin:conversations_turn_change", args=[turn.pk])
    when = formats.date_format(timezone.localtime(turn.created_at), "SHORT_DATETIME_FORMAT")
    return format_html(
        '{}<div style="margin-top:6px">{} <a href="{}">{}</a></div>'
        '<div>“{}” → “{}”{}</div>',
        link, _("Last turn:"), page, when,
        Truncator(turn.user_text or "…").chars(_SNIPPET_CHARS), Truncator(turn.reply_text or "…").chars(_SNIPPET_CHARS),
        format_html(' <strong style="color:var(--error-fg)">{}</strong>', _("error")) if turn.error else "",
    )


def _last_turn(device: Device):  # noqa: ANN202 - conversations.Turn, not importable here
    turn_model = apps.get_model("conversations", "Turn")
    return (turn_model.objects.filter(conversation__device=device)
            .only("pk", "user_text", "reply_text", "error", "created_at")
            .order_by("-conversation__started_at", "-index").first())
