"""JSON text frames of the device protocol: wire text ⇄ typed messages.

`decode_json` is total: for any input it returns a message or raises `ProtocolError`,
never anything else, because its input comes straight off the network. It is strict on
the fields a receiver acts on (types, ``state``, ``mode``, required strings) and lenient
on everything else (unknown keys are ignored; unknown hello keys are kept in
``Hello.extra``). It decodes both directions: the server uses it for device frames, the
device simulator for server frames.

`encode_json` writes the exact shapes of docs/protocol-reference.md: compact, UTF-8 kept
as is, device messages with ``session_id`` first (the firmware concatenates strings that
way), server messages with ``session_id`` last (as the reference servers do).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, cast

from devices.protocol.errors import ErrorKind, ProtocolError
from devices.protocol.messages import (
    LISTEN_MODES,
    Abort,
    Alert,
    AudioParams,
    Custom,
    Goodbye,
    Hello,
    JSONObject,
    ListenDetect,
    ListenMode,
    ListenStart,
    ListenStop,
    Llm,
    Mcp,
    Message,
    ServerHello,
    Stt,
    System,
    TtsSentenceEnd,
    TtsSentenceStart,
    TtsStart,
    TtsStop,
)

# Deep enough for any JSON-RPC payload (tool schemas nest ~6 levels), shallow enough that
# later consumers (json.dumps, JSONField, repr) never hit the recursion limit.
MAX_DEPTH = 64

# Keys the Hello dataclass models; anything else at the top level goes to Hello.extra.
_HELLO_KEYS = frozenset({"type", "version", "features", "transport", "audio_params", "session_id"})


class _BadNumber(ValueError):
    """Raised from json hooks; NaN/Infinity cannot be re-encoded, so they are refused."""


# --- decoding: text and structure ------------------------------------------------------


def decode_json(data: str | bytes, *, max_bytes: int | None = None) -> Message:
    """Parse one JSON text frame into a message.

    Args:
        data: the frame as received (``str`` from a text frame, or UTF-8 ``bytes``).
        max_bytes: optional limit on the UTF-8 size of the frame.

    Raises:
        ProtocolError: for any input that is not a well-formed known message.
    """
    obj = _parse_object(_as_text(data, max_bytes))
    msg_type = obj.get("type")
    if not isinstance(msg_type, str):
        raise ProtocolError("message has no string 'type'", "malformed")
    decoder = _DECODERS.get(msg_type)
    if decoder is None:
        raise ProtocolError("unknown message type", "unknown_type")
    return decoder(obj, _opt_str(obj, "session_id"))


def _as_text(data: object, max_bytes: int | None) -> str:
    if isinstance(data, str):
        _check_text_size(data, max_bytes)
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
        if max_bytes is not None and len(raw) > max_bytes:
            raise ProtocolError("message too large", "too_large")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("message is not valid UTF-8", "malformed") from None
    raise ProtocolError("message must be text or bytes", "malformed")


def _check_text_size(text: str, max_bytes: int | None) -> None:
    # A character is 1..4 UTF-8 bytes: decide from len() when possible, encode otherwise.
    if max_bytes is None or len(text) * 4 <= max_bytes:
        return
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise ProtocolError("message too large", "too_large")


def _parse_object(text: str) -> JSONObject:
    try:
        obj = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise ProtocolError("message nested too deeply", "too_large") from None
    except ValueError:  # JSONDecodeError, _BadNumber, int digit limit
        raise ProtocolError("message is not valid JSON", "malformed") from None
    if not isinstance(obj, dict):
        raise ProtocolError("message is not a JSON object", "malformed")
    _check_tree(obj)
    return obj


def _refuse_constant(name: str) -> Any:
    raise _BadNumber(name)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # e.g. 1e400 overflows to inf
        raise _BadNumber(literal)
    return value


def _check_tree(root: JSONObject) -> None:
    """Refuse over-deep nesting and lone surrogates anywhere in the decoded value.

    A ``"\\ud800"`` escape decodes to a str that cannot be encoded to UTF-8; echoed back
    later (e.g. a wake word shown as ``stt``) it would crash the send path instead of here.
    Iterative, so the check itself cannot overflow the stack.
    """
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > MAX_DEPTH:
                raise ProtocolError("message nested too deeply", "too_large")
            for key, value in node.items():
                _check_str(key)
                stack.append((value, depth + 1))
        elif isinstance(node, list):
            if depth > MAX_DEPTH:
                raise ProtocolError("message nested too deeply", "too_large")
            stack.extend((value, depth + 1) for value in node)
        elif isinstance(node, str):
            _check_str(node)


def _check_str(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError("message contains invalid unicode", "malformed") from None


# --- decoding: fields ------------------------------------------------------------------


def _invalid(reason: str, kind: ErrorKind = "invalid_field") -> ProtocolError:
    return ProtocolError(reason, kind)


def _req_str(obj: JSONObject, key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise _invalid(f"field '{key}' must be a string")
    return value


def _opt_str(obj: JSONObject, key: str) -> str | None:
    """Absent and null both mean "not given"."""
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise _invalid(f"field '{key}' must be a string")
    return value


def _req_obj(obj: JSONObject, key: str) -> JSONObject:
    value = obj.get(key)
    if not isinstance(value, dict):
        raise _invalid(f"field '{key}' must be an object")
    return value


def _opt_int(obj: JSONObject, key: str, default: int, low: int, high: int, label: str) -> int:
    value = obj.get(key)
    if value is None:
        return default
    # type() rather than isinstance(): JSON true/false are bools, and bool is an int.
    if type(value) is not int:
        raise _invalid(f"field '{label}' must be an integer")
    if not low <= value <= high:
        raise _invalid(f"field '{label}' is out of range")
    return value


def _decode_audio_params(value: object, default_rate: int) -> AudioParams:
    """Missing keys take the firmware's defaults; present keys must have the right type."""
    if not isinstance(value, dict):
        raise _invalid("field 'audio_params' must be an object")
    fmt = _opt_str(value, "format")
    return AudioParams(
        format="opus" if fmt is None else fmt,
        sample_rate=_opt_int(value, "sample_rate", default_rate, 1, 384_000,
                             "audio_params.sample_rate"),
        channels=_opt_int(value, "channels", 1, 1, 8, "audio_params.channels"),
        frame_duration=_opt_int(value, "frame_duration", 60, 1, 10_000,
                                "audio_params.frame_duration"),
    )


