"""ws_fastpath: the integer XOR masker gives autobahn's own maskers' bytes, whole or in pieces;
received bytes reach autobahn's frame parser as before."""
from __future__ import annotations

import asyncio
import os
import pprint
from collections.abc import Iterator, Mapping
from types import SimpleNamespace

import pytest
from autobahn import util
from autobahn.twisted import websocket
from autobahn.websocket import protocol
from autobahn.websocket.xormasker import create_xor_masker as autobahn_masker

from autobahn.twisted.websocket import WebSocketAdapterProtocol, WebSocketServerFactory, WebSocketServerProtocol
from xiaozhi_site import ws_fastpath
from xiaozhi_site.ws_fastpath import IntXorMasker


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 127, 128, 136, 1000, 65536 + 3])
def test_it_unmasks_like_autobahn(size: int) -> None:
    mask, data = os.urandom(4), os.urandom(size)
    ours, theirs = IntXorMasker(mask), autobahn_masker(mask, size)
    assert ours.process(data) == theirs.process(data)
    assert ours.pointer() == theirs.pointer() == size


def test_a_payload_in_pieces_keeps_the_keys_phase() -> None:
    mask, data = os.urandom(4), os.urandom(1001)
    whole = autobahn_masker(mask, len(data)).process(data)
    ours = IntXorMasker(mask)
    pieces = [ours.process(data[a:b]) for a, b in ((0, 1), (1, 6), (6, 6), (6, 503), (503, 1001))]
    assert b"".join(pieces) == whole
    assert ours.pointer() == 1001
    ours.reset()
    assert ours.pointer() == 0 and ours.process(data[:9]) == whole[:9]


def test_masking_twice_gives_the_data_back() -> None:
    mask, data = b"\x01\x02\x03\x04", b"hello, device"
    assert IntXorMasker(mask).process(IntXorMasker(mask).process(data)) == data


def test_install_swaps_autobahns_factory_and_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "create_xor_masker", autobahn_masker)
    monkeypatch.setattr(WebSocketAdapterProtocol, "dataReceived", WebSocketAdapterProtocol.dataReceived)
    monkeypatch.setattr(protocol, "pformat", pprint.pformat)
    monkeypatch.setattr(protocol.Timings, "__str__", protocol.Timings.__str__)
    for module in (protocol, websocket):
        monkeypatch.setattr(module, "hltype", util.hltype)
        monkeypatch.setattr(module, "hlval", util.hlval)
    assert not ws_fastpath.installed()
    ws_fastpath.install()
    assert ws_fastpath.installed()
    assert isinstance(protocol.create_xor_masker(b"abcd", 10), IntXorMasker)


def test_a_connection_pretty_prints_its_options_only_for_a_debug_line_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "pformat", pprint.pformat)
    monkeypatch.setattr(protocol.Timings, "__str__", protocol.Timings.__str__)
    ws_fastpath.install()
    printed: list[object] = []

    def pretty(value: object) -> str:
        printed.append(value)
        return "pretty"

    monkeypatch.setattr(pprint, "pformat", pretty)
    connection = WebSocketServerProtocol()
    connection.factory = WebSocketServerFactory()
    connection.factory.setProtocolOptions(openHandshakeTimeout=0)  # no timer left on the reactor
    connection.peer, connection.trackTimings = "tcp:127.0.0.1:1", False
    connection._connectionMade()
    assert printed == []  # autobahn's debug logging is off: the options were never formatted
    options = protocol.pformat([("openHandshakeTimeout", 5, "factory")])
    assert printed == [] and f"{options}" == str(options) == "pretty"
    timings = protocol.Timings()
    assert isinstance(str(timings), str)


def test_a_sent_frame_and_a_lost_connection_highlight_nothing_for_debug_lines_not_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[object] = []

    def highlight(value: object, **_: object) -> str:
        made.append(value)
        return f"<{value}>"

    for module in (protocol, websocket):  # autobahn's own, as its modules import them
        monkeypatch.setattr(module, "hltype", highlight)
        monkeypatch.setattr(module, "hlval", highlight)
    ws_fastpath.install()
    connection = WebSocketServerProtocol()
    connection.factory = WebSocketServerFactory()
    connection.factory.setProtocolOptions(openHandshakeTimeout=0)
    connection.peer, connection.trackTimings = "tcp:127.0.0.1:1", False
    sent: list[bytes] = []
    connection.transport = type("Transport", (), {"write": lambda _self, data: sent.append(data)})()
    connection._connectionMade()
    connection.sendData(b"frame")
    connection._connectionLost("the peer went away")
    assert sent == [b"frame"] and made == []  # autobahn's debug logging is off: nothing was made
    line = f"{protocol.hlval(140)} from {websocket.hltype(util)}"
    assert line == f"<140> from <{util}>" and made == [140, util]  # a line written gets the real text
    assert str(protocol.hlval("peer", color="green")) == "<peer>"


