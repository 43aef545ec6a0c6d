"""Turn audio on disk (or any Django storage): written after a turn, deleted with it.

The pipeline hands a `TurnAudio` (conversations/capture.py) to the history writer, which
stores the turn row first and then calls `turn_audio_save_later(turn_id=..., audio=...)`.
That returns at once; a child process of the web worker (or a thread:
`XIAOZHI_AUDIO_WRITER`) muxes the packets into Ogg/Opus (conversations/oggopus.py, no
re-encoding) and saves them through `STORAGES["default"]`
(the filesystem under the data dir by default; any django-storages backend by settings).
Nothing here ever fails a turn: a failed write logs an error and the turn keeps no audio.

What is kept follows `XIAOZHI_RECORDING` (`on`: both directions, `reply-only`: what the
device played, `off`: nothing) and the persona's `record_audio` switch.
"""
from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Iterable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
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
    try:
        return _save(turn_id, audio)
    except Exception:
        logger.exception("turn audio not saved", extra={"turn_id": turn_id})
        return SavedAudio()


class _Writer:
    """Writes turn audio in arrival order, off every event loop.

    By default (`XIAOZHI_AUDIO_WRITER=process`) the work runs in a child process of its own,
    started on the first turn: the mux, the storage write and the row update then never take
    the interpreter lock this process's event loop needs. In a thread they cost the web
    process ~4–5 ms of CPU per turn and P1's p99 at 100 devices (docs/performance.md, P8).
    `thread` keeps the work here (the tests: their database exists in this process's
    settings only). A child that dies costs the turns it held (logged); the next turn starts
    a new one.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: Executor | None = None
        self.pending = 0
        self.dropped = 0

    def submit(self, turn_id: int, audio: TurnAudio) -> Future[SavedAudio] | None:
        with self._lock:
            if self.pending >= MAX_PENDING:
                self.dropped += 1
                logger.error("turn audio dropped: the writer is behind",
                             extra={"turn_id": turn_id, "dropped": self.dropped})
                return None
            job = self._submit(turn_id, audio)
            self.pending += 1
        saved: Future[SavedAudio] = Future()
        job.add_done_callback(lambda done: self._finish(turn_id, done, saved))
        return saved

    def _submit(self, turn_id: int, audio: TurnAudio) -> Future[SavedAudio]:
        if self._executor is not None:
            try:
                return self._executor.submit(_write, turn_id, audio)
            except BrokenProcessPool:  # the child died since the last turn: start another
                self._executor.shutdown(wait=False)
        self._executor = _executor()
        return self._executor.submit(_write, turn_id, audio)

    def _finish(self, turn_id: int, job: Future[SavedAudio], saved: Future[SavedAudio]) -> None:
        with self._lock:
            self.pending -= 1
        try:
            result = job.result()
        except BaseException:  # the child process died (killed, out of memory): not this turn's fault
            logger.exception("turn audio not saved: the writer process failed", extra={"turn_id": turn_id})
            result = SavedAudio()
        saved.set_result(result)


def _executor() -> Executor:
    if settings.XIAOZHI_AUDIO_WRITER == AUDIO_WRITER_THREAD:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="turn-audio")
    # spawn, not fork: the web process has threads and an event loop a fork would copy mid-use
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=django_child)


def _write(turn_id: int, audio: TurnAudio) -> SavedAudio:
    close_old_connections()  # a long-lived worker: drop connections the database closed
    try:
        return turn_audio_save(turn_id=turn_id, audio=audio)
    finally:
        close_old_connections()


_writer = _Writer()


def turn_audio_save_later(*, turn_id: int, audio: TurnAudio | None) -> Future[SavedAudio] | None:
    """Queue a stored turn's audio for the writer and return at once (safe to call
    from an event loop). The future never raises; None when there is nothing to do."""
    if audio is None or not (audio.uplink or audio.downlink) or settings.XIAOZHI_RECORDING == RECORDING_OFF:
        return None
    return _writer.submit(turn_id, audio)


def _save(turn_id: int, audio: TurnAudio) -> SavedAudio:
    turn = Turn.objects.select_related("conversation__persona").filter(pk=turn_id).first()
    if turn is None:
        logger.error("turn audio not saved: no such turn", extra={"turn_id": turn_id})
        return SavedAudio()
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
        saved = _saved(written)
        if written and not Turn.objects.filter(pk=turn_id).update(**_fields(saved, written)):
            raise LookupError("the turn was deleted while its audio was written")
    except BaseException:
        audio_files_delete(name for name, _ in written.values())
        raise
    return saved


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
