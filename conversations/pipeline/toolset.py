"""The voice session's Toolset: the built-in tools from the start (filtered by the persona's
policy), the persona's remote MCP servers (`SessionConfig.tool_sources`), and the device's
own MCP tools once it has listed them (device_mcp.py adds them)."""
from __future__ import annotations

from conversations.pipeline.config import SessionConfig
from tools.builtin import BuiltinToolSource, SessionToolState
from tools.registry import ToolPolicy, Toolset


def build_toolset(config: SessionConfig) -> tuple[Toolset, SessionToolState]:
    """The session's Toolset with the built-in tools, filtered by the persona's policy."""
    persona = config.persona
    state = SessionToolState(
        timezone=config.device.timezone or "UTC",
        location=config.device.location,
        language=persona.language,
        characters=[dict(c) for c in persona.characters],
    )
    if config.weather_base_url:
        state.weather_base_url = config.weather_base_url
    if config.geocoding_url:
        state.geocoding_url = config.geocoding_url
    allowed = frozenset(persona.server_tools) if persona.server_tools is not None else None
    policy = ToolPolicy(
        server_tools=allowed,
        mcp_servers=frozenset(persona.mcp_servers),
        device_tools=persona.device_tools_enabled,
        device_exclude=frozenset(persona.device_tool_exclusions),
    )
    builtin = BuiltinToolSource(state, allowed, timeout=config.server_tool_timeout)
    return Toolset([builtin, *config.tool_sources], policy), state
