from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

import pytest

from tools import registry
from tools.errors import ToolError
from tools.registry import ToolCallRecord, ToolPolicy, ToolSource, ToolSpec, Toolset

Handler = Callable[[str, dict], Awaitable[str]]

VOLUME_SCHEMA = {
    "type": "object",
    "properties": {"volume": {"type": "integer", "minimum": 0, "maximum": 100}},
    "required": ["volume"],
}


async def echo(name: str, arguments: dict) -> str:
    return json.dumps({"tool": name, "arguments": arguments}, separators=(",", ":"))


class StaticSource:
    """A ToolSource written for the tests: fixed specs, a pluggable handler."""

    def __init__(
        self,
        kind: str,
        specs: list[ToolSpec],
        handler: Handler = echo,
        *,
        timeout: float = 5.0,
        origin: str = "",
        list_delay: float = 0.0,
        list_error: Exception | None = None,
    ) -> None:
        self.kind = kind
        self.origin = origin
        self.timeout = timeout
        self.specs = specs
        self.handler = handler
        self.list_delay = list_delay
        self.list_error = list_error
        self.list_calls = 0
        self.calls: list[tuple[str, dict]] = []

    async def list_tools(self) -> list[ToolSpec]:
        self.list_calls += 1
        await asyncio.sleep(self.list_delay)
        if self.list_error is not None:
            raise self.list_error
        return list(self.specs)

    async def call(self, name: str, arguments: dict) -> str:
        self.calls.append((name, arguments))
        return await self.handler(name, arguments)


def spec(
    name: str, source: str, *, params: dict | None = None, user_only: bool = False, origin: str = ""
) -> ToolSpec:
    parameters = params if params is not None else {"type": "object", "properties": {}}
    return ToolSpec(name, f"{name} description", parameters, source, user_only, origin)


def device_source(handler: Handler = echo, **kwargs: object) -> StaticSource:
    specs = [
        spec("self.audio_speaker.set_volume", "device", params=VOLUME_SCHEMA),
        spec("self.get_device_status", "device"),
        spec("self.reboot", "device", user_only=True),
    ]
    return StaticSource("device", specs, handler, **kwargs)  # type: ignore[arg-type]


def names_of(toolset: Toolset) -> list[str]:
    return [tool["function"]["name"] for tool in toolset.llm_tools()]


async def ready(*sources: ToolSource, policy: ToolPolicy | None = None) -> Toolset:
    toolset = Toolset(list(sources), policy)
    await toolset.refresh()
    return toolset


# -- catalogue ------------------------------------------------------------------------------


async def test_it_offers_tools_in_openai_format_with_safe_names() -> None:
    toolset = await ready(device_source())
    tools = toolset.llm_tools()
    assert tools[0] == {
        "type": "function",
        "function": {
            "name": "self_audio_speaker_set_volume",
            "description": "self.audio_speaker.set_volume description",
            "parameters": VOLUME_SCHEMA,
        },
    }
    assert names_of(toolset) == ["self_audio_speaker_set_volume", "self_get_device_status"]


async def test_it_never_offers_user_only_device_tools() -> None:
    toolset = await ready(device_source(), policy=ToolPolicy(device_tools=True))
    assert "self_reboot" not in names_of(toolset)
    record = await toolset.call("self_reboot", "{}")
    assert not record.success and record.error == "unknown_tool"


async def test_it_lists_sources_concurrently() -> None:
    slow = [StaticSource("mcp", [spec(f"t{i}", "mcp", origin=f"s{i}")], origin=f"s{i}", list_delay=0.3)
            for i in range(3)]
    started = time.monotonic()
    toolset = await ready(*slow)
    assert time.monotonic() - started < 0.6
    assert names_of(toolset) == ["t0", "t1", "t2"]


async def test_a_failing_source_contributes_no_tools_and_breaks_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = ToolError("unreachable")
    broken = StaticSource("mcp", [spec("x", "mcp")], origin="down", list_error=down)
    crashing = StaticSource("client", [spec("y", "client")], list_error=RuntimeError("bug"))
    with caplog.at_level(logging.WARNING, logger="tools.registry"):
        toolset = await ready(broken, device_source(), crashing)
    assert names_of(toolset) == ["self_audio_speaker_set_volume", "self_get_device_status"]
    assert "tool source listing failed" in caplog.text


