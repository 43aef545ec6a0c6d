from __future__ import annotations

import datetime as dt
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

import pytest
from aiohttp import web

from tools.builtin import BUILTIN_TOOLS, SUPPORTED_LANGUAGES, BuiltinToolSource, SessionToolState
from tools.errors import ToolError
from tools.registry import Toolset

DAYS = [f"2025-02-{d:02d}" for d in range(21, 28)]
PLACES = {
    "berlin": {"id": 2950159, "name": "Berlin", "latitude": 52.52437, "longitude": 13.41053,
               "country_code": "DE", "timezone": "Europe/Berlin", "country": "Germany",
               "admin1": "Land Berlin"},
    "北京": {"id": 1816670, "name": "北京市", "latitude": 39.9075, "longitude": 116.39723,
           "country_code": "CN", "timezone": "Asia/Shanghai", "country": "中国"},
}


@dataclass
class FakeOpenMeteo:
    """A loopback server answering like Open-Meteo's geocoding and forecast APIs."""

    base: str = ""
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/search", self.search)
        app.router.add_get("/v1/forecast", self.forecast)
        app.router.add_get("/broken/forecast", self.broken)
        app.router.add_get("/garbage/search", self.garbage)
        return app

    async def search(self, request: web.Request) -> web.Response:
        self.requests.append(("search", dict(request.query)))
        place = PLACES.get(request.query.get("name", "").lower())
        body: dict = {"generationtime_ms": 0.4}
        if place is not None:
            body["results"] = [place]
        return web.json_response(body)

    async def forecast(self, request: web.Request) -> web.Response:
        self.requests.append(("forecast", dict(request.query)))
        return web.json_response({
            "latitude": 52.52, "longitude": 13.42, "timezone": "Europe/Berlin",
            "current_units": {"temperature_2m": "°C", "weather_code": "wmo code", "wind_speed_10m": "km/h"},
            "current": {"time": "2025-02-21T10:30", "interval": 900, "temperature_2m": 4.2,
                        "weather_code": 3, "wind_speed_10m": 11.5},
            "daily": {
                "time": DAYS,
                "weather_code": [3, 61, 0, 95, 71, 2, 45],
                "temperature_2m_max": [6.1, 8.0, 9.5, 7.2, 1.0, 3.3, 4.4],
                "temperature_2m_min": [0.2, 2.5, 1.1, -1.0, -4.2, -2.0, 0.0],
                "precipitation_probability_max": [10, 80, 0, 65, 90, 5, 20],
            },
        })

    async def broken(self, request: web.Request) -> web.Response:
        return web.Response(status=500, text="internal error")

    async def garbage(self, request: web.Request) -> web.Response:
        return web.Response(text="<html>not json</html>", content_type="text/html")


@pytest.fixture
async def meteo() -> AsyncIterator[FakeOpenMeteo]:
    fake = FakeOpenMeteo()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.base = f"http://127.0.0.1:{port}"
    yield fake
    await runner.cleanup()


def state_for(meteo: FakeOpenMeteo | None = None, **overrides: object) -> SessionToolState:
    values: dict = {
        "timezone": "Asia/Shanghai",
        "location": "Berlin",
        "language": "zh",
        "characters": [{"name": "Pirate", "description": "A cheerful pirate"},
                       {"name": "Robot", "description": "A polite robot"}],
    }
    state = SessionToolState(**(values | overrides))
    if meteo is not None:
        state.geocoding_url = f"{meteo.base}/v1/search"
        state.weather_base_url = f"{meteo.base}/v1/forecast"
    return state


async def call(state: SessionToolState, name: str, **arguments: object) -> dict:
    text = await BuiltinToolSource(state).call(name, dict(arguments))
    assert ": " not in text and ", " not in text.replace("你好, ", "")  # compact JSON
    return json.loads(text)


# -- catalogue ------------------------------------------------------------------------------


async def test_it_lists_every_builtin_tool_with_an_object_schema() -> None:
    specs = await BuiltinToolSource(state_for()).list_tools()
    assert [s.name for s in specs] == [
        "get_current_time", "get_weather", "get_location", "set_response_language",
        "get_response_language", "list_supported_languages", "enter_roleplay_mode",
        "exit_roleplay_mode", "get_roleplay_status", "list_available_characters", "end_conversation",
    ]
    for spec in specs:
        assert spec.source == "server" and spec.description
        assert spec.parameters["type"] == "object" and "properties" in spec.parameters


async def test_it_offers_only_the_allowed_tools() -> None:
    source = BuiltinToolSource(state_for(), allowed={"get_location", "end_conversation"})
    assert [s.name for s in await source.list_tools()] == ["get_location", "end_conversation"]
    with pytest.raises(ToolError, match="unknown server tool 'get_weather'"):
        await source.call("get_weather", {})


