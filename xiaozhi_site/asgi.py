"""ASGI entry point: HTTP goes to Django, WebSockets to the Channels routes."""
from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "xiaozhi_site.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402  (after Django setup)

from xiaozhi_site import daphne_close, daphne_limits, tcp_write, ws_fastpath  # noqa: E402
from xiaozhi_site.collector import settle_heap  # noqa: E402
from xiaozhi_site.device_http import device_http_application  # noqa: E402
from xiaozhi_site.listening import ListeningPorts  # noqa: E402

daphne_close.install()  # close codes such as 1013 and their reasons reach the client
daphne_limits.install(daphne_limits.limits_from_settings())  # timeouts and sizes, before Django
ws_fastpath.install()  # autobahn's per-frame unmasking and debug line, made cheap (issue 17)
tcp_write.install()  # a write with nothing queued goes to the socket at once, keeping the interpreter lock

from conversations.admission import refusal_before_application, set_pace  # noqa: E402
from conversations.pipeline.engine import preload_hearing  # noqa: E402
from conversations.routing import websocket_urlpatterns  # noqa: E402

ws_fastpath.set_gate(refusal_before_application)  # devices past capacity: 1013 before any consumer
daphne_limits.set_first_read_answer(ws_fastpath.upgrade_refusal)  # ...and before daphne parses their request
# While the hearing is late or the places are full, new connections wait in the kernel's queue.
listening_ports = ListeningPorts()
set_pace(listening_ports.pace, listening_ports.line)

application = ProtocolTypeRouter(
    {
        # The firmware's check-ins in one hop each, the rest through Django's ASGI handler.
        "http": device_http_application(django_asgi_app),
        "websocket": URLRouter(websocket_urlpatterns),
    }
)

preload_hearing()  # the VAD's weights now, not under the first device's first window

# Start-up objects out of the collector's reach, young collections less often (xiaozhi_site/collector.py).
settle_heap()
