from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from tools.errors import ToolError
from tools.limits import ToolLimits
from tools.mcp.device import DeviceMcpClient, DeviceToolSource, compact_json_text, parse_tools
from tools.registry import Toolset

PAGE_LIMIT = 8000
JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4


class Silent(Exception):
    """Raised by a fake tool to mean "never answer"."""


class FakeFirmware:
    """A device MCP server that behaves like xiaozhi-esp32 2.4.x main/mcp_server.cc.

    Payloads cross a JSON text boundary both ways, as on the real socket. Replies are sent
    from a separate task, like the firmware's main loop.
    """

    def __init__(
        self, tools: list[dict], handlers: dict[str, Callable[[dict], Any]] | None = None
    ) -> None:
        self.tools = tools
        self.handlers = handlers or {}
        self.client: DeviceMcpClient | None = None
        self.received: list[dict] = []
        self.events: list[str] = []
        self.vision: dict | None = None
        self.init_delay = 0.0
        self.list_override: Callable[[dict], dict] | None = None

    def connect(self, **kwargs: Any) -> DeviceMcpClient:
        self.client = DeviceMcpClient(self.send, **kwargs)
        return self.client

    async def send(self, payload: dict) -> None:
        message = json.loads(json.dumps(payload))
        self.received.append(message)
        self.events.append(f"received {message.get('method')}")
        asyncio.get_running_loop().create_task(self._handle(message))

    def requests(self, method: str) -> list[dict]:
        return [m for m in self.received if m.get("method") == method]

    async def _handle(self, message: dict) -> None:
        if message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
            return
        method = message["method"]
        if method.startswith("notifications"):
            return
        request_id = message.get("id")
        if not isinstance(request_id, (int, float)) or isinstance(request_id, bool):
            return  # "Invalid id" is only logged by the firmware: no reply at all
        params = message.get("params", {})
        try:
            result = await self._dispatch(method, params)
        except Silent:
            return
        except Exception as exc:  # the firmware turns every failure into a code-less error
            self._reply({"jsonrpc": "2.0", "id": int(request_id), "error": {"message": str(exc)}})
            return
        self._reply({"jsonrpc": "2.0", "id": int(request_id), "result": result})

    def _reply(self, payload: dict) -> None:
        self.events.append(f"replied {payload['id']}")
        assert self.client is not None
        self.client.feed(json.loads(json.dumps(payload)))

    async def _dispatch(self, method: str, params: dict) -> dict:
        if method == "initialize":
            await asyncio.sleep(self.init_delay)
            self.vision = params.get("capabilities", {}).get("vision")
            return {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "bread-compact-wifi", "version": "2.4.2"}}
        if method == "tools/list":
            if self.list_override is not None:
                return self.list_override(params)
            return self._tools_page(params.get("cursor", ""), bool(params.get("withUserTools", False)))
        if method == "tools/call":
            return await self._call(params)
        raise RuntimeError(f"Method not implemented: {method}")

    def _tools_page(self, cursor: str, with_user_tools: bool) -> dict:
        # Same algorithm as McpServer::GetToolsList: serialise until 8000 bytes, the
        # cursor names the first tool left out and the next page starts at it.
        body, next_cursor, found = '{"tools":[', "", not cursor
        for tool in self.tools:
            if not found:
                if tool["name"] != cursor:
                    continue
                found = True
            if tool.get("annotations", {}).get("audience") == ["user"] and not with_user_tools:
                continue
            tool_json = json.dumps(tool, separators=(",", ":")) + ","
            if len(body) + len(tool_json) + 30 > PAGE_LIMIT:
                next_cursor = tool["name"]
                break
            body += tool_json
        body = body.rstrip(",")
        if body.endswith("["):
            raise RuntimeError(f"Failed to add tool {cursor} because of payload size limit")
        body += "]" + (f',"nextCursor":"{next_cursor}"' if next_cursor else "") + "}"
        return json.loads(body)

    async def _call(self, params: dict) -> dict:
        name = params.get("name")
        tool = next((t for t in self.tools if t["name"] == name), None)
        if tool is None:
            raise RuntimeError(f"Unknown tool: {name}")
        arguments = params.get("arguments", {})
        check_arguments(tool["inputSchema"], arguments)
        value = self.handlers.get(name, lambda args: True)(arguments)
        if asyncio.iscoroutine(value):
            value = await value
        return {"content": [content_of(value)], "isError": False}


