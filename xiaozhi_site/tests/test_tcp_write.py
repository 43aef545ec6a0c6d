"""tcp_write: a write with nothing queued goes to the socket at once (no writer registered, no
loop turn); what the kernel does not take is queued and sent in order by Twisted's own path;
a lost connection is still reported by that path; the send keeps the interpreter lock. Real
sockets, a reactor that only records."""
from __future__ import annotations

import ctypes
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet import main, tcp
from twisted.internet.protocol import Protocol

from xiaozhi_site import tcp_write
from xiaozhi_site.tests.recording_reactor import RecordingReactor


class Lost(Protocol):
    reason: Any = None

    def connectionLost(self, reason: Any = None) -> None:  # noqa: N802
        self.reason = reason


@pytest.fixture
def pair() -> Iterator[tuple[tcp.Connection, socket.socket, RecordingReactor]]:
    tcp_write.install()
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


def test_install_is_idempotent_and_keeps_twisteds_write_for_the_rest() -> None:
    tcp_write.install()
    tcp_write.install()
    assert tcp_write.installed()
    assert tcp_write._queued_write is not tcp_write.write


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


@pytest.mark.skipif(not tcp_write.NATIVE, reason="the lock-keeping calls are Linux's")
def test_the_send_calls_libc_keeping_the_interpreter_lock() -> None:
    # ctypes gives the lock up around a foreign call unless the function comes from a PyDLL,
    # which marks it "Python API"; a CDLL function here would hand the loop's lock away again.
    assert tcp_write._send._flags_ & ctypes._FUNCFLAG_PYTHONAPI


def test_one_send_takes_no_more_than_twisteds_limit_and_queues_the_rest(pair: Any) -> None:
    connection, peer, reactor = pair
    connection.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)  # room for it all
    data = bytes(range(256)) * 4096  # 1 MiB, more than SEND_LIMIT
    connection.write(data)
    queued = len(connection.dataBuffer) + sum(map(len, connection._tempDataBuffer))
    assert queued == len(data) - connection.SEND_LIMIT  # the lock held for one bounded copy only
    assert reactor.writers == [connection]
    received = bytearray()
    peer.settimeout(2)
    while len(received) < len(data):
        if reactor.writers:
            connection.doWrite()
        received += peer.recv(1 << 20)
    assert bytes(received) == data
