"""Turn audio on disk (or any Django storage): written after a turn, deleted with it.

The pipeline hands a `TurnAudio` (conversations/capture.py) to the history writer, which
stores the turn row first and then calls `turn_audio_save_later(turn_id=..., audio=...)`.
That returns at once; a child process of the web worker (or a thread:
`XIAOZHI_AUDIO_WRITER`) muxes the packets into Ogg/Opus (conversations/oggopus.py, no
re-encoding) and saves them through `STORAGES["default"]`
(the filesystem under the data dir by default; any django-storages backend by settings).
The turns handed over while the writer is busy go to it together as its next job: one query
for their rows, their files, one transaction for their updates (`_Writer`, `_save_batch`).
Nothing here ever fails a turn: a failed write logs an error and the turn keeps no audio,
and one turn's failure costs the other turns of its batch nothing.

What is kept follows `XIAOZHI_RECORDING` (`on`: both directions, `reply-only`: what the
device played, `off`: nothing) and the persona's `record_audio` switch.
"""
from __future__ import annotations

import logging
import multiprocessing
import threading
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Executor, Future, InvalidStateError, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import close_old_connections, transaction
from django.db.models import FileField
from django.db.models.signals import post_delete
from django.dispatch import receiver

from conversations.capture import AudioTrack, TurnAudio
from conversations.models import Turn
from conversations.oggopus import OggOpusError, ogg_opus
from xiaozhi_site.child import django_child

logger = logging.getLogger(__name__)

RECORDING_ON, RECORDING_REPLY_ONLY, RECORDING_OFF = "on", "reply-only", "off"
RECORDING_MODES = (RECORDING_ON, RECORDING_REPLY_ONLY, RECORDING_OFF)
AUDIO_WRITER_THREAD = "thread"  # XIAOZHI_AUDIO_WRITER; the default is "process"
MAX_PENDING = 256  # turns waiting for the writer; beyond it (storage stuck) audio is dropped
MAX_BATCH = 32  # turns per writer job


@dataclass(frozen=True)
class SavedAudio:
    """Storage names written for one turn ("" when not written) and durations in ms."""

    user: str = ""
    reply: str = ""
    user_ms: int | None = None
    reply_ms: int | None = None


def recording_mode(*, persona_records: bool = True) -> str:
    """What a session of this persona keeps: the setting, unless the persona says no."""
    return settings.XIAOZHI_RECORDING if persona_records else RECORDING_OFF


def turn_audio_save(*, turn_id: int, audio: TurnAudio) -> SavedAudio:
    """Write a stored turn's audio now (blocking). Never raises: failures are logged."""
    [saved] = _save_batch([(turn_id, audio)])
    return saved


