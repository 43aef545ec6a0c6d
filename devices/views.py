"""HTTP endpoints the firmware calls: OTA check, activation polling, firmware download.

The firmware treats any non-200 OTA answer as "no server config" and falls back to MQTT, so
only clearly broken requests get a 4xx; unknown boards or odd-but-typed fields are fine.
Errors are JSON: `{"error": "<code>", "message": "<text>"}`, never a 500 for bad input.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Annotated, Any, TypeVar, cast

from django.conf import settings
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from devices.auth import normalize_mac
from devices.models import FirmwareRelease
from devices.ratelimit import activate_poll_limit, rate_limit_hit
from devices.selectors import device_get_by_mac
from devices.services import ActivationBody, CheckinReport, device_activate, device_checkin, ota_response_for

logger = logging.getLogger(__name__)

# Real OTA bodies are 1-3 KB (the partition table is the bulk).
MAX_BODY_BYTES = 64 * 1024
WS_PATH = "/xiaozhi/v1/"
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")  # no "|": it separates the token's fields

View = Callable[..., HttpResponse]
SpecT = TypeVar("SpecT", bound=BaseModel)


def json_error(status: int, error: str, message: str) -> JsonResponse:
    return JsonResponse({"error": error, "message": message}, status=status)


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


@dataclass(frozen=True)
class DeviceHeaders:
    mac: str
    client_id: str
    activation_version: int
    serial_number: str


class DeviceRequest(HttpRequest):
    """An HttpRequest after the decorators below: validated headers and body attached."""

    device_headers: DeviceHeaders
    spec: Any


# --- Decorators -------------------------------------------------------------------------------


def allow_methods(*methods: str) -> Callable[[View], View]:
    def decorator(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
            if request.method not in methods:
                response = json_error(405, "method_not_allowed", f"Use {' or '.join(methods)}.")
                response["Allow"] = ", ".join(methods)
                return response
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def _parse_device_headers(request: HttpRequest) -> DeviceHeaders | JsonResponse:
    raw_mac = request.headers.get("Device-Id", "").strip()
    if not raw_mac:
        return json_error(400, "missing_device_id", "The Device-Id header (the MAC address) is required.")
    mac = normalize_mac(raw_mac)
    if mac is None:
        return json_error(400, "invalid_device_id", "Device-Id must be a MAC address like aa:bb:cc:dd:ee:ff.")
    client_id = request.headers.get("Client-Id", "").strip()
    if not client_id:
        return json_error(400, "missing_client_id", "The Client-Id header is required.")
    if not _CLIENT_ID.fullmatch(client_id):
        return json_error(400, "invalid_client_id", "Client-Id must be 1-64 letters, digits, '.', '_', ':' or '-'.")
    version = request.headers.get("Activation-Version", "1").strip()
    if version not in ("1", "2"):
        return json_error(400, "invalid_activation_version", "Activation-Version must be 1 or 2.")
    serial = request.headers.get("Serial-Number", "").strip()
    if len(serial) > 64:
        return json_error(400, "invalid_serial_number", "Serial-Number is longer than 64 characters.")
    return DeviceHeaders(mac=mac, client_id=client_id, activation_version=int(version), serial_number=serial)


def device_headers(view: View) -> View:
    """Attach the validated Device-Id / Client-Id / Activation-Version / Serial-Number."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        parsed = _parse_device_headers(request)
        if isinstance(parsed, JsonResponse):
            return parsed
        cast(DeviceRequest, request).device_headers = parsed
        return view(request, *args, **kwargs)

    return wrapper


def _field_path(error: dict[str, Any]) -> str:
    return ".".join(str(part) for part in error["loc"]) or "body"


def _parse_body(request: HttpRequest, spec: type[SpecT]) -> SpecT | JsonResponse:
    declared = request.headers.get("Content-Length", "0")
    if (declared.isdigit() and int(declared) > MAX_BODY_BYTES) or len(request.body) > MAX_BODY_BYTES:
        return json_error(413, "body_too_large", f"The body must be at most {MAX_BODY_BYTES} bytes.")
    try:
        data = json.loads(request.body or b"")
    except (ValueError, UnicodeDecodeError):
        return json_error(400, "invalid_json", "The body must be a JSON object.")
    if not isinstance(data, dict):
        return json_error(400, "invalid_body", "The body must be a JSON object.")
    try:
        return spec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        return json_error(400, "invalid_body", f"{_field_path(first)}: {first['msg']}")


