"""Shared helpers for the benchmarks in bench/ (P1-P6 of docs/product.md).

- `BenchServer`: the real server (daphne via testing/server.py) on a fresh SQLite database in
  a temporary data directory, migrated, with the default persona's providers and turn-taking
  set for the benchmark, open device auth, the fake providers plugin, and the pipeline's
  per-session stats written as JSON lines (bench/server_settings.py).
- Reading results back: turn timings from the database, pipeline stats, server RSS.
- Reporting: percentiles, markdown tables, machine description, PASS/FAIL lines.
- The load generator's own process: `generator_collector_off` (no collector pauses that
  would stall every simulated device at once).

Every benchmark prints a markdown table plus the date, the machine and the command line, and
exits 0 whether or not a target is met.
"""
from __future__ import annotations

import datetime as dt
import gc
import json
import math
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

from testing.server import AsgiServer  # noqa: E402

DEVICE_PATH = "/xiaozhi/v1/"
FAKE_PERSONA = {"asr_providers": ["fake_echo"], "llm_providers": ["fake_echo"], "tts_providers": ["fake_tone"]}

# -- statistics and reporting ---------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1), as bench/p6_gateway.py computes it; NaN if empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: Sequence[float]) -> float:
    return percentile(values, 0.5)


def fmt(value: float, digits: int = 1) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """A markdown table; `align` is one character per column, "l" or "r" (default: l then r)."""
    align = align or "l" + "r" * (len(headers) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(label: str, ok: bool, detail: str) -> str:
    return f"{label}: {'PASS' if ok else 'FAIL'} ({detail})"


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _first_line_with(path: str, prefix: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip() if ":" in line else line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return ""


def machine() -> str:
    """CPU model, cores, RAM, OS and Python of this machine, on one line."""
    cpu = _first_line_with("/proc/cpuinfo", "model name") or platform.processor() or "unknown CPU"
    mem_kb = _first_line_with("/proc/meminfo", "MemTotal").split()
    ram = f"{int(mem_kb[0]) / 1024 / 1024:.1f} GiB RAM" if mem_kb else "unknown RAM"
    distro = _first_line_with("/etc/os-release", "PRETTY_NAME=") or platform.system()
    return (
        f"{cpu}, {os.cpu_count()} cores, {ram}, {distro} (Linux {platform.release()}), "
        f"Python {platform.python_version()}"
    )


def _relative(arg: str) -> str:
    path = Path(arg)
    return path.relative_to(BASE_DIR).as_posix() if path.is_absolute() and path.is_relative_to(BASE_DIR) else arg


def header(title: str) -> str:
    """Title, UTC date, machine and the command line, for the top of a report."""
    command = " ".join(_relative(arg) for arg in [sys.executable, *sys.argv])
    return f"\n{title}\nDate: {utc_now()}\nMachine: {machine()}\nCommand: `{command}`\n"


def core_share(cpu_seconds: float, seconds: float) -> str:
    """CPU seconds as a share of one core over `seconds` (2 busy cores = 200%)."""
    return f"{cpu_seconds / seconds * 100:.0f}%" if seconds else "-"


# -- the server under test ------------------------------------------------------------------


class ServerMode:
    """Which ASGI server, how many workers (xiaozhi_site/webserver.py), and the Redis that links
    several workers (its database is flushed before each server start: stale channel-layer
    groups and presence keys of an earlier run must not count)."""

    def __init__(self, server: str = "daphne", workers: int = 1, redis_url: str = "") -> None:
        self.server, self.workers, self.redis_url = server, workers, redis_url
        if workers > 1 and not redis_url:
            raise SystemExit("--workers > 1 needs Redis: pass --redis redis://127.0.0.1:6379/<db> (or set REDIS_URL)")

    @property
    def label(self) -> str:
        return f"{self.server} x{self.workers}"

    def env(self) -> dict[str, str]:
        env = {"XIAOZHI_ASGI_SERVER": self.server, "XIAOZHI_WORKERS": str(self.workers)}
        if self.redis_url:
            env["REDIS_URL"] = self.redis_url
        return env

    def flush_redis(self) -> None:
        if self.redis_url:
            import redis

            redis.Redis.from_url(self.redis_url).flushdb()


def server_modes(servers: str, workers: int, redis_url: str) -> list[ServerMode]:
    """`--servers daphne,uvicorn --workers N`: one mode per server."""
    return [ServerMode(kind.strip(), workers, redis_url) for kind in servers.split(",") if kind.strip()]


class BenchServer:
    """A migrated temporary data directory and the running server on it.

    `persona` updates the default persona (created by a migration) before the server starts;
    `provider_options` sets the options of the seeded provider configurations, keyed
    "<stage>.<kind>" (e.g. {"asr.faster_whisper": {"fast_pass": True}}); `env` adds server
    settings. Use as a context manager; `restart()` starts a fresh server process on the same
    database (a new stats file each time).
    """

    def __init__(self, *, persona: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                 prefix: str = "bench-", server: str = "daphne", workers: int = 1, redis_url: str = "",
                 provider_options: dict[str, dict[str, Any]] | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix=prefix)
        self.data_dir = Path(self._tmp.name)
        self.db_path = self.data_dir / "db.sqlite3"
        self.persona = persona or {}
        self.provider_options = provider_options or {}
        self.extra_env = env or {}
        self.mode = ServerMode(server, workers, redis_url)
        self.server: AsgiServer | None = None
        self.runs = 0

    @property
    def stats_path(self) -> Path:
        return self.data_dir / f"stats-{self.runs}.jsonl"

    def env(self) -> dict[str, str]:
        return {
            "XIAOZHI_DATA_DIR": str(self.data_dir),
            "DATABASE_URL": f"sqlite:///{self.db_path}",
            "DJANGO_SETTINGS_MODULE": os.environ.get("BENCH_SETTINGS", "bench.server_settings"),
            "BENCH_STATS_FILE": str(self.stats_path),
            "XIAOZHI_WS_AUTH": "open",
            "XIAOZHI_UNBOUND_POLICY": "allow",
            "XIAOZHI_PROVIDER_PLUGINS": "testing.fake_providers",
            **self.mode.env(),
            **self.extra_env,
        }

    def prepare(self) -> None:
        env = {**os.environ, **self.env()}
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=BASE_DIR, env=env, check=True)
        code = (
            "import json, os; from conversations.models import Persona; "
            "p = Persona.objects.get(is_default=True); "
            "[setattr(p, k, v) for k, v in json.loads(os.environ['BENCH_PERSONA']).items()]; p.save(); "
            "from conversations.models import ProviderConfig; "
            "[ProviderConfig.objects.filter(stage=key.split('.')[0], kind=key.split('.')[1]).update(options=o) "
            " for key, o in json.loads(os.environ['BENCH_PROVIDER_OPTIONS']).items()]"
        )
        env["BENCH_PERSONA"] = json.dumps(self.persona)
        env["BENCH_PROVIDER_OPTIONS"] = json.dumps(self.provider_options)
        subprocess.run([*manage, "shell", "-c", code], cwd=BASE_DIR, env=env, check=True)

    def start(self) -> AsgiServer:
        self.runs += 1
        self.mode.flush_redis()
        self.server = AsgiServer(env=self.env(), log_path=self.data_dir / f"server-{self.runs}.log").start(60)
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def restart(self) -> AsgiServer:
        self.stop()
        return self.start()

    @property
    def ws_url(self) -> str:
        assert self.server is not None
        return f"{self.server.ws_url}{DEVICE_PATH}"

    @property
    def http_url(self) -> str:
        assert self.server is not None
        return self.server.http_url

    @property
    def pid(self) -> int:
        assert self.server is not None and self.server.process is not None
        return self.server.process.pid

    def cpu_seconds(self) -> float:
        """CPU of every server process so far (the workers and their supervisor)."""
        return tree_cpu_seconds(self.pid)

    def loop_cpu_seconds(self) -> float:
        """CPU of the servers' main threads, where their event loops run."""
        return sum(thread_cpu_seconds(pid, pid) for pid in server_pids(self.pid))

    def __enter__(self) -> BenchServer:
        self.prepare()
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        self._tmp.cleanup()

    # -- results --------------------------------------------------------------------------

    def turn_timings(self, since_id: int = 0) -> list[dict[str, float]]:
        """`Turn.timings` of every stored turn with id > since_id (ms since the VAD decision)."""
        with sqlite3.connect(self.db_path) as db:
            rows = db.execute("SELECT timings FROM conversations_turn WHERE id > ? ORDER BY id", (since_id,))
            return [json.loads(row[0]) for row in rows.fetchall()]

    def last_turn_id(self) -> int:
        with sqlite3.connect(self.db_path) as db:
            return int(db.execute("SELECT COALESCE(MAX(id), 0) FROM conversations_turn").fetchone()[0])

    def stats(self, message: str | None = None, run: int | None = None) -> list[dict[str, Any]]:
        """Pipeline stats records (JSON lines) of a server run, optionally one message only."""
        path = self.data_dir / f"stats-{run or self.runs}.jsonl"
        if not path.exists():
            return []
        records = whole_json_lines(path)
        return [r for r in records if message is None or r.get("message") == message]

    def log(self) -> str:
        return self.server.log() if self.server is not None else ""


def whole_json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON records of a file other processes append to: only whole lines, because the
    server's workers may be writing one while this reads (P2 polls until every session has
    reported)."""
    *complete, _partial = path.read_text().split("\n")
    return [json.loads(line) for line in complete if line.strip()]


# -- process memory ---------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def rss_bytes(pid: int, include_children: bool = True) -> int:
    """VmRSS of `pid` (and, recursively, of its child processes) in bytes."""
    total = 0
    pids = [pid]
    while pids:
        current = pids.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
        if include_children:
            pids.extend(_children(current))
    return total


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        pending.extend(_children(current))
    return found


def server_pids(pid: int) -> list[int]:
    """The ASGI server processes in the tree of `pid` (the workers, or `pid` itself)."""
    servers = []
    for candidate in process_tree(pid):
        try:
            cmdline = Path(f"/proc/{candidate}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"daphne" in cmdline or b"uvicorn" in cmdline:
            servers.append(candidate)
    return servers or [pid]


def tree_cpu_seconds(pid: int) -> float:
    total = 0.0
    for member in process_tree(pid):
        try:
            total += cpu_seconds(member)
        except OSError:
            pass
    return total


def thread_cpu_seconds(pid: int, tid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    return cpu_seconds(os.getpid())


def generator_collector_off() -> None:
    """The load generator is one process standing for hundreds or thousands of independent
    devices; its own garbage collector stopped all of them at once (in P2 --overload its
    lateness reached 145-155 ms, and the server then heard a burst of every device's frames
    that no fleet sends: docs/performance.md, session 45). A run lasts minutes, so the
    generator runs without the collector; reference counting still frees what is not in a
    cycle. The server's own collector is untouched (xiaozhi_site/collector.py)."""
    gc.collect()
    gc.freeze()
    gc.disable()


def steal_note(span: str) -> str:
    """The reports' footnote for their `steal` column; `span`: "phase" or "step"."""
    return (f"steal: CPU the hypervisor gave to other guests over the {span}, as a share of one core (the "
            "machine's, not the server's); a run with much steal measures the neighbours, not the code.")


STEAL_FIELD = 7  # /proc/stat's `cpu` line: user nice system idle iowait irq softirq steal ...


def steal_seconds(stat_path: str = "/proc/stat") -> float:
    """Machine-wide CPU steal so far (all cores), in seconds; 0.0 if `stat_path` or the field is
    missing (not Linux, an old kernel).

    On a VM the hypervisor gives cores to other guests when it likes; that steal slows every
    thread of the server and of the load generator alike, so a run with much steal measures
    the neighbours, not the code. Reported next to the CPU figures so such a run can be told."""
    try:
        with open(stat_path) as stat:
            for line in stat:
                fields = line.split()
                if fields and fields[0] == "cpu":
                    return int(fields[1 + STEAL_FIELD]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        pass
    return 0.0
