"""The OTA check's reply (protocol-reference §3.2): server time, firmware offer, WebSocket
address and token, and the activation block while the device needs one.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from devices.models import Device, FirmwareRelease, PairingRequest
from devices.pairing import pairing_request_record
from devices.selectors import device_client_trusted, firmware_release_for
from devices.services import (
    ActivationCapacityError,
    CheckinReport,
    activation_capacity_reached,
    activation_code_issue,
    device_checkin,
    device_token_for_checkin,
)

logger = logging.getLogger(__name__)


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
    filename = (release.binary.name or "").rsplit("/", 1)[-1]
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


def _activation_section(device: Device, client_id: str, base_url: str, now: datetime) -> dict[str, object]:
    code = activation_code_issue(device=device, client_id=client_id, now=now)
    return {
        "code": code.code,
        "message": f"Code {code.code}\n{base_url}/admin/",
        "challenge": code.challenge,
        "timeout_ms": max(0, int((code.expires_at - now).total_seconds() * 1000)),
    }


def _base_reply(device: Device, ws_url: str, token: str, now: datetime) -> dict[str, object]:
    # `websocket` is always complete: without it the device picks MQTT, and keys left out
    # keep stale values in its NVS (an empty token overwrites an old one).
    return {
        "server_time": {
            "timestamp": int(now.timestamp() * 1000),
            "timezone_offset": _timezone_offset_minutes(device, now),
        },
        "websocket": {"url": ws_url, "token": token, "version": settings.XIAOZHI_WS_PROTOCOL_VERSION},
    }


def ota_response_for(*, device: Device, base_url: str, ws_url: str, now: datetime | None = None) -> dict[str, object]:
    """The OTA reply to the device's own client. Unbound devices get a code and a token (the
    token lets them hear their code over the WebSocket); revoked ones a code and no token.
    Raises ActivationCapacityError when a code is needed and none can be issued."""
    now = now or timezone.now()
    revoked = device.revoked_at is not None
    token = "" if revoked else device_token_for_checkin(device=device, now=now.timestamp())
    response = _base_reply(device, ws_url, token, now)
    response["firmware"] = _firmware_section(device, base_url)
    if device.needs_activation:
        response["activation"] = _activation_section(device, device.client_id, base_url, now)
    return response


def ota_response_for_stranger(
    *, device: Device, report: CheckinReport, pairing: PairingRequest | None, ws_url: str,
    now: datetime | None = None,
) -> dict[str, object]:
    """The reply to a Client-Id the bound device does not know: no token, no firmware offer,
    and (while a request is open) a challenge, so the firmware polls /activate until an
    operator approves the re-pairing (200) and then checks again for its token."""
    now = now or timezone.now()
    response = _base_reply(device, ws_url, "", now)
    response["firmware"] = {"version": report.firmware_version, "url": "", "force": 0}
    if pairing is not None:
        response["activation"] = {
            "message": "This device is paired with another client. Ask the operator to approve re-pairing.",
            "challenge": pairing.challenge,
        }
    return response


@dataclass(frozen=True)
class OtaReply:
    status: int
    body: dict[str, object]


_CAPACITY_REPLY = OtaReply(503, {
    "error": "activation_capacity",
    "message": "Too many devices are waiting for activation; try again later.",
})


def ota_check(
    *, device: Device | None, report: CheckinReport, base_url: str, ws_url: str, now: datetime | None = None,
) -> OtaReply:
    """One OTA check: `device` is the row for report.mac (None for a new MAC).

    A Client-Id the bound device does not know opens a re-pairing request and changes
    nothing on the device. A new device is not even recorded while the outstanding codes
    are at XIAOZHI_MAX_OUTSTANDING_CODES (503: the firmware retries later).
    """
    now = now or timezone.now()
    if device is not None and not device_client_trusted(device=device, client_id=report.client_id):
        pairing = pairing_request_record(device=device, report=report, now=now)
        return OtaReply(200, ota_response_for_stranger(device=device, report=report, pairing=pairing,
                                                       ws_url=ws_url, now=now))
    if device is None and activation_capacity_reached(now=now):
        return _CAPACITY_REPLY
    device = device_checkin(report=report, now=now, device=device)
    try:
        return OtaReply(200, ota_response_for(device=device, base_url=base_url, ws_url=ws_url, now=now))
    except ActivationCapacityError:
        logger.warning("activation code capacity reached", extra={"mac": device.mac})
        return _CAPACITY_REPLY
