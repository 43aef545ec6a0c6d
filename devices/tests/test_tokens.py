"""Device tokens and firmware version rules: pure functions, no database."""
from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from devices.tokens import TokenStatus, token_generation_of, token_sign, token_verify
from devices.versions import app_image_version, fake_app_image, is_newer, is_numeric_version, parse_version

SECRET = "test-secret"
CLIENT = "7b94d69a-0000-4000-8000-000000000001"
MAC = "aa:bb:cc:dd:ee:ff"
NOW = 1_786_000_000
DAY = 24 * 3600


def _verify(token: str, **overrides: object) -> TokenStatus:
    arguments = {"secret": SECRET, "client_id": CLIENT, "device_id": MAC, "generation": 0,
                 "ttl_seconds": 30 * DAY, "now": NOW, **overrides}
    return token_verify(token, **arguments).status  # type: ignore[arg-type]


def _sign(issued_at: int = NOW, generation: int = 0) -> str:
    return token_sign(secret=SECRET, client_id=CLIENT, device_id=MAC, issued_at=issued_at, generation=generation)


def test_the_token_is_the_reference_servers_format_with_a_generation() -> None:
    digest = hmac.new(SECRET.encode(), f"{CLIENT}|{MAC}|{NOW}|0".encode(), hashlib.sha256).digest()
    expected = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    assert _sign() == f"{expected}.{NOW}"
    assert " " not in _sign()  # so the firmware sends it as "Bearer <token>"


def test_a_fresh_token_verifies() -> None:
    check = token_verify(_sign(), secret=SECRET, client_id=CLIENT, device_id=MAC, generation=0,
                         ttl_seconds=30 * DAY, now=NOW + 10)
    assert check.ok and check.issued_at == NOW


def test_a_token_past_its_ttl_is_expired() -> None:
    assert _verify(_sign(NOW - 30 * DAY - 1)) is TokenStatus.EXPIRED
    assert _verify(_sign(NOW - 30 * DAY)) is TokenStatus.VALID


def test_a_token_from_the_future_beyond_the_skew_is_refused() -> None:
    assert _verify(_sign(NOW + 60)) is TokenStatus.VALID
    assert _verify(_sign(NOW + 3600)) is TokenStatus.FROM_FUTURE


@pytest.mark.parametrize("field,value", [
    ("secret", "other-secret"), ("client_id", "another-client"), ("device_id", "aa:bb:cc:dd:ee:00"),
    ("generation", 1),
])
def test_a_token_for_anything_else_has_a_bad_signature(field: str, value: object) -> None:
    assert _verify(_sign(), **{field: value}) is TokenStatus.BAD_SIGNATURE


def test_a_tampered_timestamp_breaks_the_signature() -> None:
    signature, _ = _sign().split(".")
    assert _verify(f"{signature}.{NOW + 1}") is TokenStatus.BAD_SIGNATURE


def test_a_flipped_signature_character_is_refused() -> None:
    token = _sign()
    tampered = ("B" if token[0] != "B" else "C") + token[1:]
    assert _verify(tampered) is TokenStatus.BAD_SIGNATURE


@pytest.mark.parametrize("token", [
    "", "abc", "abc.def", f"{'A' * 43}", f"{'A' * 43}.", f"{'A' * 43}.12a", f"{'A' * 42}.{NOW}",
    f"{'A' * 43}.{NOW}.1", f"{'A' * 43}={NOW}", f"{'A' * 43}.{'9' * 20}", f"{'A' * 43}.-5", "Bearer x.1",
])
def test_malformed_tokens_are_told_apart(token: str) -> None:
    assert _verify(token) is TokenStatus.MALFORMED


def test_an_earlier_generation_is_recognised_to_say_revoked() -> None:
    old = _sign(generation=2)
    assert token_generation_of(old, secret=SECRET, client_id=CLIENT, device_id=MAC, current_generation=3) == 2
    forged = "A" * 43 + f".{NOW}"
    assert token_generation_of(forged, secret=SECRET, client_id=CLIENT, device_id=MAC, current_generation=3) is None


@pytest.mark.parametrize("text,expected", [
    ("2.4.2", (2, 4, 2)), ("1.2.", (1, 2)), ("", ()), (" 3.01", (3, 1)), ("1.0.0-beta", (1, 0, 0)),
    ("1..2", None), (".1", None), ("v1.0", None), ("1.99999999999", None),
])
def test_versions_parse_the_way_the_firmware_parses_them(text: str, expected: tuple[int, ...] | None) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize("candidate,current,newer", [
    ("2.4.3", "2.4.2", True), ("2.10.0", "2.9.9", True), ("2.4.2.1", "2.4.2", True),
    ("2.4.2", "2.4.2", False), ("2.4", "2.4.0", False), ("1.9", "2.0", False), ("3.0", "dev", False),
])
def test_newer_means_what_the_firmware_means(candidate: str, current: str, newer: bool) -> None:
    assert is_newer(candidate, current) is newer


@pytest.mark.parametrize("text,ok", [
    ("2.4.3", True), ("10", True), ("2.4.3-rc1", False), ("v2", False), ("2..3", False), ("2.", False),
    ("", False), ("1.2147483648", False), (" 2.4", False),
])
def test_only_plain_dotted_numbers_are_release_versions(text: str, ok: bool) -> None:
    assert is_numeric_version(text) is ok


def test_the_version_is_read_from_an_application_image() -> None:
    assert app_image_version(fake_app_image("2.5.0")) == "2.5.0"
    assert app_image_version(b"\x00" * 100) is None
    assert app_image_version(b"\xe9" + b"\x00" * 100) is None  # no app descriptor
