"""Turn audio leaves the server only through the staff view: permissions, Range requests so
the player can seek, missing files, hostile headers; /media/ is never served."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from conversations.audio_views import MAX_RANGE_BYTES, ByteRange, RangeNotSatisfiable, byte_range
from conversations.models import Conversation, Turn
from conversations.recording import turn_audio_save
from conversations.tests.review_data import turn_audio

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def media(settings: Any, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


@pytest.fixture
def turn(media: Path) -> Turn:
    conversation = Conversation.objects.create(session_id="audio")
    turn = Turn.objects.create(conversation=conversation, index=0, user_text="turn on the kitchen light")
    turn_audio_save(turn_id=turn.pk, audio=turn_audio())
    turn.refresh_from_db()
    return turn


def url(turn: Turn, track: str = "reply") -> str:
    return f"/admin/conversations/conversation/audio/{turn.pk}/{track}/"


def file_bytes(media: Path, turn: Turn, track: str = "reply") -> bytes:
    return (media / getattr(turn, f"{track}_audio").name).read_bytes()


def body(response: Any) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


# --- who may listen ----------------------------------------------------------------------------------


def test_anonymous_requests_are_sent_to_the_login_page(client: Client, turn: Turn) -> None:
    response = client.get(url(turn))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_logged_in_users_who_are_not_staff_are_sent_to_the_login_page(client: Client, turn: Turn) -> None:
    client.force_login(get_user_model().objects.create_user("nina", password="pw"))
    response = client.get(url(turn))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_staff_without_the_view_permission_are_refused(client: Client, turn: Turn) -> None:
    client.force_login(get_user_model().objects.create_user("sam", password="pw", is_staff=True))
    assert client.get(url(turn)).status_code == 403


@pytest.mark.parametrize("codename", ["view_turn", "view_conversation"])
def test_staff_with_a_view_permission_get_the_ogg_file(client: Client, turn: Turn, media: Path, codename: str) -> None:
    staff = get_user_model().objects.create_user("sam", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(staff)
    response = client.get(url(turn, "user"))
    assert response.status_code == 200
    assert response["Content-Type"] == "audio/ogg"
    assert response["Accept-Ranges"] == "bytes"
    assert "no-store" in response["Cache-Control"]
    assert body(response) == file_bytes(media, turn, "user")
    assert response["Content-Length"] == str(len(file_bytes(media, turn, "user")))


def test_media_files_are_not_served_at_media_url(admin_client: Client, turn: Turn) -> None:
    assert admin_client.get(f"/media/{turn.reply_audio.name}").status_code == 404
    assert admin_client.get(f"/{turn.reply_audio.name}").status_code == 404


# --- seeking ------------------------------------------------------------------------------------------


def test_a_range_request_gets_206_with_content_range(admin_client: Client, turn: Turn, media: Path) -> None:
    data = file_bytes(media, turn)
    response = admin_client.get(url(turn), HTTP_RANGE="bytes=100-199")
    assert response.status_code == 206
    assert response["Content-Range"] == f"bytes 100-199/{len(data)}"
    assert response["Content-Length"] == "100"
    assert response["Accept-Ranges"] == "bytes"
    assert body(response) == data[100:200]


def test_open_ended_and_suffix_ranges(admin_client: Client, turn: Turn, media: Path) -> None:
    data = file_bytes(media, turn)
    tail = admin_client.get(url(turn), HTTP_RANGE="bytes=-50")
    assert tail.status_code == 206 and body(tail) == data[-50:]
    assert tail["Content-Range"] == f"bytes {len(data) - 50}-{len(data) - 1}/{len(data)}"
    rest = admin_client.get(url(turn), HTTP_RANGE="bytes=10-")
    assert rest.status_code == 206 and body(rest) == data[10:]
    past_end = admin_client.get(url(turn), HTTP_RANGE=f"bytes=0-{len(data) * 10}")
    assert past_end.status_code == 206 and body(past_end) == data


@pytest.mark.parametrize("header", ["bytes={size}-", "bytes={size}-{size}", "bytes=-0", "bytes=999999999999999999-"])
def test_ranges_past_the_end_get_416(admin_client: Client, turn: Turn, media: Path, header: str) -> None:
    size = len(file_bytes(media, turn))
    response = admin_client.get(url(turn), HTTP_RANGE=header.format(size=size))
    assert response.status_code == 416
    assert response["Content-Range"] == f"bytes */{size}"


@pytest.mark.parametrize("header", ["bytes=abc", "bytes=5-2", "items=0-10", "bytes=0-1,4-5", "bytes=-",
                                    "bytes=" + "9" * 300 + "-", "bytes=\x00-1", "bytes=١-٢"])
def test_ranges_we_do_not_understand_get_the_whole_file(admin_client: Client, turn: Turn, media: Path,
                                                        header: str) -> None:
    response = admin_client.get(url(turn), HTTP_RANGE=header)
    assert response.status_code == 200
    assert body(response) == file_bytes(media, turn)


def test_if_range_cannot_be_validated_so_the_whole_file_is_sent(admin_client: Client, turn: Turn) -> None:
    response = admin_client.get(url(turn), HTTP_RANGE="bytes=0-9", HTTP_IF_RANGE='"some-etag"')
    assert response.status_code == 200


# --- missing or wrong --------------------------------------------------------------------------------


def test_a_missing_file_is_404_audio_unavailable(admin_client: Client, turn: Turn, media: Path) -> None:
    (media / turn.reply_audio.name).unlink()
    response = admin_client.get(url(turn))
    assert response.status_code == 404
    assert response.content.decode() == "Audio unavailable."
    assert admin_client.get(url(turn), HTTP_RANGE="bytes=0-10").status_code == 404


def test_a_turn_without_audio_an_unknown_turn_or_track_is_404(admin_client: Client, turn: Turn) -> None:
    silent = Turn.objects.create(conversation=turn.conversation, index=1, user_text="hi")
    assert admin_client.get(url(silent)).status_code == 404
    assert admin_client.get("/admin/conversations/conversation/audio/99999/reply/").status_code == 404
    assert admin_client.get(url(turn, "secret")).status_code == 404
    assert admin_client.get(url(turn, "..%2F..%2Fsecret_key")).status_code in (302, 404)  # no such route


def test_only_reading_is_allowed(admin_client: Client, turn: Turn) -> None:
    assert admin_client.post(url(turn)).status_code == 405
    assert admin_client.delete(url(turn)).status_code == 405
    assert admin_client.head(url(turn)).status_code == 200


# --- the Range parser (pure) -----------------------------------------------------------------------


def test_byte_range_examples() -> None:
    assert byte_range("bytes=0-0", 10) == ByteRange(0, 0)
    assert byte_range("bytes=2-", 10) == ByteRange(2, 9)
    assert byte_range("bytes=-3", 10) == ByteRange(7, 9)
    assert byte_range("bytes=-30", 10) == ByteRange(0, 9)
    assert byte_range("bytes=0-", 10 * MAX_RANGE_BYTES) == ByteRange(0, MAX_RANGE_BYTES - 1)
    with pytest.raises(RangeNotSatisfiable):
        byte_range("bytes=0-", 0)


@given(header=st.text(max_size=60) | st.from_regex(r"bytes=\d{0,4}-\d{0,4}", fullmatch=True),
       size=st.integers(min_value=0, max_value=5000))
def test_byte_range_never_leaves_the_file(header: str, size: int) -> None:
    try:
        wanted = byte_range(header, size)
    except RangeNotSatisfiable:
        return
    if wanted is not None:
        assert 0 <= wanted.start <= wanted.end < size
        assert wanted.length <= MAX_RANGE_BYTES