class FakeConnection:
    """The attributes of an open autobahn server connection that the short cut reads."""

    def __init__(self, **overrides: object) -> None:
        self.state = ws_fastpath.OPEN
        self.data = b""
        self.current_frame = None
        self.inside_message = self.failedByMe = self.logOctets = self.logFrames = False
        self._perMessageCompress = self.trackedTimings = self.autoPingTimeoutCall = None
        self.maxFramePayloadSize = self.maxMessagePayloadSize = 4096
        self.trafficStats = type("Stats", (), {})()
        for name in ("incomingOctetsWireLevel", "incomingOctetsWebSocketLevel", "incomingOctetsAppLevel",
                     "incomingWebSocketFrames", "incomingWebSocketMessages"):
            setattr(self.trafficStats, name, 0)
        self.messages: list[tuple[bytes, bool]] = []
        self.parsed: list[bytes] = []  # what went to autobahn's own parser
        for name, value in overrides.items():
            setattr(self, name, value)

    def _onMessage(self, payload: bytes, is_binary: bool) -> None:
        self.messages.append((payload, is_binary))

    def _dataReceived(self, data: bytes) -> None:
        self.parsed.append(data)


def frame(payload: bytes, first: int = 0x82, masked: bool = True) -> bytes:
    mask = b"\x11\x22\x33\x44" if masked else b""
    size, bit = len(payload), 0x80 if masked else 0
    length = bytes([size | bit]) if size < 126 else bytes([126 | bit]) + size.to_bytes(2, "big")
    body = IntXorMasker(mask).process(payload) if masked else payload
    return bytes([first]) + length + mask + body


@pytest.mark.parametrize("size", [1, 125, 126, 140, 4096])
def test_one_whole_binary_frame_goes_to_the_application_at_once(size: int) -> None:
    payload = os.urandom(size)
    connection = FakeConnection()
    data = frame(payload)
    ws_fastpath.data_received(connection, data)
    assert connection.messages == [(payload, True)] and connection.parsed == []
    stats = connection.trafficStats
    assert stats.incomingOctetsWireLevel == len(data) and stats.incomingOctetsAppLevel == size
    assert stats.incomingWebSocketFrames == stats.incomingWebSocketMessages == 1


@pytest.mark.parametrize(("data", "overrides"), [
    (frame(b'{"type":"hello"}', first=0x81), {}),  # text
    (frame(b"ping", first=0x89), {}),  # control frame
    (frame(b"part", first=0x02), {}),  # first fragment (no FIN)
    (frame(b"abc", first=0xC2), {}),  # reserved bit
    (frame(b"audio", masked=False), {}),  # unmasked: a protocol violation autobahn reports
    (frame(b"audio")[:-1], {}),  # partial read
    (frame(b"audio") + frame(b"more"), {}),  # two frames in one read
    (frame(b""), {}),  # empty message
    (frame(os.urandom(4097)), {}),  # over the route's limit: autobahn closes with 1009
    (frame(b"audio"), {"data": b"\x82"}),  # earlier bytes buffered
    (frame(b"audio"), {"inside_message": True}),
    (frame(b"audio"), {"state": ws_fastpath.OPEN - 1}),
    (frame(b"audio"), {"autoPingTimeoutCall": object()}),
])
def test_anything_else_takes_autobahns_own_path(data: bytes, overrides: dict[str, object]) -> None:
    connection = FakeConnection(**overrides)
    ws_fastpath.data_received(connection, data)
    assert connection.messages == [] and connection.parsed == [data]


class Queue:
    def __init__(self, items: int = 0) -> None:
        self.items = items

    def empty(self) -> bool:
        return not self.items


class Taker:
    """A sink that takes every frame."""

    def __init__(self) -> None:
        self.taken: list[bytes] = []

    def __call__(self, payload: bytes) -> bool:
        self.taken.append(payload)
        return True


