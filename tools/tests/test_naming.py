from __future__ import annotations

import itertools

import pytest

from tools.naming import LLM_NAME_RE, NameMap, sanitize, validate_client_tool_name


@pytest.mark.parametrize(
    "name",
    ["get_battery", "device.light.turn_on", "weather.get_current", "sensor.temperature.read",
     "_private", "a", "A1.b2_c3", "x" * 64],
)
def test_it_accepts_valid_client_tool_names(name: str) -> None:
    assert validate_client_tool_name(name) is None


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("1tool", "start with a letter"),
        (".tool", "start with a letter"),
        ("tool.", "end with a dot"),
        ("tool..name", "consecutive dots"),
        ("", "non-empty"),
        ("x" * 65, "at most 64"),
        ("get-battery", "only letters, digits"),
        ("get battery", "only letters, digits"),
        ("ébattery", "start with a letter"),
        ("batterié", "only letters, digits"),
        (None, "non-empty string"),
        (42, "non-empty string"),
    ],
)
def test_it_rejects_invalid_client_tool_names_with_a_reason(name: object, fragment: str) -> None:
    error = validate_client_tool_name(name)
    assert error is not None
    assert fragment in error


def test_it_replaces_dots_and_other_characters_with_underscores() -> None:
    assert sanitize("self.audio_speaker.set_volume") == "self_audio_speaker_set_volume"
    assert sanitize("weather/get current!") == "weather_get_current_"
    assert sanitize("keep-dashes_and_underscores") == "keep-dashes_and_underscores"


def test_it_truncates_long_names_with_a_stable_hash() -> None:
    long_a = "tool." + "a" * 100
    long_b = "tool." + "a" * 99 + "b"
    assert len(sanitize(long_a)) == 64
    assert sanitize(long_a) == sanitize(long_a)
    assert sanitize(long_a) != sanitize(long_b)
    assert sanitize(long_a).startswith("tool_aaaa")


def test_it_gives_names_without_any_ascii_a_readable_hash_name() -> None:
    first, second = sanitize("播放音乐"), sanitize("暂停")
    assert first.startswith("tool_") and second.startswith("tool_")
    assert first != second
    assert LLM_NAME_RE.match(first)


def test_it_maps_source_names_to_llm_names_and_back() -> None:
    names = NameMap([("device", "self.get_device_status"), ("server", "get_weather")])
    assert names.to_llm("device", "self.get_device_status") == "self_get_device_status"
    assert names.from_llm("self_get_device_status") == ("device", "self.get_device_status")
    assert names.from_llm("get_weather") == ("server", "get_weather")
    assert "get_weather" in names and len(names) == 2


def test_it_raises_key_error_for_unknown_names() -> None:
    names = NameMap([("server", "get_weather")])
    with pytest.raises(KeyError):
        names.from_llm("nope")
    with pytest.raises(KeyError):
        names.to_llm("device", "get_weather")


def test_it_gives_the_plain_name_to_the_higher_priority_source() -> None:
    names = NameMap([("client", "get_weather"), ("mcp:weather", "get_weather"), ("server", "get_weather")])
    assert names.from_llm("get_weather") == ("server", "get_weather")
    assert names.from_llm("get_weather_2") == ("mcp:weather", "get_weather")
    assert names.from_llm("get_weather_3") == ("client", "get_weather")


def test_it_resolves_collisions_created_by_sanitising() -> None:
    names = NameMap([("device", "self.volume"), ("device", "self_volume")])
    # Same source: sorted by name, "self.volume" < "self_volume".
    assert names.to_llm("device", "self.volume") == "self_volume"
    assert names.to_llm("device", "self_volume") == "self_volume_2"


def test_a_suffixed_name_never_steals_another_tools_plain_name() -> None:
    names = NameMap([("server", "a.b"), ("device", "a_b"), ("client", "a_b_2")])
    assert names.to_llm("server", "a.b") == "a_b"
    assert names.to_llm("client", "a_b_2") == "a_b_2"
    assert names.to_llm("device", "a_b") == "a_b_3"


def test_the_mapping_does_not_depend_on_listing_order() -> None:
    entries = [("server", "x.y"), ("device", "x_y"), ("mcp:a", "x.y"), ("mcp:b", "x-y"), ("client", "x.y")]
    reference = NameMap(entries)
    for perm in itertools.permutations(entries):
        other = NameMap(perm)
        assert all(other.to_llm(*e) == reference.to_llm(*e) for e in entries)


def test_every_llm_name_is_valid_and_unique_even_for_hostile_names() -> None:
    hostile = ["", ".", "..", "a" * 200, "a" * 200 + "b", "-", "名字", "名字", "x y", "x_y", "x.y",
               "self." * 30, "tool_" + "9" * 70]
    entries = [(source, name) for source in ("server", "device", "client") for name in hostile]
    names = NameMap(entries)
    llm_names = [names.to_llm(*e) for e in set(entries)]
    assert len(set(llm_names)) == len(set(entries))
    assert all(LLM_NAME_RE.match(n) for n in llm_names)
    assert all(names.from_llm(names.to_llm(*e)) == e for e in entries)


def test_suffixes_keep_long_names_within_64_characters() -> None:
    long_name = "n" * 64
    names = NameMap([("server", long_name), ("device", long_name), ("client", long_name)])
    assert names.to_llm("server", long_name) == long_name
    assert names.to_llm("device", long_name) == "n" * 62 + "_2"
    assert names.to_llm("client", long_name) == "n" * 62 + "_3"


def test_a_second_source_of_the_same_kind_keeps_its_kinds_priority() -> None:
    names = NameMap([("client#2", "ping"), ("mcp:z", "ping"), ("client", "ping")])
    assert names.from_llm("ping") == ("mcp:z", "ping")
    assert names.from_llm("ping_2") == ("client", "ping")
    assert names.from_llm("ping_3") == ("client#2", "ping")
