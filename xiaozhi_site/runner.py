"""`make run`: prepare the database, then run the web workers (daphne), the Celery worker and
Celery beat.

`XIAOZHI_WORKERS` daphne processes share the port (xiaozhi_site/webserver.py: one
SO_REUSEPORT socket each, bound here and inherited; a single worker binds the port itself);
the default is one per core when REDIS_URL is set, else one. `python -m xiaozhi_site.runner
--web-only` starts the web workers alone, without preparing the database (tests and
benchmarks start several workers this way).

One foreground process supervises the children. Ctrl-C (or SIGTERM) stops them all:
each child runs in its own process group, so the whole group (including Celery's pool
processes) is terminated and, if it lingers, killed. If any child dies, the others are
stopped too, so a half-running server is never left behind.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from xiaozhi_site import webserver

BASE_DIR = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
STOP_GRACE_SECONDS = 10.0


def _manage(*args: str) -> None:
    subprocess.run([PYTHON, "manage.py", *args], cwd=BASE_DIR, check=True)


def prepare() -> None:
    _manage("migrate", "--noinput", "-v", "0")
    _manage("collectstatic", "--noinput", "-v", "0")
    _manage("devices_startup")
    if os.environ.get("DJANGO_SUPERUSER_USERNAME") and os.environ.get("DJANGO_SUPERUSER_PASSWORD"):
        _manage("ensure_superuser")
    else:
        print("No admin user configured. Create one with:\n"
              "  .venv/bin/python manage.py createsuperuser\n"
              "or set DJANGO_SUPERUSER_USERNAME, DJANGO_SUPERUSER_PASSWORD (and _EMAIL) before make run.")


def _lan_address() -> str:
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            address = info[4][0]
            if isinstance(address, str) and not address.startswith("127."):
                return address
    except OSError:
        pass
    return "127.0.0.1"


@dataclass
class Child:
    command: list[str]
    fds: tuple[int, ...] = ()  # listening sockets the child inherits
    sockets: list[socket.socket] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # added to the runner's environment


def web_children(host: str, port: int, workers: int, kind: str = "daphne") -> dict[str, Child]:
    if workers == 1 and kind == "daphne":  # binds the port itself, as always (IPv6 too)
        return {"web": Child(webserver.daphne_command("-b", host, "-p", str(port)))}
    if ":" in host:
        # daphne adopts an inherited socket as IPv4 only (Twisted's fd endpoint).
        raise webserver.WorkerConfigError("several web workers need an IPv4 XIAOZHI_BIND (e.g. 0.0.0.0)")
    sockets = webserver.listening_sockets(host, port, workers)
    names = ["web"] if workers == 1 else [f"web-{n}" for n in range(1, workers + 1)]
    # Each worker knows how many share the machine (its hearing pool takes its share of the
    # cores: conversations/pipeline/cpu_pool.py hearing_threads).
    env = {"XIAOZHI_WORKERS": str(workers)}
    return {
        name: Child(webserver.server_command(sock.fileno(), kind), (sock.fileno(),), [sock], env)
        for name, sock in zip(names, sockets, strict=True)
    }


def commands() -> dict[str, Child]:
    """The Celery worker and beat (the web workers come from web_children)."""
    celery = [PYTHON, "-m", "celery", "-A", "xiaozhi_site"]
    return {
        "worker": Child([*celery, "worker", "-l", "info", "--concurrency", "2",
                         "--without-mingle", "--without-gossip"]),
        "beat": Child([*celery, "beat", "-l", "info"]),
    }


def start(children: dict[str, Child]) -> dict[str, subprocess.Popen]:
    started = {
        name: subprocess.Popen(child.command, cwd=BASE_DIR, start_new_session=True, pass_fds=child.fds,
                               env={**os.environ, **child.env} if child.env else None)
        for name, child in children.items()
    }
    for child in children.values():
        for sock in child.sockets:
            sock.close()  # the worker holds its own copy; a dead worker's port share goes with it
    return started


def stop(children: dict[str, subprocess.Popen]) -> None:
    # SIGTERM the leaders only: Celery then stops its own pool processes cleanly; whatever
    # is still alive in a group after the grace period is killed.
    for child in children.values():
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for child in children.values():
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        _signal_group(child, signal.SIGKILL)  # the group may hold pool processes even after exit
        child.wait()


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass


def print_banner(port: int, workers: int = 1) -> None:
    lan = _lan_address()
    print(
        f"\nXiaozhi server is starting ({workers} web worker{'s' if workers > 1 else ''}):\n"
        f"  Admin:         http://{lan}:{port}/admin/\n"
        f"  OTA URL:       http://{lan}:{port}/xiaozhi/ota/   (put this into the device)\n"
        f"  WebSocket URL: ws://{lan}:{port}/xiaozhi/v1/\n"
        f"  LLM Gateway:   ws://{lan}:{port}/llm/v1/\n"
        f"  Health:        http://{lan}:{port}/healthz\n"
        "Press Ctrl-C to stop.\n",
        flush=True,
    )


def supervise(children: dict[str, subprocess.Popen]) -> int:
    stopping = False

    def _on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    while not stopping:
        for name, child in children.items():
            if child.poll() is not None:
                print(f"{name} exited with code {child.returncode}; stopping the others.", flush=True)
                stop(children)
                return 1
        time.sleep(0.2)
    print("Stopping…", flush=True)
    stop(children)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the Xiaozhi server (make run).")
    parser.add_argument("--web-only", action="store_true",
                        help="only the web workers, no database preparation, Celery or banner")
    parser.add_argument("--bind", default=os.environ.get("XIAOZHI_BIND", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("XIAOZHI_PORT", "8000")))
    args = parser.parse_args(argv)
    try:
        workers = webserver.worker_count()
        kind = webserver.server_kind()
    except webserver.WorkerConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        web = web_children(args.bind, args.port, workers, kind)
    except (webserver.WorkerConfigError, OSError) as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.web_only:
        return supervise(start(web))
    prepare()
    children = start({**web, **commands()})
    print_banner(args.port, workers)
    return supervise(children)


if __name__ == "__main__":
    sys.exit(main())
