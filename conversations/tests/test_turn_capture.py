"""What a device turn hands over for review (issue 13): the Opus packets of the utterance as
heard (pre-roll included) and of the reply as sent (up to an interruption), the providers
tried per stage, and which replies are turns at all. The real session and engine (real Opus,
Silero, espeak) with the zero-latency fake ASR/LLM/TTS, on the virtual-time loop."""
from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from conversations.capture import PacketTrail
from conversations.tests.fakes import listen
from conversations.tests.test_engine import make_persona
from conversations.tests.voice_rig import MakeRig, capture_rigs
from devices.protocol.commands import command_event
from devices.protocol.messages import TtsStop
from devices.protocol.opus import OpusDecoder

pytestmark = pytest.mark.virtual_time

FRAME_BYTES = 16000 * 2 * 60 // 1000  # one 60 ms uplink frame of 16 kHz PCM


@pytest.fixture
async def rig() -> AsyncIterator[MakeRig]:
    async with capture_rigs() as make:
        yield make


def decoded_bytes(packets: list[bytes]) -> int:
    decoder = OpusDecoder(16000)
    return sum(len(decoder.decode(packet)) for packet in packets)


def is_run_of(part: list[bytes], whole: list[bytes]) -> bool:
    """`part` is a contiguous run of `whole`."""
    return any(whole[i : i + len(part)] == part for i in range(len(whole) - len(part) + 1))


# --- the packet trail (pure) ---------------------------------------------------------------------


def test_the_trail_cuts_the_packets_that_cover_a_pcm_slice() -> None:
    trail = PacketTrail()
    for number in range(10):
        trail.add(bytes([number]), 100)
    assert trail.between(250, 480) == [b"\x02", b"\x03", b"\x04"]  # 200-300 covers 250, 400-500 covers 479
    assert trail.between(300, 400) == [b"\x03"]
    trail.drop_before(350)  # the buffer dropped PCM up to 350: packets ending by then go
    assert trail.start == 300 and trail.packets[0] == b"\x03"
    assert trail.between(0, 10_000) == [bytes([n]) for n in range(3, 10)]
    assert trail.take_all() == [bytes([n]) for n in range(3, 10)]
    assert not trail.packets and not trail.sizes and trail.start == 0


def test_the_trail_gives_the_garbage_collector_nothing_new_to_track_per_packet() -> None:
    """A talking device adds ~17 packets a second; a tracked object per packet (the old
    (packet, size) tuple) set off the young collections of a busy worker every 2-3 s."""
    trail = PacketTrail()
    packets = [bytes([n % 256]) * 120 for n in range(1000)]
    gc.disable()
    try:
        before = gc.get_count()[0]
        for packet in packets:
            trail.add(packet, 1920)
        grown = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert grown < 10, f"{grown} tracked objects for 1,000 packets"
    assert trail.between(0, 1920 * 2) == packets[:2]


# --- the utterance and the reply ----------------------------------------------------------------


async def test_a_turn_keeps_the_utterance_as_heard_with_its_pre_roll(rig: Any) -> None:
    r = await rig()
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    turn = r.hooks.turns[0]
    uplink = turn.audio.uplink
    heard = len(r.utterances[-1].pcm)  # the utterance the turn answered, pre-roll included
    assert uplink.sample_rate == 16000 and is_run_of(uplink.packets, r.fed)
    # The packets cover exactly that PCM, give or take the frames its two ends fall into.
    assert heard <= decoded_bytes(uplink.packets) < heard + 2 * FRAME_BYTES
    assert r.fed.index(uplink.packets[0]) < 300 // 60  # from inside the leading silence: the pre-roll


async def test_the_reply_audio_is_every_packet_the_device_got(rig: Any) -> None:
    r = await rig()
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    downlink = r.hooks.turns[0].audio.downlink
    assert downlink.sample_rate == 24000
    assert downlink.packets == r.transport.audio() and len(downlink.packets) >= 2 * 300 // 60


