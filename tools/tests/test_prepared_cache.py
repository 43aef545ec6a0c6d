"""A listing seen before (every device of a firmware lists the same tools) is taken as prepared,
without the schema thread; a changed listing, schema or limit is prepared anew."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from tools import registry
from tools.limits import ToolLimits
from tools.registry import ToolSpec, Toolset
from tools.tests.test_registry import VOLUME_SCHEMA, StaticSource

VOLUME = ToolSpec("self.audio_speaker.set_volume", "Set the volume", VOLUME_SCHEMA, "device")
LAMP = ToolSpec("self.lamp.turn_on", "Turn the lamp on", {"type": "object", "properties": {}}, "device")


@pytest.fixture(autouse=True)
def hops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the tools prepared in the schema thread, one list per hop."""
    registry.prepared_clear()
    seen: list[str] = []
    real = registry.in_schema_thread

    async def counting(func: Any, *args: Any) -> Any:
        if func is registry.prepare_tools_cached:  # not argument validation
            seen.append(",".join(spec.name for spec in args[0]))
        return await real(func, *args)

    monkeypatch.setattr(registry, "in_schema_thread", counting)
    yield seen
    registry.prepared_clear()


async def session_tools(specs: list[ToolSpec], kind: str = "device", limits: ToolLimits | None = None) -> set[str]:
    toolset = Toolset([StaticSource(kind, specs)], limits=limits or ToolLimits())
    await toolset.refresh()
    return {tool["function"]["name"] for tool in toolset.llm_tools()}


async def test_the_same_listing_is_prepared_once(hops: list[str]) -> None:
    first = await session_tools([VOLUME, LAMP])
    second = await session_tools([VOLUME, LAMP])
    assert first == second == {"self_audio_speaker_set_volume", "self_lamp_turn_on"}
    assert len(hops) == 1


async def test_the_cached_tools_still_validate_arguments() -> None:
    await session_tools([VOLUME])
    toolset = Toolset([StaticSource("device", [VOLUME])])
    await toolset.refresh()
    bad = await toolset.call("self_audio_speaker_set_volume", {"volume": 300})
    good = await toolset.call("self_audio_speaker_set_volume", {"volume": 30})
    assert not bad.success and good.success


async def test_a_changed_listing_is_prepared_anew(hops: list[str]) -> None:
    await session_tools([VOLUME])
    assert await session_tools([VOLUME, LAMP]) == {"self_audio_speaker_set_volume", "self_lamp_turn_on"}
    narrower = replace(VOLUME, parameters={**VOLUME_SCHEMA, "properties": {"volume": {"type": "string"}}})
    await session_tools([narrower])
    toolset = Toolset([StaticSource("device", [narrower])])
    await toolset.refresh()
    assert (await toolset.call("self_audio_speaker_set_volume", {"volume": "loud"})).success
    assert hops == ["self.audio_speaker.set_volume", "self.audio_speaker.set_volume,self.lamp.turn_on",
                    "self.audio_speaker.set_volume"]  # the narrower schema: a new listing, once


async def test_new_limits_prepare_anew(hops: list[str]) -> None:
    await session_tools([VOLUME, LAMP])
    assert await session_tools([VOLUME, LAMP], limits=ToolLimits(device_max_tools=1)) == {
        "self_audio_speaker_set_volume"}
    assert len(hops) == 2


async def test_remote_catalogues_are_not_cached(hops: list[str]) -> None:
    remote = [replace(VOLUME, source="mcp")]
    await session_tools(remote, kind="mcp")
    await session_tools(remote, kind="mcp")
    assert len(hops) == 2


async def test_a_refused_tool_stays_refused_from_the_cache(caplog: pytest.LogCaptureFixture) -> None:
    bad = ToolSpec("self.bad", "Bad pattern", {"type": "object", "properties": {"x": {"type": "string",
                                                                                      "pattern": "(?=a)"}}}, "device")
    assert await session_tools([VOLUME, bad]) == {"self_audio_speaker_set_volume"}
    caplog.clear()
    assert await session_tools([VOLUME, bad]) == {"self_audio_speaker_set_volume"}
    assert any(record.getMessage() == "tools refused" for record in caplog.records)
