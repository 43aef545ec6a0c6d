"""The fleet admin: device list, bind by code (rate-limited), revoke, releases, codes, keys."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from conversations.tests.factories import PersonaFactory
from devices.auth import device_authenticate
from devices.models import ActivationCode, Device, DeviceKey, FirmwareRelease
from devices.services import device_token_issue
from devices.tests.factories import (
    ActivationCodeFactory,
    BoundDeviceFactory,
    DeviceFactory,
    DeviceKeyFactory,
    UserFactory,
)
from devices.versions import fake_app_image

pytestmark = pytest.mark.django_db

BIND = "/admin/devices/device/bind/"


@pytest.fixture(autouse=True)
def _fast_and_fresh(settings: Any) -> None:
    # admin_client creates a superuser per test; the default hasher costs ~0.3 s each time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    cache.clear()


@pytest.fixture
def media(settings: Any, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = tmp_path
    return tmp_path


def bind(admin_client: Client, code: str, *, address: str = "10.0.0.1", persona: Any = None) -> Any:
    owner = get_user_model().objects.get(username="admin")
    data = {"code": code, "owner": owner.pk, "persona": persona.pk if persona else ""}
    return admin_client.post(BIND, data, REMOTE_ADDR=address)


def code_errors(response: Any) -> list[str]:
    return response.context["form"].errors.get("code", []) if response.status_code == 200 else []


# --- Devices -------------------------------------------------------------------------------------


def test_the_device_list_shows_state_and_offers_binding(admin_client: Client) -> None:
    BoundDeviceFactory(mac="02:00:00:00:00:aa", is_online=True, persona=PersonaFactory(name="Robo"))
    response = admin_client.get("/admin/devices/device/")
    page = response.content.decode()
    assert response.status_code == 200
    for text in ("02:00:00:00:00:aa", "bread-compact-wifi", "2.4.2", "Robo", BIND, "icon-yes"):
        assert text in page


def test_devices_are_found_by_mac_as_printed_on_the_label(admin_client: Client) -> None:
    DeviceFactory(mac="02:00:00:00:00:bb")
    DeviceFactory(mac="02:00:00:00:00:cc")
    response = admin_client.get("/admin/devices/device/", {"q": "02-00-00-00-00-BB"})
    assert list(response.context["cl"].queryset.values_list("mac", flat=True)) == ["02:00:00:00:00:bb"]


@pytest.mark.parametrize("query,expected", [
    ({"is_online__exact": "1"}, ["02:00:00:00:01:01"]),
    ({"bound": "no"}, ["02:00:00:00:01:02"]),
    ({"board_type": "other"}, ["02:00:00:00:01:02"]),
    ({"firmware_version": "2.5.0"}, ["02:00:00:00:01:01"]),
])
def test_the_device_list_filters(admin_client: Client, query: dict[str, str], expected: list[str]) -> None:
    BoundDeviceFactory(mac="02:00:00:00:01:01", is_online=True, firmware_version="2.5.0")
    DeviceFactory(mac="02:00:00:00:01:02", board_type="other")
    response = admin_client.get("/admin/devices/device/", query)
    assert sorted(response.context["cl"].queryset.values_list("mac", flat=True)) == expected


def test_revoking_tokens_in_the_admin_refuses_the_old_token(admin_client: Client) -> None:
    device = BoundDeviceFactory()
    headers = {"Device-Id": device.mac, "Client-Id": device.client_id,
               "Authorization": f"Bearer {device_token_issue(device=device)}"}
    admin_client.post("/admin/devices/device/", {"action": "revoke_tokens", "_selected_action": [device.pk]})
    device.refresh_from_db()
    assert device.token_generation == 1
    assert device_authenticate(headers=headers, query={}).reason == "device revoked"


def test_unbinding_in_the_admin_forgets_the_owner(admin_client: Client) -> None:
    device = BoundDeviceFactory()
    admin_client.post("/admin/devices/device/", {"action": "unbind", "_selected_action": [device.pk]})
    device.refresh_from_db()
    assert not device.is_bound and device.bound_at is None


# --- Binding by code -----------------------------------------------------------------------------


def test_an_operator_binds_a_device_by_its_code(admin_client: Client) -> None:
    code, persona = ActivationCodeFactory(code="424242"), PersonaFactory()
    assert admin_client.get(BIND).status_code == 200
    response = bind(admin_client, "424242", persona=persona)
    device = Device.objects.get(pk=code.device_id)
    assert response.status_code == 302 and response["Location"] == f"/admin/devices/device/{device.pk}/change/"
    assert device.owner.username == "admin" and device.persona == persona


@pytest.mark.parametrize("make,message", [
    (lambda: None, "No device is waiting"),
    (lambda: ActivationCodeFactory(code="111111", used_at=timezone.now()), "already been used"),
    (lambda: ActivationCodeFactory(code="111111", expires_at=timezone.now() - timedelta(minutes=1)), "expired"),
])
def test_bad_codes_are_explained_in_the_form(admin_client: Client, make: Any, message: str) -> None:
    make()
    response = bind(admin_client, "111111")
    assert any(message in error for error in code_errors(response))


def test_a_code_must_be_six_digits(admin_client: Client) -> None:
    assert code_errors(bind(admin_client, "12ab56"))


def test_binding_needs_change_permission(client: Client) -> None:
    staff = UserFactory(username="viewer", is_staff=True)
    client.force_login(staff)
    assert client.get(BIND).status_code == 403


def test_code_guessing_is_limited_per_address(admin_client: Client, settings: Any) -> None:
    settings.XIAOZHI_ACTIVATION_RATE_PER_IP = 3
    ActivationCodeFactory(code="987654")
    guesses = [code_errors(bind(admin_client, f"00000{n}")) for n in range(3)]
    assert all("No device is waiting" in errors[0] for errors in guesses)
    # Over the limit even the right code fails, so the limit cannot be probed for hits.
    assert "Too many attempts" in code_errors(bind(admin_client, "987654"))[0]
    assert not Device.objects.get().is_bound
    assert bind(admin_client, "987654", address="10.0.0.2").status_code == 302


def test_code_guessing_is_limited_globally(admin_client: Client, settings: Any) -> None:
    settings.XIAOZHI_ACTIVATION_RATE_PER_IP = 100
    settings.XIAOZHI_ACTIVATION_RATE_GLOBAL = 5
    ActivationCodeFactory(code="987654")
    for n in range(5):
        assert "No device is waiting" in code_errors(bind(admin_client, "000000", address=f"10.1.0.{n}"))[0]
    assert "Too many attempts" in code_errors(bind(admin_client, "987654", address="10.2.0.1"))[0]
    assert not Device.objects.get().is_bound


# --- Activation codes ------------------------------------------------------------------------------


def test_the_code_list_shows_outstanding_codes_by_default(admin_client: Client) -> None:
    outstanding = ActivationCodeFactory(code="100001")
    ActivationCodeFactory(code="100002", used_at=timezone.now())
    ActivationCodeFactory(code="100003", expires_at=timezone.now() - timedelta(minutes=1))
    listed = admin_client.get("/admin/devices/activationcode/").context["cl"].queryset
    assert list(listed) == [outstanding]
    everything = admin_client.get("/admin/devices/activationcode/", {"state": "all"}).context["cl"].queryset
    assert everything.count() == 3
    assert admin_client.get("/admin/devices/activationcode/add/").status_code == 403


# --- Firmware releases -----------------------------------------------------------------------------


def release_form(version: str = "2.5.0", image: bytes | None = None, **fields: Any) -> dict[str, Any]:
    image = fake_app_image(version) if image is None else image
    return {"board_type": "bread-compact-wifi", "version": version, "rollout_percent": 10, "is_active": "on",
            "force": "", "notes": "", "binary": SimpleUploadedFile("xiaozhi.bin", image), **fields}


def test_an_uploaded_release_records_size_and_hash(admin_client: Client, media: Path) -> None:
    response = admin_client.post("/admin/devices/firmwarerelease/add/", release_form())
    assert response.status_code == 302
    release = FirmwareRelease.objects.get()
    assert release.size == len(fake_app_image("2.5.0")) and len(release.sha256) == 64
    page = admin_client.get("/admin/devices/firmwarerelease/").content.decode()
    assert "2.5.0" in page and "4.0" in page  # "4.0 KB"


@pytest.mark.parametrize("form,field,message", [
    (release_form("2.5.0-beta"), "version", "dotted numbers"),
    (release_form("2.5.0", image=b"not an image" * 10), "binary", "not an ESP32 application image"),
    (release_form("2.5.0", image=b""), "binary", ""),
    (release_form("2.5.0", image=fake_app_image("2.4.9")), "version", "image says it is version 2.4.9"),
])
def test_a_bad_release_is_refused_with_a_reason(
    admin_client: Client, media: Path, form: dict[str, Any], field: str, message: str
) -> None:
    response = admin_client.post("/admin/devices/firmwarerelease/add/", form)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors[field]
    assert any(message in error for error in errors)
    assert not FirmwareRelease.objects.exists()


# --- Device keys ---------------------------------------------------------------------------------------


def test_keys_are_uploaded_as_csv_and_never_shown(admin_client: Client) -> None:
    key = "ab" * 32
    csv = f"serial_number,key_hex\nSN-1,{key}\nSN-2,nothex\n".encode()
    response = admin_client.post("/admin/devices/devicekey/upload/",
                                 {"file": SimpleUploadedFile("keys.csv", csv)}, follow=True)
    page = response.content.decode()
    assert "1 new, 0 replaced" in page and "SN-2" in page
    assert list(DeviceKey.objects.values_list("serial_number", flat=True)) == ["SN-1"]
    listing = admin_client.get("/admin/devices/devicekey/").content.decode()
    assert "SN-1" in listing and key not in listing and "/admin/devices/devicekey/upload/" in listing
    detail = admin_client.get(f"/admin/devices/devicekey/{DeviceKey.objects.get().pk}/change/").content.decode()
    assert key not in detail


def test_a_non_text_key_file_is_refused(admin_client: Client) -> None:
    response = admin_client.post("/admin/devices/devicekey/upload/",
                                 {"file": SimpleUploadedFile("keys.csv", b"\xff\xfe\xfa")})
    assert response.status_code == 200 and response.context["form"].errors["file"]
    DeviceKeyFactory()  # the upload page is reachable again afterwards
    assert admin_client.get("/admin/devices/devicekey/upload/").status_code == 200
    assert ActivationCode.objects.count() == 0


def test_the_device_page_lists_its_tools_with_user_only_ones_marked(admin_client) -> None:  # noqa: ANN001
    device = Device.objects.create(mac="aa:bb:cc:dd:ee:77", mcp_tools=[
        {"name": "self.audio_speaker.set_volume", "description": "Set the volume", "user_only": False,
         "parameters": {"type": "object", "properties": {"volume": {"type": "integer"}}}},
        {"name": "self.reboot", "description": "Reboot", "user_only": True, "parameters": {}},
    ])
    page = admin_client.get(f"/admin/devices/device/{device.pk}/change/").content.decode()
    assert "self.audio_speaker.set_volume" in page and "volume" in page
    assert "self.reboot" in page and "[user only]" in page


def test_the_device_list_offers_the_command_actions(admin_client) -> None:  # noqa: ANN001
    Device.objects.create(mac="aa:bb:cc:dd:ee:78")
    page = admin_client.get("/admin/devices/device/").content.decode()
    for action in ("reboot_devices", "alert_devices", "say_on_devices", "call_device_tool"):
        assert f'value="{action}"' in page