async def test_a_source_that_hangs_while_listing_is_given_up_on() -> None:
    hanging = StaticSource("mcp", [spec("x", "mcp")], origin="slow", list_delay=10)
    toolset = Toolset([hanging, device_source()], list_timeout=0.2)
    started = time.monotonic()
    await toolset.refresh()
    assert time.monotonic() - started < 1
    assert "x" not in names_of(toolset)


async def test_it_offers_a_parameters_object_even_for_odd_remote_schemas() -> None:
    odd = StaticSource("mcp", [
        ToolSpec("no_schema", "", None, "mcp", origin="m"),  # type: ignore[arg-type]
        ToolSpec("no_type", "", {"properties": {"q": {"type": "string"}}}, "mcp", origin="m"),
        ToolSpec("not_object", "", {"type": "string"}, "mcp", origin="m"),
    ], origin="m")
    toolset = await ready(odd)
    by_name = {t["function"]["name"]: t["function"] for t in toolset.llm_tools()}
    assert by_name["no_schema"]["parameters"] == {"type": "object", "properties": {}}
    assert by_name["no_type"]["parameters"]["type"] == "object"
    assert by_name["no_type"]["description"] == "no_type"  # falls back to the name
    assert by_name["not_object"]["parameters"] == {"type": "object", "properties": {}}


async def test_a_refresh_picks_up_changed_catalogues() -> None:
    source = StaticSource("client", [spec("a", "client")])
    toolset = await ready(source)
    source.specs = [spec("b", "client")]
    await toolset.refresh()
    assert names_of(toolset) == ["b"]


# -- policy ---------------------------------------------------------------------------------


async def test_the_policy_filters_server_tools_mcp_servers_and_device_tools() -> None:
    server = StaticSource("server", [spec("get_weather", "server"), spec("get_location", "server")])
    weather = StaticSource("mcp", [spec("forecast", "mcp", origin="weather")], origin="weather")
    search = StaticSource("mcp", [spec("search", "mcp", origin="search")], origin="search")
    policy = ToolPolicy(
        server_tools=frozenset({"get_weather"}),
        mcp_servers=frozenset({"weather"}),
        device_exclude=frozenset({"self.get_device_status"}),
    )
    toolset = await ready(server, weather, search, device_source(), policy=policy)
    assert names_of(toolset) == ["forecast", "get_weather", "self_audio_speaker_set_volume"]


async def test_the_policy_can_switch_device_tools_off() -> None:
    toolset = await ready(device_source(), policy=ToolPolicy(device_tools=False))
    assert toolset.llm_tools() == []


async def test_client_tools_are_always_offered() -> None:
    client = StaticSource("client", [spec("control_device", "client")])
    policy = ToolPolicy(server_tools=frozenset(), mcp_servers=frozenset(), device_tools=False)
    assert names_of(await ready(client, policy=policy)) == ["control_device"]


# -- collisions -----------------------------------------------------------------------------


async def test_colliding_names_get_suffixes_and_calls_reach_the_right_source() -> None:
    async def server_handler(name: str, arguments: dict) -> str:
        return "from server"

    async def client_handler(name: str, arguments: dict) -> str:
        return "from client"

    server = StaticSource("server", [spec("get_weather", "server")], server_handler)
    client = StaticSource("client", [spec("get_weather", "client")], client_handler)
    toolset = await ready(client, server)
    assert names_of(toolset) == ["get_weather", "get_weather_2"]
    assert (await toolset.call("get_weather", "{}")).result == "from server"
    second = await toolset.call("get_weather_2", "{}")
    assert second.result == "from client"
    assert (second.name, second.llm_name, second.source) == ("get_weather", "get_weather_2", "client")


