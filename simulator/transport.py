"""The device's WebSocket handshake (protocol-reference §2.1) on top of `websockets`.

esp-ml307 sends `Host` without the port, the four device headers, and nothing a browser
or library would add: no Origin, no User-Agent, no extensions (no permessage-deflate), no
subprotocol. It never pings on its own (it only answers pings).
"""
from __future__ import annotations

from typing import Any
from urllib.parse import urlencode, urlsplit

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.exceptions import InvalidHandshake, InvalidStatus
from websockets.http11 import Request

from simulator.events import DeviceError

HANDSHAKE_TIMEOUT_S = 10.0
MAX_INCOMING_BYTES = 4 * 1024 * 1024


class FirmwareConnection(ClientConnection):
    """A client connection whose handshake puts `Host` (without port) first, like the firmware."""

    def __init__(self, protocol: ClientProtocol, *args: Any, **kwargs: Any) -> None:
        super().__init__(protocol, *args, **kwargs)
        build_request = protocol.connect
        host = protocol.uri.host

        def connect() -> Request:
            request = build_request()
            headers = Headers(Host=host)
            for name, value in request.headers.raw_items():
                if name.lower() != "host":
                    headers[name] = value
            request.headers = headers
            return request

        protocol.connect = connect  # type: ignore[method-assign]


def handshake_headers(token: str, version: int, mac: str, client_id: str) -> dict[str, str]:
    """WebsocketProtocol::OpenAudioChannel headers, in the firmware's order."""
    headers: dict[str, str] = {}
    if token:
        # A token with a space (e.g. "Bearer x") is sent raw; an empty one is omitted.
        headers["Authorization"] = token if " " in token else f"Bearer {token}"
    headers["Protocol-Version"] = str(version)
    headers["Device-Id"] = mac
    headers["Client-Id"] = client_id
    return headers


def move_auth_to_query(url: str, headers: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The browser-test-page variant: device-id/client-id/authorization as query parameters."""
    params = {"device-id": headers["Device-Id"], "client-id": headers["Client-Id"]}
    if "Authorization" in headers:
        params["authorization"] = headers["Authorization"]
    separator = "&" if urlsplit(url).query else ("" if url.endswith("?") else "?")
    kept = {k: v for k, v in headers.items() if k not in ("Device-Id", "Client-Id", "Authorization")}
    return url + separator + urlencode(params), kept


def override_headers(headers: dict[str, str], override: dict[str, str | None]) -> dict[str, str]:
    """Replace headers case-insensitively; a value of None removes the header."""
    result = dict(headers)
    for name, value in override.items():
        for existing in [k for k in result if k.lower() == name.lower()]:
            del result[existing]
        if value is not None:
            result[name] = value
    return result


async def open_connection(url: str, headers: dict[str, str]) -> ClientConnection:
    """Connect like esp-ml307; DeviceError with the HTTP status when the upgrade is refused."""
    try:
        return await ws_connect(
            url, additional_headers=headers, compression=None, origin=None,
            user_agent_header=None, proxy=None, ping_interval=None,
            open_timeout=HANDSHAKE_TIMEOUT_S, close_timeout=1, max_size=MAX_INCOMING_BYTES,
            create_connection=FirmwareConnection,
        )
    except InvalidStatus as exc:
        raise DeviceError(f"WebSocket handshake refused: HTTP {exc.response.status_code}") from exc
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        raise DeviceError(f"WebSocket connect to {url} failed: {exc or type(exc).__name__}") from exc


def drop(connection: ClientConnection) -> bool:
    """Close TCP without a close frame (CloseAudioChannel); False if the library gives no transport."""
    transport = getattr(connection, "transport", None)
    if transport is None:
        return False
    transport.abort()
    return True
