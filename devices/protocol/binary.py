"""Binary WebSocket frames of the device protocol: one Opus packet per message.

Three framings, chosen per connection (docs/protocol-reference.md §4.2):

- v1: the frame is the raw Opus packet;
- v2: 16-byte big-endian header ``version u16 = 2, type u16 = 0, reserved u32,
  timestamp u32 (ms, for server-side AEC), payload_size u32``, then the packet;
- v3: 4-byte header ``type u8 = 0, reserved u8, payload_size u16 (big-endian)``, then the packet.

Decoding is stricter than the firmware (which trusts ``payload_size`` blindly): the size
must equal the bytes that follow, the payload must not be empty, the v2 ``version`` field
must be 2 and the frame type must be 0 (Opus). Type 1 ("JSON in a binary frame") exists in
the firmware's enum but is never sent — JSON always travels as text frames — so it is
refused like any other unknown type. Reserved bytes are ignored.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from devices.protocol.errors import ProtocolError

SUPPORTED_VERSIONS: tuple[int, ...] = (1, 2, 3)
OPUS_FRAME_TYPE = 0

_V2_HEADER = struct.Struct(">HHIII")  # version, type, reserved, timestamp, payload_size
_V3_HEADER = struct.Struct(">BBH")  # type, reserved, payload_size
_U32_MAX = 0xFFFF_FFFF
_U16_MAX = 0xFFFF


@dataclass(frozen=True, slots=True)
class AudioPacket:
    """One Opus packet; ``timestamp`` is only carried by v2 (0 otherwise)."""

    payload: bytes
    timestamp: int = 0


def decode_audio(data: bytes, version: int) -> AudioPacket:
    """Unwrap one binary frame received under framing ``version``.

    Raises:
        ProtocolError: unsupported version, short header, size mismatch, empty payload,
            or a frame type other than Opus.
    """
    _check_version(version)
    raw = _as_bytes(data)
    if version == 1:
        return AudioPacket(payload=_non_empty(raw))
    if version == 2:
        return _decode_v2(raw)
    return _decode_v3(raw)


def encode_audio(payload: bytes, version: int, timestamp: int = 0) -> bytes:
    """Wrap one Opus packet for framing ``version``.

    ``timestamp`` is written only by v2; v1 and v3 have no room for it and drop it, so
    callers may pass it regardless of the negotiated version.

    Raises:
        ProtocolError: unsupported version, empty payload, payload too large for the
            size field, or (v2) a timestamp outside 0..2**32-1.
    """
    _check_version(version)
    packet = _non_empty(_as_bytes(payload))
    if version == 1:
        return packet
    if version == 2:
        return _encode_v2(packet, timestamp)
    if len(packet) > _U16_MAX:
        raise ProtocolError("payload too large for a v3 frame", "too_large")
    return _V3_HEADER.pack(OPUS_FRAME_TYPE, 0, len(packet)) + packet


def negotiate_version(header_value: str | None, hello_version: int | None) -> int:
    """Pick the binary framing for a connection.

    The hello ``version`` wins when given (it is what the firmware's framing code uses);
    otherwise the ``Protocol-Version`` header; otherwise 1. A value that is given but is
    not 1, 2 or 3 raises instead of falling back: a wrong guess turns all audio into
    noise, while an error gets logged and answered. A header is only checked when used.

    Raises:
        ProtocolError: (kind ``invalid_field``) for an unusable value.
    """
    if hello_version is not None:
        _check_version(hello_version)
        return hello_version
    if header_value is None:
        return 1
    text = header_value.strip() if isinstance(header_value, str) else None
    # Compare strings, not int(): int() would accept "+2", "02" or non-ASCII digits.
    if text not in ("1", "2", "3"):
        raise ProtocolError("Protocol-Version header must be 1, 2 or 3", "invalid_field")
    return int(text)


def _check_version(version: object) -> None:
    # type() rather than isinstance(): True must not pass for 1.
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise ProtocolError("unsupported binary protocol version", "invalid_field")


def _as_bytes(data: object) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise ProtocolError("audio frame must be bytes", "malformed")


def _non_empty(payload: bytes) -> bytes:
    if not payload:
        raise ProtocolError("audio frame has an empty payload", "malformed")
    return payload


def _decode_v2(raw: bytes) -> AudioPacket:
    if len(raw) < _V2_HEADER.size:
        raise ProtocolError("v2 frame shorter than its header", "malformed")
    version, frame_type, _reserved, timestamp, size = _V2_HEADER.unpack_from(raw)
    if version != 2:
        raise ProtocolError("v2 frame has a wrong version field", "invalid_field")
    if frame_type != OPUS_FRAME_TYPE:
        raise ProtocolError("binary frame type is not opus", "unknown_type")
    if size != len(raw) - _V2_HEADER.size:
        raise ProtocolError("v2 payload_size does not match the frame length", "malformed")
    return AudioPacket(payload=_non_empty(raw[_V2_HEADER.size:]), timestamp=timestamp)


def _decode_v3(raw: bytes) -> AudioPacket:
    if len(raw) < _V3_HEADER.size:
        raise ProtocolError("v3 frame shorter than its header", "malformed")
    frame_type, _reserved, size = _V3_HEADER.unpack_from(raw)
    if frame_type != OPUS_FRAME_TYPE:
        raise ProtocolError("binary frame type is not opus", "unknown_type")
    if size != len(raw) - _V3_HEADER.size:
        raise ProtocolError("v3 payload_size does not match the frame length", "malformed")
    return AudioPacket(payload=_non_empty(raw[_V3_HEADER.size:]))


def _encode_v2(packet: bytes, timestamp: int) -> bytes:
    if type(timestamp) is not int or not 0 <= timestamp <= _U32_MAX:
        raise ProtocolError("v2 timestamp must fit in 32 bits", "invalid_field")
    if len(packet) > _U32_MAX:
        raise ProtocolError("payload too large for a v2 frame", "too_large")
    return _V2_HEADER.pack(2, OPUS_FRAME_TYPE, 0, timestamp, len(packet)) + packet
