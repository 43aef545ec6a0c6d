"""The firmware waits 10 s for its WebSocket upgrade (protocol-reference §2.1); daphne, as this
project starts it, lets an upgrade wait as long. With daphne's own default (5 s) a device whose
upgrade took longer, as in a reboot storm, lost its connection without an HTTP answer."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from simulator import transport
from simulator.events import DeviceError
from testing.server import BASE_DIR, free_port
from xiaozhi_site.webserver import DAPHNE_OPTIONS, UPGRADE_TIMEOUT_SECONDS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ACCEPT_AFTER_S = 7.0  # past daphne's default, within the firmware's 10 s


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def _daphne(options: tuple[str, ...]) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "SLOW_ACCEPT_SECONDS": str(ACCEPT_AFTER_S)}
    process = subprocess.Popen([sys.executable, "-m", "daphne", *options, "-b", "127.0.0.1", "-p", str(port),
                                "testing.slow_accept:application"], cwd=BASE_DIR, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not _listening(port):
            assert process.poll() is None and time.monotonic() < deadline, "daphne did not start"
            time.sleep(0.1)
        yield f"ws://127.0.0.1:{port}/xiaozhi/v1/"
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def project_daphne() -> Iterator[str]:
    yield from _daphne(DAPHNE_OPTIONS)


@pytest.fixture
def default_daphne() -> Iterator[str]:
    yield from _daphne(())


def test_the_upgrade_may_take_as_long_as_the_firmware_waits() -> None:
    assert UPGRADE_TIMEOUT_SECONDS == transport.HANDSHAKE_TIMEOUT_S == 10


async def test_a_slow_upgrade_within_the_firmwares_wait_still_connects(project_daphne: str) -> None:
    started = time.monotonic()
    connection = await transport.open_connection(project_daphne, {})
    try:
        assert await connection.recv() == "accepted"
        assert time.monotonic() - started >= ACCEPT_AFTER_S
    finally:
        await connection.close()


async def test_with_daphnes_default_the_same_upgrade_was_dropped(default_daphne: str) -> None:
    # What the option changes: the 5 s default ends the wait without an HTTP answer.
    with pytest.raises(DeviceError, match="did not receive a valid HTTP response|HTTP 403"):
        await transport.open_connection(default_daphne, {})
