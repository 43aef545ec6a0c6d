"""Built-in server tools (seed 001 §7.2 plus `end_conversation`).

Each tool is a plain async function `(state, **arguments) -> dict` with a JSON schema; the
`BuiltinToolSource` serialises results as compact JSON. `state` is the session's
`SessionToolState`: tools that change the conversation (language, role-play, ending it)
write there and the session reads it back, so these functions need no session object.
"""
from __future__ import annotations

import copy
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
import datetime as dt
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import aiohttp

from tools.errors import ToolError
from tools.registry import ToolSpec, empty_schema

logger = logging.getLogger(__name__)

SUPPORTED_LANGUAGES: dict[str, str] = {
    "zh": "Chinese",
    "en": "English",
    "ja": "Japanese",
    "ko": "Korean",
    "de": "German",
    "fr": "French",
    "ru": "Russian",
    "pt": "Portuguese",
    "es": "Spanish",
    "it": "Italian",
}

# WMO weather interpretation codes, as used by Open-Meteo.
WEATHER_CODES: dict[int, str] = {
    0: "clear sky", 1: "mainly clear", 2: "partly cloudy", 3: "overcast",
    45: "fog", 48: "depositing rime fog",
    51: "light drizzle", 53: "moderate drizzle", 55: "dense drizzle",
    56: "light freezing drizzle", 57: "dense freezing drizzle",
    61: "slight rain", 63: "moderate rain", 65: "heavy rain",
    66: "light freezing rain", 67: "heavy freezing rain",
    71: "slight snow", 73: "moderate snow", 75: "heavy snow", 77: "snow grains",
    80: "slight rain showers", 81: "moderate rain showers", 82: "violent rain showers",
    85: "slight snow showers", 86: "heavy snow showers",
    95: "thunderstorm", 96: "thunderstorm with slight hail", 99: "thunderstorm with heavy hail",
}

_DAILY = "weather_code,temperature_2m_max,temperature_2m_min,precipitation_probability_max"
_CURRENT = "temperature_2m,weather_code,wind_speed_10m"
_FORECAST_DAYS = 7
# Relative dates models pass through from the user's words (most users speak Chinese).
_TODAY = ("today", "今天")
_TOMORROW = ("tomorrow", "明天")
_DAY_AFTER = ("day after tomorrow", "the day after tomorrow", "后天")


@dataclass
class SessionToolState:
    """Per-session state the built-in tools read and write."""

    timezone: str = "UTC"  # IANA name
    location: str = ""  # the device's configured location (a city name)
    language: str = "zh"  # reply language code; default from the persona
    characters: list[dict] = field(default_factory=list)  # [{"name", "description"}]
    roleplay: str | None = None  # active character name
    end_requested: bool = False  # the session closes after the goodbye
    weather_base_url: str = "https://api.open-meteo.com/v1/forecast"
    geocoding_url: str = "https://geocoding-api.open-meteo.com/v1/search"
    http_timeout: float = 8.0  # below the source's 10 s so the clearer error wins


ToolFunc = Callable[..., Awaitable[dict]]


@dataclass(frozen=True)
class BuiltinTool:
    name: str
    description: str
    parameters: dict
    func: ToolFunc


def _schema(properties: dict | None = None, required: list[str] | None = None) -> dict:
    schema = empty_schema()
    schema["properties"] = properties or {}
    if required:
        schema["required"] = required
    return schema


_SESSION_ID = {
    "type": "string",
    "description": "Optional session id (ignored: the tool always acts on this conversation).",
}


# -- time and place ---------------------------------------------------------------------------


async def get_current_time(state: SessionToolState, timezone: str | None = None) -> dict:
    zone = _zone(timezone or state.timezone)
    now = dt.datetime.now(zone)
    return {
        "timezone": str(zone),
        "datetime": now.isoformat(timespec="seconds"),
        "date": now.date().isoformat(),
        "time": now.strftime("%H:%M"),
        "weekday": now.strftime("%A"),
    }


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        text = f"unknown timezone '{name}'; use an IANA name such as 'Asia/Shanghai'"
        raise ToolError(text) from None


async def get_location(state: SessionToolState) -> dict:
    if not state.location:
        return {"location": None, "note": "no location is configured for this device"}
    return {"location": state.location}


# -- weather ----------------------------------------------------------------------------------


async def get_weather(
    state: SessionToolState, city: str | None = None, date: str | None = None
) -> dict:
    city = (city or state.location).strip()
    if not city:
        raise ToolError(
            "no city given and the device has no configured location; ask the user for a city"
        )
    timeout = aiohttp.ClientTimeout(total=state.http_timeout)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        place = await _geocode(http, state.geocoding_url, city)
        forecast = await _forecast(http, state.weather_base_url, place)
    index = _day_index(forecast, date)
    result: dict[str, Any] = {"city": place.get("name", city), "country": place.get("country", "")}
    current = _current(forecast) if index == 0 else None
    if current is not None:
        result["current"] = current
    result["day"] = _daily(forecast, index)
    return result


