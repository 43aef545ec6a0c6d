"""VoiceEngine behind the real VoiceSession, with fake providers and a recording transport,
on a virtual-time event loop (testing/virtual_time.py).

The session (protocol, state machine) and the engine (real Opus, real Silero VAD on espeak
speech) are the real code; only the ASR/LLM/TTS are the zero-latency fakes of
testing/fake_providers.py and the socket is a recorder. Assertions are about what reaches
the device and in which order, plus the turn records handed to the hooks. Paced replies of
seconds take no real time, and "nothing was sent after X" covers every timer that was due.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

import testing.fake_providers  # noqa: F401 - registers the fake provider kinds
from conversations.pipeline.config import DeviceInfo, PersonaConfig, SessionConfig
from conversations.pipeline.engine import VoiceEngine, normalize_phrase
from conversations.pipeline.session import VoiceSession
from conversations.pipeline.states import SessionState
from conversations.tests.fakes import PLAIN_HELLO, RecordingHooks, RecordingTransport, Sent, listen, until
from devices.protocol.messages import Llm, Stt, TtsSentenceStart, TtsStop
from testing.speech import opus_packets, silence, speak

pytestmark = pytest.mark.virtual_time


class Rig:
    """A session + engine under test, driven like a device would drive it."""

    def __init__(self, persona: PersonaConfig, providers: dict[str, dict[str, Any]]) -> None:
        config = SessionConfig(
            session_id="7f1c2d3e-0000-4000-8000-000000000001",
            device=DeviceInfo(id=1, mac="aa:bb:cc:dd:ee:ff", name="desk"),
            persona=persona, providers=providers, llm_model="fake",
        )
        self.transport = RecordingTransport()
        self.hooks = RecordingHooks()
        self.engines: list[VoiceEngine] = []
        self.session = VoiceSession(self.transport, config, self.hooks, self._factory)

    def _factory(self, ctx: Any) -> VoiceEngine:
        engine = VoiceEngine(ctx)
        self.engines.append(engine)
        return engine

    @property
    def engine(self) -> VoiceEngine:
        return self.engines[0]

    async def connect(self) -> None:
        await self.session.start()
        await self.session.feed_text(PLAIN_HELLO)

    async def say_words(self, text: str, trailing_ms: int = 900) -> None:
        """Stream espeak speech as Opus, faster than real time but never overflowing."""
        pcm = silence(16000, 300) + speak(text) + silence(16000, trailing_ms)
        for packet in opus_packets(pcm):
            await self.session.feed_bytes(packet)
            await asyncio.sleep(0.001)

    async def wait_for(self, predicate: Any, timeout: float = 10.0) -> None:
        await until(predicate, timeout, what=lambda: f"wire so far: {self.transport.kinds()}")

    def count(self, kind: type) -> int:
        return self.transport.count(kind)

    async def close(self) -> None:
        await self.session.aclose()


def make_persona(**overrides: Any) -> PersonaConfig:
    base = PersonaConfig(
        name="Tester", language="en", asr=("fake_echo",), llm=("fake_echo",), tts=("fake_tone",),
        vad_min_silence_ms=300,
    )
    return replace(base, **overrides)


PROVIDERS: dict[str, dict[str, Any]] = {
    "asr.fake_echo": {"text": "turn on the kitchen light"},
    "llm.fake_echo": {"reply": "😊 Sure, the light is on now. Anything else?"},
    "tts.fake_tone": {"duration_ms": 300},
}


@pytest.fixture
async def rig() -> Any:
    rigs: list[Rig] = []

    async def make(persona: PersonaConfig | None = None, providers: dict[str, dict[str, Any]] | None = None) -> Rig:
        r = Rig(persona or make_persona(), {**PROVIDERS, **(providers or {})})
        rigs.append(r)
        await r.connect()
        return r

    yield make
    for r in rigs:
        await r.close()


async def test_it_answers_an_utterance_in_wire_order(rig: Any) -> None:
    r = await rig()
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: r.count(TtsStop) == 1)
    kinds = r.transport.kinds()
    assert kinds[kinds.index("Stt"):] == [
        "Stt", "TtsStart", "Llm", "TtsSentenceStart", "audio", "TtsSentenceEnd",
        "TtsSentenceStart", "audio", "TtsSentenceEnd", "TtsSentenceStart", "audio", "TtsSentenceEnd", "TtsStop",
    ]
    messages = r.transport.decoded()
    assert next(m for m in messages if isinstance(m, Stt)).text == "turn on the kitchen light"
    assert next(m for m in messages if isinstance(m, Llm)).emotion == "happy"
    subtitles = [m.text for m in messages if isinstance(m, TtsSentenceStart)]
    assert subtitles == ["Sure,", "the light is on now.", "Anything else?"]
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    turn = r.hooks.turns[0]
    assert turn.user_text == "turn on the kitchen light"
    assert turn.reply_text == "Sure, the light is on now. Anything else?"
    assert turn.emotion == "happy"
    assert turn.providers == {"asr": "fake_echo", "llm": "fake_echo", "tts": "fake_tone"}
    assert set(turn.timings) >= {"speech_end", "asr_done", "llm_first_token", "tts_first_audio",
                                 "first_frame_sent", "last_frame_sent"}
    assert r.session.state is SessionState.LISTENING


def assert_spoken_block(kinds: list[str]) -> None:
    """`tts start`, then whole sentences (start, audio, end), then `tts stop`."""
    assert kinds[0] == "TtsStart" and kinds[-1] == "TtsStop", kinds
    body = kinds[1:-1]
    assert body and len(body) % 3 == 0, kinds
    assert body == ["TtsSentenceStart", "audio", "TtsSentenceEnd"] * (len(body) // 3), kinds


def audio_after(r: Rig, kind: type) -> list[Sent]:
    """Everything sent after the first message of `kind`."""
    return r.transport.after(kind)


class SlowTool:
    """A tool source whose call never finishes unless cancelled."""

    kind = "server"
    origin = ""
    timeout = 30.0

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def list_tools(self) -> list[Any]:
        from tools.registry import ToolSpec

        return [ToolSpec("slow_lookup", "Looks something up slowly.", {"type": "object"}, "server")]

    async def call(self, name: str, arguments: dict) -> str:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return "never"


async def test_it_interrupts_tts_on_abort_and_sends_nothing_after_tts_stop(rig: Any) -> None:
    r = await rig(providers={"tts.fake_tone": {"duration_ms": 3000}})
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("tell me a long story")
    await r.wait_for(lambda: sum(s.audio is not None for s in r.transport.sent) >= 5)
    await r.session.feed_text(json.dumps({"session_id": "", "type": "abort"}))
    stops = r.count(TtsStop)
    assert stops == 1
    await asyncio.sleep(0.3)  # a dozen frame periods: anything still running would show up
    assert audio_after(r, TtsStop) == []
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    assert r.hooks.turns[0].interrupted is True
    assert r.session.state is SessionState.LISTENING


async def test_it_cancels_a_running_tool_on_abort(rig: Any) -> None:
    r = await rig(providers={"llm.fake_echo": {"tool_calls": [{"name": "slow_lookup", "arguments": {}}]}})
    tool = SlowTool()
    await r.session.toolset.add_source(tool)
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("look it up")
    await asyncio.wait_for(tool.started.wait(), 10)
    await r.session.feed_text(json.dumps({"session_id": "", "type": "abort"}))
    await r.wait_for(lambda: tool.cancelled, timeout=0.5)
    await asyncio.sleep(0.1)
    assert audio_after(r, TtsStop) == []
    assert r.count(TtsStop) == 1


async def test_a_new_listen_start_interrupts_the_reply(rig: Any) -> None:
    r = await rig(providers={"tts.fake_tone": {"duration_ms": 3000}})
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("tell me a long story")
    await r.wait_for(lambda: any(s.audio is not None for s in r.transport.sent))
    await r.session.feed_text(listen("start", mode="auto"))
    assert r.count(TtsStop) == 1
    await asyncio.sleep(0.2)
    assert audio_after(r, TtsStop) == []
    assert r.session.state is SessionState.LISTENING


async def test_realtime_speech_barges_in_and_starts_a_new_turn(rig: Any) -> None:
    r = await rig(providers={
        "tts.fake_tone": {"duration_ms": 4000},
        "asr.fake_echo": {"script": ["tell me a long story", "stop it"]},
    })
    await r.session.feed_text(listen("start", mode="realtime"))
    await r.say_words("tell me a long story")
    await r.wait_for(lambda: any(s.audio is not None for s in r.transport.sent))
    await r.say_words("stop it")  # the device keeps streaming while it speaks
    await r.wait_for(lambda: r.count(Stt) == 2 and r.count(TtsStop) == 2, timeout=20)
    kinds = r.transport.kinds()
    first_stop = kinds.index("TtsStop")
    assert kinds[first_stop + 1] == "Stt"  # the old reply ended before the new turn spoke
    await r.wait_for(lambda: len(r.hooks.turns) == 2)
    assert [t.interrupted for t in r.hooks.turns] == [True, False]


async def test_empty_recognition_ends_the_turn_quietly(rig: Any) -> None:
    r = await rig(providers={"asr.fake_echo": {"text": " . "}})
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("hmm")
    await r.wait_for(lambda: r.engine._turns == 1 and r.engine._reply is None)
    assert r.transport.kinds() == ["ServerHello"]
    assert r.session.state is SessionState.LISTENING
    assert r.hooks.turns == []


async def test_a_failing_asr_is_replaced_by_the_next_one(rig: Any) -> None:
    r = await rig(make_persona(asr=("fail", "fake_echo")))
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    assert r.hooks.turns[0].providers["asr"] == "fake_echo"


async def test_a_hanging_llm_times_out_and_falls_over(rig: Any) -> None:
    r = await rig(make_persona(llm=("hang", "fake_echo")), providers={"llm.hang": {"timeout": 0.2}})
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    assert r.hooks.turns[0].providers["llm"] == "fake_echo"
    assert r.hooks.turns[0].error == ""


async def test_a_failing_tts_falls_back_to_espeak(rig: Any) -> None:
    r = await rig(make_persona(tts=("fail",)))
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    assert r.hooks.turns[0].providers["tts"] == "espeak"
    assert sum(s.audio is not None for s in r.transport.sent) > 10


async def test_when_every_llm_fails_the_device_hears_an_apology_and_listens_again(rig: Any) -> None:
    r = await rig(make_persona(llm=("fail",)))
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: r.count(TtsStop) == 1)
    kinds = r.transport.kinds()
    assert kinds[kinds.index("Stt") : kinds.index("Llm") + 1] == ["Stt", "TtsStart", "Llm"]
    assert_spoken_block(["TtsStart", *kinds[kinds.index("Llm") + 1 :]])
    subtitle = next(m for m in r.transport.decoded() if isinstance(m, TtsSentenceStart))
    assert subtitle.text.startswith("Sorry")
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    turn = r.hooks.turns[0]
    assert turn.error.startswith("llm:") and turn.providers["tts"] == "espeak"
    assert r.session.state is SessionState.LISTENING


async def test_when_every_asr_fails_the_device_hears_an_apology(rig: Any) -> None:
    r = await rig(make_persona(asr=("fail",)))
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: r.count(TtsStop) == 1)
    assert_spoken_block(r.transport.kinds()[1:])
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    assert r.hooks.turns[0].error.startswith("asr:")
    assert r.session.state is SessionState.LISTENING


async def test_an_exit_phrase_says_farewell_then_closes(rig: Any) -> None:
    r = await rig(make_persona(exit_phrases=("Goodbye",), farewell="See you soon!"),
                  providers={"asr.fake_echo": {"text": "Goodbye."}})
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("goodbye")
    await r.wait_for(lambda: r.transport.closed is not None)
    kinds = r.transport.kinds()
    assert_spoken_block(kinds[kinds.index("Stt") + 1 :])
    assert r.transport.closed[0] == 1000


async def test_the_end_conversation_tool_closes_after_the_goodbye(rig: Any) -> None:
    r = await rig(providers={"llm.fake_echo": {
        "tool_calls": [{"name": "end_conversation", "arguments": {}}], "reply": "👋 Bye bye!",
    }})
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("that is all")
    await r.wait_for(lambda: r.transport.closed is not None)
    assert r.count(TtsStop) == 1
    assert r.transport.sent[-1].message == TtsStop(session_id=r.session.session_id)
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    assert r.hooks.turns[0].tool_calls[0]["name"] == "end_conversation"


async def test_manual_mode_collects_until_listen_stop(rig: Any) -> None:
    r = await rig()
    await r.session.feed_text(listen("start", mode="manual"))
    await r.say_words("turn on the kitchen light", trailing_ms=100)
    assert r.count(Stt) == 0  # no VAD endpointing in manual mode
    await r.session.feed_text(listen("stop"))
    await r.wait_for(lambda: r.count(TtsStop) == 1)
    assert r.session.state is SessionState.IDLE
    asr = r.engine._runner._chains.ready.asr.slots[0].provider
    assert asr.calls[-1] >= 16000 * 2 * 1.5  # the whole press: about two seconds of audio


async def test_the_wake_word_is_greeted_and_mutes_vad_for_a_moment(rig: Any) -> None:
    r = await rig(make_persona(greeting="Hi, I am listening."))
    await r.session.feed_text(listen("detect", text="hey xiaozhi"))
    await r.session.feed_text(listen("start", mode="auto"))
    await r.wait_for(lambda: r.count(TtsStop) == 1)
    assert_spoken_block(r.transport.kinds()[1:])
    r.engine.hearing.mute(0.0)  # the test does not wait out the real post-wake window
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: r.count(Stt) == 1)


async def test_audio_right_after_the_wake_word_is_ignored(rig: Any) -> None:
    r = await rig()  # the mute window is engine time (virtual)
    await r.session.feed_text(listen("detect", text="hey xiaozhi"))
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light", trailing_ms=300)
    assert r.engine.hearing.ignored > 0
    await asyncio.sleep(0.3)
    assert r.count(Stt) == 0


async def test_say_speaks_a_fixed_text_and_returns_after_tts_stop(rig: Any) -> None:
    r = await rig()
    await r.session.feed_text(listen("start", mode="auto"))
    await r.engine.say("Your code is 1 2 3 4 5 6.")
    assert_spoken_block(r.transport.kinds()[1:])
    assert r.session.state is SessionState.LISTENING


async def test_emoji_and_markdown_never_reach_the_subtitles(rig: Any) -> None:
    r = await rig(providers={"llm.fake_echo": {"reply": "**Done!** 🎉 The *light* is on."}})
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words("turn on the kitchen light")
    await r.wait_for(lambda: r.count(TtsStop) == 1)
    assert next(m for m in r.transport.decoded() if isinstance(m, Llm)).emotion == "neutral"
    subtitles = [m.text for m in r.transport.decoded() if isinstance(m, TtsSentenceStart)]
    assert subtitles == ["Done!", "The light is on."]


def test_exit_phrases_match_without_case_or_punctuation() -> None:
    assert normalize_phrase(" Goodbye! ") == normalize_phrase("goodbye")
    assert normalize_phrase("再见。") == "再见"
    assert normalize_phrase("good bye") != normalize_phrase("goodbye")


def llm_of(r: Rig) -> Any:
    return r.engine._runner._chains.ready.llm.slots[0].provider


async def feed_in_real_time(r: Rig, pcm: bytes) -> None:
    """One 60 ms packet per 60 ms (of virtual time), as a device sends them."""
    for packet in opus_packets(pcm):
        await r.session.feed_bytes(packet)
        await asyncio.sleep(0.06)


async def test_an_early_reply_asks_the_llm_before_the_turn_ends(rig: Any) -> None:
    """The speculative ASR's text goes to the LLM at once (persona early_reply): with a model
    whose first token takes 1 s, the turn hears it less than 1 s after it ended."""
    r = await rig(make_persona(early_reply=True), providers={"llm.fake_echo": {
        **PROVIDERS["llm.fake_echo"], "first_token_delay": 1.0}})
    await r.session.feed_text(listen("start", mode="auto"))
    await feed_in_real_time(r, silence(16000, 300) + speak("turn on the kitchen light") + silence(16000, 900))
    await r.wait_for(lambda: len(r.hooks.turns) == 1, timeout=20)
    turn = r.hooks.turns[0]
    assert turn.timings["early_reply"] == 1.0
    assert turn.timings["llm_first_token"] < 900  # asked at the pause, ≥ 1,000 ms if asked at the turn's end
    assert len(llm_of(r).requests) == 1
    assert turn.reply_text == "Sure, the light is on now. Anything else?"
    subtitles = [m.text for m in r.transport.decoded() if isinstance(m, TtsSentenceStart)]
    assert subtitles == ["Sure,", "the light is on now.", "Anything else?"]


@pytest.mark.parametrize("early", [True, False])
async def test_the_pauses_turn_check_waits_for_its_transcript_only_with_early_replies(rig: Any, early: bool) -> None:
    """Hearing.check_after: with early replies the transcript is the critical path; without
    them the verdict is, and the model must not wait."""
    r = await rig(make_persona(early_reply=early))
    await r.session.feed_text(listen("start", mode="auto"))
    await feed_in_real_time(r, silence(16000, 300) + speak("turn on the kitchen light") + silence(16000, 900))
    await r.wait_for(lambda: len(r.hooks.turns) == 1, timeout=20)
    waited_for = r.engine.hearing._check_after
    assert (waited_for is not None) == early
    assert waited_for is None or (waited_for.done() and waited_for.result().text == "turn on the kitchen light")


async def test_speech_resuming_cancels_the_early_reply_and_none_of_it_reaches_the_device(rig: Any) -> None:
    r = await rig(make_persona(early_reply=True, vad_min_silence_ms=600), providers={
        "asr.fake_echo": {"script": ["turn on the"], "text": "turn on the kitchen light"},
        "llm.fake_echo": {"reply": "", "first_token_delay": 0.5},  # echoes what it was asked
    })
    await r.session.feed_text(listen("start", mode="auto"))
    # A 250 ms pause: speculated on (at 120 ms of quiet), shorter than the 600 ms window.
    pcm = (silence(16000, 300) + speak("turn on the") + silence(16000, 250) + speak("kitchen light")
           + silence(16000, 900))
    await feed_in_real_time(r, pcm)
    await r.wait_for(lambda: len(r.hooks.turns) == 1 and r.count(TtsStop) == 1, timeout=20)
    asked = [request[-1]["content"] for request in llm_of(r).requests]
    assert asked[0] == "turn on the" and asked[-1] == "turn on the kitchen light"  # the pause was asked about
    assert llm_of(r).cancelled == len(asked) - 1  # every request but the turn's was cancelled
    messages = r.transport.decoded()
    assert [m.text for m in messages if isinstance(m, Stt)] == ["turn on the kitchen light"]
    spoken = " ".join(m.text for m in messages if isinstance(m, TtsSentenceStart))
    assert spoken == "You said: turn on the kitchen light."
    assert r.hooks.turns[0].reply_text == "You said: turn on the kitchen light."
