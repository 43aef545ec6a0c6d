"""The turn audio writer in isolation: CPU per recorded turn of its child process and of the
process that hands the turns over (conversations/recording.py, `turn_audio_save_later`).

In process: Django on a fresh, migrated SQLite database in a temporary data directory
(XIAOZHI_DATA_DIR, DATABASE_URL), recording on, the writer in its default mode (a child
process spawned from this one's environment). Each pass creates `--turns` turn rows and
hands them over as `--rates` says, each with realistic audio (uplink: 35 Opus packets of
60 ms at 16 kHz, speech-like tones; downlink: 10 packets at 24 kHz):

- `33`: 33 turns a second (P1's load on one web worker), one by one;
- `33@0.2`: the same rate in the groups the history writer hands over after each commit,
  one group per 0.2 s `linger` (conversations/turns/history.py): what the server does;
- `0`: all at once (beyond MAX_PENDING, dropped: the table says how many).

It waits for every future and reports:

- child CPU: the writer process's utime + stime over the pass (/proc/<pid>/stat) per turn;
- parent CPU: this process's over the pass (submitting, pickling, the executor's threads);
- latency: hand-over to the future's result (p50 / p99), so batching is seen to add none.

On an idle machine the child is done with a turn long before the next one comes one by one;
on a loaded one (P1's web worker keeps 2 cores ~85% busy) it runs only on the CPU nobody else
wants (SCHED_IDLE) and turns wait for it. `--loads 0.85` starts one spinner process per core,
busy that share of every 20 ms at normal priority, for the passes of that load (not counted).

A warm-up of a few turns first starts the child (Django set-up, PyAV's import) outside the
figures.

    .venv/bin/python bench/recording_writer.py [--turns 300] [--rates 33,33@0.2,0] [--loads 0,0.85] [--repeat 2]
"""
from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from common import cpu_seconds, fmt, header, md_table, own_cpu_seconds, percentile

UPLINK_PACKETS, DOWNLINK_PACKETS = 35, 10
WARM_UP_TURNS = 5
TURN_FIELDS: dict[str, Any] = {  # what a P1 turn's row holds besides its texts
    "providers": {"asr": "fake_echo", "llm": "fake_echo", "tts": "fake_tone"},
    "provider_attempts": {stage: [{"kind": kind, "ok": True, "ms": 1.2}]
                          for stage, kind in (("asr", "fake_echo"), ("llm", "fake_echo"), ("tts", "fake_tone"))},
    "timings": {"speech_end": 0.0, "asr_done": 21.4, "llm_first_token": 24.9, "tts_first_audio": 30.2,
                "first_frame_sent": 31.0, "last_frame_sent": 640.7, "turn_silence_ms": 500.0},
}
SPIN_PERIOD_S = 0.02
SPINNER = (
    "import sys, time\n"
    f"busy = float(sys.argv[1]) * {SPIN_PERIOD_S}\n"
    "while True:\n"
    "    start = time.monotonic()\n"
    "    while time.monotonic() - start < busy:\n"
    "        pass\n"
    f"    time.sleep({SPIN_PERIOD_S} - busy)\n"
)


def speech_like(rate: int, packets: int) -> list[bytes]:
    """60 ms Opus packets of syllable-like tones (varying pitch and loudness) with some noise."""
    import numpy as np

    from devices.protocol.opus import OpusEncoder
    from testing.fake_providers import tone

    encoder = OpusEncoder(rate, 60, bitrate=24000)
    pcm = b"".join(tone(60, rate, frequency=140 + 35 * (i % 5) + 9 * (i % 3),
                        amplitude=0.08 + 0.2 * abs(math.sin(i / 2.3))) for i in range(packets))
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
    samples += np.random.default_rng(7).normal(0, 300, samples.size).astype(np.float32)
    pcm = np.clip(samples, -32768, 32767).astype("<i2").tobytes()
    size = encoder.frame_bytes
    return [encoder.encode(pcm[i:i + size]) for i in range(0, len(pcm), size)]


def spinners(load: float) -> list[subprocess.Popen[bytes]]:
    """One busy-looping process per core, busy `load` of the time (none for 0)."""
    if load <= 0:
        return []
    return [subprocess.Popen([sys.executable, "-c", SPINNER, str(min(load, 1.0))]) for _ in range(os.cpu_count() or 1)]


