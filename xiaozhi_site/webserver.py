"""The web processes: one ASGI server process per worker, all on the same listening port.

One Python process is bound by one interpreter lock, so one process hears ~100-150 streaming
devices however many cores the machine has (docs/performance.md, P2). `XIAOZHI_WORKERS`
server processes share the port through `SO_REUSEPORT`: the supervisor (runner.py, or
testing/server.py in tests) binds one listening socket per worker on the same address and
hands each worker its own (`--fd`), and the kernel spreads new connections over them. The
workers share nothing in memory: commands, presence, the "replaced" event and the
dashboard's live figures go through Redis (channel layer, cache, dashboard/live.py), which is
why more than one worker needs `REDIS_URL`.

The server is daphne (docs/performance.md "Choosing the ASGI server" says why): the edge
limits (xiaozhi_site/daphne_limits.py) and close codes with reasons (daphne_close.py) are
applied inside it. `uvicorn` is kept as a second mode for measurements only
(`XIAOZHI_ASGI_SERVER=uvicorn` in tests and benchmarks): it does not enforce those limits.
"""
from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping

SERVERS = ("daphne", "uvicorn")
BACKLOG = 2048  # a reboot storm connects thousands of devices within seconds
APPLICATION = "xiaozhi_site.asgi:application"
# daphne's options on every command line that starts it. The upgrade may take as long as the
# firmware waits for it (10 s, protocol-reference §2.1): daphne's default of 5 s dropped, in a
# reboot storm, devices whose upgrade took 5-10 s without an HTTP answer, though each would
# have waited for it (docs/performance.md, session 41).
UPGRADE_TIMEOUT_SECONDS = 10
DAPHNE_OPTIONS = ("--websocket_connect_timeout", str(UPGRADE_TIMEOUT_SECONDS))


class WorkerConfigError(ValueError):
    pass


def worker_count(environ: Mapping[str, str] | None = None) -> int:
    """`XIAOZHI_WORKERS`; default one per core when Redis links the workers, else 1."""
    env = os.environ if environ is None else environ
    raw = env.get("XIAOZHI_WORKERS", "").strip()
    redis = bool(env.get("REDIS_URL", "").strip())
    if not raw:
        return (os.cpu_count() or 1) if redis else 1
    try:
        count = int(raw)
    except ValueError:
        raise WorkerConfigError(f"XIAOZHI_WORKERS must be a whole number, not {raw!r}") from None
    if count < 1:
        raise WorkerConfigError("XIAOZHI_WORKERS must be at least 1")
    if count > 1 and not redis:
        # The in-memory channel layer and caches end at the process: a command issued in one
        # worker would never reach a device connected to another.
        raise WorkerConfigError("XIAOZHI_WORKERS > 1 needs REDIS_URL (workers share state through Redis)")
    return count


def server_kind(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    kind = env.get("XIAOZHI_ASGI_SERVER", "daphne").strip() or "daphne"
    if kind not in SERVERS:
        raise WorkerConfigError(f"XIAOZHI_ASGI_SERVER must be one of {', '.join(SERVERS)}, not {kind!r}")
    return kind


def listening_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening sockets on the same address (SO_REUSEPORT), inheritable by children.
    With port 0 the first socket picks a free port and the others join it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.listen(BACKLOG)
            sock.set_inheritable(True)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def server_command(fd: int, kind: str = "daphne") -> list[str]:
    """The command line of one worker serving the already listening socket `fd`."""
    if kind == "uvicorn":
        # The firmware's needs: no permessage-deflate; uvicorn checks no Origin. uvloop and
        # httptools are used when installed ("auto").
        return [sys.executable, "-m", "uvicorn", "--fd", str(fd), "--ws", "websockets",
                "--ws-per-message-deflate", "false", "--lifespan", "off", "--no-access-log",
                "--loop", "auto", "--http", "auto", APPLICATION]
    return daphne_command("--fd", str(fd))


def daphne_command(*where: str) -> list[str]:
    """daphne serving the project where `where` says (`--fd N`, or `-b HOST -p PORT`), with
    `DAPHNE_OPTIONS`: the one daphne command line of the runner and the test server."""
    return [sys.executable, "-m", "daphne", *DAPHNE_OPTIONS, *where, APPLICATION]
