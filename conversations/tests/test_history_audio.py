"""The history writer hands a turn's audio to the audio writer once the row is committed, by
the stored turn's id; whatever happens to the audio, the turn is saved (issue 13)."""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from conversations import recording
from conversations.capture import AttemptLog, TurnAudio
from conversations.models import Conversation, Turn
from conversations.services import history_save
from conversations.tests.review_data import turn_audio
from conversations.turns.history import ConversationKey, HistoryWriter, PendingTurn
from conversations.turns.record import TurnRecord

pytestmark = pytest.mark.django_db(transaction=True)

KEY = ConversationKey("rec-1", Conversation.SOURCE_DEVICE)


@pytest.fixture
def media(settings: Any, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


def turn(index: int, audio: TurnAudio | None = None, **fields: Any) -> TurnRecord:
    return TurnRecord(index=index, user_text="turn on the kitchen light", reply_text="Done.", audio=audio, **fields)


def writer_idle(timeout: float = 20.0) -> None:
    """Wait for the process's audio writer thread to finish what it was given."""
    deadline = time.monotonic() + timeout
    while recording._writer.pending:
        assert time.monotonic() < deadline, "the audio writer did not finish"
        time.sleep(0.02)


def files(media: Path) -> list[str]:
    return sorted(p.name for p in media.rglob("*.ogg")) if media.exists() else []


def test_a_stored_turns_audio_and_attempts_reach_its_row(media: Path) -> None:
    attempts = AttemptLog()
    attempts.failed("tts", "edge", TimeoutError(), 3000.0)
    attempts.served("tts", "espeak", 15.0)
    history_save(turns=[PendingTurn(KEY, turn(1, turn_audio(), provider_attempts=attempts.as_json()))], ended=[])
    writer_idle()
    stored = Turn.objects.get(conversation__session_id="rec-1", index=1)
    assert stored.provider_attempts == {"tts": [{"kind": "edge", "ok": False, "error": "TimeoutError", "ms": 3000.0},
                                                {"kind": "espeak", "ok": True, "ms": 15.0}]}
    assert stored.user_audio.name.endswith(f"{stored.conversation_id}-1-user.ogg")
    assert stored.reply_audio.name.endswith(f"{stored.conversation_id}-1-reply.ogg")
    assert stored.user_audio_ms > 500 and stored.reply_audio_ms > 500
    assert (media / stored.reply_audio.name).read_bytes().startswith(b"OggS")


def test_a_turn_stored_again_gets_its_audio_on_the_same_row(media: Path) -> None:
    history_save(turns=[PendingTurn(KEY, turn(0)), PendingTurn(KEY, turn(1))], ended=[])
    first = Turn.objects.get(conversation__session_id="rec-1", index=1).pk
    history_save(turns=[PendingTurn(KEY, turn(2, turn_audio())), PendingTurn(KEY, turn(1, turn_audio()))], ended=[])
    writer_idle()
    rows = {t.index: t for t in Turn.objects.filter(conversation__session_id="rec-1")}
    assert rows[1].pk == first and rows[1].reply_audio and rows[2].reply_audio and not rows[0].reply_audio
    assert len(files(media)) == 4


def test_the_audio_of_a_turn_the_database_refused_is_never_written(media: Path) -> None:
    refused = turn(1, turn_audio(), timings={"llm_ms": float("nan")})  # JSON the database will not store
    history_save(turns=[PendingTurn(KEY, turn(0, turn_audio())), PendingTurn(KEY, refused)], ended=[])
    writer_idle()
    stored = Turn.objects.get()
    assert stored.index == 0
    assert files(media) == sorted(Path(f.name).name for f in (stored.user_audio, stored.reply_audio))


def test_a_failed_audio_write_leaves_the_turn_saved(settings: Any, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("the storage cannot create directories under a file")
    settings.MEDIA_ROOT = str(blocked)
    with caplog.at_level(logging.ERROR, logger="conversations.recording"):
        history_save(turns=[PendingTurn(KEY, turn(0, turn_audio()))], ended=[])
        writer_idle()
    stored = Turn.objects.get(conversation__session_id="rec-1")
    assert stored.user_text == "turn on the kitchen light" and not stored.user_audio and not stored.reply_audio
    assert "turn audio not saved" in caplog.text


def test_with_recording_off_no_audio_is_written(settings: Any, media: Path) -> None:
    settings.XIAOZHI_RECORDING = "off"
    history_save(turns=[PendingTurn(KEY, turn(0, turn_audio()))], ended=[])
    writer_idle()
    assert Turn.objects.get().user_audio.name == "" and files(media) == []


async def test_only_so_many_buffered_turns_keep_their_audio() -> None:
    saved: list[list[PendingTurn]] = []
    release = asyncio.Event()

    async def save(turns: list[PendingTurn], ended: list[ConversationKey]) -> None:
        await release.wait()  # a database that does not answer
        saved.append(turns)

    writer = HistoryWriter(save, linger=0.01, audio_limit=2)
    for index in range(3):
        writer.add_turn(KEY, turn(index, turn_audio("hi", "ok")))
    assert [p.turn.audio is not None for p in writer._turns] == [True, True, False]
    assert writer.audio_dropped == 1
    release.set()
    await writer.aclose()
    writer.add_turn(KEY, turn(3, turn_audio("hi", "ok")))  # the buffer drained: audio is kept again
    assert writer._turns[-1].turn.audio is not None
    await writer.aclose()
    assert sum(len(batch) for batch in saved) == 4
