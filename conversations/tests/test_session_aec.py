"""The session's side of server-side AEC: v2 downlink timestamps, the reference reported to
the engine, uplink stamps handed on, and realtime mode for `features.aec` devices."""
from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest

from conversations.pipeline.config import DeviceInfo, SessionConfig
from conversations.pipeline.contracts import NullEngine
from conversations.pipeline.engine import VoiceEngine
from conversations.pipeline.session import VoiceSession
from conversations.tests import fakes
from conversations.tests.fakes import RecordingHooks, RecordingTransport
from devices.protocol.binary import decode_audio, encode_audio

pytestmark = pytest.mark.virtual_time


class StampEngine(NullEngine):
    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.uplink: list[tuple[bytes, int]] = []

    def on_audio(self, opus: bytes, timestamp: int = 0) -> None:
        self.uplink.append((opus, timestamp))


async def open_session(version: int, features: dict[str, Any], aec: str = "webrtc") -> tuple[
        VoiceSession, RecordingTransport, StampEngine]:
    transport = RecordingTransport()
    config = SessionConfig(session_id=str(uuid.uuid4()), device=DeviceInfo(id=1, mac="aa:bb:cc:dd:ee:0a"), aec=aec)
    session = VoiceSession(transport, config, RecordingHooks(), StampEngine)
    await session.start()
    await session.feed_text(fakes.hello_text(version, features))
    engine = session.engine
    assert isinstance(engine, StampEngine)
    return session, transport, engine


async def speak_frames(session: VoiceSession, engine: StampEngine, count: int) -> None:
    await engine.ctx.replies.reply_speaking()
    for i in range(count):
        await engine.ctx.send_audio(bytes([i + 1]) * 20)


async def test_v2_frames_carry_increasing_stamps_reported_as_the_echo_reference() -> None:
    session, transport, engine = await open_session(2, {"mcp": True, "aec": True})
    try:
        assert session.listen_mode == "realtime"  # what the firmware picks with AEC
        assert engine.ctx.server_aec
        await speak_frames(session, engine, 4)
        stamps = [decode_audio(frame, 2).timestamp for frame in transport.audio()]
        assert all(s > 0 for s in stamps) and all(b - a >= 60 for a, b in itertools.pairwise(stamps))
        assert [e for e in engine.events if e[0] == "audio_sent"] == [("audio_sent", s) for s in stamps]
        # The device stamps its uplink with what it played: the engine gets that stamp.
        await session.feed_bytes(encode_audio(b"\xf8\xff\xfe", 2, stamps[1]))
        assert engine.uplink == [(b"\xf8\xff\xfe", stamps[1])]
    finally:
        await session.aclose()


async def test_v2_without_aec_is_stamped_but_keeps_no_reference() -> None:
    session, transport, engine = await open_session(2, {"mcp": True})
    try:
        assert session.listen_mode == "auto" and not engine.ctx.server_aec
        await speak_frames(session, engine, 2)
        assert all(decode_audio(frame, 2).timestamp > 0 for frame in transport.audio())
        assert not [e for e in engine.events if e[0] == "audio_sent"]
    finally:
        await session.aclose()


@pytest.mark.parametrize(("version", "aec"), [(1, "webrtc"), (3, "webrtc"), (2, "")])
async def test_aec_needs_v2_timestamps_and_a_configured_canceller(version: int, aec: str) -> None:
    session, _transport, engine = await open_session(version, {"aec": True}, aec=aec)
    try:
        assert not engine.ctx.server_aec
        await speak_frames(session, engine, 1)
        assert not [e for e in engine.events if e[0] == "audio_sent"]
    finally:
        await session.aclose()


async def test_a_hostile_aec_feature_value_is_not_true() -> None:
    session, _transport, engine = await open_session(2, {"aec": "yes"})
    try:
        assert not engine.ctx.server_aec and session.listen_mode == "auto"
    finally:
        await session.aclose()


@pytest.mark.parametrize(("aec", "cancelling"), [("webrtc", True), ("no_such_canceller", False)])
async def test_the_engine_cancels_with_the_configured_canceller_or_goes_on_without(
    aec: str, cancelling: bool, caplog: pytest.LogCaptureFixture,
) -> None:
    transport = RecordingTransport()
    config = SessionConfig(session_id=str(uuid.uuid4()), device=DeviceInfo(id=1, mac="aa:bb:cc:dd:ee:0b"), aec=aec)
    session = VoiceSession(transport, config, RecordingHooks(), VoiceEngine)
    try:
        await session.start()
        await session.feed_text(fakes.hello_text(2, {"aec": True}))
        engine = session.engine
        assert isinstance(engine, VoiceEngine)
        assert (engine.hearing.echo is not None) is cancelling
        assert ("echo cancellation unavailable" in caplog.text) is not cancelling
    finally:
        await session.aclose()
