"""Provisioning services: check-in, activation codes, binding, /activate polls, tokens,
keys, firmware releases (the OTA reply is built in devices/ota.py, re-pairing requests are
handled in devices/pairing.py).

Every write goes through here (views, the admin, management commands and the WebSocket auth
call these); models stay plain. Functions are keyword-only and named `<entity>_<action>`.
"""
from __future__ import annotations

import csv
import functools
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

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Model
from django.db.models import F
from django.utils import timezone
from django.utils.translation import gettext

from devices.models import ActivationCode, Device, DeviceKey, FirmwareRelease, PairingRequest
from devices.selectors import (
    activation_code_current,
    activation_codes_at_capacity,
    activation_codes_outstanding,
    device_client_trusted,
    device_key_for_serial,
    pairing_request_pending,
)
from devices.tokens import token_sign

logger = logging.getLogger(__name__)

CODE_DIGITS = 6
_CODE_ATTEMPTS = 20
_KEY_HEX = re.compile(r"[0-9a-fA-F]{64}")  # 256 bits: eFuse HMAC keys and HMAC-SHA256 digests


class BindError(ValueError):
    """A code that cannot bind a device; the message is shown to the operator."""


class ActivationCapacityError(RuntimeError):
    """XIAOZHI_MAX_OUTSTANDING_CODES codes are outstanding: no new one until some expire."""


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


CHECKIN_REFRESH = timedelta(minutes=5)  # last_checkin_at of an unchanged device: at most this stale


def device_checkin(*, report: CheckinReport, now: datetime | None = None, device: Device | None = None) -> Device:
    """Create or update the Device from an OTA request; blank reports keep known values.

    `device`: the row already read for report.mac. A known device that reports what is stored
    costs no write: after a power cut a whole fleet checks in at once, and a write per check
    (a row lock, a WAL append, a commit) was most of the check's time. `last_checkin_at` is
    then refreshed only every CHECKIN_REFRESH (it says "recently", not the exact boot). No
    transaction around it: on SQLite every transaction takes the write lock when it begins.
    """
    now = now or timezone.now()
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
    defaults.update(last_ip=report.ip)
    if device is None or device.mac != report.mac:
        defaults.update(last_checkin_at=now)
        device, created = Device.objects.update_or_create(mac=report.mac, defaults=defaults)
        if created:
            logger.info("new device checked in", extra={"mac": device.mac, "board": device.board_type})
        return device
    changed = {key: value for key, value in defaults.items() if getattr(device, key) != value}
    if changed or device.last_checkin_at is None or now - device.last_checkin_at >= CHECKIN_REFRESH:
        changed["last_checkin_at"] = now
        Device.objects.filter(pk=device.pk).update(**changed)  # one UPDATE, no SELECT … FOR UPDATE
        for key, value in changed.items():
            setattr(device, key, value)
    return device


# --- Activation codes and binding ------------------------------------------------------------


def activation_capacity_reached(*, now: datetime | None = None) -> bool:
    return activation_codes_at_capacity(limit=settings.XIAOZHI_MAX_OUTSTANDING_CODES, now=now)


def _new_code(now: datetime) -> str:
    # The capacity check keeps the code space at most 10 % full (the cap cannot go higher),
    # so a free code is found in a draw or two; the attempt cap guards a broken random source.
    if activation_capacity_reached(now=now):
        raise ActivationCapacityError("too many outstanding activation codes")
    usable = activation_codes_outstanding(now=now)
    for _ in range(_CODE_ATTEMPTS):
        code = f"{secrets.randbelow(10**CODE_DIGITS):0{CODE_DIGITS}d}"
        if not usable.filter(code=code).exists():
            return code
    raise ActivationCapacityError("could not find a free activation code")


