"""Binary audio framings v1/v2/v3 (docs/protocol-reference.md §4.2) and version negotiation."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.protocol.binary import AudioPacket, decode_audio, encode_audio, negotiate_version
from devices.protocol.errors import ProtocolError

# A 60 ms SILK/CELT-ish Opus packet: TOC byte then data; the codec never looks inside.
OPUS = bytes.fromhex("58 b1 0c 7f 3e")

# Exact frames ⇄ packets: encode(packet) == frame and decode(frame) == packet.
GOLDEN: list[tuple[str, int, bytes, AudioPacket]] = [
    ("v1_raw_opus", 1, OPUS, AudioPacket(OPUS)),
    ("v1_one_byte_dtx", 1, b"\xf8", AudioPacket(b"\xf8")),
    ("v2_no_timestamp", 2,
     bytes.fromhex("0002 0000 00000000 00000000 00000005") + OPUS, AudioPacket(OPUS, 0)),
    ("v2_aec_timestamp", 2,
     bytes.fromhex("0002 0000 00000000 0001e240 00000005") + OPUS, AudioPacket(OPUS, 123456)),
    ("v2_max_timestamp", 2,
     bytes.fromhex("0002 0000 00000000 ffffffff 00000001") + b"\xf8",
     AudioPacket(b"\xf8", 0xFFFF_FFFF)),
    ("v3", 3, bytes.fromhex("00 00 0005") + OPUS, AudioPacket(OPUS)),
    ("v3_largest_payload", 3, b"\x00\x00\xff\xff" + b"\x01" * 0xFFFF,
     AudioPacket(b"\x01" * 0xFFFF)),
]


@pytest.mark.parametrize(("version", "frame", "packet"), [g[1:] for g in GOLDEN],
                         ids=[g[0] for g in GOLDEN])
def test_it_decodes_each_framing_exactly(version: int, frame: bytes, packet: AudioPacket) -> None:
    assert decode_audio(frame, version) == packet


@pytest.mark.parametrize(("version", "frame", "packet"), [g[1:] for g in GOLDEN],
                         ids=[g[0] for g in GOLDEN])
def test_it_encodes_each_framing_exactly(version: int, frame: bytes, packet: AudioPacket) -> None:
    assert encode_audio(packet.payload, version, packet.timestamp) == frame


def _v2(payload: bytes, *, version: int = 2, frame_type: int = 0, reserved: int = 0,
        size: int | None = None) -> bytes:
    size = len(payload) if size is None else size
    return struct.pack(">HHIII", version, frame_type, reserved, 0, size) + payload


def _v3(payload: bytes, *, frame_type: int = 0, reserved: int = 0,
        size: int | None = None) -> bytes:
    size = len(payload) if size is None else size
    return struct.pack(">BBH", frame_type, reserved, size) + payload


REJECTS: list[tuple[str, Any, Any, str]] = [
    ("version_0", OPUS, 0, "invalid_field"),
    ("version_4", OPUS, 4, "invalid_field"),
    ("version_negative", OPUS, -1, "invalid_field"),
    ("version_bool", OPUS, True, "invalid_field"),
    ("version_string", OPUS, "2", "invalid_field"),
    ("version_none", OPUS, None, "invalid_field"),
    ("text_instead_of_bytes", "58b1", 1, "malformed"),
    ("none_instead_of_bytes", None, 2, "malformed"),
    ("v1_empty", b"", 1, "malformed"),
    ("v2_empty", b"", 2, "malformed"),
    ("v2_short_header", _v2(OPUS)[:15], 2, "malformed"),
    ("v2_header_only", _v2(b""), 2, "malformed"),
    ("v2_size_larger_than_data", _v2(OPUS, size=6), 2, "malformed"),
    ("v2_size_smaller_than_data", _v2(OPUS, size=4), 2, "malformed"),
    ("v2_size_huge", _v2(OPUS, size=0xFFFF_FFFF), 2, "malformed"),
    ("v2_wrong_version_field", _v2(OPUS, version=1), 2, "invalid_field"),
    ("v2_json_type_is_not_used", _v2(b'{"type":"stt"}', frame_type=1), 2, "unknown_type"),
    ("v2_unknown_type", _v2(OPUS, frame_type=7), 2, "unknown_type"),
    ("v2_frame_read_as_v3", _v2(OPUS), 3, "malformed"),
    ("v3_empty", b"", 3, "malformed"),
    ("v3_short_header", b"\x00\x00\x00", 3, "malformed"),
    ("v3_header_only", _v3(b""), 3, "malformed"),
    ("v3_size_larger_than_data", _v3(OPUS, size=6), 3, "malformed"),
    ("v3_size_smaller_than_data", _v3(OPUS, size=1), 3, "malformed"),
    ("v3_json_type_is_not_used", _v3(b"{}", frame_type=1), 3, "unknown_type"),
    ("v3_frame_read_as_v2", _v3(OPUS), 2, "malformed"),
]


@pytest.mark.parametrize(("data", "version", "kind"), [r[1:] for r in REJECTS],
                         ids=[r[0] for r in REJECTS])
def test_it_rejects_bad_frames_with_a_typed_error(data: Any, version: Any, kind: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_audio(data, version)
    assert caught.value.kind == kind


@pytest.mark.parametrize(("frame", "version"), [(_v2(OPUS, reserved=0xDEAD_BEEF), 2),
                                                (_v3(OPUS, reserved=0xFF), 3)])
def test_it_ignores_reserved_header_bytes(frame: bytes, version: int) -> None:
    assert decode_audio(frame, version).payload == OPUS


@pytest.mark.parametrize("wrap", [bytearray, memoryview])
def test_it_accepts_any_bytes_like_frame(wrap: Any) -> None:
    packet = decode_audio(wrap(_v2(OPUS)), 2)
    assert packet == AudioPacket(OPUS) and type(packet.payload) is bytes


@pytest.mark.parametrize("version", [1, 3])
def test_it_drops_the_timestamp_where_the_framing_has_no_room(version: int) -> None:
    assert decode_audio(encode_audio(OPUS, version, timestamp=99), version).timestamp == 0


ENCODE_REJECTS: list[tuple[str, Any, Any, Any, str]] = [
    ("v1_empty", b"", 1, 0, "malformed"),
    ("v2_empty", b"", 2, 0, "malformed"),
    ("v3_empty", b"", 3, 0, "malformed"),
    ("v3_too_large", b"\x00" * 0x10000, 3, 0, "too_large"),
    ("v2_negative_timestamp", OPUS, 2, -1, "invalid_field"),
    ("v2_timestamp_past_32_bits", OPUS, 2, 2**32, "invalid_field"),
    ("v2_float_timestamp", OPUS, 2, 1.5, "invalid_field"),
    ("bad_version", OPUS, 5, 0, "invalid_field"),
    ("not_bytes", "opus", 1, 0, "malformed"),
]


@pytest.mark.parametrize(("payload", "version", "timestamp", "kind"),
                         [r[1:] for r in ENCODE_REJECTS], ids=[r[0] for r in ENCODE_REJECTS])
def test_it_refuses_to_encode_what_the_framing_cannot_carry(
    payload: Any, version: Any, timestamp: Any, kind: str,
) -> None:
    with pytest.raises(ProtocolError) as caught:
        encode_audio(payload, version, timestamp)
    assert caught.value.kind == kind


# --- negotiate_version -----------------------------------------------------------------

NEGOTIATED: list[tuple[str | None, int | None, int]] = [
    (None, None, 1),
    ("1", None, 1),
    ("2", None, 2),
    ("3", None, 3),
    (" 3 ", None, 3),
    (None, 2, 2),
    ("1", 3, 3),  # the hello wins over the header
    ("3", 1, 1),
    ("garbage", 2, 2),  # an unused header is not judged
]


@pytest.mark.parametrize(("header", "hello", "expected"), NEGOTIATED)
def test_it_negotiates_the_framing_hello_first_then_header_then_v1(
    header: str | None, hello: int | None, expected: int,
) -> None:
    assert negotiate_version(header, hello) == expected


@pytest.mark.parametrize(("header", "hello"), [
    ("0", None), ("4", None), ("", None), ("two", None), ("+2", None), ("02", None),
    ("٢", None), (b"2", None), (None, 0), (None, 4), (None, True), ("1", 5), (None, "2"),
])
def test_it_refuses_an_unusable_version_instead_of_guessing(header: Any, hello: Any) -> None:
    with pytest.raises(ProtocolError) as caught:
        negotiate_version(header, hello)
    assert caught.value.kind == "invalid_field"


# --- properties ------------------------------------------------------------------------

versions = st.sampled_from([1, 2, 3])


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(min_size=1, max_size=1500), version=versions,
       timestamp=st.integers(0, 0xFFFF_FFFF))
def test_decode_inverts_encode_for_every_version(payload: bytes, version: int,
                                                 timestamp: int) -> None:
    frame = encode_audio(payload, version, timestamp)
    expected_timestamp = timestamp if version == 2 else 0
    assert decode_audio(frame, version) == AudioPacket(payload, expected_timestamp)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64), version=versions | st.integers())
def test_arbitrary_bytes_raise_nothing_but_protocol_error(data: bytes, version: int) -> None:
    try:
        packet = decode_audio(data, version)
    except ProtocolError:
        return
    assert packet.payload and (version == 2 or packet.timestamp == 0)


@settings(max_examples=300, deadline=None)
@given(version=st.integers(0, 3), frame_type=st.integers(0, 2), reserved=st.integers(0, 3),
       timestamp=st.integers(0, 0xFFFF_FFFF), size=st.none() | st.integers(0, 40),
       payload=st.binary(max_size=40), as_v3=st.booleans())
def test_near_valid_headers_decode_only_when_fully_consistent(
    version: int, frame_type: int, reserved: int, timestamp: int, size: int | None,
    payload: bytes, as_v3: bool,
) -> None:
    size = len(payload) if size is None else size  # None: the size the sender should write
    if as_v3:
        frame = struct.pack(">BBH", frame_type, reserved, size) + payload
        consistent = frame_type == 0 and size == len(payload) > 0
    else:
        frame = struct.pack(">HHIII", version, frame_type, reserved, timestamp, size) + payload
        consistent = version == 2 and frame_type == 0 and size == len(payload) > 0
    try:
        packet = decode_audio(frame, 3 if as_v3 else 2)
    except ProtocolError:
        assert not consistent
        return
    assert consistent and packet.payload == payload
    assert packet.timestamp == (0 if as_v3 else timestamp)