# --- decoding: one function per wire type ----------------------------------------------


def _decode_hello(obj: JSONObject, session_id: str | None) -> Hello | ServerHello:
    # Both directions use type "hello". The firmware always sends "features" (an empty
    # object when built without MCP); no server hello has it. "version" cannot decide:
    # the reference Python server puts "version":1 in its hello too.
    if "features" in obj:
        return _decode_device_hello(obj, session_id)
    return _decode_server_hello(obj, session_id)


def _decode_device_hello(obj: JSONObject, session_id: str | None) -> Hello:
    version = _opt_int(obj, "version", 1, 1, 3, "version")
    features = obj.get("features")
    if features is not None and not isinstance(features, dict):
        raise _invalid("field 'features' must be an object")
    transport = _opt_str(obj, "transport")
    params = obj.get("audio_params")
    return Hello(
        version=version,
        features={} if features is None else features,
        transport="websocket" if transport is None else transport,
        audio_params=None if params is None else _decode_audio_params(params, 16000),
        extra={k: v for k, v in obj.items() if k not in _HELLO_KEYS},
        session_id=session_id,
    )


def _decode_server_hello(obj: JSONObject, session_id: str | None) -> ServerHello:
    # Required: a missing or non-string transport crashes the firmware (reference §11.3).
    transport = _req_str(obj, "transport")
    params = obj.get("audio_params")
    if params is None:
        return ServerHello(session_id=session_id, transport=transport)
    return ServerHello(session_id=session_id, transport=transport,
                       audio_params=_decode_audio_params(params, 24000))


def _decode_listen(obj: JSONObject, session_id: str | None) -> Message:
    state = _req_str(obj, "state")
    if state == "start":
        mode = _req_str(obj, "mode")
        if mode not in LISTEN_MODES:
            raise _invalid("field 'mode' must be auto, manual or realtime")
        return ListenStart(mode=cast(ListenMode, mode), session_id=session_id)
    if state == "stop":
        return ListenStop(session_id=session_id)
    if state == "detect":
        return ListenDetect(text=_req_str(obj, "text"), session_id=session_id)
    raise _invalid("unknown listen state")


def _decode_tts(obj: JSONObject, session_id: str | None) -> Message:
    state = _req_str(obj, "state")
    if state == "start":
        return TtsStart(session_id=session_id)
    if state == "stop":
        return TtsStop(session_id=session_id)
    if state == "sentence_start":
        return TtsSentenceStart(text=_req_str(obj, "text"), session_id=session_id)
    if state == "sentence_end":
        return TtsSentenceEnd(text=_req_str(obj, "text"), session_id=session_id)
    raise _invalid("unknown tts state")


def _decode_llm(obj: JSONObject, session_id: str | None) -> Llm:
    text = _opt_str(obj, "text")  # ignored by the firmware, so optional
    return Llm(emotion=_req_str(obj, "emotion"), text="" if text is None else text,
               session_id=session_id)


def _decode_alert(obj: JSONObject, session_id: str | None) -> Alert:
    return Alert(status=_req_str(obj, "status"), message=_req_str(obj, "message"),
                 emotion=_req_str(obj, "emotion"), session_id=session_id)


