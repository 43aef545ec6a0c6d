"""P6 — LLM Gateway overhead: `text_input` → `llm_response` with an instant LLM stub.

    .venv/bin/python bench/p6_gateway.py [--clients 100] [--messages 20] [--sequential 1000]

Starts the real server (daphne, testing/server.py) on a fresh database in a temporary data
directory, with LLM_BASE_URL pointing at FakeOpenAI answering at once, creates a gateway API
key (`manage.py gateway_key_create`, limits above what the run needs), then opens N WebSocket
clients over real sockets with that key, all connected at the same time, and measures:

- 1 in flight: one question at a time, round-robin over the N connected clients: the
  gateway's latency including the stub's HTTP round trip (the P6 figure);
- N in flight: every client asks `--messages` questions back to back, all at once;
- ping → pong, 1 in flight: the socket, daphne, Channels and the session without the LLM;
- the stub alone (in its own process, like the server's client): the same completion
  straight from the openai client, with the gateway's request and with a bare one.

Prints a markdown table, the P6 verdict (p50 ≤ 3 ms; 100 clients at once, no errors) and the
machine. Clients, the stub and the server share this machine's cores.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

import openai  # noqa: E402
from websockets.asyncio.client import ClientConnection, connect  # noqa: E402

from conversations.gateway.session_config import SERVER_TOOLS, SYSTEM_PROMPT  # noqa: E402
from testing.fake_openai import FakeOpenAI, Reply  # noqa: E402
from testing.server import AsgiServer  # noqa: E402
from tools.builtin import BuiltinToolSource, SessionToolState  # noqa: E402
from tools.registry import Toolset  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, utc_now  # noqa: E402  (bench/common.py)

P50_TARGET_MS = 3.0
QUESTION = "你好"


@dataclass
class Result:
    name: str
    clients: int
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def row(self) -> str:
        rate = len(self.latencies_ms) / self.seconds if self.seconds else 0.0
        cells = [
            self.name, str(self.clients), str(len(self.latencies_ms)),
            f"{statistics.median(self.latencies_ms):.2f}" if self.latencies_ms else "-",
            f"{self.percentile(0.90):.2f}", f"{self.percentile(0.99):.2f}",
            f"{max(self.latencies_ms, default=float('nan')):.2f}", f"{rate:.0f}", str(self.errors),
        ]  # fmt: skip
        return "| " + " | ".join(cells) + " |"


class GatewayFailed(Exception):
    pass


async def hello(url: str) -> ClientConnection:
    ws = await connect(url, open_timeout=30, max_size=2**20)
    first = json.loads(await ws.recv())
    if first.get("status") != "connected":
        raise GatewayFailed(f"unexpected first message {first.get('type')}")
    return ws


TEXT_INPUT = json.dumps({"type": "text_input", "text": QUESTION}, ensure_ascii=False)
PING = json.dumps({"type": "ping"})


async def ask(ws: ClientConnection, request: str = TEXT_INPUT, answer: str = "llm_response") -> float:
    """Milliseconds from sending text_input to receiving llm_response (or ping to pong)."""
    started = time.perf_counter()
    await ws.send(request)
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if message["type"] == answer:
            return (time.perf_counter() - started) * 1000
        if message["type"] == "error":
            raise GatewayFailed(message["code"])


async def measure(result: Result, ws: ClientConnection, request: str = TEXT_INPUT,
                  answer: str = "llm_response") -> None:
    try:
        result.latencies_ms.append(await ask(ws, request, answer))
    except Exception:  # an error message, a closed socket, a timeout: all count
        result.errors += 1


async def sequential(clients: list[ClientConnection], count: int, *, ping: bool = False) -> Result:
    name = "ping → pong, 1 in flight (transport floor)" if ping else "text_input → llm_response, 1 in flight"
    result = Result(name, len(clients))
    request, answer = (PING, "pong") if ping else (TEXT_INPUT, "llm_response")
    started = time.perf_counter()
    for n in range(count):
        await measure(result, clients[n % len(clients)], request, answer)
    result.seconds = time.perf_counter() - started
    return result


async def concurrent(clients: list[ClientConnection], per_client: int) -> Result:
    result = Result(f"text_input → llm_response, {len(clients)} in flight", len(clients))

    async def one(ws: ClientConnection) -> None:
        for _ in range(per_client):
            await measure(result, ws)

    started = time.perf_counter()
    await asyncio.gather(*(one(ws) for ws in clients))
    result.seconds = time.perf_counter() - started
    return result


async def gateway_tools() -> list[dict]:
    toolset = Toolset([BuiltinToolSource(SessionToolState(), SERVER_TOOLS)])
    await toolset.refresh()
    return toolset.llm_tools()


async def stub_alone(base_url: str, count: int, *, same_request: bool) -> Result:
    """The LLM stub's own round trip through the openai client, for reference: a bare
    question, or the gateway's own request (system prompt and the 10 tool schemas)."""
    name = "LLM stub alone, gateway's request" if same_request else "LLM stub alone, bare request"
    result = Result(name, 1)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": QUESTION}]
    # Plain dicts, as the server's provider (openai_compat.py) passes them.
    params: dict[str, Any] = {"model": "m", "messages": messages, "stream": True}
    if same_request:
        messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
        params.update(tools=await gateway_tools(), temperature=0.7, max_tokens=2048)
    started = time.perf_counter()
    for _ in range(count):
        t0 = time.perf_counter()
        stream = await client.chat.completions.create(**params)
        async for _chunk in stream:
            pass
        result.latencies_ms.append((time.perf_counter() - t0) * 1000)
    result.seconds = time.perf_counter() - started
    await client.close()
    return result


