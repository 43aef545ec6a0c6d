"""P5 — downlink pacing: reply frames against the device's 60 ms playout clock: never more
than 3 frames ahead, never behind by more than 1 frame while audio is ready, and `tts stop`
only after the playout.

    .venv/bin/python bench/p5_pacing.py [--devices 10] [--turns 2]

Starts the real server (daphne) on a fresh SQLite database; the default persona gets asr
["fake_echo"] (instant), llm ["openai"] pointed at FakeOpenAI streaming a long reply (six
sentences, about 30 s of speech) at once, and tts ["espeak"]. `--devices` light devices
(bench/loadgen.py: firmware handshake, hello, MCP answers, real-time Opus uplink in auto
mode) ask `--turns` questions each, all at the same time. A light device timestamps every
downlink frame the moment its receive loop gets it and does nothing else, so the client adds
as little jitter as possible; the frames are decoded afterwards (Opus at the server hello's
rate, one 60 ms frame each, as the firmware's fixed buffer requires).

For every reply, from the frame arrival times (loopback, so arrival ≈ send time):
- ahead: frames received but not yet played when a frame arrives (the one playing included),
  against a playout clock that starts with the first frame, as the firmware's decode queue
  plays; ideal pacing gives exactly 3 (the server's MAX_LEAD_FRAMES);
- behind: how late a frame arrives after its playout slot (the device ran dry); a late frame
  restarts the device's clock, as the firmware's queue does;
- `tts stop` margin: `tts stop` arrival − the end of the last frame's playout.
Verdicts allow 15 ms of arrival jitter (0.25 frame, as the end-to-end test does); the
strict figures and the share of frames beyond 3 are printed too.
"""
from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field

from common import BenchServer, fmt, header, md_table, median, percentile, verdict
from loadgen import FRAME_S, LightDevice, Reply, Utterance, mac_for, talk

from devices.protocol.opus import AudioError, OpusDecoder
from testing.fake_openai import FakeOpenAI, Reply as LlmReply

MAX_AHEAD = 3
MAX_BEHIND_S = FRAME_S  # one frame
JITTER_S = 0.015
DOWNLINK_RATE = 24000
DEVICE_QUEUE = 40  # the firmware's decode queue, in packets
LONG_REPLY = (
    "😊 Once upon a time, a little robot lived on a quiet desk by the window. "
    "Every morning it watched the sun climb over the roofs and counted the birds on the wire. "
    "One day a small blue bird landed right next to it and asked why it never went outside. "
    "The robot thought about it for a long time, because nobody had ever asked it that before. "
    "Then it rolled to the edge of the desk, looked down, and decided that tomorrow it would try. "
    "And so the next morning, the little robot and the blue bird went out together to see the world."
)


@dataclass
class Pacing:
    frames: int
    aheads: list[float]  # per frame
    max_behind_ms: float
    late_frames: int  # arrived after their playout slot (the device ran dry)
    stop_margin_ms: float | None  # tts stop − end of playout
    bad_frames: int  # not decodable as one 60 ms Opus frame

    @property
    def max_ahead(self) -> float:
        return max(self.aheads, default=0.0)


@dataclass
class Result:
    replies: list[Pacing] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def pacing(reply: Reply) -> Pacing:
    """The device's view of one reply: playout clock from the first frame, re-anchored when
    the queue runs dry."""
    frames = reply.frames
    anchor = frames[0]
    aheads: list[float] = []
    max_behind, late = 0.0, 0
    for index, at in enumerate(frames):
        behind = at - (anchor + index * FRAME_S)
        if behind > 0:  # the queue ran dry: this frame plays on arrival
            max_behind = max(max_behind, behind)
            late += behind > 0.001
            anchor = at - index * FRAME_S
        aheads.append(index + 1 - (at - anchor) / FRAME_S)
    end = anchor + len(frames) * FRAME_S
    margin = None if reply.tts_stop is None else (reply.tts_stop - end) * 1000
    return Pacing(len(frames), aheads, max_behind * 1000, late, margin, bad_frames(reply.payloads))


def bad_frames(payloads: list[bytes]) -> int:
    decoder = OpusDecoder(DOWNLINK_RATE, 1)
    limit = DOWNLINK_RATE * 60 // 1000 * 2
    bad = 0
    for payload in payloads:
        try:
            bad += len(decoder.decode(payload)) > limit
        except AudioError:
            bad += 1
    return bad


