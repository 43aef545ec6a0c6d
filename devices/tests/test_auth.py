"""device_authenticate: the WebSocket handshake decision, under every policy setting."""
from __future__ import annotations

import time
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from devices.auth import CLOSE_AUTH_FAILED, CLOSE_NOT_ACTIVATED, device_authenticate
from devices.models import Device
from devices.services import activation_code_issue, device_revoke_tokens, device_token_issue
from devices.tests.factories import BoundDeviceFactory, DeviceFactory
from devices.tokens import token_sign

pytestmark = pytest.mark.django_db


def handshake(device: Device, token: str | None = None, **overrides: str) -> dict[str, str]:
    token = device_token_issue(device=device) if token is None else token
    headers = {"Authorization": f"Bearer {token}", "Protocol-Version": "1",
               "Device-Id": device.mac, "Client-Id": device.client_id}
    return {**headers, **overrides}


def refused(result: Any, reason: str, code: int = CLOSE_AUTH_FAILED) -> bool:
    return not result.ok and result.close_code == code and result.reason == reason


def test_a_bound_device_with_its_token_is_accepted() -> None:
    device = BoundDeviceFactory()
    result = device_authenticate(headers=handshake(device), query={})
    assert result.ok and result.device == device and result.bound and result.activation_code is None


def test_header_names_are_case_insensitive_and_a_raw_token_works() -> None:
    device = BoundDeviceFactory()
    token = device_token_issue(device=device)
    headers = {"authorization": token, "device-id": device.mac.upper(), "client-id": device.client_id}
    assert device_authenticate(headers=headers, query={}).ok


def test_browsers_may_pass_credentials_in_the_query() -> None:
    device = BoundDeviceFactory()
    query = {"device-id": device.mac, "client-id": device.client_id,
             "authorization": f"Bearer {device_token_issue(device=device)}"}
    assert device_authenticate(headers={"Origin": "http://localhost"}, query=query).ok


def test_an_expired_token_is_refused() -> None:
    device = BoundDeviceFactory()
    old = token_sign(secret=settings.SECRET_KEY, client_id=device.client_id, device_id=device.mac,
                     issued_at=int(time.time()) - settings.XIAOZHI_TOKEN_TTL_SECONDS - 10, generation=0)
    assert refused(device_authenticate(headers=handshake(device, old), query={}), "token expired")


def test_a_tampered_or_foreign_token_is_refused() -> None:
    device, other = BoundDeviceFactory(), BoundDeviceFactory()
    token = device_token_issue(device=device)
    tampered = token[:-1] + ("1" if token[-1] != "1" else "2")
    assert refused(device_authenticate(headers=handshake(device, tampered), query={}), "token invalid")
    foreign = device_token_issue(device=other)
    assert refused(device_authenticate(headers=handshake(device, foreign), query={}), "token invalid")
    assert refused(device_authenticate(headers=handshake(device, "garbage"), query={}), "token invalid")


def test_a_token_for_another_client_id_is_refused() -> None:
    device = BoundDeviceFactory()
    headers = handshake(device, **{"Client-Id": "reflashed-client"})
    assert refused(device_authenticate(headers=headers, query={}), "token invalid")


def test_revoked_tokens_are_refused_and_say_so() -> None:
    device = BoundDeviceFactory()
    headers = handshake(device)
    device_revoke_tokens(device=device)
    assert refused(device_authenticate(headers=headers, query={}), "device revoked")
    assert device_authenticate(headers=handshake(device), query={}).ok


@pytest.mark.parametrize("headers,reason", [
    ({}, "device id missing"),
    ({"Device-Id": "nonsense"}, "device id invalid"),
    ({"Device-Id": "02:00:00:ff:ff:ff", "Client-Id": "x", "Authorization": "Bearer a.1"}, "device unknown"),
])
def test_handshakes_without_a_known_device_are_refused(headers: dict[str, str], reason: str) -> None:
    assert refused(device_authenticate(headers=headers, query={}), reason)


def test_missing_token_or_client_id_is_refused() -> None:
    device = BoundDeviceFactory()
    no_token = {k: v for k, v in handshake(device).items() if k != "Authorization"}
    assert refused(device_authenticate(headers=no_token, query={}), "token missing")
    no_client = {k: v for k, v in handshake(device).items() if k != "Client-Id"}
    assert refused(device_authenticate(headers=no_client, query={}), "client id missing")


def test_open_mode_lets_an_unknown_device_in_and_records_it(settings: Any) -> None:
    settings.XIAOZHI_WS_AUTH = "open"
    settings.XIAOZHI_UNBOUND_POLICY = "allow"
    result = device_authenticate(headers={"Device-Id": "02:00:00:00:aa:01", "Client-Id": "c1"}, query={})
    assert result.ok and not result.bound and result.device.mac == "02:00:00:00:aa:01"
    assert Device.objects.filter(mac="02:00:00:00:aa:01", client_id="c1").exists()


def test_open_mode_reads_a_known_device_by_one_query_without_joins(settings: Any) -> None:
    settings.XIAOZHI_WS_AUTH = "open"
    device = BoundDeviceFactory()
    headers = {"Device-Id": device.mac, "Client-Id": device.client_id}
    device_authenticate(headers=headers, query={})  # the prepared query is built once
    with CaptureQueriesContext(connection) as queries:
        result = device_authenticate(headers=headers, query={})
    assert result.ok and result.bound and result.device == device
    assert len(queries) == 1 and "JOIN" not in queries[0]["sql"].upper()


def test_an_allowlisted_mac_skips_the_token(settings: Any) -> None:
    device = BoundDeviceFactory()
    settings.XIAOZHI_WS_ALLOWED_MACS = [device.mac]
    assert device_authenticate(headers={"Device-Id": device.mac.upper()}, query={}).ok


def test_an_unbound_device_hears_its_code_by_default() -> None:
    device = DeviceFactory()
    code = activation_code_issue(device=device).code
    result = device_authenticate(headers=handshake(device), query={})
    assert result.ok and not result.bound and result.activation_code == code


def test_an_unbound_device_is_refused_when_the_policy_says_so(settings: Any) -> None:
    settings.XIAOZHI_UNBOUND_POLICY = "refuse"
    device = DeviceFactory()
    assert refused(device_authenticate(headers=handshake(device), query={}), "device not activated",
                   CLOSE_NOT_ACTIVATED)


def test_an_unbound_device_may_talk_when_the_policy_allows(settings: Any) -> None:
    settings.XIAOZHI_UNBOUND_POLICY = "allow"
    result = device_authenticate(headers=handshake(DeviceFactory()), query={})
    assert result.ok and not result.bound and result.activation_code is None
