"""factory_boy factories for provisioning tests, plus a firmware-shaped OTA request."""
from __future__ import annotations

import secrets
import uuid
from datetime import timedelta
from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from django.utils import timezone

from devices.models import ActivationCode, Device, DeviceKey, FirmwareRelease
from devices.versions import fake_app_image
from testing.model_factory import ModelFactory


def mac_for(number: int) -> str:
    raw = f"{0x02_00_00_00_00_00 + number:012x}"  # locally administered range
    return ":".join(raw[i:i + 2] for i in range(0, 12, 2))


class _UserFactory(factory.django.DjangoModelFactory[User]):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda user: f"{user.username}@example.com")


class _DeviceFactory(factory.django.DjangoModelFactory[Device]):
    class Meta:
        model = Device

    mac = factory.Sequence(mac_for)
    client_id = factory.LazyFunction(lambda: str(uuid.uuid4()))
    board_type = "bread-compact-wifi"
    firmware_version = "2.4.2"


class _BoundDeviceFactory(_DeviceFactory):
    owner = factory.SubFactory(_UserFactory)
    bound_at = factory.LazyFunction(timezone.now)


class _ActivationCodeFactory(factory.django.DjangoModelFactory[ActivationCode]):
    class Meta:
        model = ActivationCode

    device = factory.SubFactory(_DeviceFactory)
    code = factory.Sequence(lambda n: f"{(n * 7919) % 10**6:06d}")
    challenge = factory.LazyFunction(lambda: secrets.token_hex(16))
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))


class _DeviceKeyFactory(factory.django.DjangoModelFactory[DeviceKey]):
    class Meta:
        model = DeviceKey

    serial_number = factory.Sequence(lambda n: f"SN{n:06d}")
    key_hex = factory.LazyFunction(lambda: secrets.token_hex(32))


class _FirmwareReleaseFactory(factory.django.DjangoModelFactory[FirmwareRelease]):
    """Saves a real (tiny, fake) image; point MEDIA_ROOT at a temporary directory."""

    class Meta:
        model = FirmwareRelease

    board_type = "bread-compact-wifi"
    version = "2.5.0"
    binary = factory.LazyAttribute(lambda release: ContentFile(fake_app_image(release.version), name="xiaozhi.bin"))
    size = 4096


UserFactory = ModelFactory(_UserFactory)
DeviceFactory = ModelFactory(_DeviceFactory)
BoundDeviceFactory = ModelFactory(_BoundDeviceFactory)
ActivationCodeFactory = ModelFactory(_ActivationCodeFactory)
DeviceKeyFactory = ModelFactory(_DeviceKeyFactory)
FirmwareReleaseFactory = ModelFactory(_FirmwareReleaseFactory)


def ota_headers(*, mac: str, client_id: str, serial: str = "", board: str = "bread-compact-wifi",
                version: str = "2.4.2") -> dict[str, str]:
    """The headers the firmware sends (protocol-reference §3.1), Content-Type aside."""
    headers = {
        "Activation-Version": "2" if serial else "1",
        "Device-Id": mac,
        "Client-Id": client_id,
        "User-Agent": f"{board}/{version}",
        "Accept-Language": "zh-CN",
    }
    if serial:
        headers["Serial-Number"] = serial
    return headers


def ota_body(*, mac: str, client_id: str, board: str = "bread-compact-wifi", version: str = "2.4.2") -> dict[str, Any]:
    """A body shaped like GetSystemInfoJson's (minimum_free_heap_size is a string there)."""
    return {
        "version": 2, "language": "zh-CN", "flash_size": 16777216, "minimum_free_heap_size": "123456",
        "mac_address": mac, "uuid": client_id, "chip_model_name": "esp32s3",
        "chip_info": {"model": 9, "cores": 2, "revision": 2, "features": 18},
        "application": {"name": "xiaozhi", "version": version, "compile_time": "Aug  8 2026T08:33:45Z",
                        "idf_version": "v6.0", "elf_sha256": "0" * 64},
        "partition_table": [{"label": "nvs", "type": 1, "subtype": 2, "address": 36864, "size": 16384}],
        "ota": {"label": "ota_0"},
        "display": {"monochrome": False, "width": 240, "height": 240},
        "board": {"type": board, "name": board, "ssid": "MyWiFi", "rssi": -55, "channel": 6,
                  "ip": "192.168.1.23", "mac": mac},
    }