async def converse(url: str, index: int, turns: int, result: Result) -> None:
    device = LightDevice(url, mac_for(0x500000 + index), keep_audio=True)
    utterance = Utterance.spoken("tell me a story", tail_ms=3000)
    try:
        await device.connect()
        await device.hello()
        await asyncio.sleep(1.0)  # the MCP handshake
        for _ in range(turns):
            outcome = await talk(device, utterance, timeout=30.0)
            if outcome is None or not outcome[1].frames:
                result.failures.append("no reply audio")
                continue
            result.replies.append(pacing(outcome[1]))
            await asyncio.sleep(0.5)
    except Exception as exc:  # noqa: BLE001 - a failed device is a result
        result.failures.append(f"{type(exc).__name__}: {exc}"[:200])
    finally:
        await device.close()


def report(result: Result, args: argparse.Namespace) -> None:
    print(header(f"P5 — downlink pacing ({args.devices} devices at once, {args.turns} long replies each)"))
    replies = result.replies
    ahead = [r.max_ahead for r in replies]
    every = [a for r in replies for a in r.aheads]
    behind = [r.max_behind_ms for r in replies]
    margins = [r.stop_margin_ms for r in replies if r.stop_margin_ms is not None]
    nan = float("nan")
    over = sum(a > MAX_AHEAD for a in every)
    early = [max(0.0, a - MAX_AHEAD) * FRAME_S * 1000 for a in every]
    print(md_table(["figure", "p50", "p99", "max", "target"], [
        ["frames per reply", fmt(median([r.frames for r in replies]), 0), "",
         fmt(max((r.frames for r in replies), default=nan), 0), ""],
        ["frames ahead of the playout clock, every frame", fmt(median(every), 2), fmt(percentile(every, 0.99), 2),
         fmt(max(every, default=nan), 2), "≤ 3"],
        ["  beyond the 3-frame lead, ms (arrival jitter)", fmt(median(early)), fmt(percentile(early, 0.99)),
         fmt(max(early, default=nan)), f"≤ {JITTER_S * 1000:.0f} allowed"],
        ["max lateness behind the playout clock per reply, ms", fmt(median(behind)), "",
         fmt(max(behind, default=nan)), "≤ 60 (1 frame)"],
        ["frames arriving after their playout slot", "", "", str(sum(r.late_frames for r in replies)), ""],
        ["`tts stop` − end of playout per reply, ms", fmt(median(margins)), "",
         f"min {fmt(min(margins, default=nan))}", "≥ 0"],
        ["frames a 40-packet device queue would drop", "", "", str(sum(a > DEVICE_QUEUE for a in every)), "0"],
        ["frames not decodable as one 60 ms Opus frame", "", "", str(sum(r.bad_frames for r in replies)), "0"],
    ]))  # fmt: skip
    audio = sum(r.frames for r in replies) * FRAME_S
    print(f"\n{len(replies)} replies, {audio:.0f} s of audio; failures: {len(result.failures)}")
    for failure in sorted(set(result.failures))[:5]:
        print(f"- {failure}")
    max_ahead = max(ahead, default=float("inf"))
    max_behind = max(behind, default=float("inf"))
    min_margin = min(margins, default=float("-inf"))
    complete = bool(replies) and not result.failures and len(margins) == len(replies)
    print()
    print(verdict("P5 ≤ 3 frames ahead", complete and max_ahead <= MAX_AHEAD + JITTER_S / FRAME_S,
                  f"max {max_ahead:.2f} frames = {(max_ahead - MAX_AHEAD) * FRAME_S * 1000:.1f} ms beyond the lead; "
                  f"{over} of {len(every)} frames beyond 3 at all; allowance {JITTER_S * 1000:.0f} ms"))
    print(verdict("P5 never behind by > 1 frame", complete and max_behind <= MAX_BEHIND_S * 1000,
                  f"max {max_behind:.1f} ms behind"))
    print(verdict("P5 `tts stop` only after playout", complete and min_margin >= 0,
                  f"min margin {min_margin:.1f} ms"))


async def run(bench: BenchServer, args: argparse.Namespace, result: Result) -> None:
    await asyncio.gather(*(converse(bench.ws_url, i, args.turns, result) for i in range(args.devices)))


def main() -> None:
    parser = argparse.ArgumentParser(description="P5: downlink pacing")
    parser.add_argument("--devices", type=int, default=10, help="devices listening to replies at once")
    parser.add_argument("--turns", type=int, default=2, help="long replies per device")
    args = parser.parse_args()
    persona = {"asr_providers": ["fake_echo"], "llm_providers": ["openai"], "tts_providers": ["espeak"],
               "language": "en", "greeting": "", "exit_phrases": [], "vad_min_silence_ms": 500}
    result = Result()
    with FakeOpenAI(default=LlmReply(text=LONG_REPLY)) as fake:
        env = {"LLM_BASE_URL": fake.base_url, "LLM_MODEL": "fake-model"}
        with BenchServer(persona=persona, env=env, prefix="p5-") as bench:
            asyncio.run(run(bench, args, result))
    report(result, args)


if __name__ == "__main__":
    main()
