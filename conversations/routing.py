"""WebSocket routes. The device route is deliberately not wrapped in an Origin validator:
the firmware sends no Origin header (protocol-reference §11.1) and authenticates with its
bearer token instead. Both `/xiaozhi/v1/` and `/xiaozhi/v1` are served (gotcha 13)."""
from __future__ import annotations

from django.urls import URLPattern, re_path

from conversations.consumers import DeviceConsumer
from conversations.gateway.consumer import GatewayConsumer

websocket_urlpatterns: list[URLPattern] = [
    re_path(r"^xiaozhi/v1/?$", DeviceConsumer.as_asgi(), name="device-ws"),
]

# LLM Gateway (seed 001): text clients; the root path too, so `ws://host:port` works as the seed shows.
websocket_urlpatterns += [
    re_path(r"^llm/v1/?$", GatewayConsumer.as_asgi()),
    re_path(r"^$", GatewayConsumer.as_asgi()),
]
