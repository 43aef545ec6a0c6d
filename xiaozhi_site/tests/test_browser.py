"""The browser harness itself: the admin login page renders and a staff user gets in."""
from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def test_a_staff_user_logs_into_the_admin_in_a_real_browser(asgi_server: Any, browser_factory: Any,
                                                            staff_user: Any) -> None:
    browser = browser_factory(asgi_server.http_url)
    browser.login("alice", "alice-password")
    browser.wait_for(lambda: "/admin/" in browser.driver.current_url, what="the admin index")
    assert "alice" in browser.text().lower()
    assert browser.screenshot("admin-index").stat().st_size > 1000
