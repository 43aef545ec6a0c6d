"""Database side of gateway API keys: create, authenticate, revoke (auth.py has the rest).

`gateway_key_authenticate` is the consumer's one database hop per connection; the others are
called by the admin and `manage.py gateway_key_create`.
"""
from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db.models import Q, QuerySet
from django.utils import timezone

from conversations.gateway.auth import KeyGrant, key_digest, key_generate, key_prefix
from conversations.models import LANGUAGES, GatewayKey, Persona

log = logging.getLogger(__name__)

LAST_USED_RESOLUTION = dt.timedelta(seconds=60)  # at most one write per key and minute
REVOKED_EVENT = "gateway.key.revoked"  # channel-layer message: handled by GatewayConsumer


def key_group(key_id: int) -> str:
    """The channel-layer group of a key's live connections."""
    return f"gateway-key-{key_id}"


def gateway_key_issue(key: GatewayKey) -> str:
    """Give an unsaved GatewayKey a new secret; returns the secret, which is never stored."""
    secret = key_generate()
    key.prefix = key_prefix(secret)
    key.key_hash = key_digest(secret)
    return secret


def gateway_key_create(
    *, name: str, persona: Persona | None = None, requests_per_minute: int = 60, max_connections: int = 5
) -> tuple[GatewayKey, str]:
    key = GatewayKey(
        name=name, persona=persona, requests_per_minute=requests_per_minute, max_connections=max_connections
    )
    secret = gateway_key_issue(key)
    key.full_clean()
    key.save()
    return key, secret


def gateway_key_authenticate(secret: str) -> KeyGrant | None:
    """The grant of an active key, or None (unknown or revoked). Records the use."""
    key = GatewayKey.objects.select_related("persona").filter(key_hash=key_digest(secret)).first()
    if key is None or key.revoked_at is not None:
        return None
    now = timezone.now()
    GatewayKey.objects.filter(pk=key.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_RESOLUTION)
    ).update(last_used_at=now)
    return KeyGrant(
        key_id=key.pk,
        name=key.name,
        requests_per_minute=key.requests_per_minute,
        max_connections=key.max_connections,
        system_prompt=_persona_prompt(key.persona, key.name) if key.persona else "",
        persona_id=key.persona_id,
        prefix=key.prefix,
    )


def _persona_prompt(persona: Persona, key_name: str) -> str:
    """The persona's prompt with its placeholders filled; {current_time} stays for the
    session, which fills it on every turn. str.replace, not format: prompts may hold braces."""
    values = {
        "{persona_name}": persona.name,
        "{device_name}": key_name,
        "{location}": "",
        "{language}": dict(LANGUAGES).get(persona.language, persona.language),
    }
    prompt = persona.system_prompt
    for placeholder, value in values.items():
        prompt = prompt.replace(placeholder, value)
    return prompt


def gateway_keys_revoke(keys: QuerySet[GatewayKey]) -> int:
    """Revoke keys (for good) and close their live connections."""
    ids = list(keys.filter(revoked_at__isnull=True).values_list("pk", flat=True))
    GatewayKey.objects.filter(pk__in=ids).update(revoked_at=timezone.now())
    gateway_keys_disconnect(ids)
    return len(ids)


def gateway_keys_disconnect(key_ids: Iterable[int]) -> None:
    """Tell every process's connections using these keys to close (4001)."""
    layer = get_channel_layer()
    if layer is None:
        return
    for key_id in key_ids:
        try:
            async_to_sync(layer.group_send)(key_group(key_id), {"type": REVOKED_EVENT})
        except Exception:
            # The key is refused from now on anyway; only live sockets stay until they close.
            log.warning("could not reach live gateway connections of a revoked key", extra={"key_id": key_id})
