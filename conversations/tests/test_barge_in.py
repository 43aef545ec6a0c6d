"""Barge-in on the user's voice only: the ear's "confirmed" mark (synthetic window
probabilities) and the engine's rule that speech over a reply interrupts it only once
confirmed, and is not a turn otherwise (real session, real Silero on espeak speech)."""
from __future__ import annotations

from typing import Any

import pytest

import conversations.tests.test_engine as engine_tests
from conversations.pipeline.endpointing import CONFIRM_GAP_MS, Ear, VADSettings
from conversations.tests.fakes import listen
from devices.protocol.messages import Stt, TtsStop
from testing.speech import speak

pytestmark = pytest.mark.virtual_time
WINDOW_MS = 32.0
rig = engine_tests.rig  # the engine tests' session + engine rig (a fixture)
make_persona = engine_tests.make_persona


class WindowVAD:
    """Just enough of the VAD contract for `Ear.endpoint`, which takes probabilities."""

    name = "windows"
    window_ms = WINDOW_MS

    def stream(self) -> Any:
        return None

    def probabilities(self, work: list[tuple[Any, bytes]]) -> list[list[float]]:
        raise AssertionError("not used: the tests hand probabilities to the ear")


def marks(probabilities: list[float], **settings: Any) -> list[str]:
    ear = Ear(VADSettings(0.5, 0.3, 300.0, **settings), WindowVAD())  # type: ignore[arg-type]
    return [mark.kind for mark in ear.endpoint(probabilities)]


def windows(ms: float) -> int:
    return int(-(-ms // WINDOW_MS))


def test_enough_confident_speech_confirms_once() -> None:
    kinds = marks([0.95] * windows(180) + [0.95] * 20)
    assert kinds.count("started") == 1 and kinds.count("confirmed") == 1
    assert kinds.index("started") < kinds.index("confirmed")


def test_a_short_burst_starts_speech_but_never_confirms() -> None:
    kinds = marks([0.95] * (windows(180) - 1) + [0.0] * 20)  # ~150 ms: a cough, an "mm"
    assert "started" in kinds and "confirmed" not in kinds


def test_uncertain_speech_never_confirms() -> None:
    kinds = marks([0.7] * 40)  # voiced for the detector, below the 0.8 certainty
    assert "started" in kinds and "confirmed" not in kinds
    assert "confirmed" in marks([0.7] * 40, barge_in_min_probability=0.6)


def test_scattered_blips_separated_by_gaps_do_not_add_up() -> None:
    gap = [0.0] * windows(CONFIRM_GAP_MS)
    blip = [0.95, 0.95, 0.95, 0.4]  # three confident windows: "have voice" for the detector
    kinds = marks((blip + gap) * 10)  # 10 × 96 ms of confident windows in all
    assert "confirmed" not in kinds


def test_the_threshold_is_the_personas() -> None:
    assert "confirmed" not in marks([0.95] * windows(400) + [0.0] * 20, barge_in_min_ms=500)
    assert "confirmed" in marks([0.95] * windows(500) + [0.0] * 20, barge_in_min_ms=500)


async def test_speech_over_a_reply_below_the_threshold_neither_interrupts_nor_starts_a_turn(rig: Any) -> None:
    r = await rig(make_persona(barge_in_min_ms=2000), providers={
        "tts.fake_tone": {"duration_ms": 3000},
        "asr.fake_echo": {"script": ["tell me a long story", "stop it"]},
    })
    await r.session.feed_text(listen("start", mode="realtime"))
    await r.say_words("tell me a long story")
    await r.wait_for(lambda: any(s.audio is not None for s in r.transport.sent))
    await r.say_words("stop it")  # ~0.6 s of speech: under the persona's 2 s
    await r.wait_for(lambda: r.count(TtsStop) == 1)
    await r.wait_for(lambda: len(r.hooks.turns) == 1)
    assert [t.interrupted for t in r.hooks.turns] == [False]
    # The explicit next event: a later question is the second turn, nothing came between.
    await r.say_words("what time is it")
    await r.wait_for(lambda: len(r.hooks.turns) == 2)
    assert r.count(Stt) == 2 and r.hooks.turns[1].user_text == "stop it"  # the ASR script's next line


async def test_confirmed_speech_over_a_reply_interrupts_it_and_keeps_its_start(rig: Any) -> None:
    r = await rig(providers={
        "tts.fake_tone": {"duration_ms": 4000},
        "asr.fake_echo": {"script": ["tell me a long story", "stop it"]},
        # one chunk per reply (no comma or colon to split at): each reply is one 4 s tone, so
        # the second turn ends, and is recorded, within the wait below
        "llm.fake_echo": {"reply": "Here is a long story."},
    })
    await r.session.feed_text(listen("start", mode="realtime"))
    await r.say_words("tell me a long story")
    await r.wait_for(lambda: any(s.audio is not None for s in r.transport.sent))
    await r.say_words("stop it, please")
    await r.wait_for(lambda: len(r.hooks.turns) == 2)
    assert [t.interrupted for t in r.hooks.turns] == [True, False]
    assert r.engine.hearing.accepting  # realtime: the ear kept listening through the interruption
    # The new utterance starts before the decision to interrupt (pre-roll): all the words
    # and some of the silence before them, not just what followed the decision.
    audio = r.hooks.turns[1].audio
    assert audio is not None
    assert len(audio.uplink.packets) * 0.06 >= len(speak("stop it, please")) / 32000 + 0.2