def check_arguments(schema: dict, arguments: dict) -> None:
    for prop, rules in schema.get("properties", {}).items():
        if prop not in arguments:
            if prop in schema.get("required", []):
                raise RuntimeError(f"Missing valid argument: {prop}")
            continue
        value = arguments[prop]
        integer = isinstance(rules, dict) and rules.get("type") == "integer"
        if integer and "maximum" in rules and value > rules["maximum"]:
            raise RuntimeError(f"Value exceeds maximum allowed: {rules['maximum']}")


def content_of(value: Any) -> dict:
    if isinstance(value, dict) and value.get("__image__"):
        inner = {"type": "image", "mimeType": "image/jpeg", "data": base64.b64encode(JPEG).decode()}
        return {"type": "image", "image": json.dumps(inner)}
    if isinstance(value, bool):
        return {"type": "text", "text": "true" if value else "false"}
    if isinstance(value, (dict, list)):
        return {"type": "text", "text": json.dumps(value, separators=(",", ":"))}
    return {"type": "text", "text": str(value)}


def tool(name: str, description: str = "", *, user_only: bool = False, props: dict | None = None) -> dict:
    schema: dict[str, Any] = {"type": "object", "properties": props or {}}
    if props:
        schema["required"] = [p for p, rules in props.items() if "default" not in rules]
    data: dict[str, Any] = {"name": name, "description": description, "inputSchema": schema}
    if user_only:
        data["annotations"] = {"audience": ["user"]}
    return data


VOLUME = {"volume": {"type": "integer", "minimum": 0, "maximum": 100}}


def stock_tools() -> list[dict]:
    return [
        tool("self.get_device_status", "Device status as JSON"),
        tool("self.audio_speaker.set_volume", "Set the volume", props=VOLUME),
        tool("self.camera.take_photo", "Take a photo", props={"question": {"type": "string"}}),
        tool("self.reboot", "Reboot the device", user_only=True),
    ]


def many_tools(count: int = 45) -> list[dict]:
    # ~500-byte tools: 45 of them need four 8000-byte pages.
    filler = "Controls one board peripheral; long text as real boards have. " * 7
    tools = [tool(f"self.board.tool_{i:02d}", filler, props={"level": {"type": "integer"}})
             for i in range(count)]
    tools.insert(20, tool("self.screen.snapshot", filler, user_only=True, props={"url": {"type": "string"}}))
    return tools


async def started(firmware: FakeFirmware, **kwargs: Any) -> DeviceMcpClient:
    client = firmware.connect(**kwargs)
    await client.initialize("http://host/vision/explain", "vision-token")
    return client


# -- initialize -----------------------------------------------------------------------------


async def test_initialize_sends_what_the_firmware_reads() -> None:
    firmware = FakeFirmware(stock_tools())
    client = firmware.connect()
    result = await client.initialize("http://host:8000/vision/explain", "tok")
    assert firmware.received[0] == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2024-11-05",
            "capabilities": {"vision": {"url": "http://host:8000/vision/explain", "token": "tok"}},
            "clientInfo": {"name": "xiaozhi-django", "version": "1.0"},
        },
    }
    assert firmware.vision == {"url": "http://host:8000/vision/explain", "token": "tok"}
    assert result["serverInfo"]["name"] == "bread-compact-wifi"
    assert client.server_info == {"name": "bread-compact-wifi", "version": "2.4.2"}
    assert client.initialized


async def test_listing_waits_for_the_initialize_result() -> None:
    firmware = FakeFirmware(stock_tools())
    firmware.init_delay = 0.1
    client = firmware.connect()
    init = asyncio.create_task(client.initialize("http://v", "t"))
    await asyncio.sleep(0)
    tools = await client.list_tools()
    await init
    assert firmware.events.index("replied 1") < firmware.events.index("received tools/list")
    assert len(tools) == 4


async def test_listing_before_initialize_is_refused() -> None:
    client = FakeFirmware(stock_tools()).connect()
    with pytest.raises(ToolError, match="not initialized"):
        await client.list_tools()


