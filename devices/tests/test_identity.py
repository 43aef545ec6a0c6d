"""Identity beyond the MAC, service by service: Client-Id binding (trust on first use),
re-pairing requests, revocation, the key proof, code capacity, presence ownership and the
start-up warning about ALLOWED_HOSTS."""
from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from devices.auth import device_authenticate
from devices.checks import public_url_check
from devices.models import ActivationCode, Device
from devices.pairing import MAX_PAIRING_REQUESTS_PER_DEVICE
from devices.presence import (
    device_connection_claim,
    devices_mark_offline,
)
from devices.services import (
    ActivationCapacityError,
    activation_code_issue,
    device_bind,
    device_revoke_tokens,
    device_token_issue,
)
from devices.tests.factories import (
    ActivationCodeFactory,
    BoundDeviceFactory,
    DeviceFactory,
    DeviceKeyFactory,
    UserFactory,
    ota_body,
    ota_headers,
)

pytestmark = pytest.mark.django_db

MAC = "aa:bb:cc:11:22:33"
OWNER = "11111111-2222-4333-8444-555555555555"
STRANGER = "99999999-8888-4777-8666-555555555555"


def check_in(client: Client, client_id: str, *, serial: str = "", mac: str = MAC, **extra: Any) -> dict[str, Any]:
    response = client.post("/xiaozhi/ota/", data=json.dumps(ota_body(mac=mac, client_id=client_id)),
                           content_type="application/json",
                           headers=ota_headers(mac=mac, client_id=client_id, serial=serial), **extra)
    assert response.status_code == 200, response.content
    return response.json()


def activate(client: Client, client_id: str, body: dict[str, Any], *, serial: str = "") -> Any:
    return client.post("/xiaozhi/ota/activate", data=json.dumps(body), content_type="application/json",
                       headers=ota_headers(mac=MAC, client_id=client_id, serial=serial))


# --- Client-Id binding -------------------------------------------------------------------------


def test_binding_with_a_code_binds_the_client_id_that_asked_for_it(client: Client) -> None:
    owner_code = check_in(client, OWNER)["activation"]["code"]
    stranger_code = check_in(client, STRANGER)["activation"]["code"]  # checked in last
    assert owner_code != stranger_code
    device = device_bind(code=owner_code, owner=UserFactory())
    assert device.client_id == OWNER
    assert "activation" not in check_in(client, OWNER)
    assert check_in(client, STRANGER)["websocket"]["token"] == ""


def test_a_token_issued_to_another_client_before_binding_opens_no_socket() -> None:
    device = DeviceFactory(client_id=STRANGER)
    stale = {"Authorization": f"Bearer {device_token_issue(device=device)}", "Device-Id": device.mac,
             "Client-Id": STRANGER}
    code = activation_code_issue(device=device, client_id=OWNER)
    device_bind(code=code.code, owner=UserFactory())
    result = device_authenticate(headers=stale, query={})
    assert not result.ok and result.reason == "client id not paired"


def test_a_stranger_opens_one_request_however_often_it_checks_in(client: Client) -> None:
    BoundDeviceFactory(mac=MAC, client_id=OWNER)
    first = check_in(client, STRANGER, REMOTE_ADDR="203.0.113.9")["activation"]["challenge"]
    again = check_in(client, STRANGER)["activation"]["challenge"]
    device = Device.objects.get(mac=MAC)
    request = device.pairing_requests.get()
    # The request shows where the stranger was seen last.
    assert first == again == request.challenge and request.address == "127.0.0.1"
    assert device.client_id == OWNER


def test_cycling_client_ids_cannot_fill_the_request_list(client: Client) -> None:
    BoundDeviceFactory(mac=MAC, client_id=OWNER)
    replies = [check_in(client, f"cycler-{n}") for n in range(MAX_PAIRING_REQUESTS_PER_DEVICE + 3)]
    assert Device.objects.get(mac=MAC).pairing_requests.count() == MAX_PAIRING_REQUESTS_PER_DEVICE
    assert "activation" not in replies[-1] and replies[-1]["websocket"]["token"] == ""


def test_a_stranger_polling_activate_without_a_request_is_refused(client: Client) -> None:
    BoundDeviceFactory(mac=MAC, client_id=OWNER)
    response = activate(client, STRANGER, {})
    assert response.status_code == 403 and response.json()["error"] == "pairing_required"


def test_a_re_pairing_request_records_a_valid_key_proof(client: Client) -> None:
    key = DeviceKeyFactory(serial_number="SN-RP")
    BoundDeviceFactory(mac=MAC, client_id=OWNER, serial_number="SN-RP")
    challenge = check_in(client, STRANGER, serial="SN-RP")["activation"]["challenge"]
    proof = hmac.new(bytes.fromhex(key.key_hex), challenge.encode(), hashlib.sha256).hexdigest()
    body = {"algorithm": "hmac-sha256", "serial_number": "SN-RP", "challenge": challenge, "hmac": proof}
    assert activate(client, STRANGER, body, serial="SN-RP").status_code == 202
    assert Device.objects.get(mac=MAC).pairing_requests.get().key_verified
    assert activate(client, STRANGER, {}, serial="SN-RP").json()["error"] == "hmac_required"