async def _get_json(http: aiohttp.ClientSession, url: str, params: dict[str, Any]) -> dict:
    try:
        async with http.get(url, params=params) as response:
            if response.status != 200:
                raise ToolError(f"the weather service answered with HTTP {response.status}")
            data = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        logger.warning("weather service request failed", exc_info=True, extra={"url": url})
        raise ToolError("the weather service is unavailable right now") from None
    if not isinstance(data, dict):
        raise ToolError("the weather service sent an unexpected reply")
    return data


async def _geocode(http: aiohttp.ClientSession, url: str, city: str) -> dict:
    data = await _get_json(http, url, {"name": city, "count": 1, "format": "json"})
    results = data.get("results")
    if not isinstance(results, list) or not results or not isinstance(results[0], dict):
        raise ToolError(f"could not find a place called '{city}'")
    place = results[0]
    coordinates = (place.get("latitude"), place.get("longitude"))
    if not all(isinstance(c, (int, float)) for c in coordinates):
        raise ToolError("the weather service sent an unexpected reply")
    return place


async def _forecast(http: aiohttp.ClientSession, url: str, place: dict) -> dict:
    params = {
        "latitude": place["latitude"],
        "longitude": place["longitude"],
        "current": _CURRENT,
        "daily": _DAILY,
        "timezone": "auto",
        "forecast_days": _FORECAST_DAYS,
    }
    data = await _get_json(http, url, params)
    if not isinstance(data.get("daily"), dict):
        raise ToolError("the weather service sent an unexpected reply")
    return data


def _day_index(forecast: dict, wanted: str | None) -> int:
    days = forecast["daily"].get("time") or []
    if not wanted or wanted.strip().lower() in _TODAY:
        return 0
    if not days:
        raise ToolError("the weather service has no daily forecast")
    target = _parse_date(wanted.strip().lower(), days[0])
    if target not in days:
        raise ToolError(f"no forecast for {wanted}; forecasts cover {days[0]} to {days[-1]}")
    return days.index(target)


def _parse_date(wanted: str, first_day: str) -> str:
    # "Today" is the first forecast day: Open-Meteo answers in the place's own timezone.
    try:
        base = dt.date.fromisoformat(first_day)
    except ValueError:
        base = dt.date.today()
    if wanted in _TOMORROW:
        return (base + dt.timedelta(days=1)).isoformat()
    if wanted in _DAY_AFTER:
        return (base + dt.timedelta(days=2)).isoformat()
    try:
        return dt.date.fromisoformat(wanted).isoformat()
    except ValueError:
        raise ToolError("the date must be YYYY-MM-DD, 'today' or 'tomorrow'") from None


def _current(forecast: dict) -> dict | None:
    current = forecast.get("current")
    if not isinstance(current, dict):
        return None
    return {
        "temperature_c": current.get("temperature_2m"),
        "condition": _condition(current.get("weather_code")),
        "wind_speed_kmh": current.get("wind_speed_10m"),
    }


def _daily(forecast: dict, index: int) -> dict:
    daily = forecast["daily"]

    def value(key: str) -> Any:
        series = daily.get(key)
        return series[index] if isinstance(series, list) and index < len(series) else None

    return {
        "date": value("time"),
        "condition": _condition(value("weather_code")),
        "max_c": value("temperature_2m_max"),
        "min_c": value("temperature_2m_min"),
        "precipitation_probability": value("precipitation_probability_max"),
    }


def _condition(code: object) -> str | None:
    return WEATHER_CODES.get(code, "unknown") if isinstance(code, int) else None


# -- language ---------------------------------------------------------------------------------


async def set_response_language(state: SessionToolState, language: str) -> dict:
    code = language.strip().lower()
    if code not in SUPPORTED_LANGUAGES:
        supported = ", ".join(SUPPORTED_LANGUAGES)
        raise ToolError(f"unsupported language '{language}'; supported codes: {supported}")
    state.language = code
    return {"language": code, "name": SUPPORTED_LANGUAGES[code]}


async def get_response_language(state: SessionToolState) -> dict:
    name = SUPPORTED_LANGUAGES.get(state.language, state.language)
    return {"language": state.language, "name": name}


async def list_supported_languages(state: SessionToolState) -> dict:
    languages = [{"code": code, "name": name} for code, name in SUPPORTED_LANGUAGES.items()]
    return {"languages": languages}


# -- role-play --------------------------------------------------------------------------------


async def enter_roleplay_mode(
    state: SessionToolState, character: str, session_id: str | None = None
) -> dict:
    found = _find_character(state, character)
    if found is None:
        names = ", ".join(str(c.get("name")) for c in state.characters) or "none"
        raise ToolError(f"unknown character '{character}'; available characters: {names}")
    state.roleplay = str(found.get("name"))
    return {"roleplay": state.roleplay, "description": found.get("description", "")}


def _find_character(state: SessionToolState, wanted: str) -> dict | None:
    key = wanted.strip().casefold()
    return next((c for c in state.characters if str(c.get("name", "")).casefold() == key), None)


async def exit_roleplay_mode(state: SessionToolState, session_id: str | None = None) -> dict:
    previous, state.roleplay = state.roleplay, None
    return {"roleplay": None, "previous": previous}


