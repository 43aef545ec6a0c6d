"""Unauthenticated exhaustion and hostile bodies at the device edge, against the real server:
OTA floods from one address, outstanding activation codes, WebSocket slots taken by
never-bound devices, JSON nested deeper than the parser goes."""
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from channels.db import database_sync_to_async

from devices.models import ActivationCode, Device
from devices.protocol.close_codes import CloseCode
from devices.services import device_token_issue
from simulator.device import SimulatedDevice
from devices.tests.factories import BoundDeviceFactory, mac_for, ota_body, ota_headers
from testing.server import AsgiServer

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

CLIENT = "5d5d5d5d-0000-4000-8000-000000000001"
# Fixed windows reset at their edge; a day-long window keeps a burst inside one of them.
ONE_WINDOW = {"XIAOZHI_OTA_RATE_WINDOW_SECONDS": "86400", "XIAOZHI_NEW_DEVICE_RATE_WINDOW_SECONDS": "86400"}


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any], dict[str, str]]:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={**headers, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def check_in(server: AsgiServer, number: int) -> tuple[int, dict[str, Any], dict[str, str]]:
    mac = mac_for(0x5000 + number)
    body = json.dumps(ota_body(mac=mac, client_id=CLIENT)).encode()
    return post(f"{server.http_url}/xiaozhi/ota/", body, ota_headers(mac=mac, client_id=CLIENT))


def test_an_ota_flood_from_one_address_creates_few_devices_and_codes(asgi_server_factory: Any) -> None:
    server = asgi_server_factory(XIAOZHI_NEW_DEVICE_RATE_PER_IP="5", **ONE_WINDOW)
    replies = [check_in(server, number) for number in range(20)]

    assert [status for status, _, _ in replies] == [200] * 5 + [429] * 15
    assert {body["error"] for _, body, _ in replies[5:]} == {"too_many_new_devices"}
    assert int(replies[5][2]["Retry-After"]) > 0
    assert Device.objects.count() == 5 and ActivationCode.objects.count() == 5
    assert check_in(server, 0)[0] == 200  # devices already known still check in


def test_ota_checks_are_limited_per_address(asgi_server_factory: Any) -> None:
    server = asgi_server_factory(XIAOZHI_OTA_RATE_PER_IP="10", **ONE_WINDOW)
    replies = [check_in(server, 0) for _ in range(12)]
    assert [status for status, _, _ in replies] == [200] * 10 + [429] * 2
    assert replies[-1][1]["error"] == "rate_limited" and int(replies[-1][2]["Retry-After"]) > 0


def test_new_devices_get_a_clear_error_when_too_many_codes_are_outstanding(asgi_server_factory: Any) -> None:
    server = asgi_server_factory(XIAOZHI_MAX_OUTSTANDING_CODES="3")
    first = [check_in(server, number) for number in range(3)]
    assert all(status == 200 and body["activation"]["code"] for status, body, _ in first)

    status, body, headers = check_in(server, 3)
    assert status == 503 and body["error"] == "activation_capacity" and body["message"]
    assert headers["Content-Type"] == "application/json" and int(headers["Retry-After"]) > 0
    assert Device.objects.count() == 3
    # Devices that already hold a code keep getting it.
    status, body, _ = check_in(server, 0)
    assert status == 200 and body["activation"]["code"] == first[0][1]["activation"]["code"]


async def _unbound_with_token(server: AsgiServer, number: int) -> SimulatedDevice:
    sim = SimulatedDevice(server.http_url, mac=mac_for(0x6000 + number))
    await sim.ota_check()  # unbound devices get a token so they can hear their code
    return sim


async def test_never_bound_devices_cannot_take_the_slots_of_bound_ones(asgi_server_factory: Any) -> None:
    # "allow": no activation code is written at connect, a write that SQLite can refuse with
    # "database is locked" while another session writes its presence (issue 11 item 3).
    # The limits are per process: one worker, whatever mode the suite runs in.
    server = asgi_server_factory(XIAOZHI_MAX_DEVICE_CONNECTIONS="6", XIAOZHI_MAX_UNBOUND_DEVICE_CONNECTIONS="3",
                                 XIAOZHI_UNBOUND_POLICY="allow", XIAOZHI_WORKERS="1")
    strangers = [await _unbound_with_token(server, number) for number in range(6)]
    owned = await database_sync_to_async(BoundDeviceFactory)()
    token = await database_sync_to_async(device_token_issue)(device=owned)
    bound = SimulatedDevice(server.http_url, mac=owned.mac, client_id=owned.client_id)
    try:
        outcomes = [await _hello_or_close(sim) for sim in strangers]
        assert outcomes.count("hello") == 3
        assert outcomes.count((CloseCode.TRY_AGAIN_LATER, "too many connections")) == 3
        await bound.connect(url=f"{server.ws_url}/xiaozhi/v1/", token=token)
        assert (await bound.hello())["type"] == "hello"
    finally:
        await asyncio.gather(bound.close(), *(sim.close() for sim in strangers))


async def _hello_or_close(sim: SimulatedDevice) -> str | tuple[int, str]:
    await sim.connect()
    hello = asyncio.create_task(sim.hello())
    closed = asyncio.create_task(sim.wait_closed(timeout=10))
    done, pending = await asyncio.wait({hello, closed}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    if hello in done and hello.exception() is None:
        return "hello"
    event = closed.result()
    return event.payload["code"], event.payload["reason"]


@pytest.mark.parametrize("path", ["/xiaozhi/ota/", "/xiaozhi/ota/activate"])
def test_json_nested_deeper_than_the_parser_goes_is_a_400(asgi_server: AsgiServer, path: str) -> None:
    headers = ota_headers(mac=mac_for(0x7001), client_id=CLIENT)
    for body in (b"[" * 20000, b'{"a":' * 10000):
        status, reply, _ = post(f"{asgi_server.http_url}{path}", body, headers)
        assert status == 400 and reply["error"] == "invalid_json", reply
