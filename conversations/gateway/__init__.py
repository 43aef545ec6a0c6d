"""The LLM Gateway: a text WebSocket API (seed 001) on the voice pipeline's LLM and tools.

protocol.py (pure wire format) → session.py (one connection, plain asyncio; turn.py runs
the LLM ↔ tools loop, client_tools.py the client's tools, store.py the resumable sessions)
→ consumer.py (thin Channels adapter) → services.py (conversation history in the DB).
"""
from __future__ import annotations
