"""VoiceSession without Django: a recording transport, NullEngine, and the simulator's MCP
server, on a virtual-time event loop (testing/virtual_time.py): timeouts take no real time
and "nothing happened" means nothing was due to happen."""
from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from conversations.pipeline.commands import activation_text
from conversations.pipeline.config import DeviceInfo, PersonaConfig, SessionConfig
from conversations.pipeline.contracts import EngineContext, EngineFactory, NullEngine, null_engine_factory
from conversations.pipeline.limits import TokenBucket
from conversations.pipeline.session import (
    TRANSITIONS,
    CloseCode,
    IllegalTransition,
    SessionState,
    VoiceSession,
)
from conversations.pipeline.states import MAX_PROTOCOL_ERRORS, check_transition
from conversations.tests import fakes
from conversations.tests.fakes import RecordingHooks, RecordingTransport, until
from devices.protocol.binary import encode_audio
from devices.protocol.messages import TtsStart, TtsStop
from simulator.mcp_server import DeviceMcpServer, ImageResult

S = SessionState
MAC = "aa:bb:cc:dd:ee:01"


pytestmark = pytest.mark.virtual_time


def hello_text(version: int = 1, mcp: bool = True) -> str:
    return fakes.hello_text(version, {"mcp": True} if mcp else None)


def device_json(session: VoiceSession, body: str) -> str:
    return fakes.device_json(session.session_id, body)


def make_config(**overrides: Any) -> SessionConfig:
    device = overrides.pop("device", DeviceInfo(id=7, mac=MAC))
    return SessionConfig(session_id=str(uuid.uuid4()), device=device, **overrides)


Factory = Callable[..., tuple[VoiceSession, RecordingTransport, RecordingHooks]]


@pytest.fixture
async def make_session() -> AsyncIterator[Factory]:
    sessions: list[VoiceSession] = []

    def factory(hooks: RecordingHooks | None = None, engine_factory: EngineFactory = null_engine_factory,
                protocol_header: str | None = None, touch_interval: float = 60.0, **config: Any,
                ) -> tuple[VoiceSession, RecordingTransport, RecordingHooks]:
        transport, hooks = RecordingTransport(), hooks or RecordingHooks()
        session = VoiceSession(transport, make_config(**config), hooks, engine_factory,
                               protocol_header=protocol_header, touch_interval=touch_interval)
        sessions.append(session)
        return session, transport, hooks

    yield factory
    for session in sessions:
        await session.aclose()


async def connected(make_session: Factory, *, mcp: bool = False, version: int = 1, **config: Any
                    ) -> tuple[VoiceSession, RecordingTransport, RecordingHooks]:
    session, transport, hooks = make_session(**config)
    await session.start()
    await session.feed_text(hello_text(version, mcp))
    return session, transport, hooks


def engine(session: VoiceSession) -> NullEngine:
    assert isinstance(session.engine, NullEngine)
    return session.engine


def ctx(session: VoiceSession) -> EngineContext:
    return engine(session).ctx


async def speaking(session: VoiceSession) -> None:
    """A reply of the engine starts to speak (what `tts start` follows from)."""
    await ctx(session).replies.reply_speaking()


def thinking(session: VoiceSession) -> None:
    """An utterance ended: the engine's turn reply started (ASR and LLM run)."""
    ctx(session).replies.reply_started("turn")


# -- the state machine ------------------------------------------------------------------------


# The allowed edges, written out by hand from docs/protocol-reference §2.4 and the reasons in
# states.py, so a change to the table has to be made here too, on purpose.
ALLOWED = {
    (S.CONNECTING, S.IDLE), (S.CONNECTING, S.CLOSING),
    (S.IDLE, S.LISTENING), (S.IDLE, S.THINKING), (S.IDLE, S.SPEAKING), (S.IDLE, S.CLOSING),
    (S.LISTENING, S.IDLE), (S.LISTENING, S.THINKING), (S.LISTENING, S.SPEAKING), (S.LISTENING, S.CLOSING),
    (S.THINKING, S.IDLE), (S.THINKING, S.LISTENING), (S.THINKING, S.SPEAKING), (S.THINKING, S.CLOSING),
    (S.SPEAKING, S.IDLE), (S.SPEAKING, S.LISTENING), (S.SPEAKING, S.CLOSING),
}  # fmt: skip


