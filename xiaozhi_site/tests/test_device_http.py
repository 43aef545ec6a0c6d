"""The firmware's HTTP routes through xiaozhi_site/device_http.py: the settings' middleware and
the view in one call on a kept-connection thread, other paths on Django's ASGI handler."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.signals import request_finished
from django.db.backends.signals import connection_created

from devices.tests.factories import BoundDeviceFactory, FirmwareReleaseFactory
from simulator.ota import Identity, request_headers, system_info
from xiaozhi_site.db_threads import close_kept_connections, kept_connections_executor
from xiaozhi_site.device_http import DeviceHttpRouter, SyncRequestHandler

pytestmark = pytest.mark.django_db(transaction=True)

Message = dict[str, Any]


async def call(app: Any, method: str, path: str, headers: dict[str, str] | None = None,
               body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One HTTP request through an ASGI app, as daphne hands it over."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
             "client": ("127.0.0.1", 40000), "server": ("testserver", 80)}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    heads = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], heads, b"".join(m.get("body", b"") for m in sent[1:])


def ota_request(device: Any) -> tuple[dict[str, str], bytes]:
    identity = Identity(mac=device.mac, client_id=device.client_id, board="bread-compact-wifi",
                        firmware_version="2.4.2", language="zh-CN", serial_number=None)
    body = json.dumps(system_info(identity)).encode()
    return {**request_headers(identity), "Host": "testserver", "Content-Length": str(len(body))}, body


@pytest.fixture
def device() -> Any:
    return BoundDeviceFactory()


@pytest.fixture
def release(settings: Any, tmp_path: Path) -> tuple[Any, bytes]:
    settings.MEDIA_ROOT = tmp_path
    release = FirmwareReleaseFactory(is_active=True)
    return release, Path(release.binary.path).read_bytes()


@pytest.fixture
def seen() -> Iterator[dict[str, list[str]]]:
    """The threads that finished a request, and those that opened a database connection."""
    records: dict[str, list[str]] = {"finished": [], "opened": []}

    def finished(**_: object) -> None:
        records["finished"].append(threading.current_thread().name)

    def opened(**_: object) -> None:
        records["opened"].append(threading.current_thread().name)

    request_finished.connect(finished)
    connection_created.connect(opened)
    yield records
    request_finished.disconnect(finished)
    connection_created.disconnect(opened)
    close_kept_connections()


async def test_an_ota_check_runs_middleware_and_view_on_one_thread_that_keeps_its_connection(
    device: Any, seen: dict[str, list[str]],
) -> None:
    handler = SyncRequestHandler(kept_connections_executor("test-device-http", 1))
    headers, body = ota_request(device)
    replies = [await call(handler, "POST", "/xiaozhi/ota/", headers, body) for _ in range(2)]
    for status, response_headers, content in replies:
        assert status == 200
        assert json.loads(content)["websocket"]["token"]
        # The settings' middleware ran: SecurityMiddleware and XFrameOptionsMiddleware headers.
        assert response_headers["x-content-type-options"] == "nosniff"
        assert response_headers["x-frame-options"] == "DENY"
    # Both requests finished on the handler's thread, which opened one connection for both.
    assert [name.startswith("test-device-http") for name in seen["finished"]] == [True, True]
    assert [name.startswith("test-device-http") for name in seen["opened"]] == [True]


async def test_a_bad_request_still_gets_the_views_json_error(seen: dict[str, list[str]]) -> None:
    handler = SyncRequestHandler(kept_connections_executor("test-device-http", 1))
    status, _, content = await call(handler, "POST", "/xiaozhi/ota/", {"Content-Length": "2"}, b"{}")
    assert status == 400
    assert json.loads(content)["error"] == "missing_device_id"


@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume synchronous iterators")
async def test_a_firmware_download_streams_with_its_length(
    release: tuple[Any, bytes], seen: dict[str, list[str]],
) -> None:
    release, image = release
    handler = SyncRequestHandler(kept_connections_executor("test-device-http", 1))
    path = f"/xiaozhi/ota/firmware/{release.pk}/{release.binary.name.rsplit('/', 1)[-1]}"
    status, headers, content = await call(handler, "GET", path)
    assert status == 200
    assert content == image and int(headers["content-length"]) == len(image)
    assert len(seen["finished"]) == 1  # the response was closed after it was sent


async def test_only_the_device_routes_leave_djangos_asgi_handler() -> None:
    routed: list[str] = []

    def app(name: str) -> Any:
        async def handle(scope: dict, receive: Any, send: Any) -> None:
            routed.append(f"{name} {scope['path']}")
        return handle

    router = DeviceHttpRouter(app("device"), app("django"))
    for path in ("/xiaozhi/ota/", "/xiaozhi/ota", "/xiaozhi/ota/activate", "/admin/", "/mcp/vision/explain"):
        await router({"type": "http", "path": path}, None, None)  # type: ignore[arg-type]
    assert routed == ["device /xiaozhi/ota/", "device /xiaozhi/ota", "device /xiaozhi/ota/activate",
                      "django /admin/", "django /mcp/vision/explain"]