async def run(url: str, base_url: str, args: argparse.Namespace) -> tuple[list[Result], int]:
    clients = await asyncio.gather(*(hello(url) for _ in range(args.clients)), return_exceptions=True)
    connected = [c for c in clients if isinstance(c, ClientConnection)]
    refused = len(clients) - len(connected)
    for ws in connected:  # warm-up: first turn per connection is not measured
        await measure(Result("warm-up", 0), ws)
    results = [await sequential(connected, args.sequential), await concurrent(connected, args.messages)]
    results.append(await sequential(connected, args.sequential, ping=True))
    await asyncio.gather(*(ws.close() for ws in connected))
    for same_request in (True, False):
        results.append(stub_alone_elsewhere(base_url, min(args.sequential, 500), same_request))
    return results, refused


def stub_alone_elsewhere(base_url: str, count: int, same_request: bool) -> Result:
    """Run `stub_alone` in its own process, as the server runs its LLM client: sharing this
    process (and its GIL) with the stub's thread would make the baseline look slower."""
    command = [sys.executable, __file__, "--stub-only", base_url, str(count), str(int(same_request))]
    latencies = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    result = Result(latencies["name"], 1, latencies["ms"])
    result.seconds = latencies["seconds"]
    return result


def migrate(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=BASE_DIR, env={**os.environ, **env}, check=True,
    )  # fmt: skip


def create_key(env: dict[str, str], args: argparse.Namespace) -> str:
    """A gateway API key whose limits the run never reaches (the clients all share it)."""
    command = [sys.executable, "manage.py", "gateway_key_create", "p6", "--max-connections", str(args.clients),
               "--requests-per-minute", "10000000"]  # fmt: skip
    run = subprocess.run(command, cwd=BASE_DIR, env={**os.environ, **env}, check=True, capture_output=True, text=True)
    return run.stdout.strip()


def server_split(db_path: str, args: argparse.Namespace) -> tuple[float, float]:
    """p50 of the turn inside the server and of its LLM call, for the 1-in-flight phase,
    from the timings the gateway stores with every turn (after the warm-up turns)."""
    with sqlite3.connect(db_path) as db:
        rows = db.execute("SELECT timings FROM conversations_turn ORDER BY id").fetchall()
    timings = [json.loads(row[0]) for row in rows][args.clients : args.clients + args.sequential]
    if not timings:
        return float("nan"), float("nan")
    return statistics.median(t["total_ms"] for t in timings), statistics.median(t["llm_ms"] for t in timings)


def report(results: list[Result], refused: int, args: argparse.Namespace, split: tuple[float, float]) -> None:
    print(f"\nP6 — LLM Gateway overhead, {utc_now()}")
    print(f"Machine: {machine()}\n")
    print("| scenario | clients | messages | p50 ms | p90 ms | p99 ms | max ms | msg/s | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for result in results:
        print(result.row())
    seq, stub = results[0], results[3]
    p50 = statistics.median(seq.latencies_ms) if seq.latencies_ms else float("inf")
    stub_p50 = statistics.median(stub.latencies_ms) if stub.latencies_ms else float("nan")
    errors = sum(r.errors for r in results) + refused
    print(f"\nClients connected at once: {args.clients - refused}/{args.clients}; refused: {refused}")
    total, llm = split
    print(f"Inside the server, 1 in flight: turn p50 {total:.2f} ms, of which the LLM call {llm:.2f} ms;")
    print(f"  gateway work {total - llm:.2f} ms + socket/daphne/Channels {p50 - total:.2f} ms = {p50 - llm:.2f} ms")
    print(f"Stub alone with the gateway's request, own process: p50 {stub_p50:.2f} ms")
    verdict = "PASS" if p50 <= P50_TARGET_MS else "FAIL"
    print(f"P6 p50 ≤ {P50_TARGET_MS:g} ms (text_input → llm_response, 1 in flight): {verdict} ({p50:.2f} ms)")
    print(f"P6 {args.clients} clients at once, no errors: {'PASS' if errors == 0 else 'FAIL'} ({errors} errors)")


def stub_only(base_url: str, count: str, same_request: str) -> None:
    result = asyncio.run(stub_alone(base_url, int(count), same_request=bool(int(same_request))))
    print(json.dumps({"name": result.name, "ms": result.latencies_ms, "seconds": result.seconds}))


def main() -> None:
    if sys.argv[1:2] == ["--stub-only"]:
        stub_only(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser(description="P6: LLM Gateway overhead")
    parser.add_argument("--clients", type=int, default=100, help="WebSocket clients connected at once")
    parser.add_argument("--messages", type=int, default=20, help="questions per client, concurrent phase")
    parser.add_argument("--sequential", type=int, default=1000, help="questions, one in flight")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra server setting")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="p6-") as data_dir, FakeOpenAI(default=Reply(text="好的。")) as fake:
        env = {
            "XIAOZHI_DATA_DIR": data_dir,
            "DATABASE_URL": f"sqlite:///{data_dir}/db.sqlite3",
            "LLM_BASE_URL": fake.base_url,
            "CLOUD_MAX_CONNECTIONS": str(max(100, args.clients)),
            **dict(item.split("=", 1) for item in args.env),
        }
        migrate(env)
        key = create_key(env, args)
        with AsgiServer(env=env, log_path=Path(data_dir) / "server.log") as server:
            results, refused = asyncio.run(run(f"{server.ws_url}/llm/v1/?token={key}", fake.base_url, args))
        split = server_split(f"{data_dir}/db.sqlite3", args)  # the last disconnect flushed history
    report(results, refused, args, split)


if __name__ == "__main__":
    main()
