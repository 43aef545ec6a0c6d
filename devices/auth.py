"""Who may open a device WebSocket: the decision, separate from the consumer that enforces it.

The device consumer (conversations/consumers.py) calls `device_authenticate_scope` with the
handshake's scope on a database thread, in the same hop as the session set-up; the headers
(names in any case) and query parameters decide, and the consumer accepts or closes with the
returned code. Policy comes from
settings: XIAOZHI_WS_AUTH ("token" or "open"), XIAOZHI_WS_ALLOWED_MACS (skip the token
check) and XIAOZHI_UNBOUND_POLICY ("speak_code", "refuse", "allow"). With tokens, a bound
device is only accepted with the Client-Id it was bound with (trust on first use).
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings

from devices.models import Device
from devices.protocol.close_codes import CloseCode
from devices.selectors import device_client_trusted, device_for_checkin
from devices.services import ActivationCapacityError, activation_code_issue
from devices.tokens import TokenStatus, token_generation_of, token_verify

logger = logging.getLogger(__name__)

CLOSE_AUTH_FAILED = CloseCode.AUTH_FAILED
CLOSE_NOT_ACTIVATED = CloseCode.NOT_ACTIVATED

_MAC = re.compile(r"([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}")


def normalize_mac(text: str) -> str | None:
    """`AA-BB-CC-DD-EE-FF` -> `aa:bb:cc:dd:ee:ff`; None if it is not a MAC."""
    text = text.strip()
    if not _MAC.fullmatch(text):
        return None
    return text.lower().replace("-", ":")


@dataclass(frozen=True)
class DeviceAuthResult:
    ok: bool
    close_code: int | None = None
    reason: str = ""
    device: Device | None = None
    bound: bool = False
    # Set for an unbound device under the "speak_code" policy: the session speaks it.
    activation_code: str | None = None


def _refuse(reason: str, code: int = CLOSE_AUTH_FAILED, device: Device | None = None) -> DeviceAuthResult:
    logger.info("device websocket refused", extra={"reason": reason, "mac": device.mac if device else None})
    return DeviceAuthResult(ok=False, close_code=code, reason=reason, device=device)


def _credentials(headers: dict[str, str], query: dict[str, str]) -> tuple[str, str, str]:
    """Device id, client id and token; browsers cannot set headers, so they use the query."""
    lowered = {name.lower(): value for name, value in headers.items()}
    source = lowered if "device-id" in lowered else query
    authorization = source.get("authorization", "").strip()
    # The firmware sends "Bearer <token>", or the raw token when it contains a space.
    if authorization[:7].lower() == "bearer ":
        authorization = authorization[7:].strip()
    return source.get("device-id", ""), source.get("client-id", "").strip(), authorization


def _token_problem(device: Device, client_id: str, token: str) -> str | None:
    if not token:
        return "token missing"
    secret = settings.SECRET_KEY
    check = token_verify(
        token, secret=secret, client_id=client_id, device_id=device.mac,
        generation=device.token_generation, ttl_seconds=settings.XIAOZHI_TOKEN_TTL_SECONDS, now=time.time(),
    )
    if check.ok:
        return None
    if check.status is TokenStatus.EXPIRED:
        return "token expired"
    if check.status is TokenStatus.BAD_SIGNATURE and token_generation_of(
        token, secret=secret, client_id=client_id, device_id=device.mac,
        current_generation=device.token_generation,
    ) is not None:
        return "device revoked"
    return "token invalid"


def _device_for_open_access(mac: str, client_id: str) -> Device:
    # The row alone, by the query the token path uses (built once): 35 us a lookup against the
    # ORM's 548 us with its joins, about twice that under load (P2 overload, session 45).
    device = device_for_checkin(mac=mac)
    if device is None:
        device, _ = Device.objects.get_or_create(mac=mac, defaults={"client_id": client_id[:64]})
    return device


def _spoken_code(device: Device, client_id: str) -> str | None:
    try:
        return activation_code_issue(device=device, client_id=client_id or None).code
    except ActivationCapacityError:
        return None  # the session says "not bound yet" without a code


def _with_binding_policy(device: Device, client_id: str) -> DeviceAuthResult:
    if not device.needs_activation:
        return DeviceAuthResult(ok=True, device=device, bound=True)
    policy = settings.XIAOZHI_UNBOUND_POLICY
    if policy == "refuse":
        return _refuse("device not activated", CLOSE_NOT_ACTIVATED, device)
    code = _spoken_code(device, client_id) if policy == "speak_code" else None
    return DeviceAuthResult(ok=True, device=device, bound=False, activation_code=code)


def device_authenticate(*, headers: dict[str, str], query: dict[str, str]) -> DeviceAuthResult:
    """Decide whether a WebSocket handshake belongs to a device that may talk (sync, ORM)."""
    raw_device_id, client_id, token = _credentials(headers, query)
    if not raw_device_id:
        return _refuse("device id missing")
    mac = normalize_mac(raw_device_id)
    if mac is None:
        return _refuse("device id invalid")
    if settings.XIAOZHI_WS_AUTH == "open" or mac in settings.XIAOZHI_WS_ALLOWED_MACS:
        return _with_binding_policy(_device_for_open_access(mac, client_id), client_id)
    device = device_for_checkin(mac=mac)  # the row alone: the session reads its persona itself
    if device is None:
        return _refuse("device unknown")
    if not client_id:
        return _refuse("client id missing", device=device)
    problem = _token_problem(device, client_id, token)
    if problem is not None:
        return _refuse(problem, device=device)
    if not device_client_trusted(device=device, client_id=client_id):
        # A token issued to this Client-Id before the device was bound to another one.
        return _refuse("client id not paired", device=device)
    return _with_binding_policy(device, client_id)


def device_authenticate_scope(scope: Mapping[str, Any]) -> DeviceAuthResult:
    """`device_authenticate` for a WebSocket handshake's ASGI scope (sync, ORM)."""
    headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", ())}
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    return device_authenticate(headers=headers, query=query)