async def test_two_mcp_servers_with_the_same_tool_name_stay_distinct() -> None:
    a = StaticSource("mcp", [spec("search", "mcp", origin="a")], origin="a")
    b = StaticSource("mcp", [spec("search", "mcp", origin="b")], origin="b")
    toolset = await ready(b, a)
    assert names_of(toolset) == ["search", "search_2"]
    await toolset.call("search", "{}")
    await toolset.call("search_2", "{}")
    assert a.calls == [("search", {})] and b.calls == [("search", {})]


async def test_llm_name_looks_up_a_sources_tool() -> None:
    toolset = await ready(device_source())
    assert toolset.llm_name("device", "self.get_device_status") == "self_get_device_status"
    assert toolset.llm_name("device", "self.reboot") is None


# -- calls: success -------------------------------------------------------------------------


async def test_a_successful_call_returns_a_complete_record() -> None:
    toolset = await ready(device_source())
    record = await toolset.call("self_audio_speaker_set_volume", '{"volume": 40}')
    assert isinstance(record, ToolCallRecord)
    assert record.success and record.error == ""
    assert record.name == "self.audio_speaker.set_volume"
    assert record.llm_name == "self_audio_speaker_set_volume"
    assert record.source == "device"
    assert record.arguments == {"volume": 40}
    assert json.loads(record.result) == {
        "tool": "self.audio_speaker.set_volume", "arguments": {"volume": 40}
    }
    assert record.duration_ms >= 0


@pytest.mark.parametrize("arguments", ["", "  ", None, {}, "{}"])
async def test_empty_arguments_mean_an_empty_object(arguments: str | dict | None) -> None:
    toolset = await ready(device_source())
    record = await toolset.call("self_get_device_status", arguments)
    assert record.success and record.arguments == {}


async def test_arguments_may_be_given_as_a_dict() -> None:
    toolset = await ready(device_source())
    assert (await toolset.call("self_audio_speaker_set_volume", {"volume": 1})).success


async def test_it_measures_the_duration_of_a_call() -> None:
    async def slow(name: str, arguments: dict) -> str:
        await asyncio.sleep(0.1)
        return "ok"

    toolset = await ready(StaticSource("client", [spec("slow", "client")], slow))
    record = await toolset.call("slow", "{}")
    assert 90 <= record.duration_ms < 1000


async def test_a_non_string_result_is_turned_into_text() -> None:
    async def returns_dict(name: str, arguments: dict) -> str:
        return {"ok": True}  # type: ignore[return-value]

    toolset = await ready(StaticSource("client", [spec("bad", "client")], returns_dict))
    record = await toolset.call("bad", "{}")
    assert record.success and json.loads(record.result) == {"ok": True}


# -- calls: every failure is a record -------------------------------------------------------


async def test_an_unknown_tool_is_reported_with_the_available_names() -> None:
    toolset = await ready(device_source())
    record = await toolset.call("self.get_device_status", "{}")
    assert not record.success and record.error == "unknown_tool"
    assert record.name == "self.get_device_status" and record.source == ""
    assert "no tool named 'self.get_device_status'" in record.result
    assert "self_get_device_status" in record.result


@pytest.mark.parametrize("arguments", ["{volume: 3}", '{"volume": 3', "not json"])
async def test_invalid_json_arguments_are_reported(arguments: str) -> None:
    source = device_source()
    toolset = await ready(source)
    record = await toolset.call("self_audio_speaker_set_volume", arguments)
    assert not record.success and record.error == "invalid_json"
    assert "not valid JSON" in record.result
    assert record.arguments == {}
    assert source.calls == []


@pytest.mark.parametrize("arguments", ["[1, 2]", "3", '"text"', "null"])
async def test_arguments_that_are_not_an_object_are_reported(arguments: str) -> None:
    toolset = await ready(device_source())
    record = await toolset.call("self_audio_speaker_set_volume", arguments)
    if arguments == "null":
        # JSON null is what some models send for "no arguments": the schema then decides.
        assert record.error == "invalid_arguments"
    else:
        assert record.error == "invalid_json"
        assert "must be a JSON object" in record.result


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ("{}", "'volume' is a required property"),
        ('{"volume": 101}', "101 is greater than the maximum of 100"),
        ('{"volume": "loud"}', "'loud' is not of type 'integer'"),
    ],
)
async def test_schema_violations_are_reported_before_calling(arguments: str, fragment: str) -> None:
    source = device_source()
    toolset = await ready(source)
    record = await toolset.call("self_audio_speaker_set_volume", arguments)
    assert not record.success and record.error == "invalid_arguments"
    assert fragment in record.result
    assert "self_audio_speaker_set_volume" in record.result
    assert source.calls == []


