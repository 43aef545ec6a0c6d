"""Run the real ASGI server (daphne) in a subprocess on a loopback port, for end-to-end tests
and benchmarks. The child shares the test database, so tests must use committed data
(`django_db(transaction=True)`).

The server's environment chooses the mode, as in production: `XIAOZHI_WORKERS=N` (N > 1, with
REDIS_URL) starts N workers on the port under the runner's supervisor
(`python -m xiaozhi_site.runner --web-only`); `XIAOZHI_ASGI_SERVER=uvicorn` swaps daphne for
uvicorn (measurements only, xiaozhi_site/webserver.py). Setting them in the test process's
own environment runs a whole e2e suite against that mode, e.g.
`XIAOZHI_WORKERS=2 REDIS_URL=redis://127.0.0.1:6379/7 pytest -m e2e`.
"""
from __future__ import annotations

import fcntl
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
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    # Parallel test processes share the data dir: one copies while the others wait, so no
    # server starts on a half-copied file.
    with open(Path(data_dir) / ".collectstatic.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
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

    @property
    def workers(self) -> int:
        """1 unless XIAOZHI_WORKERS says otherwise: unlike `make run`, tests do not default to
        one worker per core when REDIS_URL is set (limits per process, logs of one process)."""
        from xiaozhi_site.webserver import worker_count

        return worker_count({**self.env, "XIAOZHI_WORKERS": self.env.get("XIAOZHI_WORKERS") or "1"})

    def command(self) -> list[str]:
        from xiaozhi_site.webserver import daphne_command, server_kind

        if self.workers == 1 and server_kind(self.env) == "daphne":
            return daphne_command("-b", "127.0.0.1", "-p", str(self.port))
        return [sys.executable, "-m", "xiaozhi_site.runner", "--web-only", "--bind", "127.0.0.1",
                "--port", str(self.port)]

    def start(self, timeout: float = 30.0) -> AsgiServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        collect_static(self.env)
        log = open(self.log_path, "wb")  # noqa: SIM115 - kept open for the child's lifetime
        self.process = subprocess.Popen(
            self.command(), cwd=BASE_DIR, env={**self.env, "XIAOZHI_WORKERS": str(self.workers)}, stdout=log,
            stderr=subprocess.STDOUT,
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
                self._wait_healthz()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"server did not start in {timeout}s; log:\n{self.log()}")

    def _wait_healthz(self) -> None:
        # With several workers on the port the kernel spreads connections over them: ask
        # several times so every worker has most likely started (each answers only once ready).
        for _ in range(4 * self.workers - 3):
            with urllib.request.urlopen(f"{self.http_url}/healthz", timeout=2) as response:
                if response.status not in (200, 503):
                    raise OSError(f"healthz answered {response.status}")

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
