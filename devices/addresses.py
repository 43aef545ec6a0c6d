"""Where a request comes from and where devices should reach us: client addresses behind
trusted proxies, and the public base/WebSocket URLs handed to devices.

Used by the device views, the admin (rate limits per address), the WebSocket consumers and
the device-auth middleware, so HTTP requests and WebSocket scopes follow one rule.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.http import HttpRequest

WS_PATH = "/xiaozhi/v1/"


def trusted_client_address(remote: str, forwarded_for: str) -> str | None:
    """The client's IP for HTTP requests and WebSocket scopes alike.

    X-Forwarded-For is client-controlled: only the entries appended by our own proxies
    (XIAOZHI_TRUSTED_PROXY_COUNT of them, counted from the right) can be believed.
    """
    address = remote
    proxies = settings.XIAOZHI_TRUSTED_PROXY_COUNT
    if proxies:
        forwarded = [part.strip() for part in forwarded_for.split(",") if part.strip()]
        if len(forwarded) >= proxies:
            address = forwarded[-proxies]
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


def client_address(request: HttpRequest) -> str | None:
    return trusted_client_address(request.META.get("REMOTE_ADDR", ""), request.META.get("HTTP_X_FORWARDED_FOR", ""))


def header_value(scope: Mapping[str, Any], name: bytes) -> str:
    """One header of an ASGI scope (`name` in lowercase), "" when absent."""
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return ""


def scope_client_address(scope: Mapping[str, Any]) -> str:
    """The client's IP for a WebSocket scope, with the same proxy rules as HTTP requests."""
    client = scope.get("client")
    remote = str(client[0]) if isinstance(client, (list, tuple)) and client else ""
    return trusted_client_address(remote, header_value(scope, b"x-forwarded-for")) or ""


def public_base_url(request: HttpRequest) -> str:
    """XIAOZHI_PUBLIC_BASE_URL, else the request's own scheme and Host.

    The Host fallback is why production must set DJANGO_ALLOWED_HOSTS (or the public URLs):
    with ALLOWED_HOSTS=* any Host header is copied into what devices are told (checks.py).
    """
    configured = settings.XIAOZHI_PUBLIC_BASE_URL.rstrip("/")
    return configured or f"{request.scheme}://{request.get_host()}"


def public_ws_url(request: HttpRequest) -> str:
    if settings.XIAOZHI_PUBLIC_WS_URL:
        return settings.XIAOZHI_PUBLIC_WS_URL
    base = public_base_url(request)
    scheme, _, rest = base.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{WS_PATH}"
