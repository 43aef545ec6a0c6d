"""Firmware versions and ESP32 application images, read the way the firmware reads them.

Pure: no ORM, no settings. The firmware compares versions with `ParseVersion` (std::getline on
'.', then std::stoi per segment) and `IsNewVersionAvailable` (first differing segment wins,
longer wins on a tie) [FW main/ota.cc]. std::stoi throws on a segment without digits, which
crashes the device, so a version the firmware cannot parse is never offered or compared.
"""
from __future__ import annotations

import re
import struct

INT_MAX = 2**31 - 1
MAX_VERSION_LENGTH = 50  # FirmwareRelease.version max_length

_NUMERIC_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*")
# std::stoi: leading C whitespace, an optional sign, digits; anything after is ignored.
_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")

# esp_image_header_t (24 bytes) + first esp_image_segment_header_t (8) precede esp_app_desc_t.
ESP_IMAGE_MAGIC = 0xE9
APP_DESC_OFFSET = 32
APP_DESC_MAGIC = 0xABCD5432
_APP_VERSION_OFFSET = APP_DESC_OFFSET + 16  # magic, secure_version, reserv1[2]
APP_IMAGE_HEAD_BYTES = _APP_VERSION_OFFSET + 32


def parse_version(text: str) -> tuple[int, ...] | None:
    """Segments as the firmware sees them; None where the firmware would throw."""
    segments = text.split(".")
    # std::getline yields no empty token after a trailing delimiter ("1.2." -> 1, 2; "" -> none).
    if segments[-1] == "":
        segments.pop()
    numbers: list[int] = []
    for segment in segments:
        match = _STOI.match(segment)
        if match is None:
            return None
        value = int(match.group(1))
        if not -INT_MAX - 1 <= value <= INT_MAX:
            return None
        numbers.append(value)
    return tuple(numbers)


def is_newer(candidate: str, current: str) -> bool:
    """True when the firmware running `current` would install `candidate`."""
    new, old = parse_version(candidate), parse_version(current)
    if new is None or old is None:
        return False
    for new_part, old_part in zip(new, old, strict=False):
        if new_part != old_part:
            return new_part > old_part
    return len(new) > len(old)


def version_key(text: str) -> tuple[int, ...]:
    """Sort key for release versions (already validated as numeric)."""
    return parse_version(text) or ()


def is_numeric_version(text: str) -> bool:
    """What a release may carry: dotted decimal numbers the firmware parses exactly."""
    if len(text) > MAX_VERSION_LENGTH or not _NUMERIC_VERSION.fullmatch(text):
        return False
    return all(int(part) <= INT_MAX for part in text.split("."))


def app_image_version(head: bytes) -> str | None:
    """The version embedded in an ESP32 application image, or None if `head` is not one."""
    if len(head) < APP_IMAGE_HEAD_BYTES or head[0] != ESP_IMAGE_MAGIC:
        return None
    (magic,) = struct.unpack_from("<I", head, APP_DESC_OFFSET)
    if magic != APP_DESC_MAGIC:
        return None
    raw = head[_APP_VERSION_OFFSET:APP_IMAGE_HEAD_BYTES].split(b"\0", 1)[0]
    return raw.decode("utf-8", errors="replace")


def fake_app_image(version: str, *, size: int = 4096) -> bytes:
    """A minimal image with a valid header and app descriptor (tests, the simulator, demos)."""
    head = bytearray(APP_IMAGE_HEAD_BYTES)
    head[0] = ESP_IMAGE_MAGIC
    struct.pack_into("<I", head, APP_DESC_OFFSET, APP_DESC_MAGIC)
    encoded = version.encode()[:31]
    head[_APP_VERSION_OFFSET:_APP_VERSION_OFFSET + len(encoded)] = encoded
    return bytes(head) + bytes(max(0, size - len(head)))
