"""The one error type of the device wire codec.

Everything that comes off the network can be wrong, so the codec turns every kind of bad
input into a `ProtocolError` the caller can answer (or log) without a traceback.
"""

from __future__ import annotations

from typing import Literal, get_args

ErrorKind = Literal["malformed", "unknown_type", "invalid_field", "too_large"]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)


class ProtocolError(Exception):
    """Bad input on the device wire (JSON text frame or binary audio frame).

    Attributes:
        reason: short human-readable text. It never contains input values, so it is safe
            to log as-is and to send back to a client.
        kind: one of ``ERROR_KINDS``:
            ``malformed`` — not UTF-8, not JSON, not an object, no string ``type``, or a
            binary frame whose header is broken;
            ``unknown_type`` — a JSON ``type`` (or binary frame type) this codec does not know;
            ``invalid_field`` — a known message with a missing, mistyped or out-of-range field;
            ``too_large`` — over the caller's size limit or over what the framing can carry.
    """

    def __init__(self, reason: str, kind: ErrorKind = "malformed") -> None:
        if kind not in ERROR_KINDS:
            # A typo here would silently mis-route error handling in callers.
            raise ValueError(f"unknown ProtocolError kind: {kind!r}")
        super().__init__(reason, kind)
        self.reason: str = reason
        self.kind: ErrorKind = kind

    def __str__(self) -> str:
        return self.reason
