"""View decorators of the device HTTP endpoints: methods, identity headers, JSON bodies,
per-address rate limits. Each one answers bad input with a JSON error and never a 500:
`{"error": "<code>", "message": "<text>"}` with a 4xx status.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar, cast

from django.http import HttpRequest, JsonResponse
from django.http.response import HttpResponseBase
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from devices.addresses import client_address
from devices.auth import normalize_mac
from devices.ratelimit import RateLimit, rate_limit_hit

# Real OTA bodies are 1-3 KB (the partition table is the bulk).
MAX_BODY_BYTES = 64 * 1024
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")  # no "|": it separates the token's fields

View = Callable[..., HttpResponseBase]
SpecT = TypeVar("SpecT", bound=BaseModel)


def json_error(status: int, error: str, message: str, *, retry_after: int | None = None) -> JsonResponse:
    response = JsonResponse({"error": error, "message": message}, status=status)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


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


def allow_methods(*methods: str) -> Callable[[View], View]:
    def decorator(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponseBase:
            if request.method not in methods:
                response = json_error(405, "method_not_allowed", f"Use {' or '.join(methods)}.")
                response["Allow"] = ", ".join(methods)
                return response
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def rate_limited(limit: Callable[[], RateLimit], message: str) -> Callable[[View], View]:
    """Count the request against `limit()` for its client address; 429 once over it."""

    def decorator(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponseBase:
            decision = rate_limit_hit(limit=limit(), address=client_address(request) or "unknown")
            if not decision.allowed:
                return json_error(429, "rate_limited", message, retry_after=decision.retry_after)
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
    def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponseBase:
        parsed = _parse_device_headers(request)
        if isinstance(parsed, JsonResponse):
            return parsed
        cast(DeviceRequest, request).device_headers = parsed
        return view(request, *args, **kwargs)

    return wrapper


def _field_path(error: ErrorDetails) -> str:
    return ".".join(str(part) for part in error["loc"]) or "body"


def _parse_body(request: HttpRequest, spec: type[SpecT]) -> SpecT | JsonResponse:
    declared = request.headers.get("Content-Length", "0")
    if (declared.isdigit() and int(declared) > MAX_BODY_BYTES) or len(request.body) > MAX_BODY_BYTES:
        return json_error(413, "body_too_large", f"The body must be at most {MAX_BODY_BYTES} bytes.")
    try:
        data = json.loads(request.body or b"")
    except (ValueError, UnicodeDecodeError):
        return json_error(400, "invalid_json", "The body must be a JSON object.")
    except RecursionError:  # e.g. "[" * 20000: within the size limit, deeper than the parser goes
        return json_error(400, "invalid_json", "The body is nested too deeply.")
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
        def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponseBase:
            parsed = _parse_body(request, spec)
            if isinstance(parsed, JsonResponse):
                return parsed
            cast(DeviceRequest, request).spec = parsed
            return view(request, *args, **kwargs)

        return wrapper

    return decorator