# --- Revocation --------------------------------------------------------------------------------


def test_revocation_means_activating_again(client: Client) -> None:
    device = BoundDeviceFactory(mac=MAC, client_id=OWNER)
    device_revoke_tokens(device=device)
    reply = check_in(client, OWNER)
    assert reply["websocket"]["token"] == "" and reply["activation"]["code"]
    assert activate(client, OWNER, {}).status_code == 202
    device_bind(code=reply["activation"]["code"], owner=UserFactory())
    assert activate(client, OWNER, {}).status_code == 200
    assert check_in(client, OWNER)["websocket"]["token"]


# --- Outstanding codes -------------------------------------------------------------------------


def test_the_code_cap_is_a_clear_error_not_a_500(client: Client, settings: Any) -> None:
    settings.XIAOZHI_MAX_OUTSTANDING_CODES = 2
    ActivationCodeFactory.create_batch(2)
    with pytest.raises(ActivationCapacityError):
        activation_code_issue(device=DeviceFactory())
    response = client.post("/xiaozhi/ota/", data=json.dumps(ota_body(mac=MAC, client_id=OWNER)),
                           content_type="application/json", headers=ota_headers(mac=MAC, client_id=OWNER))
    assert response.status_code == 503 and response.json()["error"] == "activation_capacity"
    assert not Device.objects.filter(mac=MAC).exists()


def test_expired_codes_do_not_count_against_the_cap(settings: Any) -> None:
    settings.XIAOZHI_MAX_OUTSTANDING_CODES = 2
    ActivationCodeFactory.create_batch(2, expires_at=timezone.now() - timedelta(seconds=1))
    assert activation_code_issue(device=DeviceFactory()).code
    assert ActivationCode.objects.count() == 3


# --- Presence ownership ------------------------------------------------------------------------


def test_a_claim_hands_back_the_channel_it_replaces() -> None:
    device = BoundDeviceFactory()
    assert device_connection_claim(device_id=device.pk, session_id="s1", channel_name="chan.a") == ""
    assert device_connection_claim(device_id=device.pk, session_id="s2", channel_name="chan.b") == "chan.a"
    device.refresh_from_db()
    assert (device.session_id, device.channel_name) == ("s2", "chan.b")


def test_a_claim_with_the_channel_just_read_is_one_update() -> None:
    device = BoundDeviceFactory()
    device_connection_claim(device_id=device.pk, session_id="s1", channel_name="chan.a")
    with CaptureQueriesContext(connection) as queries:
        previous = device_connection_claim(device_id=device.pk, session_id="s2", channel_name="chan.b",
                                           expected="chan.a")
    assert previous == "chan.a" and len(queries) == 1


def test_a_claim_whose_read_is_stale_still_learns_the_channel_it_replaces() -> None:
    """Another socket of the device claimed the row between the authentication's read and this
    claim: the compare-and-set misses and the row is read again."""
    device = BoundDeviceFactory()
    device_connection_claim(device_id=device.pk, session_id="s1", channel_name="chan.a")
    assert device_connection_claim(device_id=device.pk, session_id="s2", channel_name="chan.b",
                                   expected="") == "chan.a"
    device.refresh_from_db()
    assert (device.session_id, device.channel_name) == ("s2", "chan.b")


@pytest.mark.parametrize("expected", [None, "", "chan.a"], ids=["unread", "stale read", "fresh read"])
def test_a_claim_marks_the_device_online_whichever_way_it_is_written(expected: str | None) -> None:
    device = BoundDeviceFactory(channel_name="chan.a", session_id="s1", is_online=False, last_seen_at=None)
    before = timezone.now()
    device_connection_claim(device_id=device.pk, session_id="s2", channel_name="chan.b", expected=expected)
    device.refresh_from_db()
    assert device.is_online and (device.session_id, device.channel_name) == ("s2", "chan.b")
    assert device.online_since is not None and device.online_since >= before
    assert device.last_seen_at == device.online_since


def test_an_older_session_cannot_take_a_reconnected_device_offline() -> None:
    device = BoundDeviceFactory()
    device_connection_claim(device_id=device.pk, session_id="old", channel_name="chan.a")
    device_connection_claim(device_id=device.pk, session_id="new", channel_name="chan.b")
    assert devices_mark_offline(session_ids=["old"]) == 0
    device.refresh_from_db()
    assert device.is_online and device.channel_name == "chan.b"


# --- Start-up warning --------------------------------------------------------------------------


def test_production_with_any_host_and_no_public_url_warns(settings: Any) -> None:
    settings.DEBUG, settings.ALLOWED_HOSTS = False, ["*"]
    settings.XIAOZHI_PUBLIC_WS_URL = settings.XIAOZHI_PUBLIC_BASE_URL = ""
    assert [message.id for message in public_url_check()] == ["devices.W001"]
    settings.XIAOZHI_PUBLIC_WS_URL = "wss://xz.example.com/xiaozhi/v1/"
    assert public_url_check() == []
    settings.XIAOZHI_PUBLIC_WS_URL, settings.ALLOWED_HOSTS = "", ["xz.example.com"]
    assert public_url_check() == []
    settings.DEBUG, settings.ALLOWED_HOSTS = True, ["*"]
    assert public_url_check() == []
