"""Which release a device is offered: board, version order, staged rollout, allowlist, force."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from devices.models import Device, FirmwareRelease
from devices.selectors import firmware_release_for, rollout_bucket
from devices.tests.factories import DeviceFactory, FirmwareReleaseFactory, mac_for
from devices.versions import fake_app_image

pytestmark = pytest.mark.django_db

BOARD = "bread-compact-wifi"
FLEET = 1000


@pytest.fixture(autouse=True)
def media(settings: Any, tmp_path: Path) -> Path:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # admin_client
    settings.MEDIA_ROOT = tmp_path
    return tmp_path


def fleet(board: str, count: int = FLEET, *, offset: int = 0) -> list[Device]:
    devices = [Device(mac=mac_for(offset + n), board_type=board, firmware_version="2.4.2") for n in range(count)]
    return Device.objects.bulk_create(devices)


def offered(devices: list[Device], release: FirmwareRelease) -> set[str]:
    return {device.mac for device in devices if firmware_release_for(device=device) == release}


def upload_release(admin_client: Client, **fields: Any) -> FirmwareRelease:
    data = {"board_type": BOARD, "version": "2.5.0", "rollout_percent": 100, "is_active": "on", "notes": "",
            **fields}
    data["binary"] = SimpleUploadedFile("xiaozhi.bin", fake_app_image(data["version"]))
    response = admin_client.post("/admin/devices/firmwarerelease/add/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    return FirmwareRelease.objects.get(board_type=data["board_type"], version=data["version"])


def test_a_ten_percent_release_uploaded_in_the_admin_reaches_a_stable_tenth(admin_client: Client) -> None:
    ours, others = fleet(BOARD), fleet("other-board", 200, offset=FLEET)
    release = upload_release(admin_client, rollout_percent=10)
    chosen = offered(ours, release)
    # Exactly the devices the documented formula picks, about a tenth of them, every time.
    assert chosen == {d.mac for d in ours if rollout_bucket(release_pk=release.pk, mac=d.mac) < 10}
    assert 60 <= len(chosen) <= 140
    assert offered(ours, release) == chosen
    assert offered(others, release) == set()


def test_widening_a_rollout_only_adds_devices() -> None:
    devices = fleet(BOARD, 300)
    release = FirmwareReleaseFactory(rollout_percent=10)
    narrow = offered(devices, release)
    release.rollout_percent = 50
    release.save()
    wide = offered(devices, release)
    assert narrow < wide and 100 <= len(wide) <= 200
    release.rollout_percent = 0
    release.save()
    assert offered(devices, release) == set()


def test_each_release_samples_its_own_devices() -> None:
    devices = fleet(BOARD, 300)
    first, second = FirmwareReleaseFactory(version="2.5.0"), FirmwareReleaseFactory(version="2.6.0")
    buckets = [(rollout_bucket(release_pk=first.pk, mac=d.mac), rollout_bucket(release_pk=second.pk, mac=d.mac))
               for d in devices]
    assert sum(a == b for a, b in buckets) < 30  # independent: about 1 in 100 agree


def test_an_allowlist_replaces_the_percentage() -> None:
    devices = fleet(BOARD, 20)
    release = FirmwareReleaseFactory(rollout_percent=0)
    release.allowlist.set(devices[:3])
    assert offered(devices, release) == {d.mac for d in devices[:3]}


def test_the_newest_eligible_newer_release_wins() -> None:
    device = DeviceFactory(firmware_version="2.9.0")
    FirmwareReleaseFactory(version="2.8.0")
    FirmwareReleaseFactory(version="2.10.0")  # numerically newest, though "2.9" > "2.10" as text
    FirmwareReleaseFactory(version="3.0.0", is_active=False)
    FirmwareReleaseFactory(version="4.0.0", rollout_percent=0)
    assert firmware_release_for(device=device).version == "2.10.0"


def test_nothing_is_offered_to_a_device_already_up_to_date() -> None:
    FirmwareReleaseFactory(version="2.4.2")
    assert firmware_release_for(device=DeviceFactory(firmware_version="2.4.2")) is None
    assert firmware_release_for(device=DeviceFactory(firmware_version="2.5.0")) is None


def test_a_forced_release_rolls_back_but_is_not_offered_to_itself() -> None:
    FirmwareReleaseFactory(version="2.4.0", force=True)
    assert firmware_release_for(device=DeviceFactory(firmware_version="2.4.2")).version == "2.4.0"
    assert firmware_release_for(device=DeviceFactory(firmware_version="2.4.0")) is None


def test_a_device_without_a_board_gets_nothing() -> None:
    FirmwareReleaseFactory(board_type="")
    assert firmware_release_for(device=DeviceFactory(board_type="")) is None
