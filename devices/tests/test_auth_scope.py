"""device_authenticate_scope: the handshake's headers or query parameters, as the device
consumer hands them over in its scope, decide."""
from __future__ import annotations

from typing import Any

import pytest

from devices.auth import device_authenticate_scope
from devices.models import Device
from devices.protocol.close_codes import CloseCode
from devices.services import device_token_issue
from devices.tests.factories import BoundDeviceFactory, DeviceFactory

pytestmark = pytest.mark.django_db


def scope_for(headers: dict[str, str], query: str = "") -> dict[str, Any]:
    return {"type": "websocket", "path": "/xiaozhi/v1/", "query_string": query.encode(),
            "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}


def handshake(device: Device, **override: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {device_token_issue(device=device)}", "Device-Id": device.mac,
            "Client-Id": device.client_id, **override}


def test_it_authenticates_a_bound_device_from_its_headers() -> None:
    device = BoundDeviceFactory()
    auth = device_authenticate_scope(scope_for(handshake(device)))
    assert (auth.ok, auth.close_code, auth.reason, auth.bound) == (True, None, "", True)
    assert auth.device is not None and auth.device.pk == device.pk


def test_a_refused_handshake_says_why() -> None:
    device = BoundDeviceFactory()
    auth = device_authenticate_scope(scope_for(handshake(device, Authorization="Bearer forged.1")))
    assert (auth.ok, auth.close_code, auth.reason, auth.bound) == (False, CloseCode.AUTH_FAILED, "token invalid",
                                                                   False)


def test_query_parameters_work_for_browser_test_pages() -> None:
    device = DeviceFactory()
    token = device_token_issue(device=device)
    query = f"device-id={device.mac}&client-id={device.client_id}&authorization=Bearer%20{token}"
    auth = device_authenticate_scope(scope_for({}, query))
    assert auth.ok and auth.bound is False and auth.device is not None and auth.device.mac == device.mac
