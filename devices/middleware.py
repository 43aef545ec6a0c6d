"""DeviceAuthMiddleware: authenticates the device WebSocket handshake before the consumer runs.

It wraps the device route (conversations/routing.py) and fills the scope:

- `scope["device_auth"]`: the `DeviceAuthResult` (ok, close code and reason, bound, the
  activation code an unbound device should hear);
- `scope["device"]`: the authenticated `Device`, or None when refused.

The consumer only enforces the decision: it accepts, or accepts and closes with the code and
reason (a close before accept would be a bare HTTP 403). There is deliberately no Origin
check: the firmware sends none (protocol-reference §11.1); the bearer token is the proof.
Like Channels' AuthMiddleware, nothing per connection is kept on `self`.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qsl

from channels.middleware import BaseMiddleware

from devices.auth import DeviceAuthResult, device_authenticate
from devices.protocol.close_codes import CloseCode
from xiaozhi_site.db_threads import device_db

if TYPE_CHECKING:
    from channels.consumer import _ChannelScope

    from devices.models import Device

    class DeviceScope(_ChannelScope, total=False):
        device_auth: DeviceAuthResult
        device: Device | None

logger = logging.getLogger(__name__)

SETUP_FAILED = DeviceAuthResult(ok=False, close_code=CloseCode.INTERNAL_ERROR, reason="internal error")


def authenticate_scope(scope: Mapping[str, Any]) -> DeviceAuthResult:
    """The handshake's headers and query parameters through `device_authenticate` (sync, ORM)."""
    headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", ())}
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    return device_authenticate(headers=headers, query=query)


# On the device threads (kept connections), never queued behind sync views.
_authenticate = device_db(authenticate_scope)


class DeviceAuthMiddleware(BaseMiddleware):
    async def __call__(self, channel_scope: _ChannelScope, receive: Any, send: Any) -> Any:
        scope = cast("DeviceScope", dict(channel_scope))
        try:
            auth = await _authenticate(scope)
        except Exception:  # e.g. the database is unreachable: the consumer closes with 1011
            logger.exception("device authentication failed")
            auth = SETUP_FAILED
        scope["device_auth"] = auth
        scope["device"] = auth.device if auth.ok else None
        return await super().__call__(scope, receive, send)
