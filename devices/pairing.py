"""Re-pairing: a bound device seen with a Client-Id other than the one it was bound with.

The device is bound to the Client-Id it was activated with (trust on first use). Another
Client-Id for the same MAC gets no token; it opens a `PairingRequest` that an operator
approves (a reflashed device whose NVS was erased) or rejects (someone who knows the MAC).
"""
from __future__ import annotations

import logging
import secrets
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from devices.models import Device, PairingRequest
from devices.services import CheckinReport

logger = logging.getLogger(__name__)

# A bound device keeps at most this many open re-pairing requests (one per Client-Id):
# someone cycling Client-Ids for a known MAC cannot fill the operator's list.
MAX_PAIRING_REQUESTS_PER_DEVICE = 5


@transaction.atomic
def pairing_request_record(
    *, device: Device, report: CheckinReport, now: datetime | None = None,
) -> PairingRequest | None:
    """Open (or refresh) the request of `report.client_id` to speak for the bound `device`.

    None when the device already has MAX_PAIRING_REQUESTS_PER_DEVICE other open requests.
    Nothing on the device row changes: the MAC alone does not own it.
    """
    now = now or timezone.now()
    seen = {"address": report.ip, "board_type": report.board_type[:100],
            "firmware_version": report.firmware_version, "last_seen_at": now}
    request = device.pairing_requests.filter(client_id=report.client_id).first()
    if request is None:
        if device.pairing_requests.filter(approved_at__isnull=True).count() >= MAX_PAIRING_REQUESTS_PER_DEVICE:
            return None
        request = PairingRequest(device=device, client_id=report.client_id, created_at=now)
        logger.warning("re-pairing requested", extra={"mac": device.mac, "address": report.ip})
    if request.approved_at is not None or not request.challenge:
        # A client approved once, replaced since, is asking again: a new request.
        request.approved_at, request.key_verified = None, False
        request.challenge = secrets.token_hex(16)
    for name, value in seen.items():
        setattr(request, name, value)
    request.save()
    return request


@transaction.atomic
def pairing_request_approve(*, request: PairingRequest, now: datetime | None = None) -> Device:
    """Accept the request's Client-Id as the device's: its next OTA check gets a token."""
    now = now or timezone.now()
    device = request.device
    device.client_id = request.client_id
    device.save(update_fields=["client_id", "updated_at"])
    request.approved_at = now
    request.save(update_fields=["approved_at"])
    logger.info("re-pairing approved", extra={"mac": device.mac})
    return device


def pairing_request_reject(*, request: PairingRequest) -> None:
    logger.info("re-pairing rejected", extra={"mac": request.device.mac})
    request.delete()
