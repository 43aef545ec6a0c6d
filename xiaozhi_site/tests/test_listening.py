"""listening: a worker whose hearing is late leaves new connections in the kernel's queue, then
takes them a budget at a time. A real Twisted listening port and real client sockets; the
reactor only records what the port asks of it, and each read is called by the test."""
from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet import tcp
from twisted.internet.protocol import Factory, Protocol

from xiaozhi_site.listening import ListeningPorts, queue_length
from xiaozhi_site.tests.recording_reactor import RecordingReactor


class Accepted(Factory):
    def __init__(self) -> None:
        self.connections = 0

    def buildProtocol(self, addr: Any) -> Protocol:  # noqa: N802
        self.connections += 1
        return Protocol()


@pytest.fixture
def port() -> Iterator[tuple[tcp.Port, Accepted, RecordingReactor, list[socket.socket]]]:
    reactor, factory = RecordingReactor(), Accepted()
    listening = tcp.Port(0, factory, interface="127.0.0.1", reactor=reactor)
    listening.startListening()
    clients: list[socket.socket] = []
    for _ in range(10):  # the kernel completes each handshake into the listening socket's queue
        client = socket.create_connection(("127.0.0.1", listening.getHost().port), timeout=2)
        clients.append(client)
    yield listening, factory, reactor, clients
    for client in clients:
        client.close()
    listening.socket.close()


def test_held_connections_wait_then_come_in_a_budget_per_read_then_freely(port: Any) -> None:
    listening, factory, reactor, _clients = port
    ports = ListeningPorts(find=lambda: [listening])
    assert listening in reactor.readers
    ports.pace(0)
    assert listening not in reactor.readers  # held: nothing reads the queue, nothing is accepted
    assert factory.connections == 0
    ports.pace(3)
    assert listening in reactor.readers
    listening.doRead()  # the loop finds the socket readable
    assert factory.connections == 3
    assert listening not in reactor.readers  # one read per budget: the rest wait for the next tick
    ports.pace(2)
    listening.doRead()
    assert factory.connections == 5
    ports.pace(None)
    listening.doRead()
    assert factory.connections == 10
    assert listening in reactor.readers  # free: it keeps reading


def test_the_line_counts_the_connections_waiting_in_the_kernels_queue_and_those_accepted(port: Any) -> None:
    listening, factory, _reactor, _clients = port
    ports = ListeningPorts(find=lambda: [listening])
    assert ports.line() == (10, 0)  # the kernel completed all ten handshakes; nobody accepted them
    ports.pace(3)
    listening.doRead()
    assert ports.line() == (7, 3) and factory.connections == 3
    ports.pace(None)
    listening.doRead()
    assert ports.line() == (0, 10)


def test_a_queue_length_is_zero_for_a_closed_or_missing_socket() -> None:
    closed = socket.socket()
    closed.close()
    assert queue_length(closed) == 0 and queue_length(None) == 0


def test_a_closing_port_is_not_read_again(port: Any) -> None:
    listening, _factory, reactor, _clients = port
    ports = ListeningPorts(find=lambda: [listening])
    ports.pace(0)
    listening.disconnecting = True  # stopListening under way
    ports.pace(None)
    assert listening not in reactor.readers


def test_outside_daphne_there_is_nothing_to_pace_and_no_reactor_is_installed() -> None:
    script = (
        "import sys\n"
        "from xiaozhi_site.listening import ListeningPorts, _reactor_ports\n"
        "assert _reactor_ports() == []\n"
        "assert ListeningPorts().line() == (0, 0)\n"
        "ListeningPorts().pace(0)\n"
        "ListeningPorts().pace(None)\n"
        "assert 'twisted.internet.reactor' not in sys.modules\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.strip() == "ok", done.stderr
