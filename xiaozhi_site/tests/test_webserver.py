"""Web workers on one port (xiaozhi_site/webserver.py) and how the runner starts them."""
from __future__ import annotations

import os
import socket

import pytest

from xiaozhi_site import runner, webserver
from xiaozhi_site.webserver import WorkerConfigError, listening_sockets, server_command, server_kind, worker_count


def test_one_worker_per_core_with_redis_one_without() -> None:
    assert worker_count({"REDIS_URL": "redis://x:6379/0"}) == (os.cpu_count() or 1)
    assert worker_count({}) == 1
    assert worker_count({"REDIS_URL": "  "}) == 1
    assert worker_count({"XIAOZHI_WORKERS": "3", "REDIS_URL": "redis://x"}) == 3
    assert worker_count({"XIAOZHI_WORKERS": "1"}) == 1


@pytest.mark.parametrize(("value", "message"), [
    ("0", "at least 1"), ("-2", "at least 1"), ("two", "whole number"), ("2.5", "whole number"),
])
def test_a_bad_worker_count_is_refused(value: str, message: str) -> None:
    with pytest.raises(WorkerConfigError, match=message):
        worker_count({"XIAOZHI_WORKERS": value, "REDIS_URL": "redis://x"})


def test_several_workers_need_redis() -> None:
    # Without Redis a command issued in one worker could never reach a device in another.
    with pytest.raises(WorkerConfigError, match="needs REDIS_URL"):
        worker_count({"XIAOZHI_WORKERS": "2"})


def test_the_server_kind_is_daphne_unless_told() -> None:
    assert server_kind({}) == "daphne"
    assert server_kind({"XIAOZHI_ASGI_SERVER": "uvicorn"}) == "uvicorn"
    with pytest.raises(WorkerConfigError, match="one of daphne, uvicorn"):
        server_kind({"XIAOZHI_ASGI_SERVER": "hypercorn"})


def test_the_workers_sockets_share_one_port_and_each_accepts() -> None:
    sockets = listening_sockets("127.0.0.1", 0, 3)
    try:
        ports = {sock.getsockname()[1] for sock in sockets}
        assert len(ports) == 1
        assert all(sock.get_inheritable() for sock in sockets)
        assert all(sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for sock in sockets)
        # The kernel hands each new connection to one of them: every one of them is listening.
        port = ports.pop()
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(24)]
        accepted = 0
        for sock in sockets:
            sock.setblocking(False)
            while True:
                try:
                    conn, _ = sock.accept()
                except BlockingIOError:
                    break
                conn.close()
                accepted += 1
        assert accepted == len(clients)
        for client in clients:
            client.close()
    finally:
        for sock in sockets:
            sock.close()


def test_a_port_taken_by_another_program_is_an_error_and_leaks_nothing() -> None:
    with socket.socket() as other:  # no SO_REUSEPORT: nobody may join it
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(OSError):
            listening_sockets("127.0.0.1", other.getsockname()[1], 2)


def test_each_worker_serves_the_socket_it_inherits() -> None:
    children = runner.web_children("127.0.0.1", 0, 2)
    (uvicorn,) = runner.web_children("127.0.0.1", 0, 1, "uvicorn").values()
    assert uvicorn.fds  # uvicorn always serves an inherited socket
    uvicorn.sockets[0].close()
    try:
        assert sorted(children) == ["web-1", "web-2"]
        for child in children.values():
            (fd,) = child.fds
            assert child.command[-3:] == ["--fd", str(fd), webserver.APPLICATION]
            assert child.env == {"XIAOZHI_WORKERS": "2"}  # each sizes its hearing pool by it
        assert server_command(7, "uvicorn")[3:5] == ["--fd", "7"]
        assert "--ws-per-message-deflate" in server_command(7, "uvicorn")
    finally:
        for child in children.values():
            for sock in child.sockets:
                sock.close()


def test_one_daphne_binds_the_port_itself_and_ipv6_needs_one_worker() -> None:
    (web,) = runner.web_children("::", 8000, 1).values()
    assert web.command[-5:] == ["-b", "::", "-p", "8000", webserver.APPLICATION] and web.fds == ()
    with pytest.raises(WorkerConfigError, match="IPv4"):
        runner.web_children("::", 8000, 2)


def test_the_runner_refuses_several_workers_without_redis(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XIAOZHI_WORKERS", "2")
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert runner.main(["--web-only"]) == 2
    assert "needs REDIS_URL" in capsys.readouterr().err
