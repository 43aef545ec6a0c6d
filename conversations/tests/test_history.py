"""The turn history's database side (conversations/services.py) with the process's writer:
one batch for many conversations, rows created with the first turn, idempotent turns, text
cleaned before the database, and one refused row never taking its batch down."""
from __future__ import annotations

import logging

import pytest
from channels.db import database_sync_to_async

from conversations.models import Conversation, Turn
from conversations.pipeline.config import SessionInfo
from conversations.services import DbSessionHooks, db_json, db_text, device_mcp_tools_store, history_save
from conversations.turns.history import ConversationKey, HistoryWriter, PendingTurn
from conversations.turns.record import TurnRecord
from devices.models import Device
from devices.tests.factories import BoundDeviceFactory

pytestmark = pytest.mark.django_db(transaction=True)

GATEWAY = ConversationKey("gw-1", Conversation.SOURCE_GATEWAY, client_address="10.0.0.9:5000")


def device_key(device: Device, session_id: str = "dev-1") -> ConversationKey:
    return ConversationKey(session_id, Conversation.SOURCE_DEVICE, device_id=device.pk, client_address="10.0.0.8:1")


def turn(index: int, text: str = "hello", **fields: object) -> TurnRecord:
    return TurnRecord(index=index, user_text=text, reply_text=f"reply {index}", **fields)  # type: ignore[arg-type]


def test_text_is_cleaned_of_nul_everywhere_in_it() -> None:
    assert db_text("a\x00b") == "ab" and db_text("plain") == "plain"
    assert db_json({"na\x00me": ["x\x00", 1, {"k": "v\x00"}], "n": None}) == {"name": ["x", 1, {"k": "v"}], "n": None}


def test_db_json_copies_what_it_is_given_as_the_database_would_store_it() -> None:
    tools = [{"name": "self.lamp", "inputSchema": {"type": "object", "enum": (1, 2)}}]
    stored = db_json(tools)
    assert stored == [{"name": "self.lamp", "inputSchema": {"type": "object", "enum": [1, 2]}}]
    assert stored is not tools and stored[0] is not tools[0]
    # A literal backslash-u0000 is text, not a NUL: kept.
    assert db_json({"text": "\\u0000 and \x00"}) == {"text": "\\u0000 and "}


def test_a_batch_of_several_conversations_creates_each_row_with_its_first_turn() -> None:
    device = BoundDeviceFactory()
    key = device_key(device)
    history_save(turns=[PendingTurn(key, turn(1)), PendingTurn(GATEWAY, turn(0)), PendingTurn(key, turn(2))], ended=[])
    conversation = Conversation.objects.get(session_id="dev-1")
    assert (conversation.source, conversation.device_id, conversation.client_address) == ("device", device.pk,
                                                                                         "10.0.0.8:1")
    assert list(conversation.turns.values_list("index", flat=True)) == [1, 2]
    assert Conversation.objects.get(session_id="gw-1").turns.count() == 1
    history_save(turns=[PendingTurn(key, turn(2, "again"))], ended=[key])  # stored twice: updated
    conversation.refresh_from_db()
    assert conversation.turns.get(index=2).user_text == "again" and conversation.ended_at is not None


def test_ending_a_conversation_without_turns_creates_no_row() -> None:
    history_save(turns=[], ended=[GATEWAY])
    assert not Conversation.objects.exists()


def test_a_turn_the_database_refuses_does_not_take_its_batch_down(caplog: pytest.LogCaptureFixture) -> None:
    refused = turn(1, "bad", timings={"llm_ms": float("nan")})  # JSON the database will not store
    other = ConversationKey("gw-2", Conversation.SOURCE_GATEWAY)
    with caplog.at_level(logging.WARNING):
        history_save(turns=[PendingTurn(GATEWAY, turn(0)), PendingTurn(GATEWAY, refused),
                            PendingTurn(other, turn(0, "fine"))], ended=[GATEWAY])
    assert sorted(Turn.objects.values_list("user_text", flat=True)) == ["fine", "hello"]
    assert Conversation.objects.get(session_id="gw-1").ended_at is not None
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "history batch refused, storing turn by turn", "turn refused by the database, dropped"]


def test_nul_in_a_turn_and_in_a_device_tool_list_is_stored_without_it() -> None:
    device = BoundDeviceFactory()
    history_save(turns=[PendingTurn(GATEWAY, turn(0, "a\x00b", tool_calls=[{"name": "x\x00"}]))], ended=[])
    stored = Turn.objects.get()
    assert stored.user_text == "ab" and stored.tool_calls == [{"name": "x"}]
    device_mcp_tools_store(device_id=device.pk, server_info={"name": "b\x00"}, tools=[{"name": "self.a\x00b"}])
    device.refresh_from_db()
    assert device.mcp_tools == [{"name": "self.ab"}] and device.mcp_server_info == {"name": "b"}


async def test_a_device_session_writes_its_turns_then_its_end_and_leaves_presence_to_the_consumer() -> None:
    device = await database_sync_to_async(BoundDeviceFactory)(is_online=True, session_id="dev-9")
    order: list[str] = []

    async def save(turns: list[PendingTurn], ended: list[ConversationKey]) -> None:
        order.append(f"history {len(turns)} turns, {len(ended)} ended")
        await database_sync_to_async(history_save)(turns=turns, ended=ended)

    hooks = DbSessionHooks(device_id=device.pk, persona_id=None, client_address="10.0.0.7:9",
                           history=HistoryWriter(save, linger=60))
    info = SessionInfo("dev-9", device.pk)
    await hooks.session_started(info)
    assert not await Conversation.objects.filter(session_id="dev-9").aexists()  # no turn, no row
    hooks.turn_finished(TurnRecord(index=1, user_text="hi", session_id="dev-9"))
    await hooks.session_closed(info)  # drains the history first, though its linger is a minute
    assert order == ["history 1 turns, 1 ended"]
    conversation = await Conversation.objects.aget(session_id="dev-9")
    assert conversation.device_id == device.pk and conversation.ended_at is not None
    # Offline is the consumer's last write, through its offline writer (devices/tests/test_presence_e2e.py).
    assert (await Device.objects.aget(pk=device.pk)).is_online


async def test_a_device_session_without_a_turn_closes_without_a_write() -> None:
    device = await database_sync_to_async(BoundDeviceFactory)()
    saved: list[tuple[list[PendingTurn], list[ConversationKey]]] = []

    async def save(turns: list[PendingTurn], ended: list[ConversationKey]) -> None:
        saved.append((turns, ended))

    hooks = DbSessionHooks(device_id=device.pk, persona_id=None, history=HistoryWriter(save, linger=60))
    info = SessionInfo("dev-10", device.pk)
    await hooks.session_started(info)
    await hooks.session_closed(info)
    assert saved == []  # no conversation to end: the UPDATE would match no row
    hooks.turn_finished(TurnRecord(index=1, user_text="hi", session_id="dev-10"))  # a turn after all
    await hooks.session_closed(info)
    assert [len(turns) for turns, _ in saved] == [1] and saved[0][1][0].session_id == "dev-10"
