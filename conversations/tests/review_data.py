"""Conversations as the history writer stores them, for review-page, export and audio tests:
tool calls (device, MCP, a failure), an interrupted turn, an error, a TTS fallback, and real
speech encoded as the device and the server do (60 ms Opus at 16 kHz up, 24 kHz down)."""
from __future__ import annotations

from typing import Any

from conversations.capture import AttemptLog, TurnAudio
from conversations.models import Conversation, Persona, Turn
from devices.models import Device
from devices.protocol.opus import OpusEncoder
from testing.speech import speak

UTTERANCE = "turn on the kitchen light"
REPLY = "The kitchen light is on now."
DEVICE_TIMINGS = {"speech_end": 0.0, "asr_done": 312.4, "llm_first_token": 803.9, "tts_first_audio": 845.2,
                  "first_frame_sent": 851.0, "last_frame_sent": 2450.7}


def speech_packets(text: str, rate: int) -> list[bytes]:
    """`text` spoken by espeak-ng as 60 ms Opus packets at `rate`."""
    pcm = speak(text, rate=rate)
    encoder = OpusEncoder(rate, 60, bitrate=24000)
    size = encoder.frame_bytes
    return [encoder.encode(pcm[i:i + size]) for i in range(0, len(pcm), size)]


def turn_audio(user_text: str = UTTERANCE, reply_text: str = REPLY) -> TurnAudio:
    audio = TurnAudio.for_rates(uplink_rate=16000, downlink_rate=24000)
    for packet in speech_packets(user_text, 16000):
        audio.uplink.add(packet)
    for packet in speech_packets(reply_text, 24000):
        audio.downlink.add(packet)
    return audio


def tts_fallback_attempts() -> dict[str, Any]:
    log = AttemptLog()
    log.served("asr", "faster_whisper", 310.0)
    log.served("llm", "openai", 490.0)
    log.failed("tts", "edge", ConnectionError("speech.platform.example: Name or service not known"), 12.0)
    log.served("tts", "espeak", 15.0)
    return log.as_json()


def tool_calls() -> list[dict[str, Any]]:
    return [
        {"name": "self.light.turn_on", "llm_name": "self_light_turn_on", "source": "device",
         "arguments": {"room": "kitchen", "brightness": 80}, "result": '{"ok": true, "state": "on"}',
         "success": True, "duration_ms": 48.2, "error": ""},
        {"name": "weather", "llm_name": "weather", "source": "mcp", "arguments": {"city": "Berlin"},
         "result": "MCP server did not answer within 10 s", "success": False, "duration_ms": 10001.0,
         "error": "timeout"},
    ]


def rich_conversation(*, device: Device | None = None, persona: Persona | None = None) -> Conversation:
    """Three turns: a served one with tools and a TTS fallback, an interrupted one, a failed one."""
    conversation = Conversation.objects.create(session_id="3f1c-review", device=device, persona=persona,
                                               client_address="192.0.2.7")
    Turn.objects.create(conversation=conversation, index=0, user_text=UTTERANCE, reply_text=REPLY,
                        emotion="happy", tool_calls=tool_calls(), timings=DEVICE_TIMINGS,
                        providers={"asr": "faster_whisper", "llm": "openai", "tts": "edge,espeak"},
                        provider_attempts=tts_fallback_attempts())
    Turn.objects.create(conversation=conversation, index=1, user_text="tell me a long story",
                        reply_text="Once upon a time there was", emotion="thinking", interrupted=True,
                        timings={"speech_end": 0.0, "asr_done": 290.0, "llm_first_token": 700.0})
    Turn.objects.create(conversation=conversation, index=2, user_text="what is the weather",
                        reply_text="Sorry, I cannot think right now.", error="llm: APIConnectionError",
                        timings={"speech_end": 0.0, "asr_done": 305.0},
                        provider_attempts={"llm": [{"kind": "openai", "ok": False, "error": "APIConnectionError",
                                                    "ms": 2004.5}]})
    return conversation