async def test_an_interrupted_reply_keeps_what_was_sent_until_the_interruption(rig: Any) -> None:
    r = await rig(providers={"tts.fake_tone": {"duration_ms": 3000}})
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("tell me a long story")
    await r.wait_for(lambda: len(r.transport.audio()) >= 8)
    await r.session.feed_text(json.dumps({"session_id": "", "type": "abort"}))
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    turn = r.hooks.turns[0]
    assert turn.interrupted and turn.audio.downlink.packets == r.transport.audio()
    assert len(turn.audio.downlink.packets) < 2 * 3000 // 60  # far from the whole reply


async def test_manual_mode_keeps_the_whole_press(rig: Any) -> None:
    r = await rig()
    await r.session.feed_text(listen("start", mode="manual"))
    await r.say_words("turn on the kitchen light", trailing_ms=100)
    await r.session.feed_text(listen("stop"))
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    assert r.hooks.turns[0].audio.uplink.packets == r.fed


async def test_reply_only_recording_keeps_no_utterance_at_all(rig: Any) -> None:
    r = await rig(recording="reply-only")
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    audio = r.hooks.turns[0].audio
    assert audio.uplink.packets == [] and audio.downlink.packets == r.transport.audio()
    assert r.engine.hearing._ear.trail is None  # not even kept while listening


async def test_with_recording_off_nothing_is_kept(rig: Any) -> None:
    r = await rig(recording="off")
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    assert r.hooks.turns[0].audio is None and r.engine.hearing._ear.trail is None
    assert r.hooks.turns[0].reply_text  # the turn itself is recorded as ever


# --- providers tried ------------------------------------------------------------------------------


async def test_a_turn_records_every_provider_tried_per_stage(rig: Any) -> None:
    r = await rig(make_persona(asr=("fail", "fake_echo"), tts=("fail",)))
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    attempts = r.hooks.turns[0].provider_attempts
    assert [(a["kind"], a["ok"]) for a in attempts["asr"]] == [("fail", False), ("fake_echo", True)]
    assert attempts["asr"][0]["error"] == "ProviderError"
    assert [(a["kind"], a["ok"]) for a in attempts["llm"]] == [("fake_echo", True)]
    # Two sentences: the failing engine once (then tried last), espeak once for both.
    assert [(a["kind"], a["ok"]) for a in attempts["tts"]] == [("fail", False), ("espeak", True)]
    assert r.hooks.turns[0].providers["tts"] == "espeak"


# --- replies that are turns of their own ----------------------------------------------------------


async def test_an_operators_say_is_a_turn_with_its_reply_audio(rig: Any) -> None:
    r = await rig()
    await r.session.feed_text(listen("start", mode="auto"))
    await r.session.handle_command(command_event("say", text="Dinner is ready."))
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    said = r.hooks.turns[0]
    assert (said.user_text, said.reply_text, said.interrupted) == ("", "Dinner is ready.", False)
    assert said.audio.downlink.packets == r.transport.audio() and not said.audio.uplink
    assert said.providers == {"tts": "fake_tone"} and said.provider_attempts["tts"][0]["ok"]
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: len(r.hooks.turns) == 2)
    assert [t.index for t in r.hooks.turns] == [1, 2]


async def test_the_servers_own_words_are_not_turns(rig: Any) -> None:
    r = await rig()
    await r.session.feed_text(listen("start", mode="auto"))
    await r.engine.say("Your code is 1 2 3 4 5 6.")  # the activation code, a farewell
    assert r.transport.count(TtsStop) == 1
    await asyncio.sleep(0.5)
    assert r.hooks.turns == []


async def test_the_wake_word_greeting_is_a_turn_after_the_wake_word(rig: Any) -> None:
    r = await rig(make_persona(greeting="Hi, I am listening."))
    await r.session.feed_text(listen("detect", text="hey xiaozhi"))
    await r.session.feed_text(listen("start", mode="auto"))
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    greeting = r.hooks.turns[0]
    assert (greeting.user_text, greeting.reply_text) == ("hey xiaozhi", "Hi, I am listening.")
    assert greeting.audio.downlink.packets == r.transport.audio() and greeting.audio.downlink


async def test_a_say_with_recording_off_is_a_turn_without_audio(rig: Any) -> None:
    r = await rig(recording="off")
    await r.session.feed_text(listen("start", mode="auto"))
    await r.session.handle_command(command_event("say", text="Dinner is ready."))
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    assert r.hooks.turns[0].reply_text == "Dinner is ready." and r.hooks.turns[0].audio is None
