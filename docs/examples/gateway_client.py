"""A Python client for the LLM Gateway, following the seed's example (§10.1).

    .venv/bin/python manage.py gateway_key_create "example"      # prints a key, once
    .venv/bin/python docs/examples/gateway_client.py --url ws://127.0.0.1:8000/llm/v1/ --key xzgw_…

The key goes with the handshake as `Authorization: Bearer <key>`; a client that cannot set
headers (a browser's WebSocket, the seed's C example) appends `?token=<key>` to the URL
instead. Without a valid key the server sends `error` UNAUTHORIZED and closes with 4001.

Connect, switch the conversation context on, register two client tools declared with a
decorator, then ask two questions; when the model wants a client tool the server sends
`tool_callback`, and the client runs the function and answers `tool_result`.

Differences from the seed's listing, all for robustness: it uses the `websockets` asyncio
API (`websockets.asyncio.client.connect`), it reads past messages it is not waiting for
(`status` updates such as `idle`), and tool errors (TOOL_*) are reported as warnings while the
turn goes on to its `llm_response`, which is how the server behaves.
"""
from __future__ import annotations

import argparse
import asyncio
import inspect
import json
from collections.abc import Callable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

# Errors about one tool call: the server still finishes the turn with an llm_response.
TOOL_NOTICES = {"TOOL_NOT_FOUND", "TOOL_EXECUTION_FAILED", "INVALID_TOOL_PARAMETERS", "TOOL_RESULT_TIMEOUT"}


class GatewayError(Exception):
    def __init__(self, message: dict[str, Any]) -> None:
        super().__init__(f"{message.get('code')}: {message.get('message')} ({message.get('details', '')})")
        self.code = str(message.get("code"))


