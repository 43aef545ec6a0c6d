"""Retention: old turn audio and (optionally) old conversations go, recent ones stay; the
hourly Celery job and `manage.py apply_retention` run the same service."""
from __future__ import annotations

import subprocess
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.core.management import CommandError, call_command
from django.utils import timezone

from conversations import retention
from conversations.models import Conversation, Turn
from conversations.retention import history_retention_apply

BASE_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture
def media(settings: Any, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


def aged_turn(days: float, *, index: int = 0, conversation: Conversation | None = None) -> Turn:
    """A turn with both audio files, created `days` ago (its conversation too)."""
    started = timezone.now() - timedelta(days=days)
    if conversation is None:
        conversation = Conversation.objects.create(session_id=f"aged-{days}-{index}")
        Conversation.objects.filter(pk=conversation.pk).update(started_at=started)
    turn = Turn.objects.create(conversation=conversation, index=index, user_text=f"{days} days ago")
    names = [default_storage.save(f"turns/t{turn.pk}-{track}.ogg", ContentFile(b"OggS")) for track in ("user", "reply")]
    Turn.objects.filter(pk=turn.pk).update(user_audio=names[0], reply_audio=names[1], user_audio_ms=60,
                                           reply_audio_ms=60, created_at=started)
    return Turn.objects.get(pk=turn.pk)


def files_of(turn: Turn, media: Path) -> list[bool]:
    return [(media / name).exists() for name in (turn.user_audio.name, turn.reply_audio.name)]


@pytest.mark.django_db(transaction=True)  # files go after the commit, as in production
def test_old_audio_is_deleted_and_recent_audio_kept(media: Path) -> None:
    old, recent = aged_turn(31), aged_turn(29)
    result = history_retention_apply(audio_days=30, conversation_days=0)
    assert (result.audio_turns, result.audio_files, result.conversations) == (1, 2, 0)
    assert files_of(old, media) == [False, False] and files_of(recent, media) == [True, True]
    old_row = Turn.objects.get(pk=old.pk)
    assert not old_row.user_audio and not old_row.reply_audio and old_row.reply_audio_ms is None
    assert old_row.user_text == "31 days ago"  # the turn itself stays
    assert Turn.objects.get(pk=recent.pk).reply_audio.name == recent.reply_audio.name


@pytest.mark.django_db(transaction=True)
def test_old_conversations_go_with_their_turns_and_files(media: Path) -> None:
    old, recent = aged_turn(400), aged_turn(10)
    aged_turn(400, index=1, conversation=old.conversation)
    result = history_retention_apply(audio_days=0, conversation_days=365)
    assert (result.conversations, result.turns, result.audio_files) == (1, 2, 4)
    assert not Conversation.objects.filter(pk=old.conversation_id).exists()
    assert files_of(old, media) == [False, False]
    assert Conversation.objects.filter(pk=recent.conversation_id).exists() and files_of(recent, media) == [True, True]


@pytest.mark.django_db
def test_zero_days_keeps_everything(media: Path, settings: Any) -> None:
    settings.XIAOZHI_AUDIO_RETENTION_DAYS = 0
    settings.XIAOZHI_CONVERSATION_RETENTION_DAYS = 0
    ancient = aged_turn(5000)
    assert history_retention_apply() == retention.RetentionResult()
    assert files_of(ancient, media) == [True, True]


@pytest.mark.django_db(transaction=True)
def test_work_goes_in_batches(media: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(retention, "AUDIO_BATCH", 2)
    monkeypatch.setattr(retention, "CONVERSATION_BATCH", 2)
    for n in range(5):
        aged_turn(40 + n)
    assert history_retention_apply(audio_days=30, conversation_days=0).audio_turns == 5
    assert not Turn.objects.exclude(user_audio="").exists()
    assert history_retention_apply(audio_days=0, conversation_days=30).conversations == 5


@pytest.mark.django_db(transaction=True)
def test_a_file_already_gone_does_not_stop_the_sweep(media: Path) -> None:
    first, second = aged_turn(50), aged_turn(51)
    (media / first.user_audio.name).unlink()
    result = history_retention_apply(audio_days=30, conversation_days=0)
    assert result.audio_turns == 2 and files_of(second, media) == [False, False]


@pytest.mark.django_db
def test_the_counts_are_logged(media: Path, caplog: Any) -> None:
    aged_turn(90)
    caplog.set_level("INFO", logger="conversations.retention")
    history_retention_apply(audio_days=30, conversation_days=0)
    [record] = [r for r in caplog.records if r.getMessage() == "history retention applied"]
    assert record.audio_turns == 1 and record.conversations == 0


@pytest.mark.django_db(transaction=True)
def test_the_management_command_runs_the_same_service(media: Path) -> None:
    old = aged_turn(45)
    out = StringIO()
    call_command("apply_retention", "--audio-days", "30", stdout=out)
    assert "Removed the audio of 1 turn(s)" in out.getvalue()
    assert files_of(old, media) == [False, False]
    with pytest.raises(CommandError):
        call_command("apply_retention", "--conversation-days", "-1")


def test_beat_runs_retention_every_hour() -> None:
    entry = django_settings.CELERY_BEAT_SCHEDULE["apply-history-retention"]
    assert entry["task"] == "conversations.tasks.history_retention_apply" and entry["schedule"] == 3600.0


@pytest.fixture
def worker(celery_worker_factory: Any, media: Path) -> subprocess.Popen:
    return celery_worker_factory(XIAOZHI_MEDIA_ROOT=str(media), XIAOZHI_AUDIO_RETENTION_DAYS="30")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_celery_worker_applies_retention(worker: subprocess.Popen, media: Path) -> None:
    from conversations.tasks import history_retention_apply as task

    old, recent = aged_turn(31), aged_turn(1)
    result = task.delay().get(timeout=60)
    assert result["audio_turns"] == 1 and result["audio_files"] == 2
    assert files_of(old, media) == [False, False] and files_of(recent, media) == [True, True]
