"""HTTP endpoints the firmware calls: OTA check, activation polling, firmware download.

The firmware treats any non-200 OTA answer as "no server config" and falls back to MQTT, so
only clearly broken requests get a 4xx; unknown boards or odd-but-typed fields are fine.
Errors are JSON: `{"error": "<code>", "message": "<text>"}`, never a 500 for bad input.
"""
from __future__ import annotations

import logging
from typing import Annotated, cast

from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from devices.addresses import client_address, public_base_url, public_ws_url
from devices.decorators import (
    DeviceRequest,
    allow_methods,
    device_headers,
    json_body,
    json_error,
    rate_limited,
)
from devices.models import FirmwareRelease
from devices.ota import ota_check
from devices.ratelimit import activate_poll_limit, new_device_limit, ota_check_limit, rate_limit_hit
from devices.selectors import device_for_checkin, device_get_by_mac
from devices.services import ActivationBody, CheckinReport, device_activate

logger = logging.getLogger(__name__)


# --- Request specs ----------------------------------------------------------------------------


def _int_from_text(value: object) -> object:
    # The firmware sends minimum_free_heap_size as a string ("123456").
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value


def _no_nul(value: str) -> str:
    # PostgreSQL text cannot hold NUL; refuse it here rather than fail in the database.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


Text = Annotated[str, AfterValidator(_no_nul)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ApplicationSpec(_Spec):
    version: Text = Field(min_length=1, max_length=50)
    name: Text = Field("", max_length=100)


class BoardSpec(_Spec):
    type: Text = Field("", max_length=100)
    name: Text = Field("", max_length=100)


class OtaSpec(_Spec):
    application: ApplicationSpec
    board: BoardSpec = BoardSpec()
    chip_model_name: Text = Field("", max_length=50)
    flash_size: int | None = Field(None, ge=0, le=2**53)
    minimum_free_heap_size: Annotated[int | None, BeforeValidator(_int_from_text)] = Field(None, ge=0, le=2**53)
    language: Text = Field("", max_length=64)


class ActivateSpec(_Spec):
    algorithm: Text = Field("", max_length=32)
    serial_number: Text = Field("", max_length=64)
    challenge: Text = Field("", max_length=64)
    hmac: Text = Field("", max_length=128)


# --- Views ----------------------------------------------------------------------------------


def _checkin_report(request: DeviceRequest) -> CheckinReport:
    headers, spec = request.device_headers, cast(OtaSpec, request.spec)
    user_agent = request.headers.get("User-Agent", "")
    language = request.headers.get("Accept-Language", "") or spec.language
    return CheckinReport(
        mac=headers.mac,
        client_id=headers.client_id,
        ip=client_address(request),
        firmware_version=spec.application.version,
        serial_number=headers.serial_number,
        # board.type is the firmware model key; old firmware only names it in the User-Agent.
        board_type=spec.board.type or user_agent.split("/", 1)[0][:100],
        board_name=spec.board.name,
        chip_model=spec.chip_model_name,
        flash_size=spec.flash_size,
        minimum_free_heap=spec.minimum_free_heap_size,
        language=language.split(",", 1)[0].strip()[:20],
        user_agent=user_agent[:200],
    )


def _new_device_refused(request: HttpRequest) -> HttpResponse | None:
    decision = rate_limit_hit(limit=new_device_limit(), address=client_address(request) or "unknown")
    if decision.allowed:
        return None
    return json_error(429, "too_many_new_devices", "Too many new devices from this address; try again later.",
                      retry_after=decision.retry_after)


@rate_limited(ota_check_limit, "Too many update checks from this address; slow down.")
@device_headers
@json_body(OtaSpec)
def _ota_check(request: DeviceRequest) -> HttpResponse:
    report = _checkin_report(request)
    device = device_for_checkin(mac=report.mac)
    if device is None and (refused := _new_device_refused(request)) is not None:
        return refused
    reply = ota_check(device=device, report=report, base_url=public_base_url(request), ws_url=public_ws_url(request))
    response = JsonResponse(reply.body, status=reply.status)
    if reply.status == 503:
        response["Retry-After"] = "300"
    return response


@csrf_exempt
@allow_methods("GET", "POST")
def ota(request: HttpRequest) -> HttpResponseBase:
    """POST: the firmware's boot-time check. GET: a notice for humans testing the address."""
    if request.method == "GET":
        notice = f"OTA endpoint is working. Devices are sent the WebSocket address {public_ws_url(request)}\n"
        return HttpResponse(notice, content_type="text/plain; charset=utf-8")
    return _ota_check(request)


@csrf_exempt
@allow_methods("POST")
@rate_limited(activate_poll_limit, "Too many activation attempts; slow down.")
@device_headers
@json_body(ActivateSpec)
def activate(request: DeviceRequest) -> HttpResponse:
    """Polled every 3 s by a device waiting for activation: 202 while waiting, 200 once bound."""
    device = device_get_by_mac(mac=request.device_headers.mac)
    if device is None:
        return json_error(404, "device_unknown", "Unknown device: check for updates (OTA) first.")
    spec = cast(ActivateSpec, request.spec)
    outcome = device_activate(device=device, client_id=request.device_headers.client_id,
                              body=ActivationBody(**spec.model_dump()))
    return JsonResponse(outcome.body, status=outcome.status)


@csrf_exempt  # so a stray POST gets the JSON 405 rather than a CSRF page
@allow_methods("GET", "HEAD")
def firmware_download(request: HttpRequest, pk: int, filename: str) -> HttpResponseBase:
    """The binary, with Content-Length (the firmware refuses a download without one)."""
    release = FirmwareRelease.objects.filter(pk=pk, is_active=True).first()
    name = (release.binary.name or "") if release is not None else ""
    if release is None or not name or name.rsplit("/", 1)[-1] != filename or not release.binary.storage.exists(name):
        return json_error(404, "not_found", "No such firmware release.")
    stream = release.binary.storage.open(name, "rb")
    return FileResponse(stream, as_attachment=True, filename=filename, content_type="application/octet-stream")