async def test_sessions_share_one_listing_made_from_copies_of_the_catalogue() -> None:
    first = await BuiltinToolSource(state_for()).list_tools()
    second = await BuiltinToolSource(state_for()).list_tools()
    assert first == second and all(a is b for a, b in zip(first, second, strict=True))
    assert first is not second  # each session gets its own list
    for spec in first:
        assert spec.parameters == BUILTIN_TOOLS[spec.name].parameters
        assert spec.parameters is not BUILTIN_TOOLS[spec.name].parameters


async def test_an_unknown_tool_is_a_tool_error() -> None:
    with pytest.raises(ToolError, match="unknown server tool"):
        await BuiltinToolSource(state_for()).call("rm_rf", {})


async def test_arguments_the_schema_does_not_declare_are_ignored() -> None:
    result = await call(state_for(), "get_location", mood="happy")
    assert result == {"location": "Berlin"}


# -- time and place -------------------------------------------------------------------------


async def test_get_current_time_defaults_to_the_device_timezone() -> None:
    result = await call(state_for(), "get_current_time")
    assert result["timezone"] == "Asia/Shanghai"
    now = dt.datetime.fromisoformat(result["datetime"])
    assert now.utcoffset() == dt.timedelta(hours=8)
    assert abs((now - dt.datetime.now(ZoneInfo("Asia/Shanghai"))).total_seconds()) < 5
    assert result["date"] == now.date().isoformat()
    assert result["weekday"] == now.strftime("%A")


async def test_get_current_time_accepts_another_timezone() -> None:
    result = await call(state_for(), "get_current_time", timezone="America/New_York")
    assert result["timezone"] == "America/New_York"


@pytest.mark.parametrize("zone", ["Mars/Olympus", "../etc/passwd", ""])
async def test_get_current_time_rejects_unknown_timezones(zone: str) -> None:
    state = state_for()
    if zone == "":
        state.timezone = "Nowhere/Land"
    with pytest.raises(ToolError, match="unknown timezone"):
        await BuiltinToolSource(state).call("get_current_time", {"timezone": zone} if zone else {})


async def test_get_location_reports_the_configured_location() -> None:
    assert await call(state_for(), "get_location") == {"location": "Berlin"}
    empty = await call(state_for(location=""), "get_location")
    assert empty["location"] is None and "no location" in empty["note"]


# -- weather --------------------------------------------------------------------------------


async def test_get_weather_geocodes_the_city_then_asks_for_the_forecast(meteo: FakeOpenMeteo) -> None:
    result = await call(state_for(meteo), "get_weather", city="Berlin")
    assert result == {
        "city": "Berlin",
        "country": "Germany",
        "current": {"temperature_c": 4.2, "condition": "overcast", "wind_speed_kmh": 11.5},
        "day": {"date": "2025-02-21", "condition": "overcast", "max_c": 6.1, "min_c": 0.2,
                "precipitation_probability": 10},
    }
    (kind1, search), (kind2, forecast) = meteo.requests
    assert (kind1, kind2) == ("search", "forecast")
    assert search["name"] == "Berlin" and search["count"] == "1"
    assert forecast["latitude"] == "52.52437" and forecast["longitude"] == "13.41053"
    assert forecast["current"] == "temperature_2m,weather_code,wind_speed_10m"
    assert forecast["timezone"] == "auto"
    assert "temperature_2m_max" in forecast["daily"]


async def test_get_weather_defaults_to_the_device_location(meteo: FakeOpenMeteo) -> None:
    result = await call(state_for(meteo, location="北京"), "get_weather")
    assert result["city"] == "北京市"
    assert meteo.requests[0][1]["name"] == "北京"


@pytest.mark.parametrize(
    ("date", "expected"),
    [("tomorrow", "2025-02-22"), ("2025-02-24", "2025-02-24"), ("today", "2025-02-21"),
     ("明天", "2025-02-22"), ("后天", "2025-02-23")],
)
async def test_get_weather_gives_the_forecast_for_a_date(
    meteo: FakeOpenMeteo, date: str, expected: str
) -> None:
    result = await call(state_for(meteo), "get_weather", city="Berlin", date=date)
    assert result["day"]["date"] == expected
    assert ("current" in result) == (expected == "2025-02-21")


async def test_get_weather_names_the_condition_of_the_day(meteo: FakeOpenMeteo) -> None:
    result = await call(state_for(meteo), "get_weather", city="Berlin", date="2025-02-24")
    assert result["day"]["condition"] == "thunderstorm" and result["day"]["min_c"] == -1.0


@pytest.mark.parametrize(
    ("date", "fragment"),
    [("2025-03-30", "no forecast for 2025-03-30"), ("next week", "YYYY-MM-DD")],
)
async def test_get_weather_refuses_dates_it_cannot_answer(
    meteo: FakeOpenMeteo, date: str, fragment: str
) -> None:
    source = BuiltinToolSource(state_for(meteo))
    with pytest.raises(ToolError, match=fragment):
        await source.call("get_weather", {"city": "Berlin", "date": date})


async def test_get_weather_reports_an_unknown_city(meteo: FakeOpenMeteo) -> None:
    with pytest.raises(ToolError, match="could not find a place called 'Atlantis'"):
        await BuiltinToolSource(state_for(meteo)).call("get_weather", {"city": "Atlantis"})


