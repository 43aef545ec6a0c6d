"""What a talking session's OpenAI-compatible providers cost to set up (issue 17).

Every session that talks builds its provider chains (conversations/pipeline/fallback.py
`Chains`, in a worker thread at its first `listen start`). With OpenAI-compatible ASR, LLM
and TTS, this builds the three chains N times on one event loop, as N sessions would, keeps
them (the sessions stay connected), then sends each session's first LLM request to a local
OpenAI-compatible server (testing/fake_openai.py) and reports:

- CPU ms per session to build its chains (this process's CPU time);
- RSS per session kept;
- the first request's time to first token, p50 / p99 (a warm shared connection, or a new one).

    .venv/bin/python bench/session_providers.py [--sessions 200]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import time

import django
from common import header, md_table, percentile

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "xiaozhi_site.settings")
django.setup()

from conversations.pipeline.fallback import ProviderChain, build_chain  # noqa: E402
from conversations.providers.llm.openai_compat import OpenAILLM  # noqa: E402
from testing.fake_openai import FakeOpenAI, Reply  # noqa: E402

STAGES = ("asr", "llm", "tts")


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def first_token_ms(llm: OpenAILLM) -> float:
    started, first = time.perf_counter(), None
    async for _ in llm.stream([{"role": "user", "content": "hi"}], tools=None, model="m", temperature=0.5,
                              max_tokens=50):
        first = first or (time.perf_counter() - started) * 1000
    assert first is not None, "the reply had no delta"
    return first


async def run(sessions: int, fake: FakeOpenAI) -> list[str]:
    options = {"base_url": fake.base_url, "api_key": "sk-bench", "timeout": 10}
    configs = {f"{stage}.openai": options for stage in STAGES}
    build_chain("llm", ["openai"], configs)  # imports the SDK once, outside the figures
    rss, cpu = rss_mib(), time.process_time()
    kept: list[list[ProviderChain]] = [[build_chain(stage, ["openai"], configs) for stage in STAGES]
                                       for _ in range(sessions)]
    cpu_ms = (time.process_time() - cpu) * 1000 / sessions
    rss_kib = (rss_mib() - rss) * 1024 / sessions
    fake.script(*[Reply(text="It is noon.") for _ in range(sessions)])
    waits = []
    for chains in kept:
        llm = chains[1].slots[0].provider
        assert isinstance(llm, OpenAILLM)
        waits.append(await first_token_ms(llm))
    return [str(sessions), f"{cpu_ms:.2f}", f"{rss_kib:.0f}",
            f"{percentile(waits, 0.5):.2f} / {percentile(waits, 0.99):.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=200)
    args = parser.parse_args()
    with FakeOpenAI() as fake:
        row = asyncio.run(run(args.sessions, fake))
    print(header("Session providers — OpenAI-compatible ASR, LLM and TTS chains per talking session"))
    print(md_table(["sessions", "CPU ms per session (build)", "RSS KiB per session",
                    "first request: time to first token p50 / p99 ms"], [row]))


if __name__ == "__main__":
    main()
