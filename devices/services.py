"""Provisioning services: check-in, activation codes, binding, tokens, keys, firmware releases.

Every write goes through here (views, the admin, management commands and the WebSocket auth
call these); models stay plain. Functions are keyword-only and named `<entity>_<action>`.
"""
from __future__ import annotations

import csv
import hashlib
import hmac
import io
import logging
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Model
from django.db.models import F
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext

from devices.models import ActivationCode, Device, DeviceKey, FirmwareRelease
from devices.selectors import (
    activation_code_current,
    activation_codes_outstanding,
    device_key_for_serial,
    firmware_release_for,
)
from devices.tokens import token_sign

logger = logging.getLogger(__name__)

CODE_DIGITS = 6
_CODE_ATTEMPTS = 20
_KEY_HEX = re.compile(r"[0-9a-fA-F]{64}")  # 256 bits: eFuse HMAC keys and HMAC-SHA256 digests


class BindError(ValueError):
    """A code that cannot bind a device; the message is shown to the operator."""


@dataclass(frozen=True)
class CheckinReport:
    """What one OTA request says about the device (headers and body, already validated)."""

    mac: str
    client_id: str
    ip: str | None
    firmware_version: str
    serial_number: str = ""
    board_type: str = ""
    board_name: str = ""
    chip_model: str = ""
    flash_size: int | None = None
    minimum_free_heap: int | None = None
    language: str = ""
    user_agent: str = ""


@dataclass(frozen=True)
class ActivationBody:
    """The /activate body: `{}` for Activation-Version 1, the HMAC proof for version 2."""

    algorithm: str = ""
    serial_number: str = ""
    challenge: str = ""
    hmac: str = ""


@dataclass(frozen=True)
class ActivationOutcome:
    status: int  # 200 activated, 202 pending, 4xx refused
    body: dict[str, object]


@dataclass
class KeyImportResult:
    created: int = 0
    updated: int = 0
    errors: list[str] = field(default_factory=list)


# --- Check-in -----------------------------------------------------------------------------


@transaction.atomic
def device_checkin(*, report: CheckinReport, now: datetime | None = None) -> Device:
    """Create or update the Device from an OTA request; blank reports keep known values."""
    reported = {
        "client_id": report.client_id,
        "serial_number": report.serial_number,
        "board_type": report.board_type,
        "board_name": report.board_name,
        "chip_model": report.chip_model,
        "firmware_version": report.firmware_version,
        "flash_size": report.flash_size,
        "minimum_free_heap": report.minimum_free_heap,
        "language": report.language,
        "user_agent": report.user_agent,
    }
    defaults: dict[str, object] = {key: value for key, value in reported.items() if value not in ("", None)}
    defaults.update(last_checkin_at=now or timezone.now(), last_ip=report.ip)
    device, created = Device.objects.update_or_create(mac=report.mac, defaults=defaults)
    if created:
        logger.info("new device checked in", extra={"mac": device.mac, "board": device.board_type})
    return device


# --- Activation codes and binding ------------------------------------------------------------


def _new_code(now: datetime) -> str:
    usable = activation_codes_outstanding(now=now)
    for _ in range(_CODE_ATTEMPTS):
        code = f"{secrets.randbelow(10**CODE_DIGITS):0{CODE_DIGITS}d}"
        if not usable.filter(code=code).exists():
            return code
    raise RuntimeError("could not find a free activation code")  # 10^6 codes: never in practice


@transaction.atomic
def activation_code_issue(*, device: Device, now: datetime | None = None) -> ActivationCode:
    """The device's usable code, or a new one; a code is unique among usable codes."""
    now = now or timezone.now()
    # Lock the device row so two simultaneous check-ins do not issue two codes.
    Device.objects.select_for_update().filter(pk=device.pk).first()
    current = activation_code_current(device=device, now=now)
    if current is not None:
        return current
    return ActivationCode.objects.create(
        device=device,
        code=_new_code(now),
        challenge=secrets.token_hex(16),
        created_at=now,
        expires_at=now + timedelta(seconds=settings.XIAOZHI_ACTIVATION_CODE_TTL_SECONDS),
    )


def _code_for_binding(code: str, now: datetime) -> ActivationCode:
    candidate = ActivationCode.objects.select_related("device").filter(code=code).order_by("-created_at").first()
    if candidate is None:
        raise BindError(gettext("No device is waiting for this code."))
    if candidate.used_at is not None:
        raise BindError(gettext("This code has already been used."))
    if candidate.expires_at <= now:
        raise BindError(gettext("This code has expired; restart the device to get a new one."))
    return candidate


