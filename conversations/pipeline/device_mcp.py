"""The device's own MCP server, driven over the session socket (protocol-reference §5).

`DeviceMcpLink` sends `initialize` with the vision URL and token, then `tools/list` page
after page, stores the list (through the session's hooks) and offers the tools to the LLM,
and serves `tools/call` for the LLM and for commands. The JSON-RPC details live in
`tools.mcp.device.DeviceMcpClient`; this class only decides *when* things happen.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from conversations.pipeline.config import SessionConfig
from tools.errors import ToolError
from tools.mcp.device import DeviceMcpClient, DeviceToolSource
from tools.registry import Toolset, ToolSpec

logger = logging.getLogger(__name__)

# initialize and each tools/list page; a healthy device answers in tens of milliseconds.
MCP_REQUEST_TIMEOUT = 10.0

ListedCallback = Callable[[dict, list[dict]], None]


def tool_record(spec: ToolSpec) -> dict:
    """What is stored on the Device row and shown in the admin."""
    return {
        "name": spec.name,
        "description": spec.description,
        "parameters": spec.parameters,
        "user_only": spec.user_only,
    }


class DeviceMcpLink:
    """MCP with one connected device. Inactive until `activate()` (hello with features.mcp)."""

    def __init__(
        self,
        send_payload: Callable[[dict], Awaitable[None]],
        config: SessionConfig,
        toolset: Toolset,
        on_listed: ListedCallback,
    ) -> None:
        self.client = DeviceMcpClient(send_payload, request_timeout=MCP_REQUEST_TIMEOUT)
        self.source = DeviceToolSource(self.client, timeout=config.device_tool_timeout)
        self._config = config
        self._toolset = toolset
        self._on_listed = on_listed
        self.active = False

    def activate(self) -> None:
        """Called at hello (synchronously) so commands arriving right after it can call tools."""
        self.active = True

    async def setup(self) -> None:
        """initialize, then list every page, store the list and offer the tools to the LLM.

        Runs as a session task after the hello went out; a device that fails any step just
        has no tools this session (logged), the conversation still works.
        """
        self.activate()
        try:
            await self.client.initialize(self._config.vision_url, self._config.vision_token)
            tools = await self.client.list_tools(with_user_tools=True)
        except ToolError as exc:
            logger.warning("device MCP setup failed", extra={"error": str(exc)})
            return
        logger.info("device MCP tools listed", extra={"tool_count": len(tools)})
        self._on_listed(dict(self.client.server_info), [tool_record(t) for t in tools])
        await self._toolset.add_source(self.source)

    def feed(self, payload: dict) -> None:
        """A device `mcp` message; replies for unknown ids are logged and dropped inside."""
        if not self.active:
            logger.warning("device MCP message before MCP was started, dropped")
            return
        self.client.feed(payload)

    async def call(self, name: str, arguments: dict, timeout: float) -> str:
        """Call a device tool for a command; ToolError with a clear text on any failure."""
        if not self.active:
            raise ToolError("the device did not announce MCP support")
        return await self.client.call_tool(name, arguments, timeout=timeout)

    def close(self) -> None:
        """Fail pending calls at once ("device disconnected") instead of at their timeout."""
        self.client.close()
        if self.active:
            self._toolset.remove_source(self.source)
