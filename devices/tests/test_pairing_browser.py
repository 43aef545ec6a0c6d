"""An operator approves a re-pairing request in a real browser."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from devices.models import Device
from simulator.device import SimulatedDevice
from devices.tests.factories import BoundDeviceFactory

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NEW_CLIENT = "7e7e7e7e-1111-4222-8333-444444444444"


def test_an_operator_approves_a_re_pairing_request_in_the_admin(asgi_server: Any, browser_factory: Any,
                                                                 staff_user: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    device = BoundDeviceFactory(name="Kitchen speaker")
    reflashed = SimulatedDevice(asgi_server.http_url, mac=device.mac, client_id=NEW_CLIENT)
    assert asyncio.run(reflashed.ota_check())["websocket"]["token"] == ""

    browser = browser_factory(asgi_server.http_url)
    browser.login("alice", "alice-password")
    browser.open("/admin/devices/pairingrequest/")
    browser.wait_for(lambda: NEW_CLIENT in browser.text(), what="the request in the list")
    browser.screenshot("pairing-requests")
    browser.driver.find_element(By.CSS_SELECTOR, "input[name=_selected_action]").click()
    Select(browser.driver.find_element(By.NAME, "action")).select_by_value("approve")
    browser.driver.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    browser.wait_for(lambda: "Approved 1 re-pairing request(s)." in browser.text(), what="the confirmation")
    browser.screenshot("pairing-approved")

    device.refresh_from_db()
    assert device.client_id == NEW_CLIENT
    assert asyncio.run(reflashed.ota_check())["websocket"]["token"]
    assert Device.objects.get(pk=device.pk).pairing_requests.filter(approved_at__isnull=True).count() == 0
