"""The LLM Gateway: a text WebSocket API (seed 001) on the same turn core as the devices.

protocol.py (pure wire format) → session.py (one connection, plain asyncio; turn.py adds the
gateway's tool handling to the shared LLM ↔ tools loop of conversations/turns/,
client_tools.py the client's tools, store.py the resumable sessions) → consumer.py (thin
Channels adapter; turns go to the process's history writer) → services.py (the LLM chain,
the role-play characters).
"""
from __future__ import annotations
