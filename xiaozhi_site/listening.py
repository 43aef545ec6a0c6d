"""New connections left in the kernel's queue while a worker's hearing is late (issue 17).

Past capacity, a device that arrives costs the worker CPU, on the interpreter lock the hearing
needs, before anything can refuse it: the TCP accept, the HTTP request, the WebSocket
handshake (~1.5-3.5 ms a refused device, ~4-8.5 ms an admitted one with its hello and MCP
handshake, by machine). Twice the capacity arriving in 10 s made every admitted device's
hearing late for the whole arrival, although the same devices streaming alone were on time
(docs/performance.md, P2 overload). conversations/admission.py (`observe_hearing`) decides how
many new connections a worker may take per tick; this applies it to daphne's listening
sockets: held, a socket is not read, and new connections wait in its backlog (SO_REUSEPORT:
each worker has its own) at no cost to anyone; with a budget, one read takes at most that
many; free, it is read as usual. The firmware allows 10 s for the TCP connection and the
upgrade together.

Admission also reads how many connections wait in these queues every tick (`line`: the
kernel's count for a listening socket, TCP_INFO, and Twisted's count of the connections
accepted): while a worker's places are full, or its hearing has been late for long, it takes
them at the rate that answers each within a deadline, instead of all at once.

daphne only: its Twisted listening ports are found among the reactor's readers at the first
call (a device has connected, so daphne listens). Under another server there are none, and
pacing does nothing.
"""
from __future__ import annotations

import logging
import socket
import struct
import sys
from collections.abc import Callable
from functools import partial
from typing import Any, cast

logger = logging.getLogger(__name__)


class ListeningPorts:
    """This process's listening sockets, paced: held (not read), one read of at most n
    connections per call, or read freely."""

    def __init__(self, find: Callable[[], list[Any]] | None = None) -> None:
        self._find_ports = find or _reactor_ports
        self._ports: list[Any] | None = None  # found at the first call
        self._budget: int | None = None

    def pace(self, budget: int | None) -> None:
        """`budget` new connections until the next call: 0 none, n in one read, None any."""
        self._budget = budget
        for port in self._find():
            if budget == 0:
                port.stopReading()
            elif port.connected and not port.disconnecting:  # not once the server is closing
                if budget is not None:
                    port.numberAccepts = budget  # Twisted accepts at most this many in a read
                port.startReading()

    def line(self) -> tuple[int, int]:
        """(connections waiting in these ports' queues, connections accepted from them so far)."""
        waiting = accepted = 0
        for port in self._find():
            accepted += port.sessionno  # Twisted numbers each connection it accepts
            waiting += queue_length(port.socket)
        return waiting, accepted

    def _after_read(self, port: Any, read: Callable[[], Any]) -> Any:
        try:
            return read()
        finally:
            if self._budget is not None:  # paced: this read was the budget's one
                port.stopReading()

    def _find(self) -> list[Any]:
        """The listening ports, found once (a held port is no longer among the reactor's readers)."""
        if self._ports is None:
            self._ports = self._find_ports()
            for port in self._ports:
                port.doRead = partial(self._after_read, port, port.doRead)
            logger.info("pacing new connections on %d listening port(s)", len(self._ports))
        return self._ports


def _reactor_ports() -> list[Any]:
    """daphne's listening ports: the Twisted reactor's readers that accept connections."""
    if "twisted.internet.reactor" not in sys.modules:  # not under daphne: never install a reactor here
        return []
    from twisted.internet import reactor, tcp  # noqa: PLC0415

    readers: list[Any] = cast(Any, reactor).getReaders()  # the installed reactor: its module is typed as none
    return [reader for reader in readers if isinstance(reader, tcp.Port)]


# struct tcp_info (linux/tcp.h): 8 one-byte fields, then u32s; for a listening socket the kernel
# puts the accept queue's length in tcpi_unacked, the fifth of them (after rto, ato and the MSSs).
_TCP_INFO_UNACKED = struct.Struct("=8x16xI")


def queue_length(sock: socket.socket | None) -> int:
    """Connections the kernel has completed into a listening socket's queue, not yet accepted
    (0 where the platform does not say, or the socket is closed)."""
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return 0
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_UNACKED.size)
    except OSError:
        return 0
    return _TCP_INFO_UNACKED.unpack_from(info)[0] if len(info) >= _TCP_INFO_UNACKED.size else 0
