"""Turn audio: Opus packets muxed into Ogg without re-encoding, written through the storage
API after the turn, following the recording setting, never failing the turn."""
from __future__ import annotations

import asyncio
import io
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import av
import pytest
from django.core.files.storage import default_storage
from django.db import connection
from django.test.utils import CaptureQueriesContext

from conversations.capture import AttemptLog, AudioTrack, TurnAudio, attempts_from_json
from conversations.models import Conversation, Persona, Turn
from conversations.oggopus import OggOpusError, ogg_opus, packet_samples_48k
from conversations.providers.asr.faster_whisper import FasterWhisperASR
from conversations import recording
from conversations.recording import recording_mode, turn_audio_save, turn_audio_save_later
from conversations.tests.review_data import REPLY, UTTERANCE, speech_packets, turn_audio
from devices.protocol.audio import decode_audio_file

DTX = b"\x08"  # a 1-byte packet: SILK narrowband, 20 ms, no payload (what DTX sends in silence)


def words(text: str) -> str:
    return " ".join(re.findall(r"[a-z]+", text.lower()))


@pytest.fixture
def media(settings: Any, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


@pytest.fixture
def turn(db: None) -> Turn:
    conversation = Conversation.objects.create(session_id="rec", persona=Persona.objects.create(name="Rec"))
    return Turn.objects.create(conversation=conversation, index=0, user_text=UTTERANCE, reply_text=REPLY)


# --- the Ogg writer (pure) ---------------------------------------------------------------------


def test_packets_are_muxed_as_they_are_without_re_encoding() -> None:
    packets = speech_packets(UTTERANCE, 16000)
    ogg = ogg_opus(packets)
    assert ogg.data.startswith(b"OggS") and b"OpusHead" in ogg.data[:64]
    with av.open(io.BytesIO(ogg.data)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name == "opus"
        demuxed = [bytes(packet) for packet in container.demux(stream) if packet.size]
    assert demuxed == packets  # byte for byte: nothing was decoded or encoded again
    assert ogg.packets == len(packets) and ogg.skipped == 0
    assert ogg.duration_ms == 60 * len(packets)


def test_packet_durations_come_from_each_packets_own_header() -> None:
    assert packet_samples_48k(speech_packets("hi", 24000)[0]) == 2880  # 60 ms
    assert packet_samples_48k(DTX) == 960  # 20 ms
    assert ogg_opus([*speech_packets("hi", 16000)[:2], DTX]).duration_ms == 140


@pytest.mark.parametrize("bad", [b"", b"\xff", b"\x03", b"\x0b\xff\xff"])
def test_packets_libopus_rejects_are_left_out_and_counted(bad: bytes) -> None:
    assert packet_samples_48k(bad) is None
    packets = speech_packets("hello", 16000)
    ogg = ogg_opus([bad, *packets, bad])
    assert ogg.skipped == 2 and ogg.packets == len(packets)


def test_no_valid_packet_is_no_file() -> None:
    with pytest.raises(OggOpusError):
        ogg_opus([b"", b"\xff"])
    with pytest.raises(OggOpusError):
        ogg_opus([])


@pytest.mark.slow
def test_stored_audio_decodes_to_the_words_that_were_spoken(turn: Turn, media: Path) -> None:
    """espeak → device-style Opus (16 kHz up, 24 kHz down) → Ogg in storage → PyAV → tiny.en."""
    saved = turn_audio_save(turn_id=turn.pk, audio=turn_audio())
    assert saved.user.endswith(".ogg") and saved.reply.endswith(".ogg")
    asr = FasterWhisperASR(max_concurrency=1)
    for name, spoken in ((saved.user, UTTERANCE), (saved.reply, REPLY)):
        with default_storage.open(name, "rb") as handle:
            pcm, rate = decode_audio_file(handle.read())
        assert rate == 48000  # Ogg Opus always decodes at 48 kHz
        assert words(asyncio.run(asr.transcribe(pcm, rate, "en"))) == words(spoken)


# --- writing through storage --------------------------------------------------------------------


def test_both_directions_are_stored_with_their_durations(turn: Turn, media: Path) -> None:
    audio = turn_audio()
    saved = turn_audio_save(turn_id=turn.pk, audio=audio)
    turn.refresh_from_db()
    assert turn.user_audio.name == saved.user and turn.reply_audio.name == saved.reply
    assert re.fullmatch(rf"turns/\d{{4}}/\d\d/\d\d/{turn.conversation_id}-0-user(_\w+)?\.ogg", saved.user)
    assert turn.user_audio_ms == 60 * len(audio.uplink.packets)
    assert turn.reply_audio_ms == 60 * len(audio.downlink.packets)
    assert (media / saved.reply).read_bytes().startswith(b"OggS")
    assert turn.user_text == UTTERANCE and turn.reply_text == REPLY  # only the audio fields changed


def test_reply_only_keeps_what_the_device_played(turn: Turn, media: Path, settings: Any) -> None:
    settings.XIAOZHI_RECORDING = "reply-only"
    saved = turn_audio_save(turn_id=turn.pk, audio=turn_audio())
    turn.refresh_from_db()
    assert saved.user == "" and not turn.user_audio and turn.user_audio_ms is None
    assert turn.reply_audio and (media / turn.reply_audio.name).exists()


def test_recording_off_keeps_nothing(turn: Turn, media: Path, settings: Any) -> None:
    settings.XIAOZHI_RECORDING = "off"
    assert turn_audio_save_later(turn_id=turn.pk, audio=turn_audio()) is None
    assert turn_audio_save(turn_id=turn.pk, audio=turn_audio()).user == ""
    turn.refresh_from_db()
    assert not turn.user_audio and not turn.reply_audio and not media.exists()


def test_a_persona_can_switch_recording_off(turn: Turn, media: Path) -> None:
    Persona.objects.filter(pk=turn.conversation.persona_id).update(record_audio=False)
    saved = turn_audio_save(turn_id=turn.pk, audio=turn_audio())
    assert saved.user == saved.reply == ""
    turn.refresh_from_db()
    assert not turn.user_audio and not turn.reply_audio and not media.exists()
    assert recording_mode(persona_records=False) == "off" and recording_mode() == "on"


def test_a_turn_without_speech_still_gets_its_reply_audio(turn: Turn, media: Path) -> None:
    audio = TurnAudio.for_rates(downlink_rate=24000)
    audio.downlink.packets.extend(speech_packets("Hello, I'm listening.", 24000))
    saved = turn_audio_save(turn_id=turn.pk, audio=audio)
    assert saved.user == "" and saved.reply


def test_a_track_of_garbage_is_skipped_and_the_other_kept(turn: Turn, media: Path, caplog: Any) -> None:
    audio = TurnAudio(uplink=AudioTrack(16000, [b"\xff", b""]), downlink=AudioTrack(24000, speech_packets("ok", 24000)))
    saved = turn_audio_save(turn_id=turn.pk, audio=audio)
    assert saved.user == "" and saved.reply
    assert "turn audio track not written" in caplog.text


def test_a_failing_storage_write_still_saves_the_turn(turn: Turn, settings: Any, tmp_path: Path,
                                                      caplog: Any) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the storage root should be")
    settings.STORAGES = {**settings.STORAGES, "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(blocker)}}}
    saved = turn_audio_save(turn_id=turn.pk, audio=turn_audio())
    assert saved.user == saved.reply == ""
    assert "turn audio not saved" in caplog.text
    stored = Turn.objects.get(pk=turn.pk)
    assert stored.user_text == UTTERANCE and not stored.user_audio and not stored.reply_audio


def test_audio_for_a_turn_that_does_not_exist_is_logged_not_raised(db: None, media: Path, caplog: Any) -> None:
    assert turn_audio_save(turn_id=987654, audio=turn_audio()).reply == ""
    assert "no such turn" in caplog.text
    assert not media.exists()


@pytest.mark.django_db(transaction=True)
def test_the_background_writer_stores_audio_from_its_own_thread(media: Path, caplog: Any) -> None:
    conversation = Conversation.objects.create(session_id="bg")
    turn = Turn.objects.create(conversation=conversation, index=0, user_text=UTTERANCE)
    future = turn_audio_save_later(turn_id=turn.pk, audio=turn_audio())
    assert future is not None
    saved = future.result(timeout=30)
    assert saved.user and saved.reply
    assert Turn.objects.get(pk=turn.pk).reply_audio.name == saved.reply
    # A job that fails (the turn is gone) resolves with nothing, logged from the writer thread.
    failed = turn_audio_save_later(turn_id=turn.pk + 1000, audio=turn_audio())
    assert failed is not None and failed.result(timeout=30).reply == ""
    [record] = [r for r in caplog.records if r.getMessage() == "turn audio not saved: no such turn"]
    assert record.threadName.startswith("turn-audio") and record.threadName != threading.current_thread().name


def test_nothing_to_write_is_no_job(turn: Turn) -> None:
    assert turn_audio_save_later(turn_id=turn.pk, audio=None) is None
    assert turn_audio_save_later(turn_id=turn.pk, audio=TurnAudio()) is None


def test_deleting_a_turn_deletes_its_files_after_the_commit(turn: Turn, media: Path,
                                                            django_capture_on_commit_callbacks: Any) -> None:
    saved = turn_audio_save(turn_id=turn.pk, audio=turn_audio())
    with django_capture_on_commit_callbacks(execute=True):
        Conversation.objects.filter(pk=turn.conversation_id).delete()
    assert not (media / saved.user).exists() and not (media / saved.reply).exists()


# --- provider attempts (pure) --------------------------------------------------------------------


def test_attempts_record_the_failed_providers_before_the_one_that_served() -> None:
    log = AttemptLog()
    log.failed("tts", "edge", OSError("Cannot connect to host speech.example:443 key=abc"), 12.04)
    log.served("tts", "espeak", 15)
    log.served("asr", "faster_whisper", 300)
    assert log.as_json() == {
        "asr": [{"kind": "faster_whisper", "ok": True, "ms": 300}],
        "tts": [{"kind": "edge", "ok": False, "ms": 12.0, "error": "OSError"},
                {"kind": "espeak", "ok": True, "ms": 15}],
    }  # the exception's class, never its message (URLs and keys stay out of history)


def test_attempts_per_stage_are_capped() -> None:
    log = AttemptLog()
    for _ in range(500):
        log.failed("tts", "edge", "TimeoutError", 1)
    assert len(log.as_json()["tts"]) == 50


def test_stored_attempts_are_read_back_defensively() -> None:
    read = attempts_from_json({"tts": [{"kind": "edge", "ok": "yes", "ms": True}, 7, {"ok": True}],
                               "llm": "x", 3: []})
    assert list(read) == ["tts"] and read["tts"][0].ok is False and read["tts"][0].ms == 0.0
    assert attempts_from_json(["not", "a", "dict"]) == {}


@pytest.mark.django_db(transaction=True)
def test_the_writer_process_stores_audio_and_a_dead_one_is_replaced(
        settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default writer: a child process with Django of its own, started from this process's
    environment (here pointed at the test database, which the transaction=True test commits to)."""
    database = connection.settings_dict
    if database["ENGINE"].endswith("sqlite3"):
        url = f"sqlite:///{database['NAME']}"
    else:
        url = f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}"
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("XIAOZHI_MEDIA_ROOT", str(tmp_path / "media"))
    settings.XIAOZHI_AUDIO_WRITER = "process"
    writer = recording._Writer()
    conversation = Conversation.objects.create(session_id="child")
    turns = [Turn.objects.create(conversation=conversation, index=i, user_text=UTTERANCE) for i in range(3)]

    def write(turn: Turn) -> str:
        future = writer.submit(turn.pk, turn_audio())
        assert future is not None
        return future.result(timeout=60).reply

    try:
        first = write(turns[0])
        [child] = multiprocessing.active_children()
        assert first and (tmp_path / "media" / first).is_file()  # written by the child, into its media root
        assert Turn.objects.get(pk=turns[0].pk).reply_audio.name == first
        assert child.pid != os.getpid()
        # background work: the kernel runs it only on CPU the web process does not want
        assert os.sched_getscheduler(child.pid) == os.SCHED_IDLE

        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=10)
        # The pool may or may not have noticed the death when the next turn comes: that turn's
        # audio is either lost (logged, no exception) or written by a new child; the one after
        # is written in any case.
        write(turns[1])
        assert write(turns[2])
        [replacement] = multiprocessing.active_children()
        assert replacement.pid != child.pid
        assert Turn.objects.get(pk=turns[2].pk).reply_audio.name
        assert writer.pending == 0
    finally:
        if writer._executor is not None:
            writer._executor.shutdown(wait=True)


def test_the_writer_process_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    """A web worker killed outright must not leave its writer behind (with a DB connection)."""
    script = (
        "import os, sys, multiprocessing, django\n"
        "django.setup()\n"
        "from django.conf import settings\n"
        "settings.XIAOZHI_AUDIO_WRITER = 'process'\n"
        "from conversations import recording\n"
        "from conversations.capture import TurnAudio\n"
        "audio = TurnAudio(); audio.downlink.add(b'\\xf8\\xff\\xfe')\n"
        "recording._Writer().submit(1, audio).result(timeout=60)\n"
        "print(multiprocessing.active_children()[0].pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
           "XIAOZHI_MEDIA_ROOT": str(tmp_path / "media"), "DJANGO_SETTINGS_MODULE": "xiaozhi_site.settings"}
    done = subprocess.run([sys.executable, "-c", script], check=False, env=env, capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    child = int(done.stdout.split()[0])
    deadline = time.monotonic() + 15
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists(), "the writer process outlived its parent"


# --- the writer's batches ------------------------------------------------------------------------


def ogg_files(media: Path) -> list[str]:
    return sorted(p.name for p in media.rglob("*.ogg")) if media.exists() else []


def blocked_first_job(monkeypatch: pytest.MonkeyPatch, release: threading.Event,
                      write: Any = None) -> list[list[int]]:
    """Patch the writer's job: record each job's turn ids; the first waits for `release`."""
    jobs: list[list[int]] = []
    write = write or recording._write_batch

    def write_batch(items: list[tuple[int, TurnAudio]]) -> list[recording.SavedAudio]:
        jobs.append([turn_id for turn_id, _ in items])
        if len(jobs) == 1:
            assert release.wait(30)
        return write(items)

    monkeypatch.setattr(recording, "_write_batch", write_batch)
    return jobs


@contextmanager
def thread_writer(release: threading.Event) -> Iterator[recording._Writer]:
    """A writer of the test's own; on the way out the blocked job is let go and its thread ends."""
    writer = recording._Writer()
    try:
        yield writer
    finally:
        release.set()
        if writer._executor is not None:
            writer._executor.shutdown(wait=True)


def one_packet_reply() -> TurnAudio:
    audio = TurnAudio()
    audio.downlink.add(b"\xf8\xff\xfe")
    return audio


@pytest.mark.django_db(transaction=True)
def test_turns_handed_over_while_a_job_runs_go_to_the_writer_as_one_batch(
        media: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conversation = Conversation.objects.create(session_id="batch")
    turns = [Turn.objects.create(conversation=conversation, index=i) for i in range(6)]
    audio = turn_audio()
    release = threading.Event()
    jobs = blocked_first_job(monkeypatch, release)
    with thread_writer(release) as writer:
        first = writer.submit(turns[0].pk, audio)  # a quiet writer: this one starts at once
        deadline = time.monotonic() + 30
        while not jobs:
            assert time.monotonic() < deadline, "the lone turn did not start"
            time.sleep(0.01)
        waiting = [writer.submit(t.pk, audio) for t in turns[1:]]
        assert writer.pending == 6 and jobs == [[turns[0].pk]]
        release.set()
        futures = [first, *waiting]
        assert all(future is not None for future in futures)
        results = [future.result(timeout=60) for future in futures if future is not None]
    assert jobs == [[turns[0].pk], [t.pk for t in turns[1:]]]  # the five waiting turns: one job
    for turn, saved in zip(turns, results, strict=True):
        stored = Turn.objects.get(pk=turn.pk)
        assert saved.user == stored.user_audio.name and saved.reply == stored.reply_audio.name
        assert Path(saved.reply).name.startswith(f"{conversation.pk}-{turn.index}-reply")
        assert saved.reply_ms == 60 * len(audio.downlink.packets)
    assert len(ogg_files(media)) == 12 and writer.pending == 0


def test_batches_are_capped_and_waiting_turns_count_against_the_bound(
        monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    monkeypatch.setattr(recording, "MAX_PENDING", 40)
    release = threading.Event()

    def write(items: list[tuple[int, TurnAudio]]) -> list[recording.SavedAudio]:
        return [recording.SavedAudio(reply=f"reply-{turn_id}") for turn_id, _ in items]

    jobs = blocked_first_job(monkeypatch, release, write)
    audio = one_packet_reply()
    with thread_writer(release) as writer:
        futures = [writer.submit(turn_id, audio) for turn_id in range(41)]
        # 1 in the writer + 39 waiting = the bound: the 41st is dropped
        assert futures[40] is None and writer.dropped == 1 and writer.pending == 40
        assert "turn audio dropped: the writer is behind" in caplog.text
        release.set()
        replies = [future.result(timeout=30).reply for future in futures[:40] if future is not None]
    assert replies == [f"reply-{turn_id}" for turn_id in range(40)]  # each its own, in order
    assert [len(job) for job in jobs] == [1, recording.MAX_BATCH, 40 - 1 - recording.MAX_BATCH]
    assert writer.pending == 0


def test_a_failed_job_costs_only_its_own_turns(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    release = threading.Event()

    def write(items: list[tuple[int, TurnAudio]]) -> list[recording.SavedAudio]:
        if items[0][0] == 1:
            raise RuntimeError("the writer process died")  # what a BrokenProcessPool does to a job
        return [recording.SavedAudio(reply=f"reply-{turn_id}") for turn_id, _ in items]

    jobs = blocked_first_job(monkeypatch, release, write)
    audio = one_packet_reply()
    with thread_writer(release) as writer:
        futures = [writer.submit(turn_id, audio) for turn_id in (1, 2, 3)]
        release.set()
        replies = [future.result(timeout=30).reply for future in futures if future is not None]
    assert jobs == [[1], [2, 3]] and replies == ["", "reply-2", "reply-3"]
    [record] = [r for r in caplog.records if r.getMessage() == "turn audio not saved: the writer process failed"]
    assert record.turn_ids == [1]  # type: ignore[attr-defined]


@pytest.mark.django_db(transaction=True)
def test_a_batch_costs_one_query_for_its_turns_and_one_transaction_for_its_rows(media: Path) -> None:
    persona = Persona.objects.create(name="Batch")
    conversations = [Conversation.objects.create(session_id=f"b{i}", persona=persona if i else None)
                     for i in range(2)]
    turns = [Turn.objects.create(conversation=conversations[i % 2], index=i) for i in range(5)]
    audio = turn_audio()
    with CaptureQueriesContext(connection) as queries:
        results = recording._write_batch([(turn.pk, audio) for turn in turns])
    sql = [query["sql"] for query in queries.captured_queries]
    selects = [s for s in sql if s.upper().startswith("SELECT")]
    assert len(selects) == 1 and '"conversations_turn"' in selects[0] and '"conversations_persona"' in selects[0]
    updates = [i for i, s in enumerate(sql) if s.upper().startswith("UPDATE")]
    commits = [i for i, s in enumerate(sql) if s.upper() == "COMMIT"]
    assert len(updates) == 5 and len(commits) == 1 and max(updates) < commits[0]  # one commit, after them all
    for turn, saved in zip(turns, results, strict=True):
        stored = Turn.objects.get(pk=turn.pk)
        assert saved.reply and stored.reply_audio.name == saved.reply and stored.user_audio.name == saved.user
        assert Path(saved.user).name.startswith(f"{turn.conversation_id}-{turn.index}-user")


@pytest.mark.django_db(transaction=True)
def test_a_turn_of_a_batch_deleted_meanwhile_keeps_no_files_and_the_others_are_saved(
        media: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    conversation = Conversation.objects.create(session_id="gone")
    kept, gone = (Turn.objects.create(conversation=conversation, index=i) for i in range(2))
    store_track = recording._store_track

    def store_and_delete(turn: Turn, which: str, track: AudioTrack) -> tuple[str, int] | None:
        stored = store_track(turn, which, track)
        if turn.pk == gone.pk and which == "reply":  # both its files written, then the row goes
            Turn.objects.filter(pk=gone.pk).delete()
        return stored

    monkeypatch.setattr(recording, "_store_track", store_and_delete)
    audio = turn_audio()
    missing = gone.pk + 1000
    results = recording._write_batch([(kept.pk, audio), (gone.pk, audio), (missing, audio)])
    assert results[1] == results[2] == recording.SavedAudio()
    stored = Turn.objects.get(pk=kept.pk)
    assert results[0].reply == stored.reply_audio.name and results[0].user == stored.user_audio.name
    assert ogg_files(media) == sorted(Path(name).name for name in (results[0].user, results[0].reply))
    messages = {r.getMessage(): getattr(r, "turn_id", None) for r in caplog.records}
    assert messages["turn audio not saved: the turn was deleted while its audio was written"] == gone.pk
    assert messages["turn audio not saved: no such turn"] == missing


class FailingStorage:
    """The default storage, except that saving a name containing `marker` fails."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def save(self, name: str, content: Any) -> str:
        if self.marker in name:
            raise OSError("No space left on device")
        return default_storage.save(name, content)

    def delete(self, name: str) -> None:
        default_storage.delete(name)


@pytest.mark.django_db(transaction=True)
def test_a_storage_failure_for_one_turn_does_not_lose_the_others(
        media: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    conversation = Conversation.objects.create(session_id="disk")
    turns = [Turn.objects.create(conversation=conversation, index=i, user_text=f"turn {i}") for i in range(3)]
    # turn 1's user file is written, its reply file fails: it must keep neither
    monkeypatch.setattr(recording, "default_storage", FailingStorage(f"/{conversation.pk}-1-reply"))
    audio = turn_audio()
    results = recording._write_batch([(turn.pk, audio) for turn in turns])
    assert results[1] == recording.SavedAudio()
    failed = Turn.objects.get(pk=turns[1].pk)
    assert not failed.user_audio and not failed.reply_audio and failed.user_text == "turn 1"
    for position in (0, 2):
        stored = Turn.objects.get(pk=turns[position].pk)
        assert results[position].reply == stored.reply_audio.name and results[position].user == stored.user_audio.name
    written = [name for p in (0, 2) for name in (results[p].user, results[p].reply)]
    assert ogg_files(media) == sorted(Path(name).name for name in written)
    [record] = [r for r in caplog.records if r.getMessage() == "turn audio not saved"]
    assert record.turn_id == turns[1].pk and record.exc_info is not None  # type: ignore[attr-defined]


@pytest.mark.django_db(transaction=True)
def test_a_refused_update_keeps_the_batchs_files_off_every_row_and_deletes_them(
        media: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    conversation = Conversation.objects.create(session_id="refused")
    turns = [Turn.objects.create(conversation=conversation, index=i) for i in range(2)]

    def refuse(*_: Any) -> dict[str, Any]:
        raise RuntimeError("database gone")

    monkeypatch.setattr(recording, "_fields", refuse)
    results = recording._write_batch([(turn.pk, turn_audio()) for turn in turns])
    assert results == [recording.SavedAudio()] * 2
    assert not any(t.user_audio or t.reply_audio for t in Turn.objects.filter(pk__in=[t.pk for t in turns]))
    assert ogg_files(media) == []
    [record] = [r for r in caplog.records if r.getMessage() == "turn audio not saved"]
    assert record.turn_ids == [t.pk for t in turns]  # type: ignore[attr-defined]
