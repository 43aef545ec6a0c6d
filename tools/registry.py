"""One registry through which the LLM sees and calls every tool, whatever its source.

Sources (built-in server tools, remote MCP servers, the device's own MCP server, gateway
clients) implement the small `ToolSource` protocol. A `Toolset` (one per session) lists them
concurrently, checks every listing against the caps and schema rules of tools/limits.py and
tools/schemas.py (in the schema thread: sources are untrusted, schemas can be big), filters
it through a `ToolPolicy`, gives each tool an LLM-safe name and dispatches calls. `Toolset.call`
never raises (except `asyncio.CancelledError`, so that an interrupted turn really stops): every
failure becomes a `ToolCallRecord` with `success=False` and a clear text for the LLM, because a
traceback helps nobody mid-sentence.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from tools import limits as tool_limits
from tools.errors import SchemaRefused, ToolError
from tools.limits import ToolLimits
from tools.naming import NameMap
from tools.schemas import compile_schema, first_error, in_schema_thread

logger = logging.getLogger(__name__)

_MAX_LISTED = 40  # tool names quoted back to the LLM after an unknown-tool call
_MAX_LOGGED_REFUSALS = 10


@dataclass(frozen=True)
class ToolSpec:
    name: str  # the source's own name, e.g. "self.audio_speaker.set_volume"
    description: str
    parameters: dict  # JSON schema (object)
    source: str  # "server" | "mcp" | "device" | "client"
    user_only: bool = False  # device tools with annotations.audience == ["user"]
    origin: str = ""  # e.g. MCP server name


@runtime_checkable
class ToolSource(Protocol):
    """Anything that can list and call tools.

    `call` returns the text the LLM will read and raises ToolError with a clear message on
    failure. A source may also carry an `origin: str` attribute (the MCP server name); the
    Toolset uses it to tell two sources of the same kind apart.
    """

    kind: str  # "server" | "mcp" | "device" | "client"
    timeout: float  # seconds a single call may take

    async def list_tools(self) -> list[ToolSpec]: ...

    async def call(self, name: str, arguments: dict) -> str: ...


@dataclass
class ToolCallRecord:
    """What happened when the LLM called a tool; stored in conversation history.

    `error` is a short machine-readable code ("" on success): unknown_tool,
    invalid_json, invalid_arguments, timeout, tool_error, exception.
    """

    name: str
    llm_name: str
    source: str
    arguments: dict
    result: str
    success: bool
    duration_ms: float
    error: str = ""


@dataclass(frozen=True)
class ToolPolicy:
    """Which tools a persona may offer to the LLM.

    `server_tools` / `mcp_servers` are allow-lists (None = all); MCP servers are matched by
    origin name. User-only device tools are never offered, whatever the policy says: the
    firmware marks them so because an LLM must not reboot or re-flash the device.
    """

    server_tools: frozenset[str] | None = None
    mcp_servers: frozenset[str] | None = None
    device_tools: bool = True
    device_exclude: frozenset[str] = field(default_factory=frozenset)

    def allows(self, spec: ToolSpec) -> bool:
        if spec.user_only:
            return False
        if spec.source == "server":
            return self.server_tools is None or spec.name in self.server_tools
        if spec.source == "mcp":
            return self.mcp_servers is None or spec.origin in self.mcp_servers
        if spec.source == "device":
            return self.device_tools and spec.name not in self.device_exclude
        return True


@dataclass(frozen=True)
class PreparedTool:
    """A tool whose parameters passed tools.schemas: what the LLM sees, and its validator."""

    spec: ToolSpec
    parameters: dict
    validator: Validator


@dataclass(frozen=True)
class _Entry:
    """A tool as the Toolset offers it: prepared tool, owner and LLM name."""

    tool: PreparedTool
    source_key: str
    llm_name: str

    @property
    def spec(self) -> ToolSpec:
        return self.tool.spec


class _CallFailed(Exception):
    """Internal: a call step failed; carries the record fields for the LLM."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


def source_key(source: ToolSource) -> str:
    """Base key of a source: its kind, plus the origin when it has one ("mcp:weather")."""
    origin = getattr(source, "origin", "") or ""
    return f"{source.kind}:{origin}" if origin else source.kind


def empty_schema() -> dict[str, Any]:
    """The schema of a tool without parameters (a fresh dict each time: callers mutate)."""
    return {"type": "object", "properties": {}}


def llm_parameters(schema: object) -> dict:
    """A parameters object OpenAI accepts, whatever a remote source sent."""
    if not isinstance(schema, dict):
        return empty_schema()
    params = dict(schema)
    params.setdefault("type", "object")
    if params["type"] != "object":
        # MCP requires an object schema; anything else would make the LLM API refuse
        # the whole request, not just this tool.
        return empty_schema()
    params.setdefault("properties", {})
    return params