@pytest.mark.parametrize("current", list(S))
@pytest.mark.parametrize("target", list(S))
def test_every_transition_follows_the_table(current: SessionState, target: SessionState) -> None:
    assert ((current, target) in ALLOWED) == (target in TRANSITIONS[current])
    if current is target:
        assert check_transition(current, target) is False
    elif (current, target) in ALLOWED:
        assert check_transition(current, target) is True
    else:
        with pytest.raises(IllegalTransition):
            check_transition(current, target)


def test_the_table_forbids_thinking_straight_out_of_speaking_and_leaving_closing() -> None:
    assert S.THINKING not in TRANSITIONS[S.SPEAKING]
    assert TRANSITIONS[S.CLOSING] == frozenset()
    assert TRANSITIONS[S.CONNECTING] == {S.IDLE, S.CLOSING}


async def test_an_engine_asking_for_an_illegal_transition_gets_an_error(make_session: Factory) -> None:
    session, _, _ = await connected(make_session)
    await speaking(session)
    with pytest.raises(IllegalTransition):
        thinking(session)  # a turn while the last reply still speaks: an engine bug
    assert session.state is S.SPEAKING


async def test_the_engine_cannot_send_tts_start_or_stop_itself(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    for message in (TtsStart(), TtsStop()):
        with pytest.raises(ValueError, match="session's"):
            await ctx(session).send(message)
    assert transport.of_type("tts") == [] and session.state is S.IDLE


async def test_state_changes_are_logged_at_debug_only(make_session: Factory,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Every turn changes state 3-4 times: at INFO that was a line each, per device."""
    with caplog.at_level(logging.DEBUG, logger="conversations.pipeline.session"):
        session, _, _ = await connected(make_session)
        thinking(session)
        await speaking(session)
    changes = [r for r in caplog.records if r.getMessage() == "device session state changed"]
    assert [(r.levelno, r.__dict__["to"]) for r in changes] == [
        (logging.DEBUG, "idle"), (logging.DEBUG, "thinking"), (logging.DEBUG, "speaking")]


# -- hello ----------------------------------------------------------------------------------


async def test_it_answers_hello_at_once_with_the_exact_shape(make_session: Factory) -> None:
    slow_db = RecordingHooks(delay=0.5)
    session, transport, hooks = make_session(hooks=slow_db)
    await session.start()
    started = asyncio.get_running_loop().time()
    await session.feed_text(hello_text())
    assert transport.first_text_at is not None and transport.first_text_at - started < 0.05
    assert hooks.calls == []  # the slow presence write has not even finished
    assert transport.frames[0] == (
        '{"type":"hello","transport":"websocket","session_id":"' + session.session_id + '",'
        '"audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60}}'
    )
    uuid.UUID(session.session_id)
    assert session.state is S.IDLE


async def test_the_downlink_rate_is_configurable(make_session: Factory) -> None:
    _, transport, _ = await connected(make_session, downlink_sample_rate=16000)
    assert transport.messages()[0]["audio_params"]["sample_rate"] == 16000


async def test_it_closes_when_no_hello_arrives_in_time(make_session: Factory) -> None:
    session, transport, _ = make_session(hello_timeout=0.05)
    await session.start()
    await until(lambda: transport.closed)
    assert transport.closed == (CloseCode.HELLO_TIMEOUT, "hello timeout")
    assert session.state is S.CLOSING


async def test_a_repeated_hello_is_answered_again_without_restarting(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    first_engine = session.engine
    await session.feed_text(hello_text())
    assert len(transport.of_type("hello")) == 2
    assert session.engine is first_engine


async def test_a_hello_without_features_is_still_a_hello(make_session: Factory) -> None:
    session, transport, _ = make_session()
    await session.feed_text('{"type":"hello","version":1,"transport":"websocket"}')
    assert transport.of_type("hello") and session.state is S.IDLE


async def test_hello_version_selects_the_binary_framing(make_session: Factory) -> None:
    session, transport, _ = make_session(protocol_header="1")  # the header disagrees: hello wins
    await session.feed_text(hello_text(version=3))
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    await session.feed_bytes(encode_audio(b"\xf8\xff\xfe", 3))
    assert engine(session).audio_frames == 1
    await session.feed_bytes(b"\xf8\xff\xfe")  # v1 framing on a v3 socket: a bad frame
    assert session.protocol_errors == 1
    await speaking(session)
    await ctx(session).send_audio(b"\x01\x02")
    assert transport.audio()[-1] == encode_audio(b"\x01\x02", 3)


# -- listening modes and speaking -----------------------------------------------------------


async def test_auto_mode_listens_every_turn_and_returns_to_listening(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    assert session.state is S.LISTENING
    await session.feed_bytes(b"\x01\x02\x03")
    assert engine(session).audio_frames == 1
    thinking(session)
    await engine(session).say("hello")
    assert session.state is S.LISTENING  # after tts stop, auto mode listens again
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    assert [e for e in engine(session).events if e[0] == "listen_start"] == [("listen_start", "auto")] * 2
    assert [m.get("state") for m in transport.of_type("tts")] == ["start", "sentence_start", "stop"]


async def test_manual_mode_stops_listening_on_listen_stop_and_ends_idle(make_session: Factory) -> None:
    session, _, _ = await connected(make_session)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"manual"'))
    await session.feed_bytes(b"\x01")
    await session.feed_text(device_json(session, '"type":"listen","state":"stop"'))
    assert session.state is S.IDLE
    assert ("listen_stop", None) in engine(session).events
    await session.feed_bytes(b"\x01")  # the device is idle: its audio is not the user's turn
    assert engine(session).audio_frames == 1
    thinking(session)  # manual: ASR runs after the stop
    await engine(session).say("answer")
    assert session.state is S.IDLE


async def test_realtime_mode_keeps_feeding_audio_while_speaking(make_session: Factory) -> None:
    session, _, _ = await connected(make_session)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"realtime"'))
    await speaking(session)
    assert session.state is S.SPEAKING
    await session.feed_bytes(b"\x01")
    assert engine(session).audio_frames == 1


async def test_auto_mode_drops_uplink_audio_while_speaking(make_session: Factory) -> None:
    session, _, _ = await connected(make_session)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    await speaking(session)
    await session.feed_bytes(b"\x01")
    assert engine(session).audio_frames == 0
    assert session.stats.audio_dropped_in == 1


async def test_audio_before_listen_start_is_dropped_and_counted(make_session: Factory) -> None:
    session, _, _ = await connected(make_session)
    for _ in range(3):  # the wake-word pre-roll arrives before `listen detect`
        await session.feed_bytes(b"\x01")
    assert engine(session).audio_frames == 0 and session.stats.audio_dropped_in == 3


async def test_downlink_audio_is_only_sent_while_speaking(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    await ctx(session).send_audio(b"\x01")
    assert transport.audio() == [] and session.stats.audio_dropped_out == 1
    await speaking(session)
    await ctx(session).send_audio(b"\x02")
    await ctx(session).replies.reply_ended(interrupted=False)
    await ctx(session).send_audio(b"\x03")  # a late frame after tts stop
    assert transport.audio() == [b"\x02"]


async def test_abort_interrupts_the_reply_and_sends_tts_stop(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    await speaking(session)
    await session.feed_text(device_json(session, '"type":"abort"'))
    assert ("abort", None) in engine(session).events
    assert transport.of_type("tts", "stop") and session.state is S.LISTENING


async def test_abort_without_a_running_reply_sends_no_tts_stop(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    await session.feed_text(device_json(session, '"type":"abort","reason":"wake_word_detected"'))
    assert ("abort", "wake_word_detected") in engine(session).events
    assert transport.of_type("tts", "stop") == []


async def test_abort_while_thinking_returns_to_listening(make_session: Factory) -> None:
    session, _, _ = await connected(make_session)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    thinking(session)
    await session.feed_text(device_json(session, '"type":"abort"'))
    assert session.state is S.LISTENING


async def test_listen_start_while_speaking_interrupts_then_listens(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    await speaking(session)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    events = engine(session).events
    assert events[-2:] == [("abort", "listen_start"), ("listen_start", "auto")]
    assert transport.of_type("tts", "stop") and session.state is S.LISTENING


async def test_listen_detect_reaches_the_engine(make_session: Factory) -> None:
    session, _, _ = await connected(make_session)
    await session.feed_text(device_json(session, '"type":"listen","state":"detect","text":"你好小智"'))
    assert ("listen_detect", "你好小智") in engine(session).events


async def test_a_socket_that_fails_to_send_is_logged_once_per_session(
        make_session: Factory, caplog: pytest.LogCaptureFixture) -> None:
    session, transport, _ = await connected(make_session)

    async def broken(_text: str) -> None:
        raise ConnectionResetError("gone")

    transport.send_text = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.DEBUG, logger="conversations.pipeline.session"):
        for _ in range(3):
            await session.handle_command({"command": "reboot"})
    failures = [r for r in caplog.records if r.getMessage() == "send to device failed"]
    assert [r.levelno for r in failures] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert failures[0].error == "ConnectionResetError" and not failures[0].exc_info  # type: ignore[attr-defined]


async def test_goodbye_closes_normally(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    await session.feed_text(device_json(session, '"type":"goodbye"'))
    assert transport.closed == (CloseCode.NORMAL, "goodbye")


async def test_the_engine_can_request_a_close(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    ctx(session).request_close("end_conversation")
    await until(lambda: transport.closed)
    assert transport.closed == (CloseCode.NORMAL, "end_conversation")


async def test_an_engine_factory_bug_closes_with_internal_error(make_session: Factory) -> None:
    def broken(_ctx: EngineContext) -> NullEngine:
        raise RuntimeError("boom")

    session, transport, _ = make_session(engine_factory=broken)
    await session.feed_text(hello_text())
    assert transport.closed == (CloseCode.INTERNAL_ERROR, "internal error")


# -- bad input and limits ---------------------------------------------------------------------


async def test_binary_before_hello_closes_with_a_protocol_error(make_session: Factory) -> None:
    session, transport, _ = make_session()
    await session.feed_bytes(b"\x01\x02")
    assert transport.closed == (CloseCode.PROTOCOL_ERROR, "binary before hello")
    await session.feed_text(hello_text())  # nothing happens after the close
    assert transport.frames == []


@pytest.mark.parametrize("frame", [
    "not json", "[1,2]", '{"type":42}', '{"type":"dance"}', '{"type":"listen","state":"start","mode":1}',
    '{"type":"listen","state":"start","mode":"loud"}', '{"type":"mcp","payload":"x"}',
    '{"type":"stt","text":"server-only"}', '{"type":"abort","reason":5}',
])
async def test_bad_text_frames_are_counted_and_the_session_goes_on(make_session: Factory, frame: str) -> None:
    session, transport, _ = await connected(make_session)
    await session.feed_text(frame)
    assert session.protocol_errors == 1 and transport.closed is None
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    assert session.state is S.LISTENING


async def test_messages_before_hello_are_protocol_errors(make_session: Factory) -> None:
    session, transport, _ = make_session()
    await session.feed_text('{"type":"listen","state":"start","mode":"auto"}')
    assert session.protocol_errors == 1 and session.state is S.CONNECTING


async def test_repeated_protocol_errors_close_the_socket(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    for _ in range(MAX_PROTOCOL_ERRORS - 1):
        await session.feed_text("{")
    assert transport.closed is None
    await session.feed_text("{")
    assert transport.closed == (CloseCode.PROTOCOL_ERROR, "too many protocol errors")


async def test_oversized_text_closes_with_4413(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session, max_text_bytes=1024)
    await session.feed_text('{"type":"listen","state":"detect","text":"' + "x" * 2000 + '"}')
    assert transport.closed == (CloseCode.MESSAGE_TOO_LARGE, "message too large")


async def test_oversized_binary_closes_with_4413(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session, max_binary_bytes=100)
    await session.feed_bytes(b"\x00" * 101)
    assert transport.closed == (CloseCode.MESSAGE_TOO_LARGE, "binary frame too large")


async def test_invalid_opus_is_handed_over_not_crashed_on(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    await session.feed_bytes(b"\xff" * 50)  # decoding (and counting) is the engine's job
    assert engine(session).audio_frames == 1 and transport.closed is None


async def test_a_flood_closes_with_4429(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session, max_messages_per_second=10)
    for _ in range(60):
        await session.feed_bytes(b"\x01")
        if transport.closed:
            break
    assert transport.closed == (CloseCode.FLOOD, "too many messages")


# -- the server's direct path (feed_audio_now): the same outcome, or feed_bytes ------------


async def test_audio_taken_at_once_reaches_the_engine_as_feed_bytes_would(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session, version=3)
    assert session.feed_audio_now(encode_audio(b"\xf8\xff\xfe", 3))  # not listening: dropped and counted
    assert engine(session).audio_frames == 0 and session.stats.audio_dropped_in == 1
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    assert session.feed_audio_now(encode_audio(b"\xf8\xff\xfe", 3))
    assert engine(session).audio_frames == 1 and transport.closed is None


@pytest.mark.parametrize(("frame", "closed"), [
    (b"\x00" * 101, (CloseCode.MESSAGE_TOO_LARGE, "binary frame too large")),
    (b"\xf8\xff\xfe", None),  # v1 framing on a v3 socket: a protocol error to count
])
async def test_a_frame_needing_a_close_or_an_error_is_left_to_feed_bytes(
        make_session: Factory, frame: bytes, closed: tuple[int, str] | None) -> None:
    session, transport, _ = await connected(make_session, version=3, max_binary_bytes=100)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    assert not session.feed_audio_now(frame)
    assert transport.closed is None and session.protocol_errors == 0  # nothing done yet
    await session.feed_bytes(frame)
    assert transport.closed == closed and session.protocol_errors == (0 if closed else 1)


async def test_binary_before_hello_is_left_to_feed_bytes(make_session: Factory) -> None:
    session, transport, _ = make_session()
    assert not session.feed_audio_now(b"\x01\x02")
    await session.feed_bytes(b"\x01\x02")
    assert transport.closed == (CloseCode.PROTOCOL_ERROR, "binary before hello")
    assert session.feed_audio_now(b"\x01\x02")  # closing: dropped, as feed_bytes drops it
    assert len(transport.frames) == 0


async def test_a_flood_through_the_direct_path_still_closes_with_4429(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session, max_messages_per_second=10)
    taken = 0
    while session.feed_audio_now(b"\x01"):
        taken += 1
    assert taken == 19  # the burst's 20 tokens (2 s at 10 a second) less the hello's, each spent once
    await session.feed_bytes(b"\x01")
    assert transport.closed == (CloseCode.FLOOD, "too many messages")


async def test_an_engine_bug_on_audio_taken_at_once_closes_with_internal_error(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))

    def broken(_payload: bytes, _timestamp: int = 0) -> None:
        raise RuntimeError("engine bug")

    engine(session).on_audio = broken  # type: ignore[method-assign]
    assert session.feed_audio_now(b"\x01")
    for _ in range(3):
        await asyncio.sleep(0)
    assert transport.closed == (CloseCode.INTERNAL_ERROR, "internal error")


async def test_normal_audio_rate_is_not_a_flood(make_session: Factory) -> None:
    now = [0.0]
    bucket = TokenBucket(rate=20, burst=40, clock=lambda: now[0])
    for _ in range(33):  # the wake-word pre-roll burst
        assert bucket.take()
    for _ in range(17 * 10):  # then 10 s of 60 ms frames
        now[0] += 0.06
        assert bucket.take()


# -- timeouts and presence ------------------------------------------------------------------


async def test_idle_says_the_farewell_then_closes(make_session: Factory) -> None:
    session, transport, _ = await connected(
        make_session, idle_timeout=0.15, persona=PersonaConfig(farewell="Bye now"))
    await until(lambda: transport.closed, timeout=3)
    assert transport.closed == (CloseCode.TIMEOUT, "idle timeout")
    assert ("say", "Bye now") in engine(session).events
    assert transport.of_type("tts", "sentence_start")[0]["text"] == "Bye now"


async def test_voice_activity_keeps_the_session_open(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session, idle_timeout=0.2)
    for _ in range(8):
        ctx(session).voice_activity()
        await asyncio.sleep(0.05)
    assert transport.closed is None


async def test_downlink_audio_counts_as_activity(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session, idle_timeout=0.2, hard_timeout=0.25)
    await speaking(session)
    for _ in range(10):  # a 0.5 s answer, longer than both timeouts
        await ctx(session).send_audio(b"\x01")
        await asyncio.sleep(0.05)
    assert transport.closed is None


async def test_a_stuck_reply_hits_the_hard_timeout(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session, idle_timeout=0.1, hard_timeout=0.3)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    thinking(session)  # the idle farewell waits while thinking
    await until(lambda: transport.closed, timeout=3)
    assert transport.closed == (CloseCode.TIMEOUT, "hard timeout")
    assert not any(e[0] == "say" for e in engine(session).events)


async def test_presence_is_online_then_touched_then_offline_in_order(make_session: Factory) -> None:
    session, _, hooks = make_session(hooks=RecordingHooks(delay=0.05), touch_interval=0.05)
    await session.start()
    await session.feed_text(hello_text())
    await until(lambda: "touch" in hooks.names())
    await session.aclose()
    names = hooks.names()
    assert names[0] == "started" and names[-1] == "closed"
    assert hooks.calls[0][1].device_id == 7


async def test_a_session_closed_before_hello_records_no_presence(make_session: Factory) -> None:
    session, _, hooks = make_session()
    await session.start()
    await session.aclose()
    assert hooks.calls == []


# -- unbound devices -------------------------------------------------------------------------


async def test_an_unbound_device_hears_its_code_and_is_not_listened_to(make_session: Factory) -> None:
    device = DeviceInfo(id=3, mac=MAC, bound=False, activation_code="123456")
    session, transport, _ = await connected(make_session, mcp=True, device=device)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    await until(lambda: transport.of_type("tts", "stop"))
    text = transport.of_type("tts", "sentence_start")[0]["text"]
    assert text == activation_text("123456") and "1 2 3 4 5 6" in text
    await session.feed_bytes(b"\x01")
    assert engine(session).audio_frames == 0
    assert not any(e[0] == "listen_start" for e in engine(session).events)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    await asyncio.sleep(0.02)
    assert len(transport.of_type("tts", "start")) == 1  # once per wake, not every turn
    assert transport.of_type("mcp") == []  # no MCP for a device nobody owns yet


# -- device MCP -----------------------------------------------------------------------------


def attach_device(session: VoiceSession, transport: RecordingTransport, server: DeviceMcpServer) -> None:
    """The device side of MCP: answer every server request like the firmware would."""
    tasks: set[asyncio.Task[None]] = set()

    async def answer(payload: dict) -> None:
        reply = await server.handle(payload)
        if reply is not None:
            await session.feed_text(device_json(session, '"type":"mcp","payload":' + reply))

    def on_text(text: str) -> None:
        data = json.loads(text)
        if data["type"] == "mcp":
            task = asyncio.get_running_loop().create_task(answer(data["payload"]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    transport.on_text = on_text


async def mcp_session(make_session: Factory, server: DeviceMcpServer, **config: Any
                      ) -> tuple[VoiceSession, RecordingTransport, RecordingHooks]:
    session, transport, hooks = make_session(vision_url="http://srv/mcp/vision/explain",
                                             vision_token="vt", **config)
    attach_device(session, transport, server)
    await session.feed_text(hello_text(mcp=True))
    await until(lambda: "tools" in hooks.names())
    return session, transport, hooks


async def test_it_initializes_then_lists_every_page(make_session: Factory) -> None:
    server = DeviceMcpServer.default().with_extra_tools(8, description_bytes=1500)
    session, transport, hooks = await mcp_session(make_session, server)
    requests = [m["payload"] for m in transport.of_type("mcp")]
    assert requests[0]["method"] == "initialize"
    assert requests[0]["params"]["capabilities"]["vision"] == {"url": "http://srv/mcp/vision/explain",
                                                                "token": "vt"}
    pages = [r for r in requests if r["method"] == "tools/list"]
    assert len(pages) == 3
    assert all(p["params"]["withUserTools"] is True for p in pages)
    assert all(type(r["id"]) is int for r in requests)
    server_info, tools = dict(hooks.calls)["tools"]
    assert server_info["name"] == "bread-compact-wifi"
    assert {t["name"] for t in tools} == {t.name for t in server.tools}
    assert any(t["user_only"] for t in tools)
    await until(lambda: ctx(session).toolset.llm_name("device", "self.get_device_status"))
    assert ctx(session).toolset.llm_name("device", "self.reboot") is None  # user-only


async def test_list_cursors_are_tool_names_and_inclusive(make_session: Factory) -> None:
    server = DeviceMcpServer.default().with_extra_tools(8, description_bytes=1500)
    _, transport, hooks = await mcp_session(make_session, server)
    payloads = [m["payload"] for m in transport.of_type("mcp")]
    pages = [p["params"] for p in payloads if p.get("method") == "tools/list"]
    cursors = [params["cursor"] for params in pages if "cursor" in params]
    assert cursors and all(server.get_tool(c) is not None for c in cursors)
    _, tools = dict(hooks.calls)["tools"]
    assert len(tools) == len(server.tools)  # nothing lost or doubled at the page edges


async def test_mcp_call_command_returns_the_result(make_session: Factory) -> None:
    server = DeviceMcpServer.default()
    server.set_result("self.get_device_status", {"battery": {"level": 80}})
    session, _, _ = await mcp_session(make_session, server)
    result = await session.handle_command(
        {"type": "device.command", "command": "mcp_call", "name": "self.get_device_status",
         "arguments": {}, "timeout": 2})
    assert result == {"type": "device.mcp_result", "ok": True, "result": '{"battery":{"level":80}}'}


async def test_mcp_call_image_results_become_a_short_text(make_session: Factory) -> None:
    server = DeviceMcpServer.default()
    server.set_result("self.screen.get_info", ImageResult("image/jpeg", b"\xff\xd8" + b"\x00" * 98))
    session, _, _ = await mcp_session(make_session, server)
    result = await session.handle_command({"command": "mcp_call", "name": "self.screen.get_info"})
    assert result == {"type": "device.mcp_result", "ok": True, "result": "[image image/jpeg, 100 bytes]"}


async def test_mcp_call_errors_without_code_come_back_as_errors(make_session: Factory) -> None:
    server = DeviceMcpServer.default()
    server.set_error("self.camera.take_photo", "Failed to capture photo")
    session, _, _ = await mcp_session(make_session, server)
    result = await session.handle_command({"type": "device.mcp_call", "name": "self.camera.take_photo",
                                           "arguments": {"question": "what"}})
    assert result == {"type": "device.mcp_result", "ok": False, "error": "Failed to capture photo"}


async def test_mcp_call_times_out_when_the_device_is_silent(make_session: Factory) -> None:
    server = DeviceMcpServer.default()
    session, transport, _ = await mcp_session(make_session, server)
    transport.on_text = None  # the device stops answering
    result = await session.handle_command({"command": "mcp_call", "name": "self.get_device_status",
                                           "timeout": 0.1})
    assert result is not None and result["ok"] is False and "did not answer" in result["error"]


async def test_mcp_call_without_device_mcp_is_a_clear_error(make_session: Factory) -> None:
    session, _, _ = await connected(make_session, mcp=False)
    result = await session.handle_command({"command": "mcp_call", "name": "self.reboot"})
    assert result == {"type": "device.mcp_result", "ok": False,
                      "error": "the device did not announce MCP support"}


async def test_mcp_replies_with_unknown_ids_are_dropped(make_session: Factory) -> None:
    session, transport, _ = await mcp_session(make_session, DeviceMcpServer.default())
    for payload in ('{"jsonrpc":"2.0","id":999,"result":{}}', '{"jsonrpc":"2.0","id":"1","result":{}}',
                    '{"jsonrpc":"2.0","method":"notifications/state_changed"}'):
        await session.feed_text(device_json(session, '"type":"mcp","payload":' + payload))
    assert transport.closed is None and session.protocol_errors == 0
    result = await session.handle_command({"command": "mcp_call", "name": "self.get_device_status"})
    assert result is not None and result["ok"] is True


# -- commands -------------------------------------------------------------------------------


async def test_reboot_alert_and_custom_commands_become_device_messages(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    await session.handle_command({"type": "device.command", "command": "reboot"})
    await session.handle_command({"command": "alert", "status": "Warn", "message": "Hot", "emotion": "sad"})
    await session.handle_command({"command": "custom", "payload": {"k": 1}})
    await session.handle_command({"command": "custom", "payload": "nope"})  # rejected, logged
    await session.handle_command({"command": "dance"})  # unknown, logged
    sid = session.session_id
    assert transport.messages()[1:] == [
        {"type": "system", "command": "reboot", "session_id": sid},
        {"type": "alert", "status": "Warn", "message": "Hot", "emotion": "sad", "session_id": sid},
        {"type": "custom", "payload": {"k": 1}, "session_id": sid},
    ]


async def test_say_interrupts_a_running_reply_first(make_session: Factory) -> None:
    session, transport, _ = await connected(make_session)
    await session.feed_text(device_json(session, '"type":"listen","state":"start","mode":"auto"'))
    await speaking(session)
    await session.handle_command({"command": "say", "text": "Dinner is ready"})
    assert engine(session).events[-2:] == [("abort", "command"), ("say", "Dinner is ready")]
    states = [m.get("state") for m in transport.of_type("tts")]
    assert states == ["start", "stop", "start", "sentence_start", "stop"]


async def test_commands_before_hello_are_dropped(make_session: Factory) -> None:
    session, transport, _ = make_session()
    await session.handle_command({"command": "reboot"})
    result = await session.handle_command({"command": "mcp_call", "name": "x"})
    assert transport.frames == [] and result is not None and result["ok"] is False
