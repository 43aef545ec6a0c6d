"""How much a tool source may hand us: tools, listing pages, schema size and depth, text.

Every tool source is untrusted input: a device or a gateway client chooses its catalogue, and
a remote MCP server is only as trustworthy as the network in between. These caps keep one
source from stalling the event loop or filling memory (issue 11). The tools code is plain
Python without Django, so the values come in as this dataclass: `tools.apps` builds one from
settings at start-up (`configure`), and code that is not told otherwise uses `current()`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolLimits:
    device_max_tools: int = 64  # TOOLS_DEVICE_MAX_COUNT
    device_max_pages: int = 10  # TOOLS_DEVICE_MAX_PAGES (8000-byte pages)
    mcp_max_tools: int = 128  # TOOLS_MCP_MAX_COUNT, per remote MCP server
    schema_max_bytes: int = 64 * 1024  # TOOLS_SCHEMA_MAX_BYTES, one tool's parameters as JSON
    schema_max_depth: int = 32  # TOOLS_SCHEMA_MAX_DEPTH, nested objects and arrays
    description_max_chars: int = 4096  # TOOLS_DESCRIPTION_MAX_CHARS
    name_max_chars: int = 128  # the MCP specification's limit for tool names

    def max_tools(self, kind: str) -> int | None:
        """Cap for one source of this kind; None for our own server tools. Gateway clients
        are capped by their connection (CLIENT_TOOLS_MAX_COUNT) before any schema work."""
        return {"device": self.device_max_tools, "mcp": self.mcp_max_tools}.get(kind)


_current = ToolLimits()


def configure(limits: ToolLimits) -> None:
    """Set the process-wide limits (called once at start-up from settings)."""
    global _current
    _current = limits


def current() -> ToolLimits:
    return _current