def tapped(sink: object, **overrides: object) -> FakeConnection:
    tap = ws_fastpath.BinaryTap()
    tap.sink = sink  # type: ignore[assignment]
    return FakeConnection(**{"binary_tap": tap, "muted": False, "application_queue": Queue(), "last_ping": 0.0,
                             **overrides})


def test_a_whole_audio_frame_goes_to_the_taps_sink_when_nothing_is_queued_ahead() -> None:
    sink = Taker()
    connection = tapped(sink)
    ws_fastpath.data_received(connection, frame(b"opus"))
    assert sink.taken == [b"opus"] and connection.messages == []
    assert connection.last_ping > 0  # daphne's sign of life, as its onMessage sets it
    assert connection.trafficStats.incomingWebSocketMessages == 1


@pytest.mark.parametrize("overrides", [{"application_queue": Queue(items=1)}, {"muted": True}])
def test_a_frame_with_messages_queued_ahead_or_a_muted_socket_takes_the_queue(overrides: dict[str, object]) -> None:
    sink = Taker()
    connection = tapped(sink, **overrides)
    ws_fastpath.data_received(connection, frame(b"opus"))
    assert sink.taken == [] and connection.messages == [(b"opus", True)]


def test_a_frame_the_sink_declines_or_fails_on_takes_the_queue() -> None:
    def failing(_payload: bytes) -> bool:
        raise RuntimeError("a bug in the application")

    for sink in (lambda _payload: False, failing, None):
        connection = tapped(sink)
        ws_fastpath.data_received(connection, frame(b"opus"))
        assert connection.messages == [(b"opus", True)]


def test_daphne_gives_every_websocket_scope_a_tap_and_other_scopes_none() -> None:
    from daphne.server import Server
    from daphne.ws_protocol import WebSocketProtocol

    ws_fastpath.install()
    seen: list[dict[str, object]] = []
    server = Server.__new__(Server)
    create = ws_fastpath.create_application(lambda _server, _protocol, scope: seen.append(scope))
    websocket_protocol, http_protocol = WebSocketProtocol(), object()
    assert websocket_protocol.binary_tap is None  # until the application is made
    create(server, websocket_protocol, {"type": "websocket", "extensions": {"other": {}}})
    create(server, http_protocol, {"type": "http"})
    extensions = seen[0]["extensions"]
    assert isinstance(extensions, dict) and extensions[ws_fastpath.BINARY_TAP] is websocket_protocol.binary_tap
    assert "other" in extensions and "extensions" not in seen[1]
    assert getattr(Server.create_application, "tapping", False)


class ReplyRecorder:
    """daphne's WebSocketProtocol as the gate's refusal sees it: replies are recorded."""

    def __init__(self) -> None:
        self.replies: list[dict[str, object]] = []

    def handle_reply(self, message: dict[str, object]) -> None:
        self.replies.append(message)


@pytest.fixture
def gate() -> Iterator[list[dict[str, object]]]:
    """A gate refusing scopes whose path is /busy with 1013; the scopes it saw."""
    seen: list[dict[str, object]] = []

    def refuse_busy(scope: Mapping[str, object]) -> tuple[int, str] | None:
        seen.append(dict(scope))
        return (1013, "server busy") if scope.get("path") == "/busy" else None

    ws_fastpath.set_gate(refuse_busy)
    yield seen
    ws_fastpath.set_gate(None)


async def test_a_scope_the_gate_refuses_is_accepted_and_closed_without_an_application(
        gate: list[dict[str, object]]) -> None:
    made: list[dict[str, object]] = []
    create = ws_fastpath.create_application(lambda _server, _protocol, scope: made.append(scope))
    server, busy, free = SimpleNamespace(connections={}), ReplyRecorder(), ReplyRecorder()
    server.connections.update({busy: {"connected": 0.0}, free: {"connected": 0.0}})

    queue = create(server, busy, {"type": "websocket", "path": "/busy"})
    create(server, free, {"type": "websocket", "path": "/xiaozhi/v1/"})
    create(server, object(), {"type": "http", "path": "/busy"})
    assert isinstance(queue, asyncio.Queue) and busy.replies == []  # after daphne's onConnect returns
    await asyncio.sleep(0)

    assert busy.replies == [{"type": "websocket.accept"},
                            {"type": "websocket.close", "code": 1013, "reason": "server busy"}]
    assert [scope["path"] for scope in made] == ["/xiaozhi/v1/", "/busy"]  # only the refused one was not made
    assert [scope["path"] for scope in gate] == ["/busy", "/xiaozhi/v1/"]  # http scopes are not asked
    assert getattr(busy, "binary_tap", None) is None and free.replies == []


