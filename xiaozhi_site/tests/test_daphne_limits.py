"""Limits daphne applies before Django sees a request (xiaozhi_site/daphne_limits.py), tested
against the real server over raw sockets: slow and half-sent requests are closed, bodies
over their route's limit get 413 before they are read, and the server keeps answering."""
from __future__ import annotations

import json
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from websockets.asyncio.client import connect

from testing.server import AsgiServer, database_url
from xiaozhi_site.daphne_limits import EdgeLimits

BODY_LIMIT = 64 * 1024
ADMIN_LIMIT = 32 * 1024 * 1024
SERVER_ENV = {
    "XIAOZHI_HTTP_HEADER_TIMEOUT_SECONDS": "1",
    "XIAOZHI_HTTP_BODY_TIMEOUT_SECONDS": "2",
    "XIAOZHI_HTTP_MAX_BODY_BYTES": str(BODY_LIMIT),
    "XIAOZHI_HTTP_ADMIN_MAX_BODY_BYTES": str(ADMIN_LIMIT),
}
GIVE_UP = 30.0  # a socket the server should close but does not fails the test after this


# -- the limits themselves (pure) ---------------------------------------------------------------------


LIMITS = EdgeLimits(header_timeout=1, body_timeout=1, body_bytes=100,
                    body_routes=(("/admin/", 1000), ("/mcp/vision/explain", 500)),
                    websocket_routes=(("/llm/v1", 2000), ("", 2000), ("/xiaozhi/v1", 300)))  # fmt: skip


@pytest.mark.parametrize(("target", "limit"), [
    (b"/xiaozhi/ota/", 100), (b"/admin/devices/firmwarerelease/add/", 1000), (b"/admin/?next=x", 1000),
    (b"/mcp/vision/explain", 500), (b"/mcp/vision/explain/?a=b", 500), (b"/healthz?/admin/", 100),
    (b"http://host:8000/admin/x", 1000), (b"/%61dmin/", 100), (b"*", 100),
])  # fmt: skip
def test_each_route_gets_its_body_limit_and_anything_unlisted_the_default(target: bytes, limit: int) -> None:
    assert LIMITS.body_limit(target) == limit


@pytest.mark.parametrize(("path", "limit"), [
    ("/llm/v1/", 2000), ("/llm/v1", 2000), ("/", 2000), ("/xiaozhi/v1/", 300), ("/dashboard/ws/", 1024 * 1024),
])  # fmt: skip
def test_each_websocket_route_gets_its_frame_limit(path: str, limit: int) -> None:
    assert LIMITS.websocket_limit(path) == limit


# -- the real server --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: pytest.FixtureRequest) -> Iterator[AsgiServer]:
    from django.db import connection

    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        url = database_url(connection.settings_dict)
    with AsgiServer(env={"DATABASE_URL": url, **SERVER_ENV}) as running:
        yield running


