"""WebSocket routes. The device consumer checks the handshake's bearer token, Device-Id and
Client-Id itself, before it accepts (in the database hop that sets its session up), and
the route is deliberately not wrapped in an Origin validator: the firmware sends no Origin
header (protocol-reference §11.1). Both `/xiaozhi/v1/` and `/xiaozhi/v1` are served (gotcha 13)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django.urls import re_path

from conversations.consumers import DeviceConsumer
from conversations.gateway.consumer import GatewayConsumer

if TYPE_CHECKING:
    from channels.routing import URLRouter, _ExtendedURLPattern


def _route(pattern: str, application: Any, name: str | None = None) -> _ExtendedURLPattern:
    # django-stubs types re_path for views; Channels routes ASGI applications through it.
    return cast("_ExtendedURLPattern", re_path(pattern, application, name=name))


websocket_urlpatterns: list[_ExtendedURLPattern | URLRouter] = [
    _route(r"^xiaozhi/v1/?$", DeviceConsumer.as_asgi(), name="device-ws"),
]

# LLM Gateway (seed 001): text clients; the root path too, so `ws://host:port` works as the seed shows.
websocket_urlpatterns += [
    _route(r"^llm/v1/?$", GatewayConsumer.as_asgi()),
    _route(r"^$", GatewayConsumer.as_asgi()),
]
