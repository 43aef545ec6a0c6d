"""Admin login throttling (issue 11 item 11), against the real server over real sockets.

Addresses come from X-Forwarded-For with XIAOZHI_TRUSTED_PROXY_COUNT=1, as behind a proxy,
so one test process can play several clients. Each attempt is a fresh client (new cookies),
as an attacker's would be. The failure that reaches the limit is answered with the lock-out
page already (429); a wrong password before it gets the login form again (200).
"""
from __future__ import annotations

import re
import time
from http.cookiejar import CookieJar
from typing import Any
from urllib.error import HTTPError
from urllib.parse import urlencode
from urllib.request import HTTPCookieProcessor, HTTPRedirectHandler, Request, build_opener

import pytest
from django.contrib.auth import get_user_model

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

LOCKED = "Too many failed login attempts."


class _NoRedirect(HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 302 is the answer we want to see (a successful login)


def login(base_url: str, address: str, username: str, password: str) -> tuple[int, str]:
    """One login through the admin form, as a browser from `address` would: (status, page)."""
    opener = build_opener(HTTPCookieProcessor(CookieJar()), _NoRedirect())
    headers = {"X-Forwarded-For": address}
    with opener.open(Request(f"{base_url}/admin/login/", headers=headers), timeout=20) as response:
        page = response.read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token, "no CSRF token on the login page"
    form = {"csrfmiddlewaretoken": token.group(1), "username": username, "password": password, "next": "/admin/"}
    request = Request(f"{base_url}/admin/login/?next=/admin/", data=urlencode(form).encode(), headers=headers)
    try:
        with opener.open(request, timeout=20) as response:
            return response.status, response.read().decode()
    except HTTPError as error:
        return error.code, error.read().decode()


def users(*names: str) -> None:
    for name in names:
        get_user_model().objects.create_superuser(name, f"{name}@example.com", f"{name}-password")


@pytest.fixture
def server(asgi_server_factory: Any) -> Any:
    users("alice", "bob", "carol", "dave")
    return asgi_server_factory(XIAOZHI_TRUSTED_PROXY_COUNT="1", XIAOZHI_ADMIN_LOGIN_FAILURES="5")


def test_after_5_failures_from_one_address_even_the_right_password_is_refused(server: Any) -> None:
    url = server.http_url
    answers = [login(url, "203.0.113.7", f"guess{n}", "wrong") for n in range(5)]  # only the address adds up
    assert [status for status, _ in answers] == [200, 200, 200, 200, 429]
    assert LOCKED not in answers[0][1] and LOCKED in answers[4][1]
    status, page = login(url, "203.0.113.7", "alice", "alice-password")
    assert status == 429 and LOCKED in page and 'id="login-form"' in page
    assert login(url, "198.51.100.2", "bob", "bob-password")[0] == 302  # someone else, elsewhere
    assert login(url, "198.51.100.3", "alice", "alice-password")[0] == 302  # alice, elsewhere


def test_an_account_is_locked_after_failures_from_several_addresses(server: Any) -> None:
    url = server.http_url
    statuses = [login(url, f"192.0.2.{n + 1}", "carol", "wrong")[0] for n in range(5)]  # only the account adds up
    assert statuses == [200, 200, 200, 200, 429]
    status, page = login(url, "192.0.2.99", "carol", "carol-password")
    assert status == 429 and LOCKED in page
    assert login(url, "192.0.2.1", "dave", "dave-password")[0] == 302  # another user from one of them


def test_logging_in_with_ones_own_account_between_guesses_does_not_reset_the_count(server: Any) -> None:
    url = server.http_url
    assert [login(url, "192.0.2.50", "dave", "wrong")[0] for _ in range(4)] == [200] * 4
    assert login(url, "192.0.2.50", "bob", "bob-password")[0] == 302
    assert login(url, "192.0.2.50", "dave", "wrong")[0] == 429


def test_the_lock_ends_after_the_cool_off(asgi_server_factory: Any) -> None:
    users("erin")
    server = asgi_server_factory(XIAOZHI_ADMIN_LOGIN_FAILURES="2", XIAOZHI_ADMIN_LOGIN_COOLOFF_SECONDS="2")
    assert [login(server.http_url, "127.0.0.1", "erin", "wrong")[0] for _ in range(2)] == [200, 429]
    assert login(server.http_url, "127.0.0.1", "erin", "erin-password")[0] == 429
    time.sleep(2.5)
    assert login(server.http_url, "127.0.0.1", "erin", "erin-password")[0] == 302


@pytest.mark.browser
def test_the_login_page_shows_the_lock_out_message(asgi_server_factory: Any, browser_factory: Any,
                                                   staff_user: Any) -> None:
    from selenium.webdriver.common.by import By

    server = asgi_server_factory(XIAOZHI_ADMIN_LOGIN_FAILURES="2", XIAOZHI_ADMIN_LOGIN_COOLOFF_SECONDS="900")
    browser = browser_factory(server.http_url)
    for password in ("wrong", "still-wrong", "alice-password"):
        browser.open("/admin/login/")
        browser.driver.find_element(By.NAME, "username").send_keys("alice")
        browser.driver.find_element(By.NAME, "password").send_keys(password)
        browser.driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
        browser.wait_for(lambda: browser.driver.find_elements(By.CSS_SELECTOR, ".errornote"), what="an error")
    note = browser.driver.find_element(By.CSS_SELECTOR, ".errornote").text
    assert note == "Too many failed login attempts. Try again in 15 minutes."
    assert "/login/" in browser.driver.current_url and browser.driver.find_element(By.ID, "login-form")
    browser.screenshot("admin-login-locked-out")
