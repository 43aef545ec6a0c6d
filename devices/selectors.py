"""Read-only queries for provisioning: devices, codes, keys and the firmware a device gets."""
from __future__ import annotations

import hashlib
import time
from datetime import datetime

from django.db.models import Count, QuerySet
from django.utils import timezone

from devices.models import ActivationCode, Device, DeviceKey, FirmwareRelease, PairingRequest
from devices.versions import is_newer, parse_version, version_key
from xiaozhi_site.row_query import OneRow


def device_get_by_mac(*, mac: str) -> Device | None:
    return Device.objects.select_related("owner", "persona").filter(mac=mac).first()


_DEVICE_BY_MAC = OneRow(Device, "mac")


def device_for_checkin(*, mac: str) -> Device | None:
    """The row alone, as an OTA check or a WebSocket authentication needs it: no joins, no
    ORDER BY (mac is unique; the model's default ordering would add one). Every device of a
    reboot storm runs this twice, and building the ORM's query was most of its cost: the SQL
    is built once (xiaozhi_site/row_query.py), the instance is the ORM's."""
    return _DEVICE_BY_MAC.get(mac)


def device_key_for_serial(*, serial_number: str) -> DeviceKey | None:
    if not serial_number:
        return None
    return DeviceKey.objects.filter(serial_number=serial_number).first()


def activation_codes_outstanding(*, now: datetime | None = None) -> QuerySet[ActivationCode]:
    """Codes an operator could still enter: not used, not expired."""
    now = now or timezone.now()
    return ActivationCode.objects.filter(used_at__isnull=True, expires_at__gt=now)


def activation_code_current(
    *, device: Device, client_id: str | None = None, now: datetime | None = None,
) -> ActivationCode | None:
    """The device's usable code for `client_id` (default: the device's own Client-Id)."""
    client = device.client_id if client_id is None else client_id
    codes = activation_codes_outstanding(now=now).filter(device=device, client_id__in=(client, ""))
    return codes.order_by("-created_at").first()


def activation_codes_at_capacity(*, limit: int, now: datetime | None = None) -> bool:
    """True when `limit` codes are outstanding; counts at most `limit` rows."""
    return activation_codes_outstanding(now=now)[:limit].count() >= limit


def device_client_trusted(*, device: Device, client_id: str) -> bool:
    """Whether `client_id` speaks for the device: any client while it is unbound, afterwards
    only the one it was bound with (trust on first use; a bound row without one adopts the
    next)."""
    return not device.is_bound or not device.client_id or device.client_id == client_id


def pairing_request_pending(*, device: Device, client_id: str) -> PairingRequest | None:
    return device.pairing_requests.filter(client_id=client_id, approved_at__isnull=True).first()


def pairing_requests_pending() -> QuerySet[PairingRequest]:
    return PairingRequest.objects.filter(approved_at__isnull=True)


def rollout_bucket(*, release_pk: int, mac: str) -> int:
    """A device's stable place (0-99) in one release's rollout.

    Hashing the release id with the MAC keeps each device on the same side of a release as
    its percentage grows (10% -> 20% only adds devices), while different releases pick
    independent samples, so the same unlucky tenth does not beta-test every release.
    """
    digest = hashlib.sha256(f"{release_pk}:{mac}".encode()).hexdigest()
    return int(digest, 16) % 100


def _is_eligible(release: FirmwareRelease, device: Device) -> bool:
    # An allowlist replaces the percentage: only listed devices, all of them.
    if release.allowlist_size:  # type: ignore[attr-defined]  # annotated below
        return release.allowlist.filter(pk=device.pk).exists()
    return rollout_bucket(release_pk=release.pk, mac=device.mac) < release.rollout_percent


# Active releases per board, kept for RELEASES_TTL_SECONDS: every OTA check asks, releases
# change a few times a year. A change in this process clears it at once (signals below);
# other processes see it within the TTL.
RELEASES_TTL_SECONDS = 10.0
_releases: dict[str, tuple[float, list[FirmwareRelease]]] = {}


def releases_cache_clear(**_: object) -> None:
    _releases.clear()


def _active_releases(board_type: str) -> list[FirmwareRelease]:
    now = time.monotonic()
    cached = _releases.get(board_type)
    if cached is not None and cached[0] > now:
        return cached[1]
    releases: list[FirmwareRelease] = list(
        FirmwareRelease.objects.filter(board_type=board_type, is_active=True)
        .annotate(allowlist_size=Count("allowlist"))
    )
    _releases[board_type] = (now + RELEASES_TTL_SECONDS, releases)
    return releases


def firmware_releases_eligible(*, device: Device) -> list[FirmwareRelease]:
    """Active releases for the device's board that its rollout includes, newest first."""
    if not device.board_type:
        return []
    eligible = [release for release in _active_releases(device.board_type) if _is_eligible(release, device)]
    return sorted(eligible, key=lambda release: version_key(release.version), reverse=True)


def firmware_release_for(*, device: Device) -> FirmwareRelease | None:
    """The release to offer, or None to echo the device's own version ("no update").

    The newest eligible release is offered when it is newer than what the device runs. A
    forced release is offered whenever it differs from the running version (that is how an
    operator rolls back); never when equal, since the device would download it on every boot
    only to discard it ("version is the same").
    """
    eligible = firmware_releases_eligible(device=device)
    if not eligible:
        return None
    newest = eligible[0]
    if is_newer(newest.version, device.firmware_version):
        return newest
    running = device.firmware_version
    if newest.force and newest.version != running and parse_version(running) is not None:
        return newest
    return None