def _connect(server: AsgiServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=GIVE_UP)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; socket.timeout if it never does."""
    data = b""
    while chunk := _recv(sock):
        data += chunk
    return data


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""


def _healthz(server: AsgiServer) -> int:
    try:
        with urllib.request.urlopen(f"{server.http_url}/healthz", timeout=GIVE_UP) as response:
            return response.status
    except urllib.error.HTTPError as error:  # 503 when a component is down: still an answer
        return error.code


def _json_body(response: bytes) -> dict:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


def e2e(test):  # type: ignore[no-untyped-def]
    # django_db: the server subprocess shares the test database, which must exist.
    return pytest.mark.e2e(pytest.mark.django_db(test))


@e2e
def test_a_connection_sending_half_a_request_line_is_closed(server: AsgiServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HT")
        response = _read_until_closed(sock)
    assert response.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert _json_body(response)["error"] == "request_timeout"


@e2e
def test_headers_trickled_byte_by_byte_do_not_hold_the_connection(server: AsgiServer) -> None:
    # Each byte would restart an idle timeout; the header deadline counts from the first one.
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        deadline = time.monotonic() + GIVE_UP
        closed = False
        while not closed and time.monotonic() < deadline:
            try:
                sock.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            readable, _, _ = select.select([sock], [], [], 0.2)
            closed = bool(readable) and _recv(sock).startswith(b"HTTP/1.1 408") or closed
    assert closed


@e2e
def test_a_kept_alive_connection_serves_requests_then_idles_out_without_an_answer(server: AsgiServer) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with _connect(server) as sock:
        for _ in range(2):
            sock.sendall(request)
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(65536)
            header, body = head.split(b"\r\n\r\n", 1)
            length = int(next(line.split(b":")[1] for line in header.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))  # fmt: skip
            while len(body) < length:
                body += sock.recv(65536)
            assert json.loads(body)["status"] in ("ok", "unavailable")
        assert _read_until_closed(sock) == b""  # idle past the header deadline: closed, silently


VISION_LIMIT = 5 * 1024 * 1024 + 64 * 1024  # XIAOZHI_VISION_MAX_BYTES + multipart framing


@e2e
@pytest.mark.parametrize(("path", "declared", "limit"), [
    ("/xiaozhi/ota/", 1_000_000_000, BODY_LIMIT), ("/mcp/vision/explain", VISION_LIMIT + 1, VISION_LIMIT),
])  # fmt: skip
def test_a_declared_body_over_the_routes_limit_gets_413_before_it_is_sent(
    server: AsgiServer, path: str, declared: int, limit: int
) -> None:
    with _connect(server) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                     f"Content-Length: {declared}\r\n\r\n".encode())  # fmt: skip
        response = _read_until_closed(sock)
    assert response.startswith(b"HTTP/1.1 413 Payload Too Large\r\n")
    assert _json_body(response) == {"error": "body_too_large", "message": f"The body must be at most {limit} bytes."}


@dataclass
class ChunkedUpload:
    """Streams a chunked POST in a thread and stops at the first byte of an answer."""

    server: AsgiServer
    path: str
    total: int
    chunk: bytes = b"x" * (256 * 1024)
    sent: int = 0
    response: bytes = b""
    error: str = ""
    thread: threading.Thread = field(init=False)

    def start(self) -> ChunkedUpload:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        with _connect(self.server) as sock:
            sock.sendall(f"POST {self.path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
            frame = b"%x\r\n" % len(self.chunk) + self.chunk + b"\r\n"
            try:
                while self.sent < self.total:
                    sock.sendall(frame)
                    self.sent += len(self.chunk)
                    if select.select([sock], [], [], 0)[0]:
                        break
                else:
                    sock.sendall(b"0\r\n\r\n")
            except OSError as exc:  # the server aborted after answering: the answer is buffered
                self.error = type(exc).__name__
            self.response = _read_until_closed(sock)

    def join(self) -> None:
        self.thread.join(GIVE_UP)
        assert not self.thread.is_alive(), "the upload never got an answer"


@e2e
def test_healthz_keeps_answering_while_a_huge_chunked_post_streams_and_that_post_gets_413(server: AsgiServer) -> None:
    upload = ChunkedUpload(server, "/admin/login/", total=256 * 1024 * 1024).start()
    while upload.sent < 2 * 1024 * 1024 and upload.thread.is_alive():
        time.sleep(0.01)
    statuses = [_healthz(server) for _ in range(3)]  # while the upload is read (or refused)
    upload.join()
    assert statuses and all(status in (200, 503) for status in statuses)
    assert upload.response.startswith(b"HTTP/1.1 413 Payload Too Large\r\n"), upload.error
    assert ADMIN_LIMIT <= upload.sent < upload.total  # refused once past the limit, not at the end


@e2e
def test_each_route_has_its_own_body_limit(server: AsgiServer) -> None:
    # 2 MiB: over the default limit, within the camera's (5 MiB): the vision view itself answers.
    ota = ChunkedUpload(server, "/xiaozhi/ota/", total=2 * 1024 * 1024).start()
    vision = ChunkedUpload(server, "/mcp/vision/explain", total=2 * 1024 * 1024).start()
    ota.join()
    vision.join()
    assert ota.response.startswith(b"HTTP/1.1 413 ")
    assert vision.response.startswith(b"HTTP/1.1 401 ") and vision.sent == vision.total


@e2e
def test_a_form_post_reaches_django_unparsed_by_twisted(server: AsgiServer) -> None:
    """Twisted would parse a multipart POST itself (and answer one it cannot parse, here without
    a boundary, with its own bare 400); daphne never uses that parse, so the body goes to Django
    as it came."""
    body = b'{"application": {}}'
    with _connect(server) as sock:
        sock.sendall(b"POST /xiaozhi/ota/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Type: multipart/form-data\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        response = _read_until_closed(sock)
    head, _, payload = response.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), response[:300]  # the OTA view's answer
    assert json.loads(payload)


@e2e
def test_a_body_that_stops_arriving_gets_408(server: AsgiServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"POST /xiaozhi/ota/ HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"pad\": ")
        response = _read_until_closed(sock)
    assert response.startswith(b"HTTP/1.1 408 Request Timeout\r\n")


@e2e
@pytest.mark.django_db(transaction=True)
async def test_a_websocket_lives_past_the_header_timeout(server: AsgiServer, gateway_key: str) -> None:
    async with connect(f"{server.ws_url}/llm/v1/?token={gateway_key}", open_timeout=20) as ws:
        assert json.loads(await ws.recv())["status"] == "connected"
        await _sleep(2.5)  # more than the 1 s header deadline
        await ws.send(json.dumps({"type": "ping"}))
        assert json.loads(await ws.recv())["type"] == "pong"


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