async def test_a_failed_initialize_fails_the_listing_too() -> None:
    firmware = FakeFirmware(stock_tools())
    client = firmware.connect(request_timeout=0.1)

    async def refuse(params: dict) -> dict:
        raise RuntimeError("Method not implemented: initialize")

    firmware._dispatch = lambda method, params: refuse(params)  # type: ignore[method-assign]
    with pytest.raises(ToolError, match="Method not implemented"):
        await client.initialize("http://v", "t")
    with pytest.raises(ToolError, match="Method not implemented"):
        await client.list_tools()


# -- tools/list -----------------------------------------------------------------------------


async def test_it_follows_every_page_of_an_inclusive_name_cursor() -> None:
    tools = many_tools()
    firmware = FakeFirmware(tools)
    client = await started(firmware)
    specs = await client.list_tools()

    pages = firmware.requests("tools/list")
    assert len(pages) >= 3
    assert [s.name for s in specs] == [t["name"] for t in tools]  # nothing lost, nothing doubled
    assert "cursor" not in pages[0]["params"]
    # Each cursor is the name of the first tool of the page it asks for.
    for page in pages[1:]:
        assert page["params"]["cursor"] in {t["name"] for t in tools}


async def test_with_user_tools_is_identical_on_every_page() -> None:
    firmware = FakeFirmware(many_tools())
    client = await started(firmware)
    specs = await client.list_tools()
    assert all(p["params"]["withUserTools"] is True for p in firmware.requests("tools/list"))
    snapshot = next(s for s in specs if s.name == "self.screen.snapshot")
    assert snapshot.user_only
    assert sum(s.user_only for s in specs) == 1


async def test_listing_without_user_tools_leaves_them_out_on_every_page() -> None:
    firmware = FakeFirmware(many_tools())
    client = await started(firmware)
    specs = await client.list_tools(with_user_tools=False)
    pages = firmware.requests("tools/list")
    assert len(pages) >= 3
    assert all(p["params"]["withUserTools"] is False for p in pages)
    assert "self.screen.snapshot" not in {s.name for s in specs}
    assert len(specs) == 45


async def test_every_page_the_firmware_sends_fits_in_8000_bytes() -> None:
    firmware = FakeFirmware(many_tools())
    sizes: list[int] = []
    original = firmware._tools_page

    def measured(cursor: str, with_user_tools: bool) -> dict:
        page = original(cursor, with_user_tools)
        sizes.append(len(json.dumps(page, separators=(",", ":"))))
        return page

    firmware._tools_page = measured  # type: ignore[method-assign]
    client = await started(firmware)
    await client.list_tools()
    assert len(sizes) >= 3 and max(sizes) <= PAGE_LIMIT


async def test_a_repeated_cursor_stops_the_listing(caplog: pytest.LogCaptureFixture) -> None:
    firmware = FakeFirmware([])
    cursors = iter(["b", "c", "b", "c"])
    firmware.list_override = lambda params: {"tools": [tool(f"t_{params.get('cursor', 'a')}")],
                                             "nextCursor": next(cursors)}
    client = await started(firmware)
    with caplog.at_level(logging.WARNING, logger="tools.mcp.device"):
        specs = await client.list_tools()
    assert [s.name for s in specs] == ["t_a", "t_b", "t_c"]
    assert len(firmware.requests("tools/list")) == 3
    assert "repeated a cursor" in caplog.text


async def test_the_listing_stops_at_the_page_cap() -> None:
    firmware = FakeFirmware([])
    counter = iter(range(1000))
    firmware.list_override = lambda params: {"tools": [], "nextCursor": f"c{next(counter)}"}
    client = await started(firmware)
    assert await client.list_tools() == []
    assert len(firmware.requests("tools/list")) == ToolLimits().device_max_pages == 10


async def test_a_page_error_fails_the_listing() -> None:
    firmware = FakeFirmware(many_tools())
    client = await started(firmware)
    original = firmware._tools_page
    def unknown_cursor(cursor: str, with_user_tools: bool) -> dict:
        return original("no.such.tool" if cursor else "", with_user_tools)

    firmware._tools_page = unknown_cursor  # type: ignore[method-assign]
    with pytest.raises(ToolError, match="payload size limit"):
        await client.list_tools()


