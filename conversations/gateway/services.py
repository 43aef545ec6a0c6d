"""Database side of the gateway: exchanges stored as conversations for review.

Called from async code only through `database_sync_to_async`, one atomic function per
write (Django's async ORM does not do transactions yet).
"""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from conversations.gateway.history import PendingTurn
from conversations.gateway.config import TurnRecord
from conversations.models import Conversation, Persona, Turn

_ERROR_LENGTH = Turn._meta.get_field("error").max_length or 200


def _conversation_ids(session_ids: set[str], addresses: dict[str, str]) -> dict[str, int]:
    """Each session's conversation, created with its first turn (a resumed session appends)."""
    found: dict[str, int] = {}
    rows = Conversation.objects.filter(session_id__in=session_ids, source=Conversation.SOURCE_GATEWAY)
    for session_id, pk in rows.order_by("started_at").values_list("session_id", "pk"):
        found[session_id] = pk  # the latest wins, should an id ever repeat
    for session_id in session_ids - found.keys():
        found[session_id] = Conversation.objects.create(
            session_id=session_id,
            source=Conversation.SOURCE_GATEWAY,
            client_address=addresses.get(session_id, "")[:100],
        ).pk
    return found


@transaction.atomic
def gateway_history_save(*, turns: list[PendingTurn], ended_session_ids: list[str], model: str) -> None:
    """Store a batch of finished turns (from any connections) and close ended sessions."""
    addresses = {p.turn.session_id: p.client_address for p in turns}
    conversation_ids = _conversation_ids(set(addresses), addresses)
    Turn.objects.bulk_create([_turn_row(p.turn, conversation_ids[p.turn.session_id], model) for p in turns])
    if ended_session_ids:
        gateway_conversations_end(session_ids=ended_session_ids)


def _turn_row(turn: TurnRecord, conversation_id: int, model: str) -> Turn:
    return Turn(
        conversation_id=conversation_id,
        index=turn.index,
        user_text=turn.user_text,
        reply_text=turn.reply_text,
        tool_calls=turn.tool_calls,
        providers={"llm": "openai", "model": model},
        timings=turn.timings,
        error=turn.error[:_ERROR_LENGTH],
        interrupted=turn.interrupted,
    )


def gateway_conversations_end(*, session_ids: list[str]) -> int:
    """Ended or expired sessions: mark their conversations finished."""
    return Conversation.objects.filter(
        session_id__in=session_ids, source=Conversation.SOURCE_GATEWAY, ended_at__isnull=True
    ).update(ended_at=timezone.now())


def gateway_characters() -> list[dict[str, str]]:
    """Personas offered to the role-play tools (`list_available_characters`)."""
    return [
        {"name": name, "description": description}
        for name, description in Persona.objects.order_by("name").values_list("name", "description")
    ]
