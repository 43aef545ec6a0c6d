"""The simulator's device MCP server behaves like firmware 2.4.2 (protocol-reference §5)."""
from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web

from simulator.mcp_server import (
    MAX_PAGE_BYTES,
    PAGE_SLACK_BYTES,
    DeviceMcpServer,
    ImageResult,
    Property,
    Tool,
    ToolFailure,
)


def request(method: str, params: dict[str, Any] | None = None, request_id: Any = 7) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


async def ask(server: DeviceMcpServer, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    reply = await server.handle(request(method, params))
    assert reply is not None
    return json.loads(reply)


async def call(server: DeviceMcpServer, name: str, arguments: Any = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name}
    if arguments is not None:
        params["arguments"] = arguments
    return await ask(server, "tools/call", params)


async def all_pages(server: DeviceMcpServer, with_user_tools: bool) -> list[dict[str, Any]]:
    pages, cursor = [], None
    while True:
        params: dict[str, Any] = {"withUserTools": with_user_tools}
        if cursor is not None:
            params["cursor"] = cursor
        result = (await ask(server, "tools/list", params))["result"]
        pages.append(result)
        cursor = result.get("nextCursor")
        if cursor is None:
            return pages


def nbytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


# -- tools/list --------------------------------------------------------------------------------


async def test_the_default_tool_list_fits_one_page_with_common_tools_first() -> None:
    server = DeviceMcpServer.default()
    result = (await ask(server, "tools/list"))["result"]
    names = [tool["name"] for tool in result["tools"]]
    assert names[:5] == [
        "self.get_device_status", "self.audio_speaker.set_volume", "self.screen.set_brightness",
        "self.screen.set_theme", "self.camera.take_photo",
    ]
    assert "nextCursor" not in result
    assert not any(name in names for name in ("self.get_system_info", "self.reboot"))


async def test_tool_schemas_mark_properties_without_default_as_required() -> None:
    server = DeviceMcpServer.default()
    server.add_tool(Tool("self.t", "d", (
        Property("a", "integer", minimum=1, maximum=5),
        Property("b", "string", default="x"),
        Property("c", "boolean"),
    )))
    tool = json.loads(server.get_tool("self.t").to_json())  # type: ignore[union-attr]
    assert tool == {
        "name": "self.t", "description": "d",
        "inputSchema": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 1, "maximum": 5},
                "b": {"type": "string", "default": "x"},
                "c": {"type": "boolean"},
            },
            "required": ["a", "c"],
        },
    }
    status = json.loads(server.get_tool("self.get_device_status").to_json())  # type: ignore[union-attr]
    assert "required" not in status["inputSchema"]


async def test_pages_stay_within_the_8000_byte_budget_and_the_cursor_is_inclusive() -> None:
    server = DeviceMcpServer.default().with_extra_tools(20)
    pages = await all_pages(server, with_user_tools=True)
    assert len(pages) >= 3
    for page, following in zip(pages, pages[1:], strict=False):
        # The cursor names the first tool *not* included, and the next page starts at it.
        assert page["nextCursor"] == following["tools"][0]["name"]
        assert page["nextCursor"] not in [tool["name"] for tool in page["tools"]]
        body = nbytes({"tools": page["tools"]})
        # The firmware's buffer before the cut is the page without "]}" plus a trailing comma.
        assert (body - 2) + 1 + PAGE_SLACK_BYTES <= MAX_PAGE_BYTES
        # ...and it really did not fit: firmware arithmetic len(json)+len(tool+",")+30 > 8000.
        cut = following["tools"][0]
        assert (body - 2) + 1 + nbytes(cut) + 1 + PAGE_SLACK_BYTES > MAX_PAGE_BYTES
    listed = [tool["name"] for page in pages for tool in page["tools"]]
    assert listed == [tool.name for tool in server.tools]
    assert "nextCursor" not in pages[-1]


async def test_user_only_tools_are_listed_only_with_user_tools_and_carry_the_audience() -> None:
    server = DeviceMcpServer.default().with_extra_tools(20)
    without = [t for page in await all_pages(server, False) for t in page["tools"]]
    with_user = [t for page in await all_pages(server, True) for t in page["tools"]]
    assert all("annotations" not in tool for tool in without)
    user_tools = [tool for tool in with_user if "annotations" in tool]
    assert {tool["name"] for tool in user_tools} >= {"self.get_system_info", "self.reboot"}
    assert all(tool["annotations"] == {"audience": ["user"]} for tool in user_tools)
    assert len(with_user) == len(without) + len(user_tools)


async def test_an_unknown_cursor_is_a_size_limit_error_without_code() -> None:
    reply = await ask(DeviceMcpServer.default(), "tools/list", {"cursor": "self.nope"})
    assert reply == {"jsonrpc": "2.0", "id": 7,
                     "error": {"message": "Failed to add tool  because of payload size limit"}}


