"""Memory the LLM Gateway keeps for disconnected sessions (issue 11 item 6).

    .venv/bin/python bench/gateway_session_memory.py [--clients 40] [--turns 3] [--kib 900] [--waves 3]

A wave is N clients, all with one API key, that switch the context on, send `--turns`
messages of `--kib` KiB each at the same time and disconnect; their sessions stay resumable
for CLOUD_SESSION_TIMEOUT (an hour). Each measurement runs once with the session caps lifted
(as before CLOUD_MAX_DETACHED_SESSIONS and CLOUD_SESSION_HISTORY_BYTES existed) and once
with the defaults; FakeOpenAI answers at once from its own process.

1. Held by Python objects (tracemalloc), the gateway in this process behind Channels'
   communicator: what the sessions really keep, after each wave.
2. The real server's resident memory (VmRSS, daphne subprocess), as the issue measured it.
   The first wave's messages are in flight together (tens of MB) and the C allocator keeps
   that high-water mark after Python frees it, so only the growth from wave to wave says
   what sessions hold; RSS also wanders by some tens of MB between waves.

Memory only, not timing: a busy machine gives the same answer.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

UNCAPPED = {"CLOUD_MAX_DETACHED_SESSIONS": "1000000", "CLOUD_SESSION_HISTORY_BYTES": str(2**40)}
CONFIGS: tuple[tuple[str, dict[str, str]], ...] = (("caps lifted (as before)", UNCAPPED), ("defaults", {}))


def _serve_fake(urls: Any, stop: Any) -> None:
    from testing.fake_openai import FakeOpenAI, Reply

    with FakeOpenAI(default=Reply(text="好的。")) as fake:
        urls.put(fake.base_url)
        stop.wait()


@contextmanager
def fake_llm() -> Iterator[str]:
    """FakeOpenAI in its own process, so the requests it records are not measured here."""
    context = multiprocessing.get_context("spawn")
    urls, stop = context.Queue(), context.Event()
    process = context.Process(target=_serve_fake, args=(urls, stop), daemon=True)
    process.start()
    try:
        yield urls.get(timeout=30)
    finally:
        stop.set()
        process.join(10)


def _conversation(send: Callable, receive: Callable, turns: int, size: int) -> Any:
    async def run() -> None:
        await receive()  # status: connected
        await send(json.dumps({"type": "configure", "enable_context": True}))
        for turn in range(turns):
            await send(json.dumps({"type": "text_input", "text": f"{turn}:" + "x" * size}))
            while json.loads(await receive())["type"] not in ("llm_response", "error"):
                pass

    return run()


# -- 1. held by Python objects, in this process ----------------------------------------------------


def held_by_objects(args: argparse.Namespace, llm_url: str) -> list[tuple[str, list[float]]]:
    data_dir = tempfile.mkdtemp(prefix="gw-mem-")
    os.environ.update({"XIAOZHI_DATA_DIR": data_dir, "DATABASE_URL": f"sqlite:///{data_dir}/db.sqlite3",
                       "DJANGO_SETTINGS_MODULE": "xiaozhi_site.settings"})  # fmt: skip
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    settings.LLM_BASE_URL = llm_url
    rows = []
    for name, extra in CONFIGS:
        settings.CLOUD_MAX_DETACHED_SESSIONS = int(extra.get("CLOUD_MAX_DETACHED_SESSIONS", 1000))
        settings.CLOUD_SESSION_HISTORY_BYTES = int(extra.get("CLOUD_SESSION_HISTORY_BYTES", 32 * 1024))
        rows.append((name, asyncio.run(_waves_in_process(args))))
    return rows


async def _waves_in_process(args: argparse.Namespace) -> list[float]:
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator

    from conversations.gateway.keys import gateway_key_create
    from conversations.routing import websocket_urlpatterns

    from asgiref.sync import sync_to_async

    _, key = await sync_to_async(gateway_key_create)(
        name="memory", max_connections=args.clients + 1, requests_per_minute=10**7
    )
    headers = [(b"authorization", f"Bearer {key}".encode())]

    async def client(turns: int, size: int) -> WebsocketCommunicator:
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/llm/v1/", headers=headers)
        await communicator.connect()
        await _conversation(
            lambda text: communicator.send_to(text_data=text), lambda: communicator.receive_from(120), turns, size
        )
        return communicator

    keeper = await client(1, 10)  # holds the process state (store, history writer) open throughout
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    readings = []
    for _ in range(args.waves):
        clients = await asyncio.gather(*(client(args.turns, args.kib * 1024 - 16) for _ in range(args.clients)))
        for communicator in clients:
            await communicator.disconnect(timeout=60)
        del clients
        await asyncio.sleep(1)  # the history writer flushes
        gc.collect()
        readings.append((tracemalloc.get_traced_memory()[0] - base) / 1e6)
    tracemalloc.stop()
    await keeper.disconnect(timeout=60)
    return readings


# -- 2. the real server's resident memory ---------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def manage(env: dict[str, str], *args: str) -> str:
    run = subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env={**os.environ, **env},
                         check=True, capture_output=True, text=True)  # fmt: skip
    return run.stdout.strip()


def server_rss(args: argparse.Namespace, llm_url: str) -> list[tuple[str, list[float]]]:
    from websockets.asyncio.client import connect

    from testing.server import AsgiServer

    async def client(url: str, turns: int, size: int) -> None:
        async with connect(url, max_size=None, open_timeout=30) as ws:
            await _conversation(ws.send, ws.recv, turns, size)

    async def wave(url: str) -> None:
        await asyncio.gather(*(client(url, args.turns, args.kib * 1024 - 16) for _ in range(args.clients)))

    rows = []
    for name, extra in CONFIGS:
        with tempfile.TemporaryDirectory(prefix="gw-mem-") as data_dir:
            env = {"XIAOZHI_DATA_DIR": data_dir, "DATABASE_URL": f"sqlite:///{data_dir}/db.sqlite3",
                   "LLM_BASE_URL": llm_url, **extra}  # fmt: skip
            manage(env, "migrate", "--noinput", "-v", "0")
            key = manage(env, "gateway_key_create", "memory", "--max-connections", str(args.clients),
                         "--requests-per-minute", "10000000")  # fmt: skip
            with AsgiServer(env=env, log_path=Path(data_dir) / "server.log") as server:
                assert server.process is not None
                url = f"{server.ws_url}/llm/v1/?token={key}"
                asyncio.run(client(url, 1, 10))  # warm-up: imports, LLM client, history writer
                time.sleep(1)
                readings = [rss_mb(server.process.pid)]
                for _ in range(args.waves):
                    asyncio.run(wave(url))
                    time.sleep(2)  # the disconnects and the history writer settle
                    readings.append(rss_mb(server.process.pid))
        rows.append((name, readings))
    return rows


def table(title: str, columns: list[str], rows: list[tuple[str, list[float]]]) -> None:
    print(f"\n{title}\n")
    print("| sessions | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for name, values in rows:
        print(f"| {name} | " + " | ".join(f"{value:.1f}" for value in values) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=40)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--kib", type=int, default=900, help="size of each message (the frame limit is 1024)")
    parser.add_argument("--waves", type=int, default=3)
    args = parser.parse_args()
    waves = [f"after wave {n + 1}" for n in range(args.waves)]
    print(f"Waves of {args.clients} clients x {args.turns} messages of {args.kib} KiB, context on, then disconnect")
    with fake_llm() as llm_url:
        table("Held by Python objects after each wave (MB, tracemalloc, in process)", waves,
              held_by_objects(args, llm_url))  # fmt: skip
        table("Server VmRSS (MB, real daphne)", ["after warm-up", *waves], server_rss(args, llm_url))


if __name__ == "__main__":
    main()
