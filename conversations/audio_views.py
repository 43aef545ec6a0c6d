"""The only way turn audio leaves the server: a staff-only view with HTTP Range support.

MEDIA_URL is never served. The conversation admin mounts `turn_audio` behind
`admin_site.admin_view` (anonymous and non-staff users are sent to the login page); here the
user also needs the view permission on conversations or turns. Files are read through the
storage API, so any backend works. Range requests (RFC 9110 §14) let the browser's player
seek: one range gets 206 with Content-Range, a range past the end gets 416, anything else
(several ranges, bad syntax, an If-Range we cannot validate) gets the whole file with 200.
"""
from __future__ import annotations

import logging
import re
from typing import NamedTuple

from django.core.exceptions import PermissionDenied
from django.core.files.storage import default_storage
from django.http import FileResponse, HttpRequest, HttpResponse, HttpResponseBase
from django.utils.translation import gettext as _
from django.views.decorators.http import require_safe

from conversations.models import Turn

logger = logging.getLogger(__name__)

CONTENT_TYPE = "audio/ogg"
TRACKS = ("user", "reply")
MAX_RANGE_BYTES = 4 * 1024 * 1024  # one 206 answer; longer ranges get the first 4 MiB (≈ 20 min)
_RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)")
_MAX_HEADER = 200


class ByteRange(NamedTuple):
    start: int
    end: int  # inclusive, as in Content-Range

    @property
    def length(self) -> int:
        return self.end - self.start + 1


class RangeNotSatisfiable(Exception):
    pass


def byte_range(header: str, size: int) -> ByteRange | None:
    """The one range of a `Range` header within `size` bytes; None means "send it all".

    Raises RangeNotSatisfiable when the range starts at or past the end (or asks for an
    empty suffix), which the caller answers with 416.
    """
    match = _RANGE.fullmatch(header.strip().replace(" ", "")) if len(header) <= _MAX_HEADER else None
    if match is None or match.group(1) == match.group(2) == "":
        return None  # not a single byte range we understand: ignoring Range is always allowed
    first, last = match.groups()
    if first == "":  # suffix: the last N bytes
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise RangeNotSatisfiable
        return ByteRange(max(size - suffix, 0), size - 1)
    start = int(first)
    if last and int(last) < start:
        return None  # invalid range-spec: the header is ignored (RFC 9110 §14.1.1)
    if start >= size:
        raise RangeNotSatisfiable
    end = int(last) if last else size - 1
    return ByteRange(start, min(end, size - 1, start + MAX_RANGE_BYTES - 1))


def can_listen(request: HttpRequest) -> bool:
    user = request.user
    return bool(user.is_active and user.is_staff and (
        user.has_perm("conversations.view_turn") or user.has_perm("conversations.view_conversation")))


@require_safe
def turn_audio(request: HttpRequest, turn_id: int, track: str) -> HttpResponseBase:
    if not can_listen(request):
        raise PermissionDenied
    name = _file_name(turn_id, track)
    if not name:
        return _unavailable(404)
    try:
        size = default_storage.size(name)
    except FileNotFoundError:
        return _unavailable(404)
    except Exception:  # a remote storage that is down: the page says "unavailable", no 500
        logger.exception("turn audio could not be read", extra={"turn_id": turn_id, "track": track})
        return _unavailable(503)
    header = request.headers.get("Range", "")
    if not header or "If-Range" in request.headers:  # no validators here, so If-Range never matches
        return _whole(name, size, turn_id, track)
    try:
        wanted = byte_range(header, size)
    except RangeNotSatisfiable:
        response = HttpResponse(status=416)
        response["Content-Range"] = f"bytes */{size}"
        response["Accept-Ranges"] = "bytes"
        return response
    if wanted is None:
        return _whole(name, size, turn_id, track)
    return _partial(name, size, wanted, turn_id, track)


def _file_name(turn_id: int, track: str) -> str:
    if track not in TRACKS:
        return ""
    row = Turn.objects.filter(pk=turn_id).values_list(f"{track}_audio", flat=True).first()
    return row or ""


def _whole(name: str, size: int, turn_id: int, track: str) -> HttpResponseBase:
    try:
        handle = default_storage.open(name, "rb")
    except FileNotFoundError:
        return _unavailable(404)
    response = FileResponse(handle, content_type=CONTENT_TYPE)
    return _headers(response, size, turn_id, track)


def _partial(name: str, size: int, wanted: ByteRange, turn_id: int, track: str) -> HttpResponseBase:
    try:
        with default_storage.open(name, "rb") as handle:
            handle.seek(wanted.start)
            body = handle.read(wanted.length)
    except FileNotFoundError:
        return _unavailable(404)
    response = HttpResponse(body, status=206, content_type=CONTENT_TYPE)
    response["Content-Range"] = f"bytes {wanted.start}-{wanted.start + len(body) - 1}/{size}"
    return _headers(response, len(body), turn_id, track)


def _headers(response: HttpResponseBase, length: int, turn_id: int, track: str) -> HttpResponseBase:
    response["Content-Length"] = str(length)
    response["Accept-Ranges"] = "bytes"
    response["Content-Disposition"] = f'inline; filename="turn-{turn_id}-{track}.ogg"'
    response["Cache-Control"] = "private, no-store"
    return response


def _unavailable(status: int) -> HttpResponse:
    return HttpResponse(_("Audio unavailable."), status=status, content_type="text/plain; charset=utf-8")