async def test_the_schema_error_says_where_the_problem_is() -> None:
    schema = {"type": "object", "properties": {"light": {"type": "object", "properties": {
        "level": {"type": "integer"}}}}}
    toolset = await ready(StaticSource("client", [spec("set", "client", params=schema)]))
    record = await toolset.call("set", '{"light": {"level": "x"}}')
    assert "at 'light/level'" in record.result


async def test_a_tool_with_an_invalid_schema_is_not_offered_and_the_reason_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = {"type": "object", "properties": {"q": {"type": 12}}, "required": "q"}
    source = StaticSource("mcp", [spec("search", "mcp", params=broken, origin="m"), spec("ok", "mcp", origin="m")],
                          origin="m")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="tools.registry"):
        toolset = await ready(source)
    assert names_of(toolset) == ["ok"]
    refusal = next(r for r in caplog.records if r.getMessage() == "tools refused")
    assert refusal.refused_count == 1  # type: ignore[attr-defined]
    assert refusal.refused[0][0] == "search" and "not a valid JSON Schema" in refusal.refused[0][1]  # type: ignore[attr-defined]


async def test_a_schema_with_a_dangling_ref_is_refused_at_listing() -> None:
    dangling = {"type": "object", "properties": {"q": {"$ref": "#/$defs/missing"}}}
    toolset = await ready(StaticSource("mcp", [spec("search", "mcp", params=dangling, origin="m")], origin="m"))
    assert names_of(toolset) == []
    assert (await toolset.call("search", '{"q": 1}')).error == "unknown_tool"


async def test_a_draft_7_schema_is_validated_as_draft_7() -> None:
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "properties": {"items": {"type": "array", "items": [{"type": "integer"}]}}}
    toolset = await ready(StaticSource("client", [spec("t", "client", params=schema)]))
    assert (await toolset.call("t", '{"items": [1]}')).success
    assert (await toolset.call("t", '{"items": ["x"]}')).error == "invalid_arguments"


async def test_a_timeout_is_reported() -> None:
    async def hangs(name: str, arguments: dict) -> str:
        await asyncio.sleep(10)
        return "never"

    toolset = await ready(StaticSource("client", [spec("hang", "client")], hangs, timeout=0.1))
    started = time.monotonic()
    record = await toolset.call("hang", "{}")
    assert time.monotonic() - started < 1
    assert not record.success and record.error == "timeout"
    assert record.result == "Error: the tool 'hang' did not answer within 0.1 seconds."


async def test_a_tool_error_is_passed_to_the_llm() -> None:
    async def fails(name: str, arguments: dict) -> str:
        raise ToolError("the camera is busy")

    toolset = await ready(StaticSource("client", [spec("photo", "client")], fails))
    record = await toolset.call("photo", "{}")
    assert not record.success and record.error == "tool_error"
    assert record.result == "Error: the camera is busy"


async def test_an_unexpected_exception_is_reported_without_internals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def crashes(name: str, arguments: dict) -> str:
        raise KeyError("secret-internal-detail")

    toolset = await ready(StaticSource("client", [spec("buggy", "client")], crashes))
    with caplog.at_level(logging.ERROR, logger="tools.registry"):
        record = await toolset.call("buggy", "{}")
    assert not record.success and record.error == "exception"
    assert record.result == "Error: the tool 'buggy' failed unexpectedly (KeyError)."
    assert "secret-internal-detail" not in record.result
    assert "tool raised unexpectedly" in caplog.text