def json_body(spec: type[BaseModel]) -> Callable[[View], View]:
    def decorator(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
            parsed = _parse_body(request, spec)
            if isinstance(parsed, JsonResponse):
                return parsed
            cast(DeviceRequest, request).spec = parsed
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


# --- Request-derived addresses ------------------------------------------------------------------


def client_address(request: HttpRequest) -> str | None:
    return trusted_client_address(request.META.get("REMOTE_ADDR", ""), request.META.get("HTTP_X_FORWARDED_FOR", ""))


def trusted_client_address(remote: str, forwarded_for: str) -> str | None:
    """The client's IP for HTTP requests and WebSocket scopes alike.

    X-Forwarded-For is client-controlled: only the entries appended by our own proxies
    (XIAOZHI_TRUSTED_PROXY_COUNT of them, counted from the right) can be believed.
    """
    address = remote
    proxies = settings.XIAOZHI_TRUSTED_PROXY_COUNT
    if proxies:
        forwarded = [part.strip() for part in forwarded_for.split(",") if part.strip()]
        if len(forwarded) >= proxies:
            address = forwarded[-proxies]
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


def public_base_url(request: HttpRequest) -> str:
    configured = settings.XIAOZHI_PUBLIC_BASE_URL.rstrip("/")
    return configured or f"{request.scheme}://{request.get_host()}"


def public_ws_url(request: HttpRequest) -> str:
    if settings.XIAOZHI_PUBLIC_WS_URL:
        return settings.XIAOZHI_PUBLIC_WS_URL
    base = public_base_url(request)
    scheme, _, rest = base.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{WS_PATH}"


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


@device_headers
@json_body(OtaSpec)
def _ota_check(request: DeviceRequest) -> HttpResponse:
    device = device_checkin(report=_checkin_report(request))
    body = ota_response_for(device=device, base_url=public_base_url(request), ws_url=public_ws_url(request))
    return JsonResponse(body)


@csrf_exempt
@allow_methods("GET", "POST")
def ota(request: HttpRequest) -> HttpResponse:
    """POST: the firmware's boot-time check. GET: a notice for humans testing the address."""
    if request.method == "GET":
        notice = f"OTA endpoint is working. Devices are sent the WebSocket address {public_ws_url(request)}\n"
        return HttpResponse(notice, content_type="text/plain; charset=utf-8")
    return _ota_check(request)


@csrf_exempt
@allow_methods("POST")
@device_headers
@json_body(ActivateSpec)
def activate(request: DeviceRequest) -> HttpResponse:
    """Polled every 3 s by an unbound device: 202 while waiting, 200 once bound."""
    address = client_address(request) or "unknown"
    decision = rate_limit_hit(limit=activate_poll_limit(), address=address)
    if not decision.allowed:
        response = json_error(429, "rate_limited", "Too many activation attempts; slow down.")
        response["Retry-After"] = str(decision.retry_after)
        return response
    device = device_get_by_mac(mac=request.device_headers.mac)
    if device is None:
        return json_error(404, "device_unknown", "Unknown device: check for updates (OTA) first.")
    spec = cast(ActivateSpec, request.spec)
    outcome = device_activate(
        device=device,
        body=ActivationBody(**spec.model_dump()),
        activation_version=request.device_headers.activation_version,
    )
    return JsonResponse(outcome.body, status=outcome.status)


@csrf_exempt  # so a stray POST gets the JSON 405 rather than a CSRF page
@allow_methods("GET", "HEAD")
def firmware_download(request: HttpRequest, pk: int, filename: str) -> HttpResponse:
    """The binary, with Content-Length (the firmware refuses a download without one)."""
    release = FirmwareRelease.objects.filter(pk=pk, is_active=True).first()
    name = release.binary.name if release is not None else ""
    if not name or name.rsplit("/", 1)[-1] != filename or not release.binary.storage.exists(name):
        return json_error(404, "not_found", "No such firmware release.")
    stream = release.binary.storage.open(name, "rb")
    return FileResponse(stream, as_attachment=True, filename=filename, content_type="application/octet-stream")
