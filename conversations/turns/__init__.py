"""What a conversational turn is, for every kind of client: the device's voice session
(conversations/pipeline/) and the LLM Gateway's text session (conversations/gateway/).

- `transport.py`: the socket as a session sees it (`Transport`);
- `tool_loop.py`: the LLM ↔ tools loop over a fallback chain (`ToolLoop`, `Thought`);
- `record.py`: the finished turn (`TurnRecord`);
- `history.py`: the one process-wide writer of turn history (`HistoryWriter`).

Plain asyncio, no ORM: the history writer is handed its database function.
"""
from __future__ import annotations
