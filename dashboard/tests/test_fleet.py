"""Fleet figures: versions per board, release adoption (in step with the OTA rule), quiet devices."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.fleet import fleet_figures, release_adoption
from devices.models import Device
from devices.selectors import firmware_release_for, firmware_releases_eligible
from devices.tests.factories import BoundDeviceFactory, DeviceFactory, FirmwareReleaseFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def media(settings, tmp_path) -> None:  # noqa: ANN001
    settings.MEDIA_ROOT = tmp_path


def test_an_empty_fleet_is_all_zeros() -> None:
    fleet = fleet_figures()
    assert (fleet.devices, fleet.online, fleet.quiet, fleet.boards, fleet.releases) == (0, 0, 0, [], [])


def test_versions_are_counted_per_board_most_common_first() -> None:
    for version in ("2.4.2", "2.4.2", "2.5.0"):
        DeviceFactory(board_type="bread", firmware_version=version)
    DeviceFactory(board_type="box", firmware_version="1.0.0")
    boards = {board.board_type: board for board in fleet_figures().boards}
    assert boards["bread"].devices == 3 and boards["bread"].versions == [("2.4.2", 2), ("2.5.0", 1)]
    assert boards["box"].versions == [("1.0.0", 1)]


def test_quiet_and_never_connected_devices_are_counted() -> None:
    now = timezone.now()
    DeviceFactory(last_seen_at=now - timedelta(days=8))
    DeviceFactory(last_seen_at=now - timedelta(days=1), is_online=True)
    old_silent = DeviceFactory()
    Device.objects.filter(pk=old_silent.pk).update(created_at=now - timedelta(days=9))
    DeviceFactory()  # new and never connected: not counted yet
    BoundDeviceFactory(last_seen_at=now)
    fleet = fleet_figures(now)
    assert (fleet.devices, fleet.bound, fleet.online, fleet.quiet, fleet.never_connected) == (5, 1, 1, 1, 1)


def test_adoption_agrees_with_what_each_device_is_offered() -> None:
    old = FirmwareReleaseFactory(version="2.4.2", rollout_percent=100)
    new = FirmwareReleaseFactory(version="2.5.0", rollout_percent=40)
    canary = FirmwareReleaseFactory(version="2.6.0", rollout_percent=100)
    devices = [DeviceFactory(firmware_version=("2.4.2", "2.5.0", "2.3.9")[i % 3]) for i in range(60)]
    canary.allowlist.add(*devices[:5])
    rows = {row.release.pk: row for row in release_adoption()}
    offered_by_rule = {release.pk: 0 for release in (old, new, canary)}
    for device in devices:
        chosen = firmware_release_for(device=device)
        if chosen is not None:
            offered_by_rule[chosen.pk] += 1
    assert {pk: row.offered for pk, row in rows.items()} == offered_by_rule
    assert rows[canary.pk].targeted == 5
    assert rows[old.pk].targeted == 60 and rows[old.pk].running == 20
    assert 0 < rows[new.pk].targeted < 60 and rows[new.pk].running == 20
    assert rows[old.pk].adoption == pytest.approx(20 / 60)
    in_rollout = [d for d in devices if new in firmware_releases_eligible(device=d)]
    adopted = sum(d.firmware_version == "2.5.0" for d in in_rollout)
    assert rows[new.pk].targeted == len(in_rollout) and rows[new.pk].adopted == adopted
    assert rows[new.pk].adoption == pytest.approx(adopted / len(in_rollout))


def test_a_forced_release_is_offered_to_devices_running_anything_else() -> None:
    forced = FirmwareReleaseFactory(version="2.4.0", force=True)
    DeviceFactory(firmware_version="2.5.0")
    DeviceFactory(firmware_version="2.4.0")
    row = release_adoption()[0]
    assert row.release == forced and (row.targeted, row.offered, row.running) == (2, 1, 1)


def test_inactive_releases_are_not_shown() -> None:
    FirmwareReleaseFactory(version="2.4.0", is_active=False)
    assert release_adoption() == []
