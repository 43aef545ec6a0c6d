"""A real browser for tests of pages people use: Debian's headless Chromium, driven by selenium.

`make test` and `.ci/run` install `chromium` and `chromium-driver` with apt; on a machine
without them the browser tests skip with a message saying so. Every test that uses a browser
saves screenshots under its own tmp dir (`Browser.screenshot`), so a failing or suspicious
run can be looked at afterwards.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HOW_TO_INSTALL = "headless Chromium is missing: apt-get install chromium chromium-driver (make test does this)"
T = TypeVar("T")

# Without the background-networking flags Chromium keeps calling home, and on a machine
# without internet those calls fail many at a time; autoplay lets tests start audio players.
_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
    "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--autoplay-policy=no-user-gesture-required",
)  # fmt: skip


def chromium_available() -> bool:
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


class Browser:
    """One Chromium window on a server's base URL, with the few helpers tests need."""

    def __init__(self, base_url: str, shots_dir: Path, *, language: str = "en-US", width: int = 1400,
                 height: int = 900) -> None:
        from selenium import webdriver  # noqa: PLC0415 - only browser tests pay for the import
        from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

        self.base_url = base_url.rstrip("/")
        self.shots_dir = shots_dir
        self._profile = tempfile.mkdtemp(prefix="chromium-profile-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*_FLAGS, f"--window-size={width},{height}", f"--lang={language}",
                     f"--user-data-dir={self._profile}"):
            options.add_argument(flag)
        options.add_experimental_option("prefs", {"intl.accept_languages": language})
        self.driver: Any = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.driver.set_page_load_timeout(30)

    def open(self, path: str) -> None:
        self.driver.get(self.base_url + path)

    def login(self, username: str, password: str, path: str = "/admin/login/") -> None:
        """Log in through the admin's login form, as a person would."""
        from selenium.webdriver.common.by import By  # noqa: PLC0415

        self.open(path)
        self.driver.find_element(By.NAME, "username").send_keys(username)
        self.driver.find_element(By.NAME, "password").send_keys(password)
        self.driver.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()
        self.wait_for(lambda: "/login/" not in self.driver.current_url, what="the login to go through")

    def set_size(self, width: int, height: int = 900) -> None:
        self.driver.set_window_size(width, height)

    def screenshot(self, name: str) -> Path:
        self.shots_dir.mkdir(parents=True, exist_ok=True)
        path = self.shots_dir / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def text(self) -> str:
        from selenium.webdriver.common.by import By  # noqa: PLC0415

        return str(self.driver.find_element(By.TAG_NAME, "body").text)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def wait_for(self, condition: Callable[[], T], *, timeout: float = 10.0, what: str = "a condition") -> T:
        """Poll `condition` until it returns something truthy; fail with `what` on timeout."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                value = condition()
            except Exception as exc:  # the page may be mid-navigation
                last_error = exc
            else:
                if value:
                    return value
            time.sleep(0.1)
        shot = self.screenshot("timeout")
        raise AssertionError(f"timed out after {timeout}s waiting for {what} (screenshot {shot}): {last_error!r}")

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self._profile, ignore_errors=True)
