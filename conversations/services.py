"""Write-side services of the conversations app: turn history for every client, the device's
tool list, and the ORM implementation of the voice session's SessionHooks.

Sessions are plain asyncio; they reach the database only through background jobs (presence)
and the process's one `HISTORY` writer (turns), never from the frame or reply path.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from django.db import DatabaseError, OperationalError, transaction
from django.utils import timezone

from conversations.capture import TurnAudio
from conversations.models import Conversation, Turn
from conversations.pipeline.config import SessionInfo
from conversations.recording import turn_audio_save_later
from conversations.turns.history import ConversationKey, HistoryWriter, PendingTurn
from conversations.turns.record import TurnRecord
from devices.models import Device
from devices.presence import device_touch
from xiaozhi_site.db_threads import device_db

logger = logging.getLogger(__name__)
T = TypeVar("T")

_TURN_FIELDS = ("user_text", "reply_text", "emotion", "tool_calls", "providers", "provider_attempts", "timings",
                "interrupted", "error")
_ERROR_LENGTH = Turn._meta.get_field("error").max_length or 200
_EMOTION_LENGTH = Turn._meta.get_field("emotion").max_length or 20


# -- text the database can store -----------------------------------------------------------------


def db_text(text: str) -> str:
    """PostgreSQL stores no NUL character (text or jsonb); a client may send one anyway."""
    return text.replace("\x00", "") if "\x00" in text else text


def db_json(value: Any) -> Any:
    """A copy of `value` with NUL removed from every string in it, keys included.

    Plain JSON without a NUL (nearly always) is copied by a round trip through the C codec,
    as the database will store it, instead of a walk in Python: every connecting device's
    tool list passes here. The encoder escapes every NUL, so a `\\u0000` in the text means
    there may be one (or a literal backslash-u0000): then the walk."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):  # not plain JSON: the walk leaves such values as they are
        return _without_nul(value)
    return json.loads(text) if "\\u0000" not in text else _without_nul(value)


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return db_text(value)
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(item) for item in value]
    return value


# -- turn history ----------------------------------------------------------------------------------


def history_save(*, turns: list[PendingTurn], ended: list[ConversationKey]) -> None:
    """Store a batch of finished turns (from any connections) and end conversations.

    One transaction for the batch; if the database refuses it for what it holds (a value it
    cannot store), every turn is tried alone so one bad row never takes the others down.
    A failure to reach the database (OperationalError: locked, connection lost) is raised
    for the writer to retry the whole batch.

    Turn audio goes to the audio writer (conversations/recording.py) once the turn's row is
    committed, by its stored id; writing it never fails or delays the turn.
    """
    try:
        with transaction.atomic():
            _save_turns(turns)
            _end_conversations(ended)
    except OperationalError:
        raise
    except DatabaseError:
        logger.warning("history batch refused, storing turn by turn", exc_info=True, extra={"turns": len(turns)})
        _save_one_by_one(turns)
        with transaction.atomic():
            _end_conversations(ended)


def _save_one_by_one(turns: list[PendingTurn]) -> None:
    for pending in turns:
        try:
            with transaction.atomic():
                _save_turns([pending])
        except OperationalError:
            raise
        except DatabaseError:
            logger.error("turn refused by the database, dropped", exc_info=True,
                         extra={"session_id": pending.conversation.session_id, "turn": pending.turn.index})


def _save_turns(turns: list[PendingTurn]) -> None:
    if not turns:
        return
    conversation_ids = _conversation_ids({p.conversation for p in turns})
    rows = [_turn_row(p.turn, conversation_ids[(p.conversation.source, p.conversation.session_id)]) for p in turns]
    Turn.objects.bulk_create(
        rows, update_conflicts=True, unique_fields=["conversation", "index"], update_fields=list(_TURN_FIELDS),
    )  # idempotent per (conversation, index): a turn stored twice is updated
    audio = [(row, p.turn.audio) for row, p in zip(rows, turns, strict=True) if p.turn.audio is not None]
    if audio:
        stored = _stored_ids([row for row, _ in audio])
        handover = [(turn_id, track) for row, track in audio
                    if (turn_id := stored.get((row.conversation_id, row.index))) is not None]
        transaction.on_commit(lambda: _audio_save_later(handover), robust=True)


def _stored_ids(rows: list[Turn]) -> dict[tuple[int, int], int]:
    """(conversation, index) → the stored row's id. bulk_create sets it where the database
    returns rows from an upsert (PostgreSQL, SQLite ≥ 3.35); elsewhere it is looked up."""
    ids = {(row.conversation_id, row.index): row.pk for row in rows if row.pk is not None}
    missing = [row for row in rows if row.pk is None]
    if missing:
        found = Turn.objects.filter(conversation_id__in={r.conversation_id for r in missing},
                                    index__in={r.index for r in missing})
        ids.update({(c, i): pk for c, i, pk in found.values_list("conversation_id", "index", "pk")})
    return ids


def _audio_save_later(handover: list[tuple[int, TurnAudio]]) -> None:
    """After the commit: queue each stored turn's audio; a failure costs the audio only."""
    for turn_id, audio in handover:
        try:
            turn_audio_save_later(turn_id=turn_id, audio=audio)
        except Exception:
            logger.exception("turn audio not queued", extra={"turn_id": turn_id})


