"""Run the real ASGI server (daphne) in a subprocess on a loopback port, for end-to-end tests
and benchmarks. The child shares the test database, so tests must use committed data
(`django_db(transaction=True)`)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
_static_collected: set[str] = set()  # data dirs whose static files this process collected


def collect_static(env: dict[str, str]) -> None:
    """`collectstatic` once per data dir and test process, so pages served by the child
    have their CSS and scripts (whitenoise serves STATIC_ROOT, as in production)."""
    data_dir = env.get("XIAOZHI_DATA_DIR", str(BASE_DIR / "var"))
    if data_dir in _static_collected:
        return
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
                   cwd=BASE_DIR, env=env, check=True)
    _static_collected.add(data_dir)


def _die_with_parent() -> None:
    # Linux: SIGTERM the server if the test process dies (killed by a timeout, Ctrl-C), so a
    # crashed run never leaves servers behind.
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url(settings_dict: dict[str, Any]) -> str:
    """The URL of the database Django is using now (the test database under pytest)."""
    engine = settings_dict["ENGINE"]
    if engine.endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    if engine.endswith("postgresql"):
        user = settings_dict.get("USER") or ""
        password = settings_dict.get("PASSWORD") or ""
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = settings_dict.get("HOST") or "127.0.0.1"
        port = settings_dict.get("PORT") or "5432"
        return f"postgres://{auth}{host}:{port}/{settings_dict['NAME']}"
    raise ValueError(f"unsupported engine {engine}")


class AsgiServer:
    """`with AsgiServer(env={...}) as server:` then `server.http_url`, `server.ws_url`."""

    def __init__(self, env: dict[str, str] | None = None, *, log_path: Path | None = None) -> None:
        self.port = free_port()
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path or Path(self.env.get("XIAOZHI_DATA_DIR", BASE_DIR / "var")) / f"e2e-{self.port}.log"
        self.process: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> AsgiServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        collect_static(self.env)
        log = open(self.log_path, "wb")  # noqa: SIM115 - kept open for the child's lifetime
        self.process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
             "xiaozhi_site.asgi:application"],
            cwd=BASE_DIR, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509  the hook only sets PR_SET_PDEATHSIG
        )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"server exited early; log:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.http_url}/healthz", timeout=2) as response:
                    if response.status in (200, 503):
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"server did not start in {timeout}s; log:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> AsgiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
