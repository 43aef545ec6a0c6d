"""`make run`: prepare the database, then run daphne, the Celery worker and Celery beat.

One foreground process supervises the three children. Ctrl-C (or SIGTERM) stops them all:
each child runs in its own process group, so the whole group (including Celery's pool
processes) is terminated and, if it lingers, killed. If any child dies, the others are
stopped too, so a half-running server is never left behind.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

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


def commands(host: str, port: int) -> dict[str, list[str]]:
    celery = [PYTHON, "-m", "celery", "-A", "xiaozhi_site"]
    return {
        "web": [PYTHON, "-m", "daphne", "-b", host, "-p", str(port), "xiaozhi_site.asgi:application"],
        "worker": [*celery, "worker", "-l", "info", "--concurrency", "2",
                   "--without-mingle", "--without-gossip"],
        "beat": [*celery, "beat", "-l", "info"],
    }


def start(cmds: dict[str, list[str]]) -> dict[str, subprocess.Popen]:
    return {name: subprocess.Popen(cmd, cwd=BASE_DIR, start_new_session=True) for name, cmd in cmds.items()}


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


def print_banner(port: int) -> None:
    lan = _lan_address()
    print(
        "\nXiaozhi server is starting:\n"
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


def main() -> int:
    host = os.environ.get("XIAOZHI_BIND", "0.0.0.0")
    port = int(os.environ.get("XIAOZHI_PORT", "8000"))
    prepare()
    children = start(commands(host, port))
    print_banner(port)
    return supervise(children)


if __name__ == "__main__":
    sys.exit(main())