class Pattern:
    """How turns are handed over: `rate` a second (0: all at once), one by one or, with `every`,
    in groups of rate × every turns every `every` seconds."""

    def __init__(self, spec: str) -> None:
        rate, _, every = spec.partition("@")
        self.rate, self.every = float(rate), float(every or 0)
        self.group = max(1, round(self.rate * self.every)) if self.every else 1

    def offset(self, number: int) -> float:
        """Seconds after the start at which turn `number` is handed over."""
        if self.rate <= 0:
            return 0.0
        return (number // self.group) * self.every if self.every else number / self.rate

    @property
    def label(self) -> str:
        if self.rate <= 0:
            return "all at once"
        if self.every:
            return f"{self.rate:g}/s, {self.group} every {self.every:g} s"
        return f"{self.rate:g}/s, one by one"


class Pass:
    def __init__(self, pattern: Pattern, turns: int, load: float = 0.0) -> None:
        self.pattern, self.turns, self.load = pattern, turns, load
        self.child_cpu = self.parent_cpu = self.seconds = 0.0
        self.latencies: list[float] = []
        self.saved = self.dropped = 0


def run_pass(pattern: Pattern, turns: int, uplink: list[bytes], downlink: list[bytes], child: int,
             load: float = 0.0) -> Pass:
    from conversations.capture import AudioTrack, TurnAudio
    from conversations.models import Conversation, Turn
    from conversations.recording import SavedAudio, turn_audio_save_later

    conversation = Conversation.objects.create(session_id=f"bench-{time.monotonic_ns()}")
    ids = [t.pk for t in Turn.objects.bulk_create(
        Turn(conversation=conversation, index=i, user_text="turn on the light", reply_text="Done.", **TURN_FIELDS)
        for i in range(turns))]
    result = Pass(pattern, turns, load)
    done_at: dict[int, float] = {}
    lock = threading.Lock()
    futures: list[tuple[int, float, Future[SavedAudio]]] = []

    def finished(turn_id: int) -> Any:
        def record(_: Future[SavedAudio]) -> None:
            with lock:
                done_at[turn_id] = time.monotonic()
        return record

    child_before, parent_before = cpu_seconds(child), own_cpu_seconds()
    started = time.monotonic()
    for number, turn_id in enumerate(ids):
        delay = started + pattern.offset(number) - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        audio = TurnAudio(uplink=AudioTrack(16000, list(uplink)), downlink=AudioTrack(24000, list(downlink)))
        submitted = time.monotonic()
        future = turn_audio_save_later(turn_id=turn_id, audio=audio)
        if future is None:
            result.dropped += 1
            continue
        future.add_done_callback(finished(turn_id))
        futures.append((turn_id, submitted, future))
    for _, _, future in futures:
        saved = future.result(timeout=600)
        result.saved += bool(saved.user and saved.reply)
    result.seconds = time.monotonic() - started
    result.child_cpu = cpu_seconds(child) - child_before
    result.parent_cpu = own_cpu_seconds() - parent_before
    with lock:
        result.latencies = [(done_at[turn_id] - submitted) * 1000 for turn_id, submitted, _ in futures]
    return result


def row(p: Pass) -> list[str]:
    return [f"{p.load:.0%}", p.pattern.label, str(p.turns), str(p.saved), str(p.dropped), f"{p.seconds:.1f}",
            fmt(p.child_cpu / p.turns * 1000, 2), fmt(p.parent_cpu / p.turns * 1000, 2),
            f"{fmt(percentile(p.latencies, 0.5))} / {fmt(percentile(p.latencies, 0.99))}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=300, help="turns per pass")
    parser.add_argument("--rates", default="33,33@0.2,0",
                        help="comma-separated hand-over patterns: turns a second (0 = all at once), "
                             "@S = in groups every S seconds")
    parser.add_argument("--loads", default="0", help="comma-separated shares of every core kept busy (0.85 = P1's)")
    parser.add_argument("--repeat", type=int, default=2, help="passes per rate")
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="bench-recording-"))
    # Before Django starts: the writer child is spawned from this environment.
    os.environ.update({"DJANGO_SETTINGS_MODULE": "xiaozhi_site.settings", "XIAOZHI_DATA_DIR": str(data_dir),
                       "DATABASE_URL": f"sqlite:///{data_dir / 'db.sqlite3'}", "XIAOZHI_RECORDING": "on",
                       "XIAOZHI_AUDIO_WRITER": "process"})
    os.environ.pop("XIAOZHI_MEDIA_ROOT", None)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)

    uplink, downlink = speech_like(16000, UPLINK_PACKETS), speech_like(24000, DOWNLINK_PACKETS)
    run_pass(Pattern("0"), WARM_UP_TURNS, uplink, downlink, os.getpid())  # starts the child (not counted)
    children = multiprocessing.active_children()
    if len(children) != 1 or children[0].pid is None:
        sys.exit(f"expected one writer process, found {children}")
    child = children[0].pid

    passes = []
    try:
        for load in (float(value) for value in args.loads.split(",")):
            spinning = spinners(load)
            try:
                passes += [run_pass(Pattern(spec), args.turns, uplink, downlink, child, load)
                           for _ in range(args.repeat) for spec in args.rates.split(",")]
            finally:
                for spinner in spinning:
                    spinner.kill()
                    spinner.wait()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    print(header("Turn audio writer — CPU per recorded turn (writer child and handing-over process)"))
    print(md_table(["machine load", "hand-over rate", "turns", "saved", "dropped", "seconds", "child CPU ms/turn",
                    "parent CPU ms/turn", "latency ms p50 / p99"], [row(p) for p in passes]))
    print(f"\nAudio per turn: {UPLINK_PACKETS} uplink packets (16 kHz, 60 ms) and {DOWNLINK_PACKETS} downlink "
          "(24 kHz); two Ogg files and one row update per turn, SQLite in a temporary directory.")
    print("The child runs at SCHED_IDLE (xiaozhi_site/child.py): its CPU is what it used, not what it waited.")


if __name__ == "__main__":
    main()