_Decoder = Callable[[JSONObject, str | None], Message]

_DECODERS: dict[str, _Decoder] = {
    "hello": _decode_hello,
    "listen": _decode_listen,
    "abort": lambda o, sid: Abort(reason=_opt_str(o, "reason"), session_id=sid),
    "mcp": lambda o, sid: Mcp(payload=_req_obj(o, "payload"), session_id=sid),
    "goodbye": lambda o, sid: Goodbye(session_id=sid),
    "stt": lambda o, sid: Stt(text=_req_str(o, "text"), session_id=sid),
    "llm": _decode_llm,
    "tts": _decode_tts,
    "system": lambda o, sid: System(command=_req_str(o, "command"), session_id=sid),
    "alert": _decode_alert,
    "custom": lambda o, sid: Custom(payload=_req_obj(o, "payload"), session_id=sid),
}


# --- encoding --------------------------------------------------------------------------


def encode_json(message: Message) -> str:
    """Serialize a message to its exact wire text (compact JSON, non-ASCII kept as is).

    Raises:
        TypeError: ``message`` is not a protocol message.
        ValueError: a ``Hello.extra`` key collides with a modelled key, or a payload holds
            NaN/Infinity. Both are programming errors, not bad input.
    """
    encoder = _ENCODERS.get(type(message))
    if encoder is None:
        raise TypeError(f"not a protocol message: {type(message).__name__}")
    return json.dumps(encoder(message), separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def _device(msg_type: str, session_id: str | None, **fields: Any) -> JSONObject:
    # Firmware order: {"session_id":"S","type":...,...}
    out: JSONObject = {} if session_id is None else {"session_id": session_id}
    out["type"] = msg_type
    out.update(fields)
    return out


def _server(msg_type: str, session_id: str | None, **fields: Any) -> JSONObject:
    # Reference-server order: {"type":...,...,"session_id":"S"}
    out: JSONObject = {"type": msg_type, **fields}
    if session_id is not None:
        out["session_id"] = session_id
    return out


def _audio_params(params: AudioParams) -> JSONObject:
    return {"format": params.format, "sample_rate": params.sample_rate,
            "channels": params.channels, "frame_duration": params.frame_duration}


def _encode_hello(m: Hello) -> JSONObject:
    if not _HELLO_KEYS.isdisjoint(m.extra):
        raise ValueError("Hello.extra must not repeat a modelled hello key")
    # Firmware order: type, version, features, text_font (an extra), transport, audio_params.
    out = _device("hello", m.session_id, version=m.version, features=m.features)
    out.update(m.extra)
    out["transport"] = m.transport
    if m.audio_params is not None:
        out["audio_params"] = _audio_params(m.audio_params)
    return out


def _encode_server_hello(m: ServerHello) -> JSONObject:
    # Reference §2.2 order puts session_id between transport and audio_params.
    out: JSONObject = {"type": "hello", "transport": m.transport}
    if m.session_id is not None:
        out["session_id"] = m.session_id
    out["audio_params"] = _audio_params(m.audio_params)
    return out


def _encode_abort(m: Abort) -> JSONObject:
    if m.reason is None:
        return _device("abort", m.session_id)
    return _device("abort", m.session_id, reason=m.reason)


_ENCODERS: dict[type, Callable[[Any], JSONObject]] = {
    Hello: _encode_hello,
    ListenStart: lambda m: _device("listen", m.session_id, state="start", mode=m.mode),
    ListenStop: lambda m: _device("listen", m.session_id, state="stop"),
    ListenDetect: lambda m: _device("listen", m.session_id, state="detect", text=m.text),
    Abort: _encode_abort,
    Mcp: lambda m: _device("mcp", m.session_id, payload=m.payload),
    Goodbye: lambda m: _device("goodbye", m.session_id),
    ServerHello: _encode_server_hello,
    Stt: lambda m: _server("stt", m.session_id, text=m.text),
    Llm: lambda m: _server("llm", m.session_id, text=m.text, emotion=m.emotion),
    TtsStart: lambda m: _server("tts", m.session_id, state="start"),
    TtsSentenceStart: lambda m: _server("tts", m.session_id, state="sentence_start",
                                        text=m.text),
    TtsSentenceEnd: lambda m: _server("tts", m.session_id, state="sentence_end", text=m.text),
    TtsStop: lambda m: _server("tts", m.session_id, state="stop"),
    System: lambda m: _server("system", m.session_id, command=m.command),
    Alert: lambda m: _server("alert", m.session_id, status=m.status, message=m.message,
                             emotion=m.emotion),
    Custom: lambda m: _server("custom", m.session_id, payload=m.payload),
}