class _Writer:
    """Writes turn audio in arrival order, off every event loop, in batches.

    By default (`XIAOZHI_AUDIO_WRITER=process`) the work runs in a child process of its own,
    started on the first turn: the mux, the storage write and the row update then never take
    the interpreter lock this process's event loop needs. In a thread they cost the web
    process ~4–5 ms of CPU per turn and P1's p99 at 100 devices (docs/performance.md, P8).
    `thread` keeps the work here (the tests: their database exists in this process's
    settings only).

    One job at a time is in the child; the turns handed over meanwhile wait here and go as
    the next job, all of them (up to MAX_BATCH), when it is free. Per turn alone the child
    cost ~4–7 ms of CPU, much of it fixed per job: the turn's query (Django compiling it),
    the update's commit, the pipe's round trip. A batch pays those once (one query, one
    transaction): with turns handed over as the history writer does (a few per commit),
    ~5 → ~3.5 ms per turn in the child and ~0.55 → ~0.3 ms here (bench/recording_writer.py).
    A lone turn still starts at once. Each turn's future gets its own result, in order. A
    child that dies costs the turns of the job it held (logged); the next job starts a new one.

    `submit` is called from any thread (the history writer's commit callbacks); the next job
    is started by whichever thread finds the writer free: a submitting one, or the one that
    finishes a job (the executor's). The lock guards the queue and the counts; `_busy` makes
    that thread the only one using the executor until its job is done.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: Executor | None = None
        self._waiting: deque[tuple[int, TurnAudio, Future[SavedAudio]]] = deque()
        self._busy = False  # a job is in the writer; only its owner touches the executor
        self.pending = 0  # waiting + in the writer
        self.dropped = 0

    def submit(self, turn_id: int, audio: TurnAudio) -> Future[SavedAudio] | None:
        saved: Future[SavedAudio] = Future()
        with self._lock:
            if self.pending >= MAX_PENDING:
                self.dropped += 1
                logger.error("turn audio dropped: the writer is behind",
                             extra={"turn_id": turn_id, "dropped": self.dropped})
                return None
            self.pending += 1
            self._waiting.append((turn_id, audio, saved))
            batch = self._next_batch()
        if batch:
            self._start(batch)
        return saved

    def _next_batch(self) -> list[tuple[int, TurnAudio, Future[SavedAudio]]]:
        """With the lock held: the next job's turns when the writer is free (it then is not)."""
        if self._busy or not self._waiting:
            return []
        count = min(len(self._waiting), MAX_BATCH)
        self._busy = True
        return [self._waiting.popleft() for _ in range(count)]

    def _start(self, batch: list[tuple[int, TurnAudio, Future[SavedAudio]]]) -> None:
        # Outside the lock: a job that is already done runs its callback here, and that
        # takes the lock. `_busy` keeps every other thread away from the executor meanwhile.
        try:
            job = self._submit([(turn_id, audio) for turn_id, audio, _ in batch])
        except Exception:  # the executor refused the job (interpreter shutting down)
            logger.exception("turn audio not saved: the writer did not start",
                             extra={"turn_ids": [turn_id for turn_id, _, _ in batch]})
            self._finish(batch, None)
            return
        job.add_done_callback(lambda done: self._finish(batch, done))

    def _submit(self, items: list[tuple[int, TurnAudio]]) -> Future[list[SavedAudio]]:
        if self._executor is not None:
            try:
                return self._executor.submit(_write_batch, items)
            except BrokenProcessPool:  # the child died since the last job: start another
                self._executor.shutdown(wait=False)
        self._executor = _executor()
        return self._executor.submit(_write_batch, items)

    def _finish(self, batch: list[tuple[int, TurnAudio, Future[SavedAudio]]],
                job: Future[list[SavedAudio]] | None) -> None:
        results = [SavedAudio()] * len(batch)
        if job is not None:
            try:
                done = job.result()
                if len(done) != len(batch):
                    raise ValueError(f"{len(done)} results for {len(batch)} turns")
                results = done
            except BaseException:  # the child process died (killed, out of memory): not these turns' fault
                logger.exception("turn audio not saved: the writer process failed",
                                 extra={"turn_ids": [turn_id for turn_id, _, _ in batch]})
        with self._lock:
            self.pending -= len(batch)
            self._busy = False
            following = self._next_batch()
        for (_, _, saved), result in zip(batch, results, strict=True):
            try:
                saved.set_result(result)
            except InvalidStateError:  # cancelled by its caller: nothing to tell
                pass
        if following:  # after this job's futures, so they resolve in the order of the turns
            self._start(following)


def _executor() -> Executor:
    if settings.XIAOZHI_AUDIO_WRITER == AUDIO_WRITER_THREAD:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="turn-audio")
    # spawn, not fork: the web process has threads and an event loop a fork would copy mid-use
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=django_child)


def _write_batch(items: list[tuple[int, TurnAudio]]) -> list[SavedAudio]:
    """The writer's job: one SavedAudio per (turn id, audio), in order."""
    close_old_connections()  # a long-lived worker: drop connections the database closed
    try:
        return _save_batch(items)
    finally:
        close_old_connections()


_writer = _Writer()


def turn_audio_save_later(*, turn_id: int, audio: TurnAudio | None) -> Future[SavedAudio] | None:
    """Queue a stored turn's audio for the writer and return at once (safe to call
    from an event loop). The future never raises; None when there is nothing to do."""
    if audio is None or not (audio.uplink or audio.downlink) or settings.XIAOZHI_RECORDING == RECORDING_OFF:
        return None
    return _writer.submit(turn_id, audio)


def _save_batch(items: list[tuple[int, TurnAudio]]) -> list[SavedAudio]:
    """Store each turn's tracks, then update all their rows in one transaction. Never raises;
    a turn that fails (gone, its files not stored) keeps no audio and no files, and costs the
    others nothing; a refused transaction keeps the batch's files off every row, and deletes them."""
    results = [SavedAudio()] * len(items)
    try:
        # One query for the batch: compiling one query per turn was ~a quarter of the
        # writer's CPU (py-spy of the child during P1). Only the columns the files need: a
        # turn's texts and JSON (tool calls, timings, attempts) and the persona's prompt
        # are not read, and decoding them doubled the query's cost for a batch of 8.
        turns = (Turn.objects.select_related("conversation__persona")
                 .only("index", "conversation__id", "conversation__persona__record_audio")
                 .in_bulk({turn_id for turn_id, _ in items}))
    except Exception:
        logger.exception("turn audio not saved", extra={"turn_ids": [turn_id for turn_id, _ in items]})
        return results
    stored: list[tuple[int, int, dict[str, tuple[str, int]]]] = []  # (position, turn id, written)
    for position, (turn_id, audio) in enumerate(items):
        turn = turns.get(turn_id)
        if turn is None:
            logger.error("turn audio not saved: no such turn", extra={"turn_id": turn_id})
            continue
        try:
            written = _store_tracks(turn, audio)
        except Exception:
            logger.exception("turn audio not saved", extra={"turn_id": turn_id})
            continue
        if written:
            stored.append((position, turn_id, written))
    try:
        kept = _rows_update([(turn_id, written) for _, turn_id, written in stored])
    except BaseException:
        audio_files_delete(name for _, _, written in stored for name, _ in written.values())
        raise
    for (position, _, written), row_kept in zip(stored, kept, strict=True):
        if row_kept:
            results[position] = _saved(written)
        else:
            audio_files_delete(name for name, _ in written.values())
    return results