@transaction.atomic
def activation_code_issue(
    *, device: Device, client_id: str | None = None, now: datetime | None = None,
) -> ActivationCode:
    """The usable code of the device for `client_id` (default: its own), or a new one.

    A code is unique among usable codes. Codes are per Client-Id so that binding with the
    code the device shows binds the device to that device's Client-Id, not to whoever
    checked in last with the same MAC. Raises ActivationCapacityError at the cap.
    """
    now = now or timezone.now()
    client = device.client_id if client_id is None else client_id
    # Lock the device row so two simultaneous check-ins do not issue two codes.
    Device.objects.select_for_update().filter(pk=device.pk).first()
    current = activation_code_current(device=device, client_id=client, now=now)
    if current is not None:
        return current
    return ActivationCode.objects.create(
        device=device,
        code=_new_code(now),
        challenge=secrets.token_hex(16),
        client_id=client,
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
def device_bind(*, code: str, owner: User, persona: Model | None = None) -> Device:
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
    if activation.client_id:
        # Trust on first use: the device is the one that showed this code.
        device.client_id = activation.client_id
        device.pairing_requests.filter(client_id=activation.client_id).delete()
    device.owner = owner
    device.persona = persona  # type: ignore[assignment]
    device.bound_at = now
    device.revoked_at = None
    device.save(update_fields=["owner", "persona", "bound_at", "client_id", "revoked_at", "updated_at"])
    logger.info("device bound", extra={"mac": device.mac, "owner_id": owner.pk})
    return device


@transaction.atomic
def device_unbind(*, device: Device) -> Device:
    """Forget the owner (and the Client-Id pin: open re-pairing requests go too); the device
    gets a new activation code at its next OTA check."""
    device.pairing_requests.all().delete()
    device.owner = None
    device.bound_at = None
    device.revoked_at = None
    device.save(update_fields=["owner", "bound_at", "revoked_at", "updated_at"])
    logger.info("device unbound", extra={"mac": device.mac})
    return device


def _refused(status: int, error: str, message: str) -> ActivationOutcome:
    return ActivationOutcome(status, {"error": error, "message": message})


def _hmac_matches(key_hex: str, challenge: str, proof: str) -> bool:
    if not _KEY_HEX.fullmatch(proof):  # also keeps compare_digest on ASCII (it raises otherwise)
        return False
    expected = hmac.new(bytes.fromhex(key_hex), challenge.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, proof.lower())


def _key_proof(*, device: Device, body: ActivationBody) -> ActivationOutcome | bool:
    """Where the device's key is known, the request must prove it holds the key, whatever
    Activation-Version it claims (a v1 request cannot dodge the check). Returns the refusal,
    True for a verified proof, False when no key is known (nothing to verify against)."""
    if body.serial_number and device.serial_number and body.serial_number != device.serial_number:
        # Otherwise a device could name a serial without a key and skip the check.
        return _refused(403, "serial_mismatch", "serial_number differs from the Serial-Number header.")
    key = device_key_for_serial(serial_number=device.serial_number or body.serial_number)
    if key is None:
        return False
    if body.algorithm and body.algorithm != "hmac-sha256":
        return _refused(400, "unsupported_algorithm", "Only hmac-sha256 is supported.")
    if not body.challenge or not body.hmac:
        return _refused(400, "hmac_required", "This device's key is known: send challenge and hmac.")
    if not _hmac_matches(key.key_hex, body.challenge, body.hmac):
        logger.warning("activation hmac mismatch", extra={"mac": device.mac})
        return _refused(403, "bad_hmac", "The HMAC does not match this device's key.")
    return True


def _challenge_owner(device: Device, client_id: str, challenge: str) -> ActivationCode | PairingRequest | None:
    code = device.activation_codes.filter(challenge=challenge, client_id__in=(client_id, "")).first()
    return code or device.pairing_requests.filter(challenge=challenge, client_id=client_id).first()


def _pairing_poll(device: Device, client_id: str, proven: bool) -> ActivationOutcome:
    request = pairing_request_pending(device=device, client_id=client_id)
    if request is None:
        return _refused(403, "pairing_required",
                        "This device is bound to another client: check for updates to ask for re-pairing.")
    if proven and not request.key_verified:
        request.key_verified = True
        request.save(update_fields=["key_verified"])
    return ActivationOutcome(202, {"status": "pending", "message": "Waiting for an operator to approve re-pairing."})


@transaction.atomic
def device_activate(
    *, device: Device, client_id: str, body: ActivationBody, now: datetime | None = None,
) -> ActivationOutcome:
    """Answer one /activate poll: 200 once bound (to this Client-Id), 202 while waiting for
    an operator (binding, or approving a re-pairing request), 4xx when refused."""
    now = now or timezone.now()
    owner = _challenge_owner(device, client_id, body.challenge) if body.challenge else None
    if body.challenge and owner is None:
        return _refused(403, "unknown_challenge", "This challenge was not issued to this device.")
    code = owner if isinstance(owner, ActivationCode) else None
    if code is not None and code.activated_at is not None:
        return _refused(409, "challenge_replayed", "This challenge has already completed activation.")
    proof = _key_proof(device=device, body=body)
    if isinstance(proof, ActivationOutcome):
        return proof
    if not device_client_trusted(device=device, client_id=client_id):
        return _pairing_poll(device, client_id, proof)
    if not device.needs_activation:
        if code is not None and not ActivationCode.objects.filter(
            pk=code.pk, activated_at__isnull=True
        ).update(activated_at=now):
            return _refused(409, "challenge_replayed", "This challenge has already completed activation.")
        return ActivationOutcome(200, {"status": "activated"})
    if code is not None and code.expires_at <= now:
        return _refused(410, "code_expired", "The activation code expired; check for updates again.")
    return ActivationOutcome(202, {"status": "pending", "message": "Waiting for an operator to bind the device."})


# --- Tokens ----------------------------------------------------------------------------------


TOKEN_REUSE_SECONDS = 3600  # an OTA check hands out the same token for this long


@functools.lru_cache(maxsize=16384)
def _token_signed(secret: str, client_id: str, mac: str, issued_at: int, generation: int) -> str:
    return token_sign(secret=secret, client_id=client_id, device_id=mac, issued_at=issued_at, generation=generation)


def device_token_for_checkin(*, device: Device, now: float) -> str:
    """The token an OTA check hands out: issued at the start of the current hour, so the
    checks of that hour get the same token, signed once (a reboot storm signs nothing
    twice). It expires at most TOKEN_REUSE_SECONDS earlier than one signed now; a new client
    id, a revocation (generation) or a new secret key signs a new one."""
    issued_at = int(now) - int(now) % TOKEN_REUSE_SECONDS
    return _token_signed(settings.SECRET_KEY, device.client_id, device.mac, issued_at, device.token_generation)


def device_token_issue(*, device: Device, now: float | None = None) -> str:
    return token_sign(
        secret=settings.SECRET_KEY,
        client_id=device.client_id,
        device_id=device.mac,
        issued_at=int(time.time() if now is None else now),
        generation=device.token_generation,
    )


@transaction.atomic
def device_revoke_tokens(*, device: Device, now: datetime | None = None) -> int:
    """Invalidate every token issued so far, and make the device activate again: its next
    OTA check gets an activation code and no token until an operator binds that code."""
    Device.objects.filter(pk=device.pk).update(
        token_generation=F("token_generation") + 1, revoked_at=now or timezone.now(),
    )
    device.refresh_from_db(fields=["token_generation", "revoked_at"])
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