@transaction.atomic
def device_bind(*, code: str, owner: AbstractBaseUser, persona: Model | None = None) -> Device:
    """Bind the device waiting for `code` to `owner` (single use; the caller rate-limits).

    `persona` is a conversations.Persona (typed loosely: devices never imports conversations).
    """
    now = timezone.now()
    activation = _code_for_binding(code.strip(), now)
    # Conditional update: of two operators entering the same code, exactly one wins.
    if not ActivationCode.objects.filter(pk=activation.pk, used_at__isnull=True).update(used_at=now):
        raise BindError(gettext("This code has already been used."))
    device = activation.device
    # Any other code the device still holds is now meaningless.
    activation_codes_outstanding(now=now).filter(device=device).update(expires_at=now)
    device.owner = owner
    device.persona = persona  # type: ignore[assignment]
    device.bound_at = now
    device.save(update_fields=["owner", "persona", "bound_at", "updated_at"])
    logger.info("device bound", extra={"mac": device.mac, "owner_id": owner.pk})
    return device


@transaction.atomic
def device_unbind(*, device: Device) -> Device:
    """Forget the owner; the device gets a new activation code at its next OTA check."""
    device.owner = None
    device.bound_at = None
    device.save(update_fields=["owner", "bound_at", "updated_at"])
    logger.info("device unbound", extra={"mac": device.mac})
    return device


def _refused(status: int, error: str, message: str) -> ActivationOutcome:
    return ActivationOutcome(status, {"error": error, "message": message})


def _hmac_matches(key_hex: str, challenge: str, proof: str) -> bool:
    if not _KEY_HEX.fullmatch(proof):  # also keeps compare_digest on ASCII (it raises otherwise)
        return False
    expected = hmac.new(bytes.fromhex(key_hex), challenge.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, proof.lower())


def _proof_problem(*, device: Device, body: ActivationBody, activation_version: int) -> ActivationOutcome | None:
    """For Activation-Version 2 with a known key, the device must prove it holds the key."""
    if activation_version != 2:
        return None
    if body.serial_number and device.serial_number and body.serial_number != device.serial_number:
        # Otherwise a device could name a serial without a key and skip the check.
        return _refused(403, "serial_mismatch", "serial_number differs from the Serial-Number header.")
    key = device_key_for_serial(serial_number=device.serial_number or body.serial_number)
    if key is None:
        return None  # no key imported for this serial: nothing to verify against
    if body.algorithm and body.algorithm != "hmac-sha256":
        return _refused(400, "unsupported_algorithm", "Only hmac-sha256 is supported.")
    if not body.challenge or not body.hmac:
        return _refused(400, "hmac_required", "This device's key is known: send challenge and hmac.")
    if not _hmac_matches(key.key_hex, body.challenge, body.hmac):
        logger.warning("activation hmac mismatch", extra={"mac": device.mac})
        return _refused(403, "bad_hmac", "The HMAC does not match this device's key.")
    return None


@transaction.atomic
def device_activate(
    *, device: Device, body: ActivationBody, activation_version: int, now: datetime | None = None
) -> ActivationOutcome:
    """Answer one /activate poll: 200 once bound, 202 while waiting, 4xx when refused."""
    now = now or timezone.now()
    code = None
    if body.challenge:
        code = device.activation_codes.filter(challenge=body.challenge).first()
        if code is None:
            return _refused(403, "unknown_challenge", "This challenge was not issued to this device.")
        if code.activated_at is not None:
            return _refused(409, "challenge_replayed", "This challenge has already completed activation.")
    problem = _proof_problem(device=device, body=body, activation_version=activation_version)
    if problem is not None:
        return problem
    if device.is_bound:
        if code is not None and not ActivationCode.objects.filter(
            pk=code.pk, activated_at__isnull=True
        ).update(activated_at=now):
            return _refused(409, "challenge_replayed", "This challenge has already completed activation.")
        return ActivationOutcome(200, {"status": "activated"})
    if code is not None and code.expires_at <= now:
        return _refused(410, "code_expired", "The activation code expired; check for updates again.")
    return ActivationOutcome(202, {"status": "pending", "message": "Waiting for an operator to bind the device."})


# --- Tokens ----------------------------------------------------------------------------------


def device_token_issue(*, device: Device, now: float | None = None) -> str:
    return token_sign(
        secret=settings.SECRET_KEY,
        client_id=device.client_id,
        device_id=device.mac,
        issued_at=int(time.time() if now is None else now),
        generation=device.token_generation,
    )


@transaction.atomic
def device_revoke_tokens(*, device: Device) -> int:
    """Invalidate every token issued so far; the device gets a new one at its next boot."""
    Device.objects.filter(pk=device.pk).update(token_generation=F("token_generation") + 1)
    device.refresh_from_db(fields=["token_generation"])
    logger.info("device tokens revoked", extra={"mac": device.mac, "generation": device.token_generation})
    return device.token_generation


