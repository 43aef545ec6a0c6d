"""The building blocks of the simulated device's MCP tools (mcp/mcp_server.h of the firmware):
`Property`, `Tool`, `ImageResult`, `ToolFailure`, and cJSON-style compact JSON.

Apart from the server (mcp_server.py) so the firmware's tool set (firmware_tools.py) can
build on them without importing the server that installs it.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

PropertyType = Literal["boolean", "integer", "string"]

INT_MIN, INT_MAX = -(2**31), 2**31 - 1


class _NoDefault:
    """Sentinel type: a property without default is required (Property(name, type) in C++)."""

    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()


class ToolFailure(Exception):
    """Raise from a handler to make the device reply with a JSON-RPC error of this text."""


@dataclass(frozen=True)
class ImageResult:
    """The firmware's ImageContent: serialized as a JSON *string* under `image`."""

    mime_type: str
    data: bytes

    def to_json(self) -> str:
        encoded = base64.b64encode(self.data).decode("ascii")
        return compact_json({"type": "image", "mimeType": self.mime_type, "data": encoded})


ToolResult = bool | int | str | dict | list | ImageResult
ToolHandler = Callable[[dict[str, Any]], "ToolResult | Awaitable[ToolResult]"]


@dataclass(frozen=True)
class Property:
    """One tool argument. Only the firmware's three types exist; ranges only on integers."""

    name: str
    type: PropertyType
    default: Any = NO_DEFAULT
    minimum: int | None = None
    maximum: int | None = None

    def __post_init__(self) -> None:
        if self.type not in ("boolean", "integer", "string"):
            raise ValueError(f"unsupported property type {self.type!r}")
        if (self.minimum is not None or self.maximum is not None) and self.type != "integer":
            raise ValueError("Range limits only apply to integer properties")

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT

    def schema(self) -> dict[str, Any]:
        """Key order as Property::to_json: type, default, minimum, maximum."""
        out: dict[str, Any] = {"type": self.type}
        if self.has_default:
            out["default"] = self.default
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out

    def accept(self, value: Any) -> tuple[bool, Any]:
        """Type check as the firmware does: (found, converted value). Raises on range errors."""
        if self.type == "boolean":
            return (True, value) if isinstance(value, bool) else (False, None)
        if self.type == "string":
            return (True, value) if isinstance(value, str) else (False, None)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False, None
        number = valueint(value)
        if self.minimum is not None and number < self.minimum:
            raise ToolFailure(f"Value is below minimum allowed: {self.minimum}")
        if self.maximum is not None and number > self.maximum:
            raise ToolFailure(f"Value exceeds maximum allowed: {self.maximum}")
        return True, number


@dataclass
class Tool:
    """A device tool; `user_only` tools are listed only with withUserTools=true."""

    name: str
    description: str
    properties: tuple[Property, ...] = ()
    handler: ToolHandler | None = None
    user_only: bool = False

    def to_json(self) -> str:
        """McpTool::to_json: name, description, inputSchema, annotations (user-only)."""
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {p.name: p.schema() for p in self.properties},
        }
        required = [p.name for p in self.properties if not p.has_default]
        if required:
            schema["required"] = required
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "inputSchema": schema,
        }
        if self.user_only:
            out["annotations"] = {"audience": ["user"]}
        return compact_json(out)


def compact_json(value: Any) -> str:
    # cJSON_PrintUnformatted: no spaces, UTF-8 kept as is.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def valueint(number: int | float) -> int:
    """cJSON's valueint: truncated toward zero and saturated to the int range."""
    if number != number:  # NaN
        return 0
    if number >= INT_MAX:
        return INT_MAX
    if number <= INT_MIN:
        return INT_MIN
    return int(number)
