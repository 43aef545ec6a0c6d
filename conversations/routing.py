"""WebSocket routes. The device route is deliberately not wrapped in an Origin validator:
the firmware sends no Origin header (protocol-reference §11.1)."""
from __future__ import annotations

websocket_urlpatterns: list = []
