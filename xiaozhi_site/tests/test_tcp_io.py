"""tcp_io: a write with nothing queued goes to the socket at once (no writer registered, no
loop turn); what the kernel does not take is queued and sent in order by Twisted's own path;
a lost connection is still reported by that path. A read hands the protocol what one read
brings and tells a closed or failed connection as Twisted's does. Neither gives the interpreter
lock up. Real sockets, a reactor that only records."""
from __future__ import annotations

import ctypes
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet import main, tcp
from twisted.internet.protocol import Protocol

from xiaozhi_site import tcp_io
from xiaozhi_site.tests.recording_reactor import RecordingReactor


class Lost(Protocol):
    reason: Any = None

    def __init__(self) -> None:
        self.received = bytearray()

    def dataReceived(self, data: bytes) -> None:  # noqa: N802
        self.received += data

    def connectionLost(self, reason: Any = None) -> None:  # noqa: N802
        self.reason = reason


@pytest.fixture
def pair() -> Iterator[tuple[tcp.Connection, socket.socket, RecordingReactor]]:
    tcp_io.install()
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    reactor = RecordingReactor()
    connection = tcp.Connection(ours, Lost(), reactor)
    connection.connected = True
    yield connection, peer, reactor
    ours.close()
    peer.close()


def read_all(peer: socket.socket, size: int) -> bytes:
    peer.settimeout(2)
    got = bytearray()
    while len(got) < size:
        got += peer.recv(size - len(got))
    return bytes(got)


def test_install_is_idempotent_and_keeps_twisteds_read_and_write_for_the_rest() -> None:
    tcp_io.install()
    tcp_io.install()
    assert tcp_io.installed()
    assert tcp_io._queued_write is not tcp_io.write and tcp_io._twisted_read is not tcp_io.read


def test_a_write_with_nothing_queued_is_sent_at_once(pair: Any) -> None:
    connection, peer, reactor = pair
    connection.write(b"\x82\x03abc")  # a small binary frame, as a downlink Opus packet
    assert read_all(peer, 5) == b"\x82\x03abc"
    assert reactor.writers == []  # no writer registered: nothing left for a later loop turn
    assert connection.dataBuffer == b"" and connection._tempDataBuffer == []


def test_what_the_kernel_does_not_take_is_queued_and_sent_in_order(pair: Any) -> None:
    connection, peer, reactor = pair
    big = bytes(range(256)) * 40_000  # ~10 MB: more than the socket buffers hold
    connection.write(big)
    assert reactor.writers == [connection]  # the rest waits for writability, Twisted's way
    connection.write(b"after")  # queued behind it, not sent ahead of it
    received = bytearray()
    peer.settimeout(2)
    while len(received) < len(big) + 5:
        if reactor.writers:
            connection.doWrite()
        received += peer.recv(1 << 20)
    assert bytes(received) == big + b"after"
    assert connection.doWrite() is None  # the socket is writable again: nothing left, so it stops
    assert reactor.writers == []


def test_a_write_to_a_closed_peer_is_reported_as_a_lost_connection(pair: Any) -> None:
    connection, peer, reactor = pair
    peer.close()
    connection.write(b"x" * 100_000)  # the send fails: Twisted's path takes over
    assert reactor.writers == [connection]
    assert connection.doWrite() is main.CONNECTION_LOST


def test_an_empty_or_closed_connection_write_sends_nothing(pair: Any) -> None:
    connection, peer, reactor = pair
    connection.write(b"")
    connection.connected = False
    connection.write(b"late")
    peer.setblocking(False)
    with pytest.raises(BlockingIOError):
        peer.recv(10)
    assert reactor.writers == []


def test_a_read_hands_the_protocol_what_the_peer_sent(pair: Any) -> None:
    connection, peer, _ = pair
    peer.sendall(b"\x82\x83mask" + b"abc")
    assert connection.doRead() is None
    assert bytes(connection.protocol.received) == b"\x82\x83maskabc"


def test_a_read_with_nothing_there_returns_at_once_and_a_big_one_comes_in_pieces(pair: Any) -> None:
    connection, peer, _ = pair
    assert connection.doRead() is None  # nothing to read: no wait, no data, connection kept
    assert connection.protocol.received == b""
    big = bytes(range(256)) * 1024  # 256 KiB: more than one read takes
    threading.Thread(target=peer.sendall, args=(big,)).start()  # the kernel holds less than this
    deadline = time.monotonic() + 5
    while len(connection.protocol.received) < len(big) and time.monotonic() < deadline:
        connection.doRead()
    assert bytes(connection.protocol.received) == big


def test_a_read_after_the_peer_closed_ends_the_connection(pair: Any) -> None:
    connection, peer, _ = pair
    peer.sendall(b"last")
    peer.close()
    assert connection.doRead() is None
    assert connection.doRead() is main.CONNECTION_DONE
    assert bytes(connection.protocol.received) == b"last"


def test_a_read_of_a_reset_connection_reports_it_lost() -> None:
    tcp_io.install()
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    ours, _ = listener.accept()
    ours.setblocking(False)
    connection = tcp.Connection(ours, Lost(), RecordingReactor())
    connection.connected = True
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # linger 0: the peer resets instead of closing
    time.sleep(0.05)
    try:
        assert connection.doRead() is main.CONNECTION_LOST
    finally:
        ours.close()
        listener.close()


@pytest.mark.skipif(not tcp_io.NATIVE, reason="the lock-keeping calls are Linux's")
def test_reads_and_writes_call_libc_keeping_the_interpreter_lock() -> None:
    # ctypes gives the lock up around a foreign call unless the function comes from a PyDLL,
    # which marks it "Python API"; a CDLL function here would hand the loop's lock away again.
    for function in (tcp_io._recv, tcp_io._send):
        assert function._flags_ & ctypes._FUNCFLAG_PYTHONAPI