async def test_cancellation_propagates_out_of_a_call() -> None:
    started = asyncio.Event()

    async def hangs(name: str, arguments: dict) -> str:
        started.set()
        await asyncio.sleep(10)
        return "never"

    toolset = await ready(StaticSource("client", [spec("hang", "client")], hangs))
    task = asyncio.create_task(toolset.call("hang", "{}"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cancellation_propagates_out_of_a_refresh() -> None:
    toolset = Toolset([StaticSource("client", [spec("a", "client")], list_delay=10)])
    task = asyncio.create_task(toolset.refresh())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_tool_arguments_are_logged_only_in_extra_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    toolset = await ready(device_source())
    with caplog.at_level(logging.INFO, logger="tools.registry"):
        await toolset.call("self_audio_speaker_set_volume", '{"volume": 77}')
    record = next(r for r in caplog.records if r.getMessage() == "tool call finished")
    assert record.tool_args == {"volume": 77}  # type: ignore[attr-defined]
    assert "77" not in record.getMessage()


# -- sources that come and go ---------------------------------------------------------------


async def test_a_source_added_later_is_listed_without_relisting_the_others() -> None:
    server = StaticSource("server", [spec("get_location", "server")])
    toolset = await ready(server)
    device = device_source()
    await toolset.add_source(device)
    assert server.list_calls == 1
    assert names_of(toolset) == ["get_location", "self_audio_speaker_set_volume", "self_get_device_status"]
    assert (await toolset.call("self_get_device_status", "")).success


async def test_adding_the_same_source_twice_does_not_duplicate_it() -> None:
    device = device_source()
    toolset = await ready(device)
    await toolset.add_source(device)
    assert len(toolset.sources) == 1
    assert names_of(toolset) == ["self_audio_speaker_set_volume", "self_get_device_status"]


async def test_a_removed_source_takes_its_tools_with_it() -> None:
    device = device_source()
    client = StaticSource("client", [spec("get_weather", "client")])
    toolset = await ready(device, client)
    toolset.remove_source(device)
    assert names_of(toolset) == ["get_weather"]
    record = await toolset.call("self_get_device_status", "{}")
    assert record.error == "unknown_tool"
    toolset.remove_source(device)  # removing twice is harmless


async def test_a_source_removed_while_listing_does_not_come_back() -> None:
    slow = StaticSource("client", [spec("late", "client")], list_delay=0.2)
    toolset = Toolset([])
    adding = asyncio.create_task(toolset.add_source(slow))
    await asyncio.sleep(0.05)
    toolset.remove_source(slow)
    await adding
    assert toolset.llm_tools() == []


async def test_removing_a_colliding_source_gives_the_plain_name_back() -> None:
    server = StaticSource("server", [spec("get_weather", "server")])
    client = StaticSource("client", [spec("get_weather", "client")])
    toolset = await ready(server, client)
    toolset.remove_source(server)
    assert names_of(toolset) == ["get_weather"]
    assert (await toolset.call("get_weather", "{}")).source == "client"


def test_identical_schemas_are_compiled_once() -> None:
    from tools.schemas import compile_schema

    limits = {"max_bytes": 65536, "max_depth": 32}
    schema = {"type": "object", "properties": {"volume": {"type": "integer", "minimum": 0}}}
    first = compile_schema(schema, **limits)
    assert compile_schema(json.loads(json.dumps(schema)), **limits) is first
    assert compile_schema({"type": "object"}, **limits) is not first


async def test_the_catalogue_is_built_when_read_not_on_every_change(monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[int] = []
    real = registry.NameMap

    def counting(pairs: Iterable[tuple[str, str]]) -> registry.NameMap:
        builds.append(1)
        return real(pairs)

    monkeypatch.setattr(registry, "NameMap", counting)
    device, client = device_source(), StaticSource("client", [spec("get_weather", "client")])
    toolset = await ready(client)
    await toolset.add_source(device)  # the device's tools after its hello...
    toolset.remove_source(device)  # ...gone when it disconnects, no turn in between
    assert builds == []
    assert names_of(toolset) == ["get_weather"] and toolset.specs()[0].name == "get_weather"
    assert builds == [1]  # once, at the first read, and kept until the sources change