async def test_a_tool_too_large_for_a_page_is_reported_by_name() -> None:
    server = DeviceMcpServer(tools=[Tool("self.huge", "x" * 9000)])
    reply = await ask(server, "tools/list")
    assert reply["error"] == {"message": "Failed to add tool self.huge because of payload size limit"}


# -- request validation ------------------------------------------------------------------------


@pytest.mark.parametrize("message", [
    request("tools/list", request_id="7"),                    # string id: no reply at all
    request("tools/list", request_id=None),
    {"jsonrpc": "2.0", "method": "tools/list"},               # no id
    {"jsonrpc": "1.0", "id": 1, "method": "tools/list"},
    {"jsonrpc": "2.0", "id": 1},                              # no method
    {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]},
    {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": None},
    {"jsonrpc": "2.0", "id": 1, "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    "not an object",
])
async def test_invalid_requests_and_notifications_get_no_reply(message: Any) -> None:
    assert await DeviceMcpServer.default().handle(message) is None


async def test_float_ids_are_truncated_like_cjson_valueint() -> None:
    reply = await DeviceMcpServer.default().handle(request("tools/list", request_id=3.9))
    assert json.loads(reply)["id"] == 3  # type: ignore[arg-type]


async def test_unknown_methods_are_not_implemented() -> None:
    reply = await ask(DeviceMcpServer.default(), "resources/list")
    assert reply == {"jsonrpc": "2.0", "id": 7, "error": {"message": "Method not implemented: resources/list"}}


async def test_initialize_stores_the_vision_endpoint_and_names_the_board() -> None:
    server = DeviceMcpServer.default(board_name="my-board", firmware_version="9.8.7")
    reply = await ask(server, "initialize", {
        "protocolVersion": "2024-11-05",
        "capabilities": {"vision": {"url": "http://h/mcp/vision/explain", "token": "tok"}},
        "clientInfo": {"name": "XiaozhiClient", "version": "1.0.0"},
    })
    assert reply["result"] == {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                               "serverInfo": {"name": "my-board", "version": "9.8.7"}}
    assert (server.vision_url, server.vision_token) == ("http://h/mcp/vision/explain", "tok")


# -- tools/call --------------------------------------------------------------------------------


@pytest.mark.parametrize(("arguments", "message"), [
    ({"volume": -1}, "Value is below minimum allowed: 0"),
    ({"volume": 101}, "Value exceeds maximum allowed: 100"),
    ({}, "Missing valid argument: volume"),
    ({"volume": "50"}, "Missing valid argument: volume"),
    ({"volume": True}, "Missing valid argument: volume"),
])
async def test_arguments_are_checked_with_the_firmware_error_texts(arguments: dict, message: str) -> None:
    reply = await call(DeviceMcpServer.default(), "self.audio_speaker.set_volume", arguments)
    assert reply == {"jsonrpc": "2.0", "id": 7, "error": {"message": message}}


@pytest.mark.parametrize(("params", "message"), [
    (None, "Missing params"),
    ({}, "Missing name"),
    ({"name": 5}, "Missing name"),
    ({"name": "self.reboot", "arguments": [1]}, "Invalid arguments"),
    ({"name": "self.reboot", "arguments": None}, "Invalid arguments"),
    ({"name": "self.nope"}, "Unknown tool: self.nope"),
])
async def test_malformed_calls_get_the_firmware_errors(params: dict | None, message: str) -> None:
    reply = await ask(DeviceMcpServer.default(), "tools/call", params)
    assert reply["error"] == {"message": message}
    assert "code" not in reply["error"]


async def test_integers_are_truncated_and_missing_optional_arguments_take_defaults() -> None:
    server = DeviceMcpServer.default()
    seen: list[dict[str, Any]] = []

    def handler(args: dict[str, Any]) -> bool:
        seen.append(args)
        return True

    server.add_tool(Tool("self.t", "d", (
        Property("n", "integer", minimum=0, maximum=10),
        Property("quality", "integer", default=80, minimum=1, maximum=100),
        Property("label", "string", default="x"),
    ), handler=handler))
    reply = await call(server, "self.t", {"n": 7.9, "label": 3})
    assert reply["result"] == {"content": [{"type": "text", "text": "true"}], "isError": False}
    assert seen == [{"n": 7, "quality": 80, "label": "x"}]  # wrong-typed optional → default


async def test_results_become_strings_and_json_results_are_double_encoded() -> None:
    server = DeviceMcpServer.default()
    server.add_tool(Tool("self.t", "d"))
    cases: list[tuple[Any, str]] = [
        (False, "false"), (42, "42"), ("plain", "plain"),
        ({"a": 1, "b": "é"}, '{"a":1,"b":"é"}'), ([1, 2], "[1,2]"),
    ]
    for value, text in cases:
        server.set_result("self.t", value)
        reply = await call(server, "self.t")
        assert reply["result"]["content"] == [{"type": "text", "text": text}]
    server.set_result("self.t", json.dumps({"success": True}))  # already a JSON string
    content = (await call(server, "self.t"))["result"]["content"][0]["text"]
    assert json.loads(content) == {"success": True}


async def test_device_status_is_a_json_string_that_reflects_set_volume() -> None:
    server = DeviceMcpServer.default()
    await call(server, "self.audio_speaker.set_volume", {"volume": 33})
    text = (await call(server, "self.get_device_status"))["result"]["content"][0]["text"]
    assert json.loads(text)["audio_speaker"] == {"volume": 33}
    assert server.calls[-1] == ("self.get_device_status", {})


async def test_image_results_nest_a_json_string() -> None:
    server = DeviceMcpServer.default()
    server.set_result("self.camera.take_photo", ImageResult("image/jpeg", b"\xff\xd8"))
    content = (await call(server, "self.camera.take_photo", {"question": "q"}))["result"]["content"][0]
    assert content["type"] == "image"
    assert json.loads(content["image"]) == {"type": "image", "mimeType": "image/jpeg", "data": "/9g="}


async def test_handler_exceptions_and_async_handlers_are_scriptable() -> None:
    server = DeviceMcpServer.default()
    server.set_error("self.camera.take_photo", "Failed to capture photo")
    reply = await call(server, "self.camera.take_photo", {"question": "q"})
    assert reply["error"] == {"message": "Failed to capture photo"}

    async def slow(args: dict[str, Any]) -> dict[str, Any]:
        return {"echo": args["theme"]}

    server.set_handler("self.screen.set_theme", slow)
    reply = await call(server, "self.screen.set_theme", {"theme": "dark"})
    assert reply["result"]["content"][0]["text"] == '{"echo":"dark"}'


async def test_error_texts_are_pasted_unescaped_like_the_firmware() -> None:
    server = DeviceMcpServer.default()
    server.set_handler("self.reboot", lambda _a: (_ for _ in ()).throw(ToolFailure('bad "quote"')))
    raw = await server.handle(request("tools/call", {"name": "self.reboot"}))
    assert raw == '{"jsonrpc":"2.0","id":7,"error":{"message":"bad "quote""}}'


async def test_user_only_tools_can_be_called_even_when_not_listed() -> None:
    rebooted: list[bool] = []
    server = DeviceMcpServer.default()
    server.on_reboot = lambda: rebooted.append(True)
    reply = await call(server, "self.reboot")
    assert reply["result"]["content"][0]["text"] == "true"
    assert rebooted == [True]


async def test_keys_are_looked_up_case_insensitively_like_cjson() -> None:
    reply = await DeviceMcpServer.default().handle(
        {"JSONRPC": "2.0", "Id": 4, "Method": "tools/call", "Params": {"Name": "self.lamp.turn_on"}})
    assert json.loads(reply)["result"]["content"][0]["text"] == "true"  # type: ignore[arg-type]


async def test_take_photo_uploads_to_the_vision_endpoint_and_returns_its_body() -> None:
    received: dict[str, Any] = {}

    async def explain(req: web.Request) -> web.Response:
        received["headers"] = dict(req.headers)
        form = await req.post()
        received["question"] = form["question"]
        received["file"] = form["file"].file.read()  # type: ignore[union-attr]
        return web.Response(text='{"success":true,"action":"RESPONSE","response":"a cat"}')

    app = web.Application()
    app.router.add_post("/mcp/vision/explain", explain)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        server = DeviceMcpServer.default()
        server.device_id, server.client_id = "aa:bb:cc:dd:ee:ff", "cid"
        await ask(server, "initialize", {"capabilities": {"vision": {
            "url": f"http://127.0.0.1:{port}/mcp/vision/explain", "token": "tok"}}})
        reply = await call(server, "self.camera.take_photo", {"question": "what is it?"})
    finally:
        await runner.cleanup()
    assert json.loads(reply["result"]["content"][0]["text"])["response"] == "a cat"
    assert received["question"] == "what is it?"
    assert received["file"].startswith(b"\xff\xd8")
    assert received["headers"]["Authorization"] == "Bearer tok"
    assert received["headers"]["Device-Id"] == "aa:bb:cc:dd:ee:ff"
    assert received["headers"]["Transfer-Encoding"] == "chunked"


async def test_take_photo_without_a_vision_endpoint_fails_like_the_firmware() -> None:
    reply = await call(DeviceMcpServer.default(), "self.camera.take_photo", {"question": "q"})
    assert reply["error"] == {"message": "Image explain URL or token is not set"}