def test_tool_specs_are_parsed_defensively() -> None:
    raw = [
        {"name": "self.no_schema"},
        {"name": "self.bad_schema", "description": 5, "inputSchema": "nope"},
        {"name": "self.user", "annotations": {"audience": ["user"]}},
        {"name": "self.both", "annotations": {"audience": ["user", "assistant"]}},
        {"description": "no name"},
        {"name": ""},
        "not an object",
    ]
    specs = parse_tools(raw)
    assert [s.name for s in specs] == ["self.no_schema", "self.bad_schema", "self.user", "self.both"]
    assert specs[0].parameters == {"type": "object", "properties": {}}
    assert specs[1].parameters == {"type": "object", "properties": {}} and specs[1].description == ""
    assert [s.user_only for s in specs] == [False, False, True, False]
    assert all(s.source == "device" for s in specs)
    assert parse_tools(None) == []


# -- tools/call -----------------------------------------------------------------------------


async def test_ids_are_unique_integers_across_every_kind_of_request() -> None:
    firmware = FakeFirmware(many_tools())
    client = await started(firmware)
    await client.list_tools()
    await asyncio.gather(*(client.call_tool("self.board.tool_01", {"level": i}) for i in range(5)))
    ids = [m["id"] for m in firmware.received]
    assert all(type(i) is int for i in ids)
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (False, "false"),
        (42, "42"),
        ("plain words", "plain words"),
        ({"audio_speaker": {"volume": 60}, "battery": {"level": 80}},
         '{"audio_speaker":{"volume":60},"battery":{"level":80}}'),
        # A tool that returns JSON *as a string*: the text holds an encoded JSON string.
        (json.dumps(json.dumps({"ok": True, "name": "小智"})), '{"ok":true,"name":"小智"}'),
        ("[1, 2, 3]", "[1,2,3]"),
    ],
)
async def test_results_come_back_as_text(value: Any, text: str) -> None:
    firmware = FakeFirmware(stock_tools(), {"self.get_device_status": lambda args: value})
    client = await started(firmware)
    assert await client.call_tool("self.get_device_status", {}) == text


async def test_an_image_result_becomes_a_short_description() -> None:
    firmware = FakeFirmware(stock_tools(), {"self.camera.take_photo": lambda args: {"__image__": True}})
    client = await started(firmware)
    text = await client.call_tool("self.camera.take_photo", {"question": "what is it?"})
    assert text == f"[image image/jpeg, {len(JPEG)} bytes]"


async def test_call_sends_name_and_arguments() -> None:
    firmware = FakeFirmware(stock_tools())
    client = await started(firmware)
    await client.call_tool("self.audio_speaker.set_volume", {"volume": 30})
    request = firmware.requests("tools/call")[0]
    assert request["params"] == {"name": "self.audio_speaker.set_volume", "arguments": {"volume": 30}}
    assert request["jsonrpc"] == "2.0"


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("self.audio_speaker.set_volume", {"volume": 101}, "Value exceeds maximum allowed: 100"),
        ("self.audio_speaker.set_volume", {}, "Missing valid argument: volume"),
        ("self.no_such_tool", {}, "Unknown tool: self.no_such_tool"),
    ],
)
async def test_an_error_without_code_becomes_a_tool_error(
    name: str, arguments: dict, message: str
) -> None:
    client = await started(FakeFirmware(stock_tools()))
    with pytest.raises(ToolError) as raised:
        await client.call_tool(name, arguments)
    assert str(raised.value) == message


async def test_an_exception_in_the_device_tool_becomes_a_tool_error() -> None:
    def fail(args: dict) -> None:
        raise RuntimeError("Failed to capture photo")

    client = await started(FakeFirmware(stock_tools(), {"self.camera.take_photo": fail}))
    with pytest.raises(ToolError, match="^Failed to capture photo$"):
        await client.call_tool("self.camera.take_photo", {"question": "?"})


