"""WebSocket routes. The device route is wrapped in DeviceAuthMiddleware (the handshake's
bearer token, Device-Id and Client-Id are checked before the consumer runs) and
deliberately not in an Origin validator: the firmware sends no Origin header
(protocol-reference §11.1). Both `/xiaozhi/v1/` and `/xiaozhi/v1` are served (gotcha 13)."""
from __future__ import annotations

from django.urls import URLPattern, re_path

from conversations.consumers import DeviceConsumer
from conversations.gateway.consumer import GatewayConsumer
from devices.middleware import DeviceAuthMiddleware

websocket_urlpatterns: list[URLPattern] = [
    re_path(r"^xiaozhi/v1/?$", DeviceAuthMiddleware(DeviceConsumer.as_asgi()), name="device-ws"),
]

# LLM Gateway (seed 001): text clients; the root path too, so `ws://host:port` works as the seed shows.
websocket_urlpatterns += [
    re_path(r"^llm/v1/?$", GatewayConsumer.as_asgi()),
    re_path(r"^$", GatewayConsumer.as_asgi()),
]