def _rows_update(rows: list[tuple[int, dict[str, tuple[str, int]]]]) -> list[bool]:
    """Point each turn's row at its files, the batch's rows in one transaction (one commit for
    the batch, not one per turn); whether each row took them. A row that is gone (the turn was
    deleted while its audio was written) takes nothing; a refused transaction keeps none."""
    try:
        with transaction.atomic():
            counts = [Turn.objects.filter(pk=turn_id).update(**_fields(_saved(written), written))
                      for turn_id, written in rows]
    except Exception:
        logger.exception("turn audio not saved", extra={"turn_ids": [turn_id for turn_id, _ in rows]})
        return [False] * len(rows)
    for (turn_id, _), count in zip(rows, counts, strict=True):
        if not count:
            logger.error("turn audio not saved: the turn was deleted while its audio was written",
                         extra={"turn_id": turn_id})
    return [bool(count) for count in counts]


def _store_tracks(turn: Turn, audio: TurnAudio) -> dict[str, tuple[str, int]]:
    """The turn's tracks its recording mode keeps, stored: {"user"|"reply": (name, ms)}."""
    persona = turn.conversation.persona
    mode = recording_mode(persona_records=persona is None or persona.record_audio)
    tracks = {"user": audio.uplink if mode == RECORDING_ON else None,
              "reply": audio.downlink if mode in (RECORDING_ON, RECORDING_REPLY_ONLY) else None}
    written: dict[str, tuple[str, int]] = {}
    try:
        for which, track in tracks.items():
            stored = _store_track(turn, which, track) if track else None
            if stored is not None:
                written[which] = stored
    except BaseException:
        audio_files_delete(name for name, _ in written.values())
        raise
    return written


def _store_track(turn: Turn, which: str, track: AudioTrack) -> tuple[str, int] | None:
    try:
        ogg = ogg_opus(track.packets)
    except OggOpusError as exc:
        logger.warning("turn audio track not written", extra={
            "turn_id": turn.pk, "track": which, "reason": str(exc), "packets": len(track.packets)})
        return None
    if ogg.skipped:
        logger.warning("invalid Opus packets left out of turn audio",
                       extra={"turn_id": turn.pk, "track": which, "skipped": ogg.skipped})
    field = Turn._meta.get_field(f"{which}_audio")
    assert isinstance(field, FileField)
    filename = field.generate_filename(turn, f"{turn.conversation.pk}-{turn.index}-{which}.ogg")
    name = default_storage.save(filename, ContentFile(ogg.data))
    return name, ogg.duration_ms


def _saved(written: dict[str, tuple[str, int]]) -> SavedAudio:
    user, reply = written.get("user"), written.get("reply")
    return SavedAudio(user=user[0] if user else "", reply=reply[0] if reply else "",
                      user_ms=user[1] if user else None, reply_ms=reply[1] if reply else None)


def _fields(saved: SavedAudio, written: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if "user" in written:
        fields.update(user_audio=saved.user, user_audio_ms=saved.user_ms)
    if "reply" in written:
        fields.update(reply_audio=saved.reply, reply_audio_ms=saved.reply_ms)
    return fields


def audio_files_delete(names: Iterable[str]) -> int:
    """Delete stored files by name; returns how many went. Failures are logged, not raised."""
    deleted = 0
    for name in names:
        if not name:
            continue
        try:
            default_storage.delete(name)
        except Exception:
            logger.exception("turn audio file not deleted", extra={"file": name})
        else:
            deleted += 1
    return deleted


@receiver(post_delete, sender=Turn, dispatch_uid="turn-audio-delete")
def _delete_files_with_turn(sender: type[Turn], instance: Turn, **kwargs: Any) -> None:
    # However a turn goes (admin, retention, a deleted conversation), its files go too,
    # once the deletion is committed (a rolled-back delete keeps them).
    names = [name for name in (instance.user_audio.name, instance.reply_audio.name) if name]
    if names:
        transaction.on_commit(lambda: audio_files_delete(names))