async def test_get_weather_without_city_or_location_asks_for_one(meteo: FakeOpenMeteo) -> None:
    with pytest.raises(ToolError, match="ask the user for a city"):
        await BuiltinToolSource(state_for(meteo, location="")).call("get_weather", {})
    assert meteo.requests == []


async def test_get_weather_reports_a_failing_service(meteo: FakeOpenMeteo) -> None:
    state = state_for(meteo)
    state.weather_base_url = f"{meteo.base}/broken/forecast"
    with pytest.raises(ToolError, match="HTTP 500"):
        await BuiltinToolSource(state).call("get_weather", {"city": "Berlin"})


async def test_get_weather_reports_a_garbled_reply(meteo: FakeOpenMeteo) -> None:
    state = state_for(meteo)
    state.geocoding_url = f"{meteo.base}/garbage/search"
    with pytest.raises(ToolError, match="weather service is unavailable"):
        await BuiltinToolSource(state).call("get_weather", {"city": "Berlin"})


async def test_get_weather_reports_an_unreachable_service() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    state = state_for()
    state.geocoding_url = f"http://127.0.0.1:{port}/v1/search"
    with pytest.raises(ToolError, match="weather service is unavailable"):
        await BuiltinToolSource(state).call("get_weather", {"city": "Berlin"})


async def test_get_weather_works_through_a_toolset(meteo: FakeOpenMeteo) -> None:
    toolset = Toolset([BuiltinToolSource(state_for(meteo))])
    await toolset.refresh()
    record = await toolset.call("get_weather", '{"city": "Berlin", "date": "tomorrow"}')
    assert record.success and json.loads(record.result)["day"]["condition"] == "slight rain"
    failed = await toolset.call("get_weather", '{"city": "Atlantis"}')
    assert not failed.success and failed.result == "Error: could not find a place called 'Atlantis'"


# -- language -------------------------------------------------------------------------------


async def test_set_response_language_changes_the_session_language() -> None:
    state = state_for()
    changed = await call(state, "set_response_language", language="EN")
    assert changed == {"language": "en", "name": "English"}
    assert state.language == "en"
    assert await call(state, "get_response_language") == {"language": "en", "name": "English"}


async def test_set_response_language_refuses_unsupported_languages() -> None:
    state = state_for()
    with pytest.raises(ToolError, match="unsupported language 'xx'; supported codes: zh, en"):
        await BuiltinToolSource(state).call("set_response_language", {"language": "xx"})
    assert state.language == "zh"


async def test_the_toolset_rejects_a_language_outside_the_enum() -> None:
    toolset = Toolset([BuiltinToolSource(state_for())])
    await toolset.refresh()
    record = await toolset.call("set_response_language", '{"language": "klingon"}')
    assert record.error == "invalid_arguments"


async def test_list_supported_languages_lists_the_ten_languages() -> None:
    result = await call(state_for(), "list_supported_languages")
    assert [lang["code"] for lang in result["languages"]] == list(SUPPORTED_LANGUAGES)
    assert len(result["languages"]) == 10


# -- role-play ------------------------------------------------------------------------------


async def test_roleplay_can_be_entered_checked_and_left() -> None:
    state = state_for()
    assert await call(state, "get_roleplay_status") == {"active": False, "character": None}
    entered = await call(state, "enter_roleplay_mode", character="pirate", session_id="abc")
    assert entered == {"roleplay": "Pirate", "description": "A cheerful pirate"}
    assert state.roleplay == "Pirate"
    assert await call(state, "get_roleplay_status") == {"active": True, "character": "Pirate"}
    assert await call(state, "exit_roleplay_mode") == {"roleplay": None, "previous": "Pirate"}
    assert state.roleplay is None


async def test_an_unknown_character_is_refused_with_the_available_ones() -> None:
    state = state_for()
    expected = "unknown character 'Wizard'; available characters: Pirate, Robot"
    with pytest.raises(ToolError, match=expected):
        await BuiltinToolSource(state).call("enter_roleplay_mode", {"character": "Wizard"})
    assert state.roleplay is None


async def test_list_available_characters_lists_the_personas() -> None:
    result = await call(state_for(), "list_available_characters")
    assert result == {"characters": [{"name": "Pirate", "description": "A cheerful pirate"},
                                     {"name": "Robot", "description": "A polite robot"}]}
    assert await call(state_for(characters=[]), "list_available_characters") == {"characters": []}


# -- ending ---------------------------------------------------------------------------------


async def test_end_conversation_asks_the_session_to_close_after_the_goodbye() -> None:
    state = state_for()
    result = await call(state, "end_conversation")
    assert state.end_requested is True
    assert result["ending"] is True and "goodbye" in result["instruction"]


def test_every_builtin_tool_has_a_valid_llm_name() -> None:
    assert all(name.replace("_", "").isalnum() and len(name) <= 64 for name in BUILTIN_TOOLS)