async def test_is_error_true_becomes_a_tool_error() -> None:
    firmware = FakeFirmware(stock_tools())
    client = await started(firmware)
    call = asyncio.create_task(client.call_tool("self.get_device_status", {}, timeout=1))
    await asyncio.sleep(0)
    request_id = firmware.requests("tools/call")[0]["id"]
    # Answer before the fake does, with a standard MCP error result.
    client.feed({"jsonrpc": "2.0", "id": request_id, "result": {
        "content": [{"type": "text", "text": "sensor offline"}], "isError": True}})
    with pytest.raises(ToolError, match="sensor offline"):
        await call


async def test_a_call_that_gets_no_answer_times_out_and_a_late_reply_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def never(args: dict) -> None:
        raise Silent()

    firmware = FakeFirmware(stock_tools(), {"self.get_device_status": never})
    client = await started(firmware)
    with pytest.raises(ToolError, match="did not answer within 0.1 seconds"):
        await client.call_tool("self.get_device_status", {}, timeout=0.1)
    late_id = firmware.requests("tools/call")[0]["id"]
    with caplog.at_level(logging.WARNING, logger="tools.mcp.device"):
        client.feed({"jsonrpc": "2.0", "id": late_id, "result": {"content": []}})
    assert "unknown id" in caplog.text


# -- feed -----------------------------------------------------------------------------------


async def test_replies_with_unknown_or_non_integer_ids_are_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def never(args: dict) -> None:
        raise Silent()

    firmware = FakeFirmware(stock_tools(), {"self.get_device_status": never})
    client = await started(firmware)
    call = asyncio.create_task(client.call_tool("self.get_device_status", {}, timeout=1))
    await asyncio.sleep(0)
    request_id = firmware.requests("tools/call")[0]["id"]
    with caplog.at_level(logging.WARNING, logger="tools.mcp.device"):
        for bad_id in (str(request_id), float(request_id), True, None, 9999):
            client.feed({"jsonrpc": "2.0", "id": bad_id, "result": {"content": []}})
    assert not call.done()
    assert caplog.text.count("dropped") == 5
    ok = {"content": [{"type": "text", "text": "ok"}]}
    client.feed({"jsonrpc": "2.0", "id": request_id, "result": ok})
    assert await call == "ok"


async def test_malformed_payloads_are_dropped_without_raising() -> None:
    def never(args: dict) -> None:
        raise Silent()

    firmware = FakeFirmware(stock_tools(), {"self.get_device_status": never})
    client = await started(firmware)
    call = asyncio.create_task(client.call_tool("self.get_device_status", {}, timeout=1))
    await asyncio.sleep(0)
    sent_before = len(firmware.received)
    for payload in ("text", None, 42, [], {"jsonrpc": "2.0"}, {"id": "x"}):
        client.feed(payload)  # raises nothing
    await asyncio.sleep(0)
    assert not call.done() and len(firmware.received) == sent_before  # no answer, no failed call
    request_id = firmware.requests("tools/call")[0]["id"]
    client.feed({"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": "ok"}]}})
    assert await call == "ok"  # the client still works


async def test_a_reply_without_result_or_error_fails_the_call_at_once() -> None:
    def never(args: dict) -> None:
        raise Silent()

    firmware = FakeFirmware(stock_tools(), {"self.get_device_status": never})
    client = await started(firmware)
    call = asyncio.create_task(client.call_tool("self.get_device_status", {}, timeout=5))
    await asyncio.sleep(0)
    client.feed({"jsonrpc": "2.0", "id": firmware.requests("tools/call")[0]["id"]})
    with pytest.raises(ToolError, match="malformed"):
        await call


