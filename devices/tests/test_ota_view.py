"""POST /xiaozhi/ota/: check-in, the reply the firmware parses, firmware download, bad input."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from devices.models import Device
from devices.tests.factories import (
    BoundDeviceFactory,
    DeviceFactory,
    FirmwareReleaseFactory,
    ota_body,
    ota_headers,
)
from devices.tokens import token_verify

pytestmark = pytest.mark.django_db

MAC = "aa:bb:cc:dd:ee:ff"
CLIENT = "7b94d69a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
OTA = "/xiaozhi/ota/"


@pytest.fixture
def media(settings: Any, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = tmp_path
    return tmp_path


def post_ota(client: Client, body: Any = None, *, path: str = OTA, headers: dict[str, str] | None = None,
             raw: bytes | None = None, **extra: Any) -> Any:
    data = raw if raw is not None else json.dumps(body if body is not None else ota_body(mac=MAC, client_id=CLIENT))
    headers = headers if headers is not None else ota_headers(mac=MAC, client_id=CLIENT)
    return client.post(path, data=data, content_type="application/json", headers=headers, **extra)


def assert_error(response: Any, status: int, error: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["error"] == error and body["message"]
    return body


# --- The happy path -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/xiaozhi/ota/", "/xiaozhi/ota"])
def test_it_answers_with_and_without_the_trailing_slash(client: Client, path: str) -> None:
    response = post_ota(client, path=path)
    assert response.status_code == 200
    assert set(response.json()) >= {"server_time", "firmware", "websocket"}


def test_it_records_what_the_firmware_reports(client: Client) -> None:
    post_ota(client, headers={**ota_headers(mac="AA-BB-CC-DD-EE-FF", client_id=CLIENT, serial="SN1")},
             REMOTE_ADDR="192.168.1.23")
    device = Device.objects.get()
    assert device.mac == MAC  # normalised: lowercase with colons
    assert (device.client_id, device.serial_number, device.board_type, device.board_name) == (
        CLIENT, "SN1", "bread-compact-wifi", "bread-compact-wifi")
    assert (device.chip_model, device.firmware_version, device.flash_size, device.minimum_free_heap) == (
        "esp32s3", "2.4.2", 16777216, 123456)
    assert (device.language, device.user_agent, device.last_ip) == ("zh-CN", "bread-compact-wifi/2.4.2", "192.168.1.23")
    assert device.last_checkin_at is not None


def test_a_second_check_in_updates_the_same_device(client: Client) -> None:
    post_ota(client)
    first = Device.objects.get().last_checkin_at
    body = ota_body(mac=MAC, client_id="new-client", version="2.5.0")
    body["minimum_free_heap_size"] = 99  # an int is fine too
    post_ota(client, body, headers=ota_headers(mac=MAC, client_id="new-client"))
    device = Device.objects.get()
    assert (device.client_id, device.firmware_version, device.minimum_free_heap) == ("new-client", "2.5.0", 99)
    assert device.last_checkin_at > first


def test_the_websocket_section_is_always_complete(client: Client, settings: Any) -> None:
    settings.XIAOZHI_WS_PROTOCOL_VERSION = 3
    for device_body in (post_ota(client).json(), post_ota(client).json()):
        websocket = device_body["websocket"]
        assert websocket["url"] == "ws://testserver/xiaozhi/v1/"
        assert websocket["token"] and websocket["version"] == 3


def test_the_token_is_bound_to_client_id_mac_and_generation(client: Client) -> None:
    token = post_ota(client).json()["websocket"]["token"]
    check = token_verify(token, secret=settings.SECRET_KEY, client_id=CLIENT, device_id=MAC, generation=0,
                         ttl_seconds=settings.XIAOZHI_TOKEN_TTL_SECONDS, now=time.time())
    assert check.ok


def test_the_websocket_url_follows_https_and_configuration(client: Client, settings: Any) -> None:
    assert post_ota(client, secure=True).json()["websocket"]["url"] == "wss://testserver/xiaozhi/v1/"
    settings.XIAOZHI_PUBLIC_BASE_URL = "https://xz.example.com/"
    assert post_ota(client).json()["websocket"]["url"] == "wss://xz.example.com/xiaozhi/v1/"
    settings.XIAOZHI_PUBLIC_WS_URL = "ws://10.0.0.5:8000/xiaozhi/v1/"
    assert post_ota(client).json()["websocket"]["url"] == "ws://10.0.0.5:8000/xiaozhi/v1/"


def test_server_time_is_utc_milliseconds_plus_the_offset(client: Client, settings: Any) -> None:
    settings.XIAOZHI_TIMEZONE_OFFSET_MINUTES = 480
    server_time = post_ota(client).json()["server_time"]
    assert abs(server_time["timestamp"] - time.time() * 1000) < 5000
    assert server_time["timezone_offset"] == 480


def test_a_device_time_zone_overrides_the_default_offset(client: Client) -> None:
    DeviceFactory(mac=MAC, timezone="Asia/Kolkata")
    assert post_ota(client).json()["server_time"]["timezone_offset"] == 330


def test_an_unbound_device_gets_an_activation_code(client: Client) -> None:
    activation = post_ota(client).json()["activation"]
    assert activation["code"].isdigit() and len(activation["code"]) == 6
    assert activation["code"] in activation["message"]
    assert activation["challenge"] and activation["timeout_ms"] > 0


def test_a_bound_device_gets_no_activation(client: Client) -> None:
    BoundDeviceFactory(mac=MAC, client_id=CLIENT)
    assert "activation" not in post_ota(client).json()


def test_without_a_release_the_devices_own_version_is_echoed(client: Client) -> None:
    assert post_ota(client).json()["firmware"] == {"version": "2.4.2", "url": "", "force": 0}


def test_an_unknown_board_is_fine(client: Client) -> None:
    body = ota_body(mac=MAC, client_id=CLIENT, board="no-such-board")
    response = post_ota(client, body)
    assert response.status_code == 200 and response.json()["firmware"]["url"] == ""


def test_a_get_answers_with_a_notice_for_humans(client: Client) -> None:
    response = client.get(OTA)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    assert "ws://testserver/xiaozhi/v1/" in response.content.decode()


# --- Firmware offers and download -------------------------------------------------------------------


def test_a_newer_release_is_offered_at_an_absolute_url_that_serves_it(client: Client, media: Path) -> None:
    release = FirmwareReleaseFactory(version="2.5.0", force=True)
    firmware = post_ota(client).json()["firmware"]
    assert firmware["version"] == "2.5.0" and firmware["force"] == 1
    assert firmware["url"].startswith("http://testserver/xiaozhi/ota/firmware/")
    download = client.get(firmware["url"].removeprefix("http://testserver"))
    assert download.status_code == 200
    content = b"".join(download.streaming_content)
    assert int(download["Content-Length"]) == len(content) == release.binary.size > 0


def test_the_firmware_url_uses_the_public_base_url(client: Client, media: Path, settings: Any) -> None:
    settings.XIAOZHI_PUBLIC_BASE_URL = "https://xz.example.com"
    FirmwareReleaseFactory(version="2.5.0")
    assert post_ota(client).json()["firmware"]["url"].startswith("https://xz.example.com/xiaozhi/ota/firmware/")


def test_a_download_of_an_inactive_or_unknown_release_is_a_404(client: Client, media: Path) -> None:
    release = FirmwareReleaseFactory(is_active=False)
    assert_error(client.get(f"/xiaozhi/ota/firmware/{release.pk}/xiaozhi.bin"), 404, "not_found")
    release.is_active = True
    release.save()
    assert_error(client.get(f"/xiaozhi/ota/firmware/{release.pk}/other.bin"), 404, "not_found")
    assert_error(client.get("/xiaozhi/ota/firmware/999999/xiaozhi.bin"), 404, "not_found")
    release.binary.storage.delete(release.binary.name)
    name = release.binary.name.rsplit("/", 1)[-1]
    assert_error(client.get(f"/xiaozhi/ota/firmware/{release.pk}/{name}"), 404, "not_found")


def test_a_download_answers_head_and_refuses_post(client: Client, media: Path) -> None:
    release = FirmwareReleaseFactory()
    url = f"/xiaozhi/ota/firmware/{release.pk}/{release.binary.name.rsplit('/', 1)[-1]}"
    assert client.head(url).status_code == 200
    assert_error(client.post(url), 405, "method_not_allowed")


# --- Bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["put", "delete", "patch"])
def test_other_methods_are_refused_with_json(client: Client, method: str) -> None:
    response = getattr(client, method)(OTA)
    assert_error(response, 405, "method_not_allowed")
    assert response["Allow"] == "GET, POST"


@pytest.mark.parametrize("drop,error", [("Device-Id", "missing_device_id"), ("Client-Id", "missing_client_id")])
def test_missing_identity_headers_are_refused(client: Client, drop: str, error: str) -> None:
    headers = {k: v for k, v in ota_headers(mac=MAC, client_id=CLIENT).items() if k != drop}
    assert_error(post_ota(client, headers=headers), 400, error)
    assert not Device.objects.exists()


@pytest.mark.parametrize("header,value,error", [
    ("Device-Id", "aa:bb:cc:dd:ee", "invalid_device_id"),
    ("Device-Id", "not-a-mac", "invalid_device_id"),
    ("Device-Id", "aa:bb:cc:dd:ee:fg", "invalid_device_id"),
    ("Client-Id", "has|pipe", "invalid_client_id"),
    ("Client-Id", "x" * 65, "invalid_client_id"),
    ("Activation-Version", "3", "invalid_activation_version"),
    ("Serial-Number", "S" * 65, "invalid_serial_number"),
])
def test_malformed_headers_are_refused(client: Client, header: str, value: str, error: str) -> None:
    headers = {**ota_headers(mac=MAC, client_id=CLIENT), header: value}
    assert_error(post_ota(client, headers=headers), 400, error)


@pytest.mark.parametrize("raw", [b"", b"{not json", b"\xff\xfe\x00", b"[1, 2]", b'"text"', b"null"])
def test_a_body_that_is_not_a_json_object_is_refused(client: Client, raw: bytes) -> None:
    response = post_ota(client, raw=raw)
    assert response.status_code == 400
    assert response.json()["error"] in ("invalid_json", "invalid_body")


@pytest.mark.parametrize("change,path", [
    ({"application": None}, "application"),
    ({"application": {"name": "xiaozhi"}}, "application.version"),
    ({"application": {"version": 242}}, "application.version"),
    ({"board": {"type": 42}}, "board.type"),
    ({"board": "bread"}, "board"),
    ({"flash_size": "big"}, "flash_size"),
    ({"flash_size": -1}, "flash_size"),
    ({"minimum_free_heap_size": "lots"}, "minimum_free_heap_size"),
    ({"chip_model_name": ["esp32s3"]}, "chip_model_name"),
    ({"application": {"version": "1" * 51}}, "application.version"),
    ({"application": {"version": "2.4.2\u0000"}}, "application.version"),
])
def test_wrong_types_are_refused_naming_the_field(client: Client, change: dict[str, Any], path: str) -> None:
    body = {**ota_body(mac=MAC, client_id=CLIENT), **change}
    if change.get("application", 1) is None:
        del body["application"]
    response = assert_error(post_ota(client, body), 400, "invalid_body")
    assert response["message"].startswith(path)


def test_a_huge_body_is_refused(client: Client) -> None:
    body = {**ota_body(mac=MAC, client_id=CLIENT), "padding": "x" * (70 * 1024)}
    assert_error(post_ota(client, body), 413, "body_too_large")
    assert not Device.objects.exists()


def test_client_address_trusts_only_the_configured_number_of_proxies(rf, settings) -> None:  # noqa: ANN001
    from devices.addresses import client_address

    request = rf.post("/xiaozhi/ota/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="6.6.6.6, 203.0.113.7")
    settings.XIAOZHI_TRUSTED_PROXY_COUNT = 0
    assert client_address(request) == "10.0.0.1"
    settings.XIAOZHI_TRUSTED_PROXY_COUNT = 1
    assert client_address(request) == "203.0.113.7"
    settings.XIAOZHI_TRUSTED_PROXY_COUNT = 3  # fewer entries than proxies: the header is not ours
    assert client_address(request) == "10.0.0.1"


# --- A cheap check-in (issue 17: reboot storms) -------------------------------------------------


def test_an_unchanged_check_in_writes_nothing_and_hands_out_the_same_token(client: Client) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    first = post_ota(client).json()["websocket"]["token"]
    checked_in = Device.objects.get().last_checkin_at
    with CaptureQueriesContext(connection) as queries:
        again = post_ota(client).json()["websocket"]["token"]
    writes = [q["sql"] for q in queries.captured_queries
              if q["sql"].lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE"))]
    assert writes == []
    assert again == first
    assert Device.objects.get().last_checkin_at == checked_in


def test_a_change_or_an_old_check_in_is_written(client: Client) -> None:
    from datetime import timedelta

    from devices.services import CHECKIN_REFRESH

    post_ota(client)
    post_ota(client, REMOTE_ADDR="10.1.2.3")  # a new address is news
    assert Device.objects.get().last_ip == "10.1.2.3"
    stale = Device.objects.get().last_checkin_at - CHECKIN_REFRESH - timedelta(seconds=1)
    Device.objects.update(last_checkin_at=stale)
    post_ota(client, REMOTE_ADDR="10.1.2.3")
    assert Device.objects.get().last_checkin_at > stale + CHECKIN_REFRESH


def test_a_revocation_changes_the_token_a_check_hands_out(client: Client) -> None:
    from devices.services import device_revoke_tokens

    device = BoundDeviceFactory(mac=MAC, client_id=CLIENT)
    before = post_ota(client).json()["websocket"]["token"]
    device_revoke_tokens(device=device)
    assert post_ota(client).json()["websocket"]["token"] == ""  # revoked: a code, no token
    Device.objects.filter(pk=device.pk).update(revoked_at=None)  # bound again
    after = post_ota(client).json()["websocket"]["token"]
    assert after and after != before
    device.refresh_from_db()
    assert token_verify(after, secret=settings.SECRET_KEY, client_id=CLIENT, device_id=MAC,
                        generation=device.token_generation, ttl_seconds=3600, now=time.time()).ok