def prepare_tools(
    specs: list[ToolSpec], kind: str, limits: ToolLimits
) -> tuple[list[PreparedTool], list[tuple[str, str]]]:
    """Check one source's listing against the limits: (usable tools, [(name, why refused)]).

    Blocking (schema compilation): run it with `in_schema_thread`. Tools past the source's
    cap are dropped unchecked; an over-long description is cut, not refused.
    """
    cap = limits.max_tools(kind)
    prepared: list[PreparedTool] = []
    refused: list[tuple[str, str]] = []
    if cap is not None and len(specs) > cap:
        refused.append((f"{len(specs) - cap} more", f"more than {cap} tools from one source"))
        specs = specs[:cap]
    for spec in specs:
        try:
            prepared.append(prepare_tool(spec, limits))
        except SchemaRefused as exc:
            refused.append((spec.name[:limits.name_max_chars], str(exc)))
    return prepared, refused


# Prepared listings by their content: every device of a firmware lists the same tools, and a
# reboot storm connects thousands within seconds. The key is the listing itself (JSON of every
# field of every spec, in order), the source kind and the limits, so a changed list, a changed
# schema or new limits are a new key; the value is immutable (frozen tools, a validator that
# compile_schema shares anyway, parameter dicts nobody mutates) and shared by the sessions.
# Only for our own tools and the device's: a device's listing arrived as at most
# TOOLS_DEVICE_MAX_PAGES text frames parsed on the event loop, so its key costs about as much
# again; a remote MCP catalogue may be megabytes, and is not turned into text on the loop.
_PREPARED_MAX = 256
_CACHED_KINDS = frozenset({"server", "device"})
_prepared: dict[tuple[str, ToolLimits, str], tuple[list[PreparedTool], list[tuple[str, str]]]] = {}
_prepared_lock = threading.Lock()