def _conversation_ids(keys: set[ConversationKey]) -> dict[tuple[str, str], int]:
    """Each conversation's row, created with its first turn (a resumed session appends)."""
    found: dict[tuple[str, str], int] = {}
    for source in {key.source for key in keys}:
        session_ids = {key.session_id for key in keys if key.source == source}
        rows = Conversation.objects.filter(source=source, session_id__in=session_ids).order_by("started_at")
        for session_id, pk in rows.values_list("session_id", "pk"):
            found[(source, session_id)] = pk  # the latest wins, should an id ever repeat
    for key in sorted(keys, key=lambda k: (k.source, k.session_id)):
        if (key.source, key.session_id) not in found:
            found[(key.source, key.session_id)] = Conversation.objects.create(
                session_id=key.session_id, source=key.source, device_id=key.device_id, persona_id=key.persona_id,
                client_address=key.client_address[:100],
            ).pk
    return found


def _turn_row(turn: TurnRecord, conversation_id: int) -> Turn:
    return Turn(
        conversation_id=conversation_id,
        index=turn.index,
        user_text=db_text(turn.user_text),
        reply_text=db_text(turn.reply_text),
        emotion=db_text(turn.emotion)[:_EMOTION_LENGTH],
        tool_calls=db_json(turn.tool_calls),
        providers=db_json(turn.providers),
        provider_attempts=db_json(turn.provider_attempts),
        timings=turn.timings,
        interrupted=turn.interrupted,
        error=db_text(turn.error)[:_ERROR_LENGTH],
    )


def _end_conversations(keys: list[ConversationKey]) -> None:
    for source in {key.source for key in keys}:
        conversations_end(source=source, session_ids=[key.session_id for key in keys if key.source == source])


def conversations_end(*, source: str, session_ids: list[str]) -> int:
    """Ended or expired sessions: mark their conversations finished."""
    return Conversation.objects.filter(
        session_id__in=session_ids, source=source, ended_at__isnull=True
    ).update(ended_at=timezone.now())


async def _history_save(turns: list[PendingTurn], ended: list[ConversationKey]) -> None:
    await _db(history_save)(turns=turns, ended=ended)


HISTORY = HistoryWriter(_history_save)  # the process's writer, for devices and the gateway


# -- devices -----------------------------------------------------------------------------------


def device_mcp_tools_store(*, device_id: int, server_info: dict, tools: list[dict]) -> None:
    """The device's own tool list, as shown in the admin (user-only tools flagged)."""
    Device.objects.filter(pk=device_id).update(
        mcp_server_info=db_json(server_info), mcp_tools=db_json(tools), mcp_tools_updated_at=timezone.now(),
    )


def _db(func: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    # Not thread-sensitive: presence and history writes must not queue behind sync views
    # (an admin page waiting on a device would hold them for its whole timeout); on the device
    # threads, which keep their connections.
    return device_db(func)


class DbSessionHooks:
    """SessionHooks for one device connection: presence, tool list, history."""

    def __init__(
        self, *, device_id: int | None, persona_id: int | None, client_address: str = "",
        history: HistoryWriter = HISTORY, stored_tools: tuple[dict, list] | None = None,
    ) -> None:
        self.device_id = device_id
        self.persona_id = persona_id
        self.client_address = client_address
        self._history = history
        self._conversation: ConversationKey | None = None
        # The device row's tool list as read at connect: (mcp_server_info, mcp_tools).
        self._stored_tools = stored_tools

    async def session_started(self, info: SessionInfo) -> None:
        """Nothing to write: the connection's claim marked the device online (devices/presence.py)."""

    async def tools_listed(self, server_info: dict, tools: list[dict]) -> None:
        if self.device_id is None:
            return
        listed = (db_json(server_info), db_json(tools))
        if listed == self._stored_tools:
            return  # a device reconnecting with the tools it had: nothing to write (a reboot storm)
        await _db(device_mcp_tools_store)(device_id=self.device_id, server_info=server_info, tools=tools)
        self._stored_tools = listed

    def turn_finished(self, turn: TurnRecord) -> None:
        self._history.add_turn(self._key(turn.session_id), turn)

    async def session_closed(self, info: SessionInfo) -> None:
        # The conversation's last turns and its end. A session without a turn has no
        # conversation row and nothing buffered: no write (every device of a reboot storm
        # connects and leaves without talking; the UPDATE that ended nothing cost each
        # disconnect a thread hop). Presence offline is the consumer's final write, after the
        # session has closed (its offline writer batches the closes of a whole fleet).
        if self._conversation is None:
            return
        self._history.end_conversation(self._conversation)
        await self._history.flush()

    async def touch(self) -> None:
        if self.device_id is not None:
            await _db(device_touch)(device_id=self.device_id)

    def _key(self, session_id: str) -> ConversationKey:
        if self._conversation is None:
            self._conversation = ConversationKey(
                session_id, Conversation.SOURCE_DEVICE, self.device_id, self.persona_id, self.client_address,
            )
        return self._conversation
