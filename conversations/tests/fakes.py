"""Test doubles shared by the voice session and engine tests: the device's hello, a socket
that records what the session sends, hooks that record what it would persist, and a wait
helper on the event loop's clock (virtual under testing/virtual_time.py)."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from conversations.pipeline.config import SessionInfo
from conversations.turns.record import TurnRecord
from devices.protocol.codec import decode_json
from devices.protocol.messages import Message


def hello_text(version: int = 1, features: dict[str, Any] | None = None) -> str:
    """The firmware's hello (protocol-reference §2.1), compact as the firmware writes it."""
    compact = json.dumps(features or {}, separators=(",", ":"))
    return (f'{{"type":"hello","version":{version},"features":{compact},"transport":"websocket",'
            '"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}')


PLAIN_HELLO = hello_text()
MCP_HELLO = hello_text(features={"mcp": True})


def device_json(session_id: str, body: str) -> str:
    """A device message the way the firmware concatenates it: session_id first."""
    return '{"session_id":"' + session_id + '",' + body + "}"


def listen(state: str, session_id: str = "", **extra: str) -> str:
    return json.dumps({"session_id": session_id, "type": "listen", "state": state, **extra})


@dataclass
class Sent:
    """One frame the session sent: `text` (JSON) or `audio` (binary), at loop time `at`."""

    at: float
    text: str | None = None
    audio: bytes | None = None

    @cached_property
    def message(self) -> Message | None:
        return decode_json(self.text) if self.text is not None else None


class RecordingTransport:
    """The socket (conversations/turns/transport.py): records every frame and the close;
    `on_text` lets a scripted device answer what it receives."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.closed: tuple[int, str] | None = None
        self.on_text: Callable[[str], None] | None = None

    async def send_text(self, text: str) -> None:
        self.sent.append(Sent(_now(), text=text))
        if self.on_text is not None:
            self.on_text(text)

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(Sent(_now(), audio=data))

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    @property
    def frames(self) -> list[str | bytes]:
        return [s.text if s.text is not None else s.audio or b"" for s in self.sent]

    @property
    def first_text_at(self) -> float | None:
        return next((s.at for s in self.sent if s.text is not None), None)

    def messages(self) -> list[dict[str, Any]]:
        """The JSON frames as dicts, as the device parses them."""
        return [json.loads(s.text) for s in self.sent if s.text is not None]

    def decoded(self) -> list[Message]:
        """The JSON frames as protocol messages."""
        return [s.message for s in self.sent if s.message is not None]

    def of_type(self, kind: str, state: str | None = None) -> list[dict[str, Any]]:
        return [m for m in self.messages() if m["type"] == kind and (state is None or m.get("state") == state)]

    def audio(self) -> list[bytes]:
        return [s.audio for s in self.sent if s.audio is not None]

    def count(self, kind: type) -> int:
        return sum(isinstance(m, kind) for m in self.decoded())

    def kinds(self) -> list[str]:
        """Compact wire log: message class names, audio runs collapsed to "audio"."""
        out: list[str] = []
        for s in self.sent:
            name = "audio" if s.audio is not None else type(s.message).__name__
            if not (name == "audio" and out and out[-1] == "audio"):
                out.append(name)
        return out

    def after(self, kind: type) -> list[Sent]:
        """Everything sent after the first message of `kind`."""
        index = next(i for i, s in enumerate(self.sent) if isinstance(s.message, kind))
        return self.sent[index + 1 :]


@dataclass
class RecordingHooks:
    """SessionHooks that record each call as (name, argument); `delay` slows the presence
    write down (a slow database)."""

    delay: float = 0.0
    calls: list[tuple[str, Any]] = field(default_factory=list)

    async def session_started(self, info: SessionInfo) -> None:
        await asyncio.sleep(self.delay)
        self.calls.append(("started", info))

    async def tools_listed(self, server_info: dict, tools: list[dict]) -> None:
        self.calls.append(("tools", (server_info, tools)))

    def turn_finished(self, turn: TurnRecord) -> None:
        self.calls.append(("turn", turn))

    async def session_closed(self, info: SessionInfo) -> None:
        self.calls.append(("closed", info))

    async def touch(self) -> None:
        self.calls.append(("touch", None))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    @property
    def turns(self) -> list[TurnRecord]:
        return [turn for name, turn in self.calls if name == "turn"]


async def until(check: Callable[[], object], timeout: float = 2.0, what: Callable[[], str] | None = None) -> None:
    """Wait (on the loop's clock) until `check()` is true; fail after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time" + (f": {what()}" if what else ""))
        await asyncio.sleep(0.005)


def _now() -> float:
    return asyncio.get_running_loop().time()
