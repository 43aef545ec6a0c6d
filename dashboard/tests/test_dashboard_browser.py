"""The dashboard in a real browser against the real server, with a simulated device on a real
socket: the online count follows the device without a reload, and the latency figures after
its turns are the nearest-rank percentiles of the stored Turn rows.

Screenshots (1400 px and 390 px wide, whole page) are saved under the test's tmp dir."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.db import database_sync_to_async
from selenium.webdriver.common.by import By

from conversations.models import Turn
from conversations.tests.e2e import session_recorded_closed
from dashboard.templatetags.dashboard import format_ms
from devices.models import Device
from simulator.device import SimulatedDevice
from conversations.tests.factories import PersonaFactory
from devices.tests.factories import BoundDeviceFactory
from testing.speech import speak

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TURNS = 5
SERVER_ENV = {"XIAOZHI_WS_AUTH": "open", "XIAOZHI_PROVIDER_PLUGINS": "testing.fake_providers"}


def _device() -> Device:
    persona = PersonaFactory(asr_providers=["fake_echo"], llm_providers=["fake_echo"], tts_providers=["fake_tone"],
                             greeting="", language="en")
    return BoundDeviceFactory(persona=persona)


def _nearest_rank(values: list[float], percent: int) -> float:
    ordered = sorted(values)
    rank = max(1, -(-percent * len(ordered) // 100))  # ceil(percent / 100 * n)
    return ordered[rank - 1]


def _stored_timings() -> list[dict[str, float]]:
    return list(Turn.objects.values_list("timings", flat=True))


def _text(browser: Any, selector: str) -> str:
    return str(browser.driver.find_element(By.CSS_SELECTOR, selector).text).strip()


def _full_page_screenshot(browser: Any, name: str, width: int) -> Any:
    browser.set_size(width, 900)
    height = browser.js("return document.documentElement.scrollHeight")
    browser.set_size(width, min(int(height) + 120, 8000))
    path = browser.screenshot(name)
    browser.set_size(width, 900)
    return path


async def _wait(browser: Any, condition: Any, what: str, timeout: float = 15.0) -> Any:
    # Off the event loop: the simulated device keeps answering the server meanwhile.
    return await asyncio.to_thread(browser.wait_for, condition, timeout=timeout, what=what)


async def test_the_dashboard_follows_a_device_live_and_shows_the_percentiles_of_its_turns(
        asgi_server_factory: Any, browser_factory: Any, staff_user: Any) -> None:
    server = asgi_server_factory(**SERVER_ENV)
    row = await database_sync_to_async(_device)()
    dashboard = browser_factory(server.http_url, width=1400)
    device_page = browser_factory(server.http_url, width=1400)
    for browser in (dashboard, device_page):
        await asyncio.to_thread(browser.login, "alice", "alice-password")
    await asyncio.to_thread(dashboard.open, "/dashboard/")
    await asyncio.to_thread(device_page.open, f"/admin/devices/device/{row.pk}/change/")
    online = "[data-now=devices_online]"
    await _wait(dashboard, lambda: _text(dashboard, online) == "0", "no device online")
    assert _text(device_page, "[data-device-online]") == "offline"

    speech = await asyncio.to_thread(speak, "hello there")
    device = SimulatedDevice(server.http_url, mac=row.mac, client_id=row.client_id, listen_mode="manual",
                             language="en-US")
    await device.connect(f"{server.ws_url}/xiaozhi/v1/", token="")
    await device.hello()
    await _wait(dashboard, lambda: _text(dashboard, online) == "1", "the device online, without a reload")
    await _wait(dashboard, lambda: _text(dashboard, "[data-now='sessions.idle']") == "1", "its session, idle")
    await _wait(device_page, lambda: _text(device_page, "[data-device-online]") == "online", "online on its page")

    for _ in range(TURNS):
        await device.run_turn(speech, timeout=30)
    session_id = device.session_id
    await device.close()
    await session_recorded_closed(session_id)
    await _wait(dashboard, lambda: _text(dashboard, online) == "0", "the device gone, without a reload")
    await _wait(device_page, lambda: _text(device_page, "[data-device-online]") == "offline", "offline on its page")

    timings = await database_sync_to_async(_stored_timings)()
    assert len(timings) == TURNS
    for stage in ("asr_done", "first_frame_sent"):
        values = [t[stage] for t in timings]
        for percent in (50, 95):
            expected = format_ms(_nearest_rank(values, percent))
            cell = f"[data-source=device] tr[data-stage={stage}] [data-figure=p{percent}]"
            await _wait(dashboard, lambda cell=cell, expected=expected: _text(dashboard, cell) == expected,
                        f"{stage} p{percent} = {expected} (from the Turn rows), without a reload", timeout=30)
    assert _text(dashboard, "[data-now=turns_last_hour]") == str(TURNS)
    assert dashboard.js("return document.querySelectorAll('canvas[data-series]').length") >= 4
    assert dashboard.js("return window.Chart !== undefined")  # the vendored Chart.js, no CDN
    assert await asyncio.to_thread(_full_page_screenshot, dashboard, "dashboard-1400", 1400)

    await asyncio.to_thread(dashboard.open, "/dashboard/?range=1h")
    narrow = await asyncio.to_thread(_full_page_screenshot, dashboard, "dashboard-390", 390)
    assert narrow.stat().st_size > 10_000
    # Usable at 390 px: nothing but the tables' own scroll boxes is wider than the screen.
    overflow = dashboard.js("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0

    await asyncio.to_thread(device_page.driver.refresh)
    first_frames = [t["first_frame_sent"] for t in timings]
    expected = format_ms(_nearest_rank(first_frames, 95))
    assert _text(device_page, "#device-latency tr[data-stage=first_frame_sent] [data-figure=p95]") == expected
    assert await asyncio.to_thread(_full_page_screenshot, device_page, "device-page-1400", 1400)