# --- Device keys -----------------------------------------------------------------------------


def device_keys_parse_csv(*, text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """Rows of `serial_number,key_hex` (a header line is optional); bad lines become errors."""
    rows: list[tuple[str, str]] = []
    errors: list[str] = []
    for line_number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        cells = [cell.strip() for cell in row]
        if not any(cells) or (line_number == 1 and cells[0].lower() == "serial_number"):
            continue
        if len(cells) != 2:
            problem = gettext("line %(line)d: expected 2 columns, got %(count)d")
            errors.append(problem % {"line": line_number, "count": len(cells)})
            continue
        rows.append((cells[0], cells[1]))
    return rows, errors


def _key_row_problem(serial_number: str, key_hex: str) -> str | None:
    if not serial_number or len(serial_number) > 64:
        return gettext("serial number must be 1-64 characters")
    if not _KEY_HEX.fullmatch(key_hex):
        return gettext("key must be 64 hex digits (a 256-bit HMAC key)")
    return None


@transaction.atomic
def device_keys_import(*, rows: Iterable[tuple[str, str]]) -> KeyImportResult:
    """Create or replace keys by serial number; invalid rows are reported, not imported."""
    result = KeyImportResult()
    for index, (serial_number, key_hex) in enumerate(rows, start=1):
        problem = _key_row_problem(serial_number, key_hex)
        if problem is not None:
            result.errors.append(gettext("row %(row)d (%(serial)r): %(problem)s") % {
                "row": index, "serial": serial_number[:64], "problem": problem})
            continue
        _, created = DeviceKey.objects.update_or_create(
            serial_number=serial_number, defaults={"key_hex": key_hex.lower()}
        )
        if created:
            result.created += 1
        else:
            result.updated += 1
    logger.info("device keys imported", extra={"keys_created": result.created, "keys_updated": result.updated})
    return result


# --- Firmware releases ----------------------------------------------------------------------


@transaction.atomic
def firmware_release_save(*, release: FirmwareRelease, binary_changed: bool) -> FirmwareRelease:
    """Save a release; size and SHA-256 are recomputed whenever the binary changes."""
    if binary_changed or not release.sha256:
        digest = hashlib.sha256()
        size = 0
        for chunk in release.binary.chunks():
            digest.update(chunk)
            size += len(chunk)
        release.size, release.sha256 = size, digest.hexdigest()
    release.save()
    return release


# --- OTA response ----------------------------------------------------------------------------


def _timezone_offset_minutes(device: Device, now: datetime) -> int:
    if device.timezone:
        try:
            offset = now.astimezone(ZoneInfo(device.timezone)).utcoffset()
        except (ZoneInfoNotFoundError, ValueError):
            offset = None
        if offset is not None:
            return int(offset.total_seconds() // 60)
    return settings.XIAOZHI_TIMEZONE_OFFSET_MINUTES


def firmware_download_path(release: FirmwareRelease) -> str:
    filename = release.binary.name.rsplit("/", 1)[-1]
    return reverse("devices:firmware-download", kwargs={"pk": release.pk, "filename": filename})


def _firmware_section(device: Device, base_url: str) -> dict[str, object]:
    release = firmware_release_for(device=device)
    if release is None:
        # Echoing the running version means "no update" to the firmware.
        return {"version": device.firmware_version, "url": "", "force": 0}
    return {
        "version": release.version,
        "url": base_url + firmware_download_path(release),
        "force": 1 if release.force else 0,
    }


def _activation_section(device: Device, base_url: str, now: datetime) -> dict[str, object]:
    code = activation_code_issue(device=device, now=now)
    return {
        "code": code.code,
        "message": f"Code {code.code}\n{base_url}/admin/",
        "challenge": code.challenge,
        "timeout_ms": max(0, int((code.expires_at - now).total_seconds() * 1000)),
    }


def ota_response_for(*, device: Device, base_url: str, ws_url: str, now: datetime | None = None) -> dict[str, object]:
    """The OTA reply. `websocket` is always complete: without it the device picks MQTT, and
    keys left out keep stale values in its NVS."""
    now = now or timezone.now()
    response: dict[str, object] = {
        "server_time": {
            "timestamp": int(now.timestamp() * 1000),
            "timezone_offset": _timezone_offset_minutes(device, now),
        },
        "firmware": _firmware_section(device, base_url),
        "websocket": {
            "url": ws_url,
            "token": device_token_issue(device=device, now=now.timestamp()),
            "version": settings.XIAOZHI_WS_PROTOCOL_VERSION,
        },
    }
    if not device.is_bound:
        response["activation"] = _activation_section(device, base_url, now)
    return response
