"""A gateway session's configuration as plain values (built by the consumer from settings;
the session never reads Django settings itself), with the seed's system prompt and the
built-in tools a text client is offered."""
from __future__ import annotations

from dataclasses import dataclass

# Seed §14.1, verbatim.
SYSTEM_PROMPT = """
你是一个名为"听语AI"的语音助手。请遵循以下准则：

1. 回复简洁明了，适合语音播报
2. 避免使用表情符号、特殊符号（如★☆◆◇●■□等）
3. 不要使用Markdown格式（如**加粗**、*斜体*）
4. 使用自然口语化表达
5. 信息准确，如有不确定请说明

当前时间：{current_time}
"""

# Seed §7.2: the gateway offers these built-in tools (not end_conversation: a text client
# ends its session itself with end_session).
SERVER_TOOLS = frozenset({
    "get_weather", "get_current_time", "get_location", "set_response_language",
    "get_response_language", "list_supported_languages", "enter_roleplay_mode",
    "exit_roleplay_mode", "get_roleplay_status", "list_available_characters",
})  # fmt: skip


@dataclass(frozen=True)
class GatewayConfig:
    """Everything a session needs from settings, as plain values (built by the consumer)."""

    model: str  # asked of the LLM configurations that name none: the key's persona's, else LLM_MODEL
    llm_timeout: float = 120.0
    llm_inter_token_timeout: float = 10.0  # LLM_INTER_TOKEN_TIMEOUT: silence after the first token → TIMEOUT
    temperature: float = 0.7
    max_tokens: int = 2048
    max_tokens_limit: int = 2048
    enable_context: bool = False
    history_messages: int = 10
    client_tools_enabled: bool = True
    client_tools_max: int = 32
    client_tool_timeout: float = 30.0
    server_tool_timeout: float = 10.0
    max_message_bytes: int = 1024 * 1024
    idle_timeout: float = 300.0  # CLOUD_PING_TIMEOUT
    idle_check_interval: float = 30.0  # CLOUD_PING_INTERVAL
    max_queued_requests: int = 16
    max_tool_rounds: int = 5
    system_prompt: str = SYSTEM_PROMPT
    timezone: str = "UTC"
    weather_base_url: str = ""
    geocoding_url: str = ""
    characters: tuple[dict[str, str], ...] = ()
