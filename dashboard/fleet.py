"""Fleet figures: firmware versions per board, release adoption, devices gone quiet."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, Q
from django.utils import timezone

from devices.models import Device, FirmwareRelease
from devices.selectors import rollout_bucket
from devices.versions import is_newer, parse_version, version_key

QUIET_AFTER = timedelta(days=7)
MAX_RELEASES = 20  # newest active releases shown


@dataclass
class BoardVersions:
    board_type: str
    devices: int
    versions: list[tuple[str, int]]  # (firmware version, devices), most devices first


@dataclass
class ReleaseAdoption:
    release: FirmwareRelease
    targeted: int  # devices of the board inside the release's rollout (allowlist or percentage)
    offered: int  # ... that would be offered it at their next check-in (not installed yet)
    running: int  # devices of the board now reporting its version
    adopted: int = 0  # devices in the rollout running it

    @property
    def adoption(self) -> float:
        return self.adopted / self.targeted if self.targeted else 0.0


@dataclass
class FleetFigures:
    devices: int = 0
    bound: int = 0
    online: int = 0
    quiet: int = 0  # last seen more than QUIET_AFTER ago
    never_connected: int = 0  # no WebSocket session yet, known for more than QUIET_AFTER
    quiet_cutoff: datetime | None = None
    boards: list[BoardVersions] = field(default_factory=list)
    releases: list[ReleaseAdoption] = field(default_factory=list)


def fleet_figures(now: datetime | None = None) -> FleetFigures:
    now = now or timezone.now()
    cutoff = now - QUIET_AFTER
    counts = Device.objects.aggregate(
        devices=Count("pk"), bound=Count("pk", filter=Q(owner__isnull=False)),
        online=Count("pk", filter=Q(is_online=True)),
        quiet=Count("pk", filter=Q(last_seen_at__lt=cutoff)),
        never_connected=Count("pk", filter=Q(last_seen_at__isnull=True, created_at__lt=cutoff)),
    )
    return FleetFigures(**counts, quiet_cutoff=cutoff, boards=board_versions(), releases=release_adoption())


def board_versions() -> list[BoardVersions]:
    per_board: dict[str, list[tuple[str, int]]] = defaultdict(list)
    rows = Device.objects.values_list("board_type", "firmware_version").annotate(n=Count("pk")).order_by()
    for board, version, count in rows:
        per_board[board].append((version, count))
    boards = [BoardVersions(board, sum(n for _, n in versions), sorted(versions, key=lambda v: (-v[1], v[0])))
              for board, versions in per_board.items()]
    return sorted(boards, key=lambda b: (-b.devices, b.board_type))


def release_adoption() -> list[ReleaseAdoption]:
    """Targeted / offered / running per active release, with the rule of
    devices.selectors.firmware_release_for applied to every device at once (one query for the
    devices instead of one per device; a test keeps the two in step)."""
    releases = list(
        FirmwareRelease.objects.filter(is_active=True).order_by("-created_at")
        .annotate(allowlist_size=Count("allowlist"))[:MAX_RELEASES]
    )
    if not releases:
        return []
    boards = {release.board_type for release in releases}
    active = list(FirmwareRelease.objects.filter(is_active=True, board_type__in=boards)
                  .annotate(allowlist_size=Count("allowlist")))
    allowlists = _allowlists([r for r in active if r.allowlist_size])
    devices = list(Device.objects.filter(board_type__in=boards).values_list("pk", "mac", "board_type",
                                                                            "firmware_version"))
    targeted: dict[int, int] = defaultdict(int)
    offered: dict[int, int] = defaultdict(int)
    running: dict[int, int] = defaultdict(int)
    adopted: dict[int, int] = defaultdict(int)
    by_board: dict[str, list[FirmwareRelease]] = defaultdict(list)
    for annotated in active:
        by_board[annotated.board_type].append(annotated)
    for pk, mac, board, version in devices:
        eligible = [r for r in by_board[board] if _targets(r, pk, mac, allowlists)]
        for release in eligible:
            targeted[release.pk] += 1
            adopted[release.pk] += release.version == version
        for release in by_board[board]:
            running[release.pk] += release.version == version
        chosen = _offer(eligible, version)
        if chosen is not None:
            offered[chosen.pk] += 1
    return [ReleaseAdoption(r, targeted[r.pk], offered[r.pk], running[r.pk], adopted[r.pk]) for r in releases]


def _allowlists(releases: list[FirmwareRelease]) -> dict[int, set[int]]:
    through = FirmwareRelease.allowlist.through
    lists: dict[int, set[int]] = defaultdict(set)
    for release_id, device_id in through.objects.filter(firmwarerelease__in=releases).values_list(
            "firmwarerelease_id", "device_id"):
        lists[release_id].add(device_id)
    return lists


def _targets(release: FirmwareRelease, device_pk: int, mac: str, allowlists: dict[int, set[int]]) -> bool:
    if release.allowlist_size:  # type: ignore[attr-defined]
        return device_pk in allowlists.get(release.pk, set())
    return rollout_bucket(release_pk=release.pk, mac=mac) < release.rollout_percent


def _offer(eligible: list[FirmwareRelease], running: str) -> FirmwareRelease | None:
    """What firmware_release_for offers a device given its eligible releases."""
    if not eligible:
        return None
    newest = max(eligible, key=lambda release: version_key(release.version))
    if is_newer(newest.version, running):
        return newest
    if newest.force and newest.version != running and parse_version(running) is not None:
        return newest
    return None


def fleet_json(fleet: FleetFigures) -> dict[str, object]:
    return {
        "devices": fleet.devices, "bound": fleet.bound, "online": fleet.online, "quiet": fleet.quiet,
        "never_connected": fleet.never_connected,
        "boards": [{"board_type": b.board_type, "devices": b.devices,
                    "versions": [{"version": v, "devices": n} for v, n in b.versions]} for b in fleet.boards],
        "releases": [{"id": a.release.pk, "board_type": a.release.board_type, "version": a.release.version,
                      "rollout_percent": a.release.rollout_percent, "targeted": a.targeted, "offered": a.offered,
                      "running": a.running, "adopted": a.adopted, "adoption": round(a.adoption, 4)}
                     for a in fleet.releases],
    }