async def test_requests_and_notifications_from_the_device_are_ignored() -> None:
    firmware = FakeFirmware(stock_tools())
    client = await started(firmware)
    sent_before = len(firmware.received)
    client.feed({"jsonrpc": "2.0", "method": "notifications/state_changed", "params": {"state": "idle"}})
    client.feed({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert len(firmware.received) == sent_before


# -- send failures and close ----------------------------------------------------------------


async def test_a_send_failure_is_a_tool_error() -> None:
    async def broken_send(payload: dict) -> None:
        raise ConnectionResetError("socket closed")

    client = DeviceMcpClient(broken_send)
    with pytest.raises(ToolError, match="could not reach the device"):
        await client.initialize("http://v", "t")


async def test_close_fails_every_pending_call() -> None:
    def never(args: dict) -> None:
        raise Silent()

    firmware = FakeFirmware(stock_tools(), {"self.get_device_status": never})
    client = await started(firmware)
    calls = [
        asyncio.create_task(client.call_tool("self.get_device_status", {}, timeout=5))
        for _ in range(3)
    ]
    await asyncio.sleep(0)
    client.close()
    for call in calls:
        with pytest.raises(ToolError, match="^device disconnected$"):
            await call
    with pytest.raises(ToolError, match="^device disconnected$"):
        await client.call_tool("self.get_device_status", {})
    assert client.closed


async def test_close_during_initialize_fails_a_waiting_listing() -> None:
    firmware = FakeFirmware(stock_tools())
    firmware.init_delay = 5
    client = firmware.connect()
    init = asyncio.create_task(client.initialize("http://v", "t"))
    listing = asyncio.create_task(client.list_tools())
    await asyncio.sleep(0.01)
    client.close()
    for task in (init, listing):
        with pytest.raises(ToolError, match="device disconnected"):
            await task


async def test_a_cancelled_initialize_fails_a_waiting_listing() -> None:
    firmware = FakeFirmware(stock_tools())
    firmware.init_delay = 5
    client = firmware.connect()
    init = asyncio.create_task(client.initialize("http://v", "t"))
    listing = asyncio.create_task(client.list_tools())
    await asyncio.sleep(0.01)
    init.cancel()
    with pytest.raises(ToolError, match="interrupted"):
        await listing
    assert firmware.requests("tools/list") == []
    assert not client.initialized


async def test_a_cancelled_call_leaves_nothing_pending() -> None:
    def never(args: dict) -> None:
        raise Silent()

    firmware = FakeFirmware(stock_tools(), {"self.get_device_status": never})
    client = await started(firmware)
    call = asyncio.create_task(client.call_tool("self.get_device_status", {}, timeout=5))
    await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert client._pending == {}


# -- through the Toolset --------------------------------------------------------------------


async def test_device_tools_work_through_the_toolset() -> None:
    status = {"battery": {"level": 80}}
    firmware = FakeFirmware(stock_tools(), {"self.get_device_status": lambda args: status})
    client = await started(firmware)
    await client.list_tools()
    toolset = Toolset([])
    await toolset.add_source(DeviceToolSource(client))
    names = [t["function"]["name"] for t in toolset.llm_tools()]
    assert names == ["self_audio_speaker_set_volume", "self_camera_take_photo", "self_get_device_status"]
    assert len(firmware.requests("tools/list")) == 1  # the source reused the listing

    record = await toolset.call("self_get_device_status", "{}")
    assert record.success and record.result == '{"battery":{"level":80}}'
    assert record.source == "device" and record.name == "self.get_device_status"

    refused = await toolset.call("self_audio_speaker_set_volume", '{"volume": 300}')
    assert refused.error == "invalid_arguments"
    assert len(firmware.requests("tools/call")) == 1  # caught before reaching the device


async def test_a_device_error_through_the_toolset_is_a_failed_record() -> None:
    def fail(args: dict) -> None:
        raise RuntimeError("Failed to capture photo")

    client = await started(FakeFirmware(stock_tools(), {"self.camera.take_photo": fail}))
    toolset = Toolset([DeviceToolSource(client)])
    await toolset.refresh()
    record = await toolset.call("self_camera_take_photo", '{"question": "what is this?"}')
    assert not record.success and record.error == "tool_error"
    assert record.result == "Error: Failed to capture photo"


async def test_a_silent_device_times_out_through_the_toolset() -> None:
    def never(args: dict) -> None:
        raise Silent()

    client = await started(FakeFirmware(stock_tools(), {"self.get_device_status": never}))
    toolset = Toolset([DeviceToolSource(client, timeout=0.1)])
    await toolset.refresh()
    record = await toolset.call("self_get_device_status", "")
    assert not record.success and record.error in ("timeout", "tool_error")
    assert "0.1 seconds" in record.result
    assert client._pending == {}


def test_compact_json_text_leaves_non_json_alone() -> None:
    assert compact_json_text("hello") == "hello"
    assert compact_json_text("true") == "true"
    assert compact_json_text('"quoted"') == '"quoted"'
    assert compact_json_text('{ "a" : 1 }') == '{"a":1}'
