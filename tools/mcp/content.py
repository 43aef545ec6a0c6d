"""Helpers shared by the device and remote MCP clients for turning content into text."""
from __future__ import annotations

import base64
import binascii


def decoded_size(data: str) -> int:
    """Bytes behind a base64 string; an estimate when it is malformed (it is only shown)."""
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data) * 3 // 4
