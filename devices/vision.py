"""The camera's "explain" endpoint (protocol-reference §5.6): a photo in, a text answer out.

During `self.camera.take_photo` the device POSTs `question` + `file` (JPEG) as chunked
multipart to the URL it got in MCP `initialize`, with the token from the same place. The
whole 200 body becomes the tool's text result, so the answer is returned as plain text;
any non-200 makes the device report "Failed to upload photo".

Vision tokens are signed with a key derived from SECRET_KEY, not SECRET_KEY itself: a
leaked vision token (it is stored on the camera) can never open a device WebSocket, even
with a forged `Client-Id`.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import io
import logging
import time
from dataclasses import dataclass, field

import openai
from openai.types.chat import ChatCompletionUserMessageParam
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParser, MultiPartParserError
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from conversations.providers.llm.openai_compat import Endpoint
from devices.auth import normalize_mac
from devices.models import Device
from devices.tokens import token_sign, token_verify

logger = logging.getLogger(__name__)

VISION_CLIENT_ID = "vision"
VISION_TOKEN_TTL_SECONDS = 3600  # re-issued at every session's MCP initialize
MULTIPART_SLACK_BYTES = 64 * 1024  # the question part and multipart framing around the JPEG
DEFAULT_QUESTION = "Describe this picture briefly."
VISION_TIMEOUT_SECONDS = 30.0


class VisionError(Exception):
    """The vision model could not answer (network, HTTP error, empty answer)."""


# -- tokens -------------------------------------------------------------------------------


def _vision_secret() -> str:
    return hmac.new(settings.SECRET_KEY.encode(), b"xiaozhi vision token", hashlib.sha256).hexdigest()


def vision_token_issue(*, device: Device, now: float | None = None) -> str:
    return token_sign(
        secret=_vision_secret(), client_id=VISION_CLIENT_ID, device_id=device.mac,
        issued_at=int(time.time() if now is None else now), generation=device.token_generation,
    )


def vision_token_valid(*, token: str, device: Device, now: float | None = None) -> bool:
    check = token_verify(
        token, secret=_vision_secret(), client_id=VISION_CLIENT_ID, device_id=device.mac,
        generation=device.token_generation, ttl_seconds=VISION_TOKEN_TTL_SECONDS,
        now=time.time() if now is None else now,
    )
    return check.ok


def _bearer(request: HttpRequest) -> str:
    value = request.headers.get("Authorization", "").strip()
    return value[7:].strip() if value[:7].lower() == "bearer " else value


def vision_request_device(request: HttpRequest) -> Device | None:
    """The device named in `Device-Id`, if the token is a vision token for it (sync, ORM)."""
    mac = normalize_mac(request.headers.get("Device-Id", ""))
    token = _bearer(request)
    if mac is None or not token:
        return None
    device = Device.objects.filter(mac=mac).first()
    return device if device is not None and vision_token_valid(token=token, device=device) else None


def vision_request_authorized(request: HttpRequest) -> bool:
    return vision_request_device(request) is not None


@dataclass(frozen=True)
class VisionEndpoint:
    """One OpenAI-compatible vision model to ask (a persona's vision configuration, or the
    XIAOZHI_VISION_* settings). repr() leaves the key out."""

    name: str
    base_url: str
    model: str
    timeout: float = VISION_TIMEOUT_SECONDS
    api_key: str = field(default="", repr=False)


def vision_endpoints(device: Device) -> list[VisionEndpoint]:
    """The device's persona's vision chain (admin: the persona's "Vision chain"), in order;
    without one, the XIAOZHI_VISION_* settings (default: the LLM's)."""
    from conversations.provider_configs import env_provider_options, persona_chain_specs  # noqa: PLC0415
    from conversations.selectors import persona_for_device  # noqa: PLC0415 - it imports this module

    env = env_provider_options()
    specs = persona_chain_specs(persona_for_device(device), env, stages=("vision",))["vision"]
    endpoints = [
        VisionEndpoint(spec.name, str(spec.kwargs.get("base_url") or ""),
                       spec.model or settings.XIAOZHI_VISION_MODEL,
                       float(spec.kwargs.get("timeout") or VISION_TIMEOUT_SECONDS),
                       str(spec.kwargs.get("api_key") or ""))
        for spec in specs if not isinstance(spec, str)
    ]
    return endpoints or [VisionEndpoint(
        "", settings.XIAOZHI_VISION_BASE_URL or settings.LLM_BASE_URL, settings.XIAOZHI_VISION_MODEL,
        VISION_TIMEOUT_SECONDS, settings.XIAOZHI_VISION_API_KEY or settings.LLM_API_KEY)]


# -- upload parsing -----------------------------------------------------------------------


def _max_upload_bytes() -> int:
    return settings.XIAOZHI_VISION_MAX_BYTES + MULTIPART_SLACK_BYTES


def _declared_too_large(request: HttpRequest) -> bool:
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return False
    return declared > _max_upload_bytes()


def read_upload(request: HttpRequest) -> tuple[str, bytes] | HttpResponse:
    """(question, jpeg) from the multipart body, or the error response to send.

    Parsed by hand from the raw body because the firmware sends it chunked: without a
    Content-Length Django's request.POST/FILES would simply be empty.
    """
    body = request.read(_max_upload_bytes() + 1)
    if len(body) > _max_upload_bytes():
        return _too_large()
    meta = {**request.META, "CONTENT_LENGTH": str(len(body))}
    try:
        fields, files = MultiPartParser(meta, io.BytesIO(body), request.upload_handlers,
                                        request.encoding).parse()
    except MultiPartParserError:
        return JsonResponse({"success": False, "message": "body is not multipart/form-data"}, status=400)
    upload = files.get("file")
    if upload is None or "question" not in fields:
        return JsonResponse({"success": False, "message": "question and file are required"}, status=400)
    if upload.size > settings.XIAOZHI_VISION_MAX_BYTES:
        return _too_large()
    jpeg = upload.read()
    if not jpeg.startswith(b"\xff\xd8"):
        return JsonResponse({"success": False, "message": "file must be a JPEG"}, status=400)
    return fields.get("question", "").strip() or DEFAULT_QUESTION, jpeg


def _too_large() -> JsonResponse:
    limit_mb = settings.XIAOZHI_VISION_MAX_BYTES / (1024 * 1024)
    return JsonResponse({"success": False, "message": f"image larger than {limit_mb:g} MB"}, status=413)


# -- the model ----------------------------------------------------------------------------


async def vision_explain_image(*, question: str, jpeg: bytes, endpoints: list[VisionEndpoint] | None = None) -> str:
    """Ask the vision models in order until one answers; VisionError when none does."""
    if endpoints is None:
        endpoints = [VisionEndpoint("", settings.XIAOZHI_VISION_BASE_URL or settings.LLM_BASE_URL,
                                    settings.XIAOZHI_VISION_MODEL, VISION_TIMEOUT_SECONDS,
                                    settings.XIAOZHI_VISION_API_KEY or settings.LLM_API_KEY)]
    last: VisionError | None = None
    for endpoint in endpoints:
        try:
            return await _ask(endpoint, question, jpeg)
        except VisionError as exc:
            # The class name only: SDK errors can carry URLs and keys.
            logger.warning("vision model failed, trying the next one",
                           extra={"config": endpoint.name, "error": str(exc)})
            last = exc
    raise last or VisionError("no vision model")


async def _ask(endpoint: VisionEndpoint, question: str, jpeg: bytes) -> str:
    # The process's client for this model (a new one costs ~17 ms of the event loop's CPU).
    client = Endpoint(endpoint.base_url, endpoint.api_key, endpoint.timeout).client()
    image_url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
    message: ChatCompletionUserMessageParam = {"role": "user", "content": [
        {"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": image_url}}]}
    try:
        response = await client.chat.completions.create(
            model=endpoint.model, stream=False, messages=[message])
    except (openai.OpenAIError, OSError, TimeoutError) as exc:
        raise VisionError(type(exc).__name__) from exc
    answer = (response.choices[0].message.content or "").strip() if response.choices else ""
    if not answer:
        raise VisionError("empty answer")
    return answer


# -- the view -----------------------------------------------------------------------------


@csrf_exempt
@require_POST
async def vision_explain(request: HttpRequest) -> HttpResponse:
    if _declared_too_large(request):
        return _too_large()
    device = await sync_to_async(vision_request_device)(request)
    if device is None:
        return JsonResponse({"success": False, "message": "invalid vision token"}, status=401)
    endpoints = await sync_to_async(vision_endpoints)(device)
    # Reading and parsing up to 5 MB is blocking file work: keep it off the event loop.
    upload = await sync_to_async(read_upload, thread_sensitive=False)(request)
    if isinstance(upload, HttpResponse):
        return upload
    question, jpeg = upload
    try:
        answer = await vision_explain_image(question=question, jpeg=jpeg, endpoints=endpoints)
    except VisionError as exc:
        logger.warning("vision model failed", extra={"error": str(exc)})
        return JsonResponse({"success": False, "message": "the vision model is unavailable"}, status=502)
    return HttpResponse(answer, content_type="text/plain; charset=utf-8")
