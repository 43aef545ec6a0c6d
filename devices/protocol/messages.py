"""Typed JSON messages of the Xiaozhi device WebSocket protocol.

One frozen dataclass per message; field names are the wire keys (see
docs/protocol-reference.md §2.2, §2.3, §5.1, §7). `devices.protocol.codec` turns them into
the exact wire text and back. Every message carries ``session_id: str | None = None``;
``None`` means "absent on the wire". The empty string is kept as is: the firmware sends
``"session_id":""`` until the server hello has given it one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, get_args

ListenMode: TypeAlias = Literal["auto", "manual", "realtime"]
LISTEN_MODES: tuple[str, ...] = get_args(ListenMode)

# Emotion names understood by the firmware's emoji sets and used by the reference servers
# (protocol-reference §2.3, `llm`). The device accepts any string; this is the vocabulary
# the server should choose from.
EMOTIONS: tuple[str, ...] = (
    "neutral", "happy", "laughing", "funny", "sad", "angry", "crying", "loving",
    "embarrassed", "surprised", "shocked", "thinking", "winking", "cool", "relaxed",
    "delicious", "kissy", "confident", "sleepy", "silly", "confused",
)

JSONObject: TypeAlias = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioParams:
    """``audio_params`` of both hellos.

    Keyword-only because ``sample_rate`` has no sensible shared default (the device always
    announces 16000, the server should announce what it encodes, usually 24000) and a
    positional call could silently swap numbers.
    """

    format: str = "opus"
    sample_rate: int
    channels: int = 1
    frame_duration: int = 60


# Device → server ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """Device hello. ``version`` is the binary framing version (1, 2 or 3).

    ``extra`` keeps top-level keys this codec does not model (e.g. ``text_font``) so that
    nothing the device announced is lost.
    """

    version: int = 1
    features: JSONObject = field(default_factory=dict)
    transport: str = "websocket"
    audio_params: AudioParams | None = None
    extra: JSONObject = field(default_factory=dict)
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class ListenStart:
    mode: ListenMode
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class ListenStop:
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class ListenDetect:
    text: str
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class Abort:
    reason: str | None = None
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class Mcp:
    """JSON-RPC envelope; the same class travels in both directions."""

    payload: JSONObject
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class Goodbye:
    """Channel close notice (MQTT+UDP variant); the same class travels in both directions."""

    session_id: str | None = None


# Server → device ---------------------------------------------------------------------


def _default_server_audio() -> AudioParams:
    # What the firmware assumes when the server hello omits audio_params (§2.2), and what
    # most boards play natively.
    return AudioParams(sample_rate=24000)


@dataclass(frozen=True, slots=True)
class ServerHello:
    session_id: str | None = None
    transport: str = "websocket"
    audio_params: AudioParams = field(default_factory=_default_server_audio)


@dataclass(frozen=True, slots=True)
class Stt:
    text: str
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class Llm:
    """Emotion for the device face; the firmware ignores ``text`` (servers put an emoji)."""

    emotion: str
    text: str = ""
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class TtsStart:
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class TtsSentenceStart:
    text: str
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class TtsSentenceEnd:
    text: str
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class TtsStop:
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class System:
    """Only ``command="reboot"`` does anything on the firmware."""

    command: str
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class Alert:
    """The firmware shows the alert only if all three fields are strings."""

    status: str
    message: str
    emotion: str
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class Custom:
    """Shown by the device only when built with CONFIG_RECEIVE_CUSTOM_MESSAGE."""

    payload: JSONObject
    session_id: str | None = None


DeviceMessage: TypeAlias = Hello | ListenStart | ListenStop | ListenDetect | Abort | Mcp | Goodbye
ServerMessage: TypeAlias = (
    ServerHello | Stt | Llm | TtsStart | TtsSentenceStart | TtsSentenceEnd | TtsStop
    | System | Alert | Custom | Mcp | Goodbye
)
Message: TypeAlias = (
    Hello | ListenStart | ListenStop | ListenDetect | Abort | Mcp | Goodbye
    | ServerHello | Stt | Llm | TtsStart | TtsSentenceStart | TtsSentenceEnd | TtsStop
    | System | Alert | Custom
)