class LLMGatewayClient:
    def __init__(self, url: str = "ws://localhost:9400", *, key: str = "", verbose: bool = True) -> None:
        self.url = url
        self.key = key
        self.verbose = verbose
        self.ws: ClientConnection | None = None
        self.session_id: str | None = None
        self.client_tools: dict[str, Callable[..., Any]] = {}
        self.tool_definitions: list[dict[str, Any]] = []

    def log(self, text: str) -> None:
        if self.verbose:
            print(text)

    async def connect(self) -> None:
        """Open the socket; the server's first message carries our session_id."""
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else None
        self.ws = await connect(self.url, max_size=2**20, additional_headers=headers)
        status = await self._receive()
        if status["type"] == "error":  # UNAUTHORIZED (then close 4001) or RATE_LIMITED (1013)
            raise GatewayError(status)
        if status["type"] == "status" and status["status"] == "connected":
            self.session_id = status["data"]["session_id"]
            self.log(f"Connected. Session ID: {self.session_id}")

    def define_tool(self, name: str, description: str, parameters: dict[str, Any]) -> Callable:
        """Decorator: declare a client tool and the function that runs it."""

        def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
            self.client_tools[name] = func
            self.tool_definitions.append({"name": name, "description": description, "parameters": parameters})
            return func

        return decorator

    async def register_tools(self, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Send the tool definitions (by default every decorated tool) and wait for the answer."""
        await self._send({"type": "register_tools", "tools": tools if tools is not None else self.tool_definitions})
        while True:
            response = await self._receive()
            if response["type"] == "error":
                self.log(f"  ! {response['code']}: {response['message']} {response.get('details', '')}")
            elif response["type"] == "tools_registered":
                break
        self.log(f"Registered {response['count']} tools")
        for tool in response["tools"]:
            outcome = "OK" if tool["status"] == "registered" else f"FAILED - {tool.get('error', 'Unknown error')}"
            self.log(f"  - {tool['name']}: {outcome}")
        return response

    async def configure(self, **options: Any) -> None:
        """temperature (0.0–1.0), max_tokens, enable_context; the server does not reply."""
        await self._send({"type": "configure", **options})

    async def start_session(self, session_id: str | None = None) -> str:
        """Resume a session (after a reconnect) or start a new one."""
        await self._send({"type": "start_session", **({"session_id": session_id} if session_id else {})})
        while True:
            response = await self._receive()
            if response["type"] == "error":
                raise GatewayError(response)
            if response["type"] == "status" and response["status"] == "connected":
                self.session_id = response["data"]["session_id"]
                return self.session_id

    async def send_text(self, text: str) -> str:
        """Ask; run client tools when called back; return the reply's content."""
        if self.ws is None:
            await self.connect()
        await self._send({"type": "text_input", "text": text, "session_id": self.session_id})
        while True:
            response = await self._receive()
            kind = response["type"]
            if kind == "tool_call":
                self.log(f"Server tool called: {response['tool_name']} -> {response['result']}")
            elif kind == "tool_callback":
                await self._handle_tool_callback(response)
            elif kind == "llm_response":
                return str(response["content"])
            elif kind == "error" and response["code"] in TOOL_NOTICES:
                self.log(f"  ! {response['code']}: {response.get('details', '')}")
            elif kind == "error":
                raise GatewayError(response)

    async def _handle_tool_callback(self, callback: dict[str, Any]) -> None:
        call_id, tool_name = callback["call_id"], callback["tool_name"]
        arguments = callback.get("arguments") or {}
        self.log(f"Client tool called: {tool_name} with {arguments}")
        if tool_name not in self.client_tools:
            await self._send_tool_result(call_id, success=False, error=f"Tool '{tool_name}' not found")
            return
        try:
            result = await self._execute_tool(tool_name, arguments)
        except Exception as exc:  # the tool's failure is reported to the server, not raised
            await self._send_tool_result(call_id, success=False, error=str(exc))
            return
        await self._send_tool_result(call_id, result, success=True)

    async def _execute_tool(self, tool_name: str, arguments: dict[str, Any]) -> Any:
        func = self.client_tools[tool_name]
        result = func(**arguments)
        return await result if inspect.isawaitable(result) else result

    async def _send_tool_result(
        self, call_id: str, result: Any = None, *, success: bool = True, error: str | None = None
    ) -> None:
        message: dict[str, Any] = {"type": "tool_result", "call_id": call_id, "success": success}
        if success:
            message["result"] = result
        else:
            message["error"] = error
        await self._send(message)

    async def ping(self) -> dict[str, Any]:
        await self._send({"type": "ping"})
        while (response := await self._receive())["type"] != "pong":
            pass
        return response

    async def end_session(self) -> None:
        await self._send({"type": "end_session"})

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
            self.ws = None

    async def _send(self, message: dict[str, Any]) -> None:
        assert self.ws is not None, "connect() first"
        await self.ws.send(json.dumps(message, ensure_ascii=False))

    async def _receive(self) -> dict[str, Any]:
        assert self.ws is not None, "connect() first"
        return json.loads(await self.ws.recv())


async def main(url: str, key: str) -> list[str]:
    client = LLMGatewayClient(url, key=key)

    @client.define_tool("get_battery", "获取设备当前电量百分比", {"type": "object", "properties": {}, "required": []})
    async def get_battery() -> dict[str, Any]:
        return {"level": 85, "charging": False}  # a real device reads its hardware here

    @client.define_tool(
        "set_volume",
        "设置设备音量",
        {
            "type": "object",
            "properties": {"volume": {"type": "integer", "description": "音量值 0-100", "minimum": 0, "maximum": 100}},
            "required": ["volume"],
        },
    )
    async def set_volume(volume: int) -> dict[str, Any]:
        return {"volume": volume, "status": "set"}

    replies = []
    try:
        await client.connect()
        await client.configure(enable_context=True)
        await client.register_tools()
        for question in ("我的电量还剩多少？", "把音量调到50"):
            reply = await client.send_text(question)
            print(f"Response: {reply}")
            replies.append(reply)
    finally:
        await client.close()
    return replies


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8000/llm/v1/", help="gateway WebSocket URL")
    parser.add_argument("--key", default="", help="gateway API key (see above)")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.url, arguments.key))
