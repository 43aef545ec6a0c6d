"""`make run`: the runner serves /healthz with 200 and Ctrl-C leaves no process behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from testing.server import free_port

BASE_DIR = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True, check=False).stdout
    children: dict[int, list[int]] = {}
    for line in out.split("\n"):
        if line.strip():
            child, parent = map(int, line.split())
            children.setdefault(parent, []).append(child)
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0) until reaped; it no longer runs anything.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _wait_healthy(url: str, runner: subprocess.Popen, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert runner.poll() is None, "runner exited early"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return {"http": response.status, **json.load(response)}
        except OSError:
            time.sleep(0.3)
    raise AssertionError("server did not answer /healthz in time")


def test_make_run_serves_healthz_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "XIAOZHI_DATA_DIR": str(tmp_path), "XIAOZHI_PORT": str(port),
           "XIAOZHI_BIND": "127.0.0.1", "DATABASE_URL": "", "REDIS_URL": "",
           "CELERY_BROKER_URL": "", "CELERY_RESULT_BACKEND": "",
           "DJANGO_SUPERUSER_USERNAME": "admin", "DJANGO_SUPERUSER_PASSWORD": "s3cret-Pass"}
    runner = subprocess.Popen([sys.executable, "-m", "xiaozhi_site.runner"], cwd=BASE_DIR, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        health = _wait_healthy(f"http://127.0.0.1:{port}/healthz", runner, timeout=60)
        assert health["http"] == 200 and health["down"] == []
        time.sleep(1.0)  # let the worker and beat finish starting so they are in the tree
        family = _descendants(runner.pid)
        assert len(family) >= 3  # daphne, worker (+ its pool), beat
        runner.send_signal(signal.SIGINT)
        output, _ = runner.communicate(timeout=30)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, output
    assert "/xiaozhi/ota/" in output and "ws://" in output and "/admin/" in output
    assert "Created admin user 'admin'" in output
    time.sleep(0.5)
    leftovers = [pid for pid in family if _alive(pid)]
    assert leftovers == [], f"processes left behind: {leftovers}"