async def get_roleplay_status(state: SessionToolState, session_id: str | None = None) -> dict:
    return {"active": state.roleplay is not None, "character": state.roleplay}


async def list_available_characters(state: SessionToolState) -> dict:
    characters = [
        {"name": c.get("name"), "description": c.get("description", "")} for c in state.characters
    ]
    return {"characters": characters}


# -- ending -----------------------------------------------------------------------------------


async def end_conversation(state: SessionToolState) -> dict:
    state.end_requested = True
    return {"ending": True, "instruction": "say a short goodbye; the conversation ends after it"}


# -- catalogue and source ---------------------------------------------------------------------

_LANGUAGE = {"type": "string", "enum": list(SUPPORTED_LANGUAGES), "description": "Language code"}
_CITY = {"type": "string", "description": "City name; omit for the device's location"}
_DATE = {"type": "string", "description": "YYYY-MM-DD, 'today' or 'tomorrow'; omit for today"}
_TIMEZONE = {"type": "string", "description": "IANA timezone, e.g. Asia/Shanghai"}
_CHARACTER = {"type": "string", "description": "Character name"}

_CATALOGUE = [
    BuiltinTool(
        "get_current_time",
        "Get the current date, time and weekday. Defaults to the device's timezone.",
        _schema({"timezone": _TIMEZONE}),
        get_current_time,
    ),
    BuiltinTool(
        "get_weather",
        "Get the weather for a city: current conditions and the forecast for a day within "
        "the next 7 days. Defaults to the device's location and today.",
        _schema({"city": _CITY, "date": _DATE}),
        get_weather,
    ),
    BuiltinTool("get_location", "Get the device's configured location.", _schema(), get_location),
    BuiltinTool(
        "set_response_language",
        "Change the language you reply in.",
        _schema({"language": _LANGUAGE}, ["language"]),
        set_response_language,
    ),
    BuiltinTool(
        "get_response_language", "Get the current reply language.", _schema(), get_response_language
    ),
    BuiltinTool(
        "list_supported_languages",
        "List the reply languages you can switch to.",
        _schema(),
        list_supported_languages,
    ),
    BuiltinTool(
        "enter_roleplay_mode",
        "Start role-playing one of the available characters.",
        _schema({"character": _CHARACTER, "session_id": _SESSION_ID}, ["character"]),
        enter_roleplay_mode,
    ),
    BuiltinTool(
        "exit_roleplay_mode",
        "Stop role-playing and return to your normal persona.",
        _schema({"session_id": _SESSION_ID}),
        exit_roleplay_mode,
    ),
    BuiltinTool(
        "get_roleplay_status",
        "Tell whether role-play is active and as which character.",
        _schema({"session_id": _SESSION_ID}),
        get_roleplay_status,
    ),
    BuiltinTool(
        "list_available_characters",
        "List the characters available for role-play.",
        _schema(),
        list_available_characters,
    ),
    BuiltinTool(
        "end_conversation",
        "End the conversation when the user says goodbye or asks to stop. "
        "Say goodbye in the same reply.",
        _schema(),
        end_conversation,
    ),
]

BUILTIN_TOOLS: dict[str, BuiltinTool] = {tool.name: tool for tool in _CATALOGUE}


@functools.lru_cache(maxsize=64)
def builtin_listing(allowed: frozenset[str] | None) -> tuple[ToolSpec, ...]:
    """The specs of the allowed built-in tools, made once per set of allowed names.

    Every session lists them as it starts: a deep copy of every schema per session was ~0.4 ms
    of a device's connect in a reboot storm (docs/performance.md, P10). The copies made here
    keep the catalogue itself out of reach; the specs are frozen and their parameter dicts
    are shared by the sessions, as the prepared listings of tools/registry.py already are
    (nobody mutates them)."""
    return tuple(
        ToolSpec(t.name, t.description, copy.deepcopy(t.parameters), "server")
        for name, t in BUILTIN_TOOLS.items() if allowed is None or name in allowed
    )


class BuiltinToolSource:
    """The built-in tools as a ToolSource (kind "server"), bound to one session's state."""

    kind = "server"
    origin = ""

    def __init__(
        self,
        state: SessionToolState,
        allowed: set[str] | frozenset[str] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.state = state
        self.allowed = frozenset(allowed) if allowed is not None else None
        self.timeout = timeout

    async def list_tools(self) -> list[ToolSpec]:
        return list(builtin_listing(self.allowed))

    async def call(self, name: str, arguments: dict) -> str:
        tool = BUILTIN_TOOLS.get(name)
        if tool is None or (self.allowed is not None and name not in self.allowed):
            raise ToolError(f"unknown server tool '{name}'")
        # Drop arguments the schema does not declare: models invent extras, and a Python
        # TypeError is no help to them.
        known = tool.parameters.get("properties", {})
        kwargs = {k: v for k, v in arguments.items() if k in known and v is not None}
        result = await tool.func(self.state, **kwargs)
        return json.dumps(result, ensure_ascii=False, separators=(",", ":"))