async def test_a_refused_client_that_left_before_the_close_gets_nothing(gate: list[dict[str, object]]) -> None:
    create = ws_fastpath.create_application(lambda _server, _protocol, _scope: None)
    gone, early = ReplyRecorder(), ReplyRecorder()
    server = SimpleNamespace(connections={gone: {"connected": 0.0}})
    create(server, gone, {"type": "websocket", "path": "/busy"})
    create(server, early, {"type": "websocket", "path": "/busy"})  # already forgotten by daphne
    server.connections[gone]["disconnected"] = 1.0
    await asyncio.sleep(0)
    assert gone.replies == [] and early.replies == []


# -- the refusal on the first read ---------------------------------------------------------------

RFC_KEY = b"dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455 §1.3's example: its accept value is below


def upgrade(path: bytes = b"/busy", *, key: bytes = RFC_KEY, extra: bytes = b"",
            connection: bytes = b"Upgrade", version: bytes = b"13") -> bytes:
    return (b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: " + connection
            + b"\r\nSec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: " + version + b"\r\n"
            + b"Device-Id: aa:bb:cc:dd:ee:ff\r\n" + extra + b"\r\n")


def test_a_whole_upgrade_the_gate_refuses_gets_the_handshake_and_the_close_frame_in_one_answer(
        gate: list[dict[str, object]]) -> None:
    answer = ws_fastpath.upgrade_refusal(upgrade(b"/busy?device-id=1", connection=b"keep-alive, Upgrade"))
    assert answer == (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\n"
                      b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
                      b"\x88\x0d\x03\xf5server busy")  # FIN close, 13 bytes: code 1013, the reason
    assert gate == [{"type": "websocket", "path": "/busy"}]  # the path without its query, as daphne's scope


def test_an_upgrade_the_gate_lets_through_is_left_to_daphne(gate: list[dict[str, object]]) -> None:
    assert ws_fastpath.upgrade_refusal(upgrade(b"/xiaozhi/v1/")) is None
    assert ws_fastpath.upgrade_refusal(upgrade(b"/bu%73y")) is not None  # percent-decoded, as daphne's path
    assert [scope["path"] for scope in gate] == ["/xiaozhi/v1/", "/busy"]


@pytest.mark.parametrize("data", [
    upgrade()[:-2],  # the headers go on in the next read
    upgrade().replace(b"GET", b"POST", 1),
    upgrade().replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    upgrade().replace(b" HTTP/1.1", b"  HTTP/1.1", 1),  # not three parts
    upgrade().replace(b"Upgrade: websocket", b"Upgrade: h2c"),
    upgrade(connection=b"keep-alive"),
    upgrade(version=b"8"),
    upgrade(key=b"not base64!"),
    upgrade(key=b"c2hvcnQ="),  # 5 bytes, not 16
    upgrade(key=b""),
    upgrade(b"/b\xc3\xbcsy"),  # not ASCII
    upgrade(b"/bu%FFsy"),  # decodes to no UTF-8
    upgrade(extra=b"no colon here\r\n"),
    b"\x16\x03\x01\x02\x00",  # a TLS hello
    b"",
])
def test_anything_but_a_whole_valid_upgrade_is_left_to_daphne_without_asking_the_gate(
        gate: list[dict[str, object]], data: bytes) -> None:
    assert ws_fastpath.upgrade_refusal(data) is None
    assert gate == []


def test_without_a_gate_nothing_is_answered_early() -> None:
    assert ws_fastpath.upgrade_refusal(upgrade()) is None


def test_a_long_reason_is_cut_to_a_close_frames_room_on_a_character_boundary() -> None:
    frame = ws_fastpath._close_frame(1013, "忙" * 60)  # 180 bytes of UTF-8
    assert frame[0] == 0x88 and frame[1] == len(frame) - 2 <= 125
    assert frame[4:].decode() == "忙" * 41  # 123 bytes, whole characters