def listing_key(specs: list[ToolSpec], kind: str, limits: ToolLimits) -> tuple[str, ToolLimits, str] | None:
    """The cache key of one source's listing; None when it is not cached (another kind of
    source, or a schema that is not plain JSON)."""
    if kind not in _CACHED_KINDS:
        return None
    try:
        text = json.dumps([[s.name, s.description, s.parameters, s.source, s.user_only, s.origin] for s in specs],
                          ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return kind, limits, text


def prepared_cached(key: tuple[str, ToolLimits, str] | None) -> tuple[list[PreparedTool], list[tuple[str, str]]] | None:
    """A listing prepared before with the same key (copies of the lists), or None."""
    found = _prepared.get(key) if key is not None else None
    return (list(found[0]), list(found[1])) if found is not None else None


def prepare_tools_cached(
    specs: list[ToolSpec], kind: str, limits: ToolLimits, key: tuple[str, ToolLimits, str] | None,
) -> tuple[list[PreparedTool], list[tuple[str, str]]]:
    """`prepare_tools`, remembered under `key` (from `listing_key`). Blocking: schema thread."""
    tools, refused = prepare_tools(specs, kind, limits)
    if key is not None:
        with _prepared_lock:  # two schema threads
            if len(_prepared) >= _PREPARED_MAX:
                _prepared.pop(next(iter(_prepared)))
            _prepared[key] = (list(tools), list(refused))
    return tools, refused


def prepared_clear() -> None:
    _prepared.clear()


def prepare_tool(spec: ToolSpec, limits: ToolLimits) -> PreparedTool:
    """One tool, or SchemaRefused saying why it cannot be offered."""
    if len(spec.name) > limits.name_max_chars:
        raise SchemaRefused("Tool name is too long",
                            f"{len(spec.name)} characters; the limit is {limits.name_max_chars}")
    if len(spec.description) > limits.description_max_chars:
        spec = dataclasses.replace(spec, description=spec.description[: limits.description_max_chars])
    parameters = llm_parameters(spec.parameters)
    validator = compile_schema(parameters, max_bytes=limits.schema_max_bytes, max_depth=limits.schema_max_depth)
    return PreparedTool(spec, parameters, validator)


class Toolset:
    """All tools one session may use, under LLM-safe names.

    Build it with the sources known at start, `await refresh()`, then hand `llm_tools()` to
    the LLM and route its calls to `call()`. Sources that appear later (the device's MCP
    server after hello, tools registered by a gateway client) join with `add_source()`.
    """

    def __init__(
        self,
        sources: list[ToolSource],
        policy: ToolPolicy | None = None,
        *,
        list_timeout: float = 30.0,
        limits: ToolLimits | None = None,
    ) -> None:
        self._policy = policy or ToolPolicy()
        self._list_timeout = list_timeout
        self._limits = limits or tool_limits.current()
        self._sources: dict[str, ToolSource] = {}
        self._tools: dict[str, list[PreparedTool]] = {}
        self._built: dict[str, _Entry] | None = {}  # None: sources changed, built at the next read
        for source in sources:
            self._register(source)

    # -- sources ---------------------------------------------------------------------------

    def _register(self, source: ToolSource) -> str:
        base = source_key(source)
        key, n = base, 1
        while key in self._sources:
            n += 1
            key = f"{base}#{n}"
        self._sources[key] = source
        return key

    def _key_of(self, source: ToolSource) -> str | None:
        return next((k for k, s in self._sources.items() if s is source), None)

    @property
    def sources(self) -> list[ToolSource]:
        return list(self._sources.values())

    async def add_source(self, source: ToolSource) -> None:
        """Register a source and list its tools now (the others are not re-listed)."""
        key = self._key_of(source) or self._register(source)
        await self._list_one(key, source)
        self._rebuild()

    def remove_source(self, source: ToolSource) -> None:
        """Forget a source and its tools (device disconnected, client unregistered)."""
        key = self._key_of(source)
        if key is None:
            return
        del self._sources[key]
        self._tools.pop(key, None)
        self._rebuild()

    async def refresh(self) -> None:
        """List every source concurrently; a failing source just contributes no tools."""
        items = list(self._sources.items())
        await asyncio.gather(*(self._list_one(key, source) for key, source in items))
        self._rebuild()

    async def _list_one(self, key: str, source: ToolSource) -> None:
        try:
            async with asyncio.timeout(self._list_timeout):
                specs = await source.list_tools()
            # Checking schemas takes milliseconds each: never on the event loop. A listing
            # seen before (the same firmware's tools) is taken as prepared then, without a hop.
            specs = list(specs)
            listing = listing_key(specs, source.kind, self._limits)
            cached = prepared_cached(listing)
            if cached is not None:
                tools, refused = cached
            else:
                tools, refused = await in_schema_thread(prepare_tools_cached, specs, source.kind, self._limits,
                                                        listing)
        except (ToolError, TimeoutError) as exc:
            # Expected (server down, device slow): no traceback, the reason is enough.
            reason = str(exc) or type(exc).__name__
            logger.warning(
                "tool source listing failed", extra={"tool_source": key, "reason": reason}
            )
            tools, refused = [], []
        except Exception:
            logger.exception("tool source listing failed", extra={"tool_source": key})
            tools, refused = [], []
        if refused:
            logger.warning(
                "tools refused",
                extra={"tool_source": key, "refused_count": len(refused),
                       "refused": refused[:_MAX_LOGGED_REFUSALS]},
            )
        # The source may have been removed while we were waiting for it.
        if self._sources.get(key) is source:
            self._tools[key] = tools

    # -- catalogue -------------------------------------------------------------------------

    def _allowed(self) -> Iterable[tuple[str, PreparedTool]]:
        for key, tools in self._tools.items():
            seen: set[str] = set()
            for tool in tools:
                if tool.spec.name not in seen and self._policy.allows(tool.spec):
                    seen.add(tool.spec.name)
                    yield key, tool

    def _rebuild(self) -> None:
        # At the next read, not now: a session adds its device's tools after its hello and
        # removes them when it closes, and in a reboot storm most never read the catalogue
        # in between (no turn); building it each time was ~5 % of a connect and of a
        # disconnect (docs/performance.md, session 41).
        self._built = None

    @property
    def _entries(self) -> dict[str, _Entry]:
        if self._built is None:
            allowed = list(self._allowed())
            names = NameMap((key, tool.spec.name) for key, tool in allowed)
            entries: dict[str, _Entry] = {}
            for key, tool in allowed:
                llm_name = names.to_llm(key, tool.spec.name)
                entries[llm_name] = _Entry(tool, key, llm_name)
            self._built = dict(sorted(entries.items()))
        return self._built

    def specs(self) -> list[ToolSpec]:
        """The specs offered to the LLM (after policy), in LLM-name order."""
        return [entry.spec for entry in self._entries.values()]

    def llm_name(self, source_kind: str, name: str) -> str | None:
        """The LLM name of a source's tool, e.g. to mention it in a prompt."""
        for entry in self._entries.values():
            if entry.spec.source == source_kind and entry.spec.name == name:
                return entry.llm_name
        return None

    def llm_tools(self) -> list[dict]:
        """The OpenAI `tools` array."""
        return [
            {
                "type": "function",
                "function": {
                    "name": entry.llm_name,
                    "description": entry.spec.description or entry.spec.name,
                    "parameters": entry.tool.parameters,
                },
            }
            for entry in self._entries.values()
        ]

    # -- calls -----------------------------------------------------------------------------

    async def call(self, llm_name: str, arguments_json: str | dict | None) -> ToolCallRecord:
        """Run one tool call for the LLM. Never raises, except asyncio.CancelledError."""
        started = time.monotonic()
        entry: _Entry | None = None
        arguments: dict = {}
        try:
            entry = self._lookup(llm_name)
            arguments = parse_arguments(arguments_json)
            await self._validate(entry, arguments)
            result = await self._run(entry, arguments)
        except _CallFailed as failure:
            return self._record(llm_name, entry, arguments, started, failure.text, failure.code)
        return self._record(llm_name, entry, arguments, started, result, "")

    def _lookup(self, llm_name: str) -> _Entry:
        entry = self._entries.get(llm_name)
        if entry is None:
            available = ", ".join(list(self._entries)[:_MAX_LISTED]) or "none"
            raise _CallFailed(
                "unknown_tool",
                f"Error: there is no tool named '{llm_name}'. Available tools: {available}.",
            )
        return entry

    async def _validate(self, entry: _Entry, arguments: dict) -> None:
        try:
            error = await in_schema_thread(first_error, entry.tool.validator, arguments)
        except Exception:
            # Unexpected: tools.schemas refuses what could fail here. The source checks its
            # own arguments anyway.
            logger.warning(
                "tool argument validation crashed, skipped", extra={"tool_name": entry.spec.name}
            )
            return
        if error is not None:
            raise _CallFailed("invalid_arguments", _schema_error_text(entry.llm_name, error))

    async def _run(self, entry: _Entry, arguments: dict) -> str:
        source = self._sources.get(entry.source_key)
        name = entry.llm_name
        if source is None:
            raise _CallFailed("unknown_tool", f"Error: the tool '{name}' is no longer available.")
        try:
            async with asyncio.timeout(source.timeout):
                # A copy: the record must show what the LLM sent even if the source mutates.
                result = await source.call(entry.spec.name, dict(arguments))
        except TimeoutError:
            text = f"Error: the tool '{name}' did not answer within {source.timeout:g} seconds."
            raise _CallFailed("timeout", text) from None
        except ToolError as exc:
            text = f"Error: {exc}" if str(exc) else f"Error: the tool '{name}' failed."
            raise _CallFailed("tool_error", text) from None
        except Exception as exc:
            logger.exception(
                "tool raised unexpectedly",
                extra={"tool_name": entry.spec.name, "tool_source": entry.source_key},
            )
            raise _CallFailed(
                "exception", f"Error: the tool '{name}' failed unexpectedly ({type(exc).__name__})."
            ) from None
        if isinstance(result, str):
            return result
        # A source broke the contract and returned data; the LLM still needs text.
        return json.dumps(result, ensure_ascii=False, default=str)

    def _record(
        self,
        llm_name: str,
        entry: _Entry | None,
        arguments: dict,
        started: float,
        result: str,
        error: str,
    ) -> ToolCallRecord:
        record = ToolCallRecord(
            name=entry.spec.name if entry else llm_name,
            llm_name=llm_name,
            source=entry.spec.source if entry else "",
            arguments=arguments,
            result=result,
            success=not error,
            duration_ms=round((time.monotonic() - started) * 1000, 3),
            error=error,
        )
        logger.info(
            "tool call finished",
            extra={
                "tool_name": record.name,
                "tool_args": arguments,
                "tool_error": error,
                "duration_ms": record.duration_ms,
            },
        )
        return record


def parse_arguments(arguments_json: str | dict | None) -> dict:
    """The call's arguments as a dict; models send "", "null" or nothing for "no arguments"."""
    if arguments_json is None:
        return {}
    if isinstance(arguments_json, dict):
        return arguments_json
    if not isinstance(arguments_json, str):
        raise _CallFailed("invalid_json", "Error: the tool arguments must be a JSON object.")
    if not arguments_json.strip():
        return {}
    try:
        value = json.loads(arguments_json)
    except ValueError as exc:
        raise _CallFailed(
            "invalid_json",
            f"Error: the tool arguments are not valid JSON ({exc}). Send a JSON object.",
        ) from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _CallFailed("invalid_json", "Error: the tool arguments must be a JSON object.")
    return value


def _schema_error_text(llm_name: str, error: ValidationError) -> str:
    where = "/".join(str(p) for p in error.absolute_path)
    location = f" at '{where}'" if where else ""
    return (
        f"Error: invalid arguments for tool '{llm_name}'{location}: {error.message}. "
        "Fix the arguments and call it again."
    )
