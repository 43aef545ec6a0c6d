"""Activation codes, POST /xiaozhi/ota/activate, binding by code, and device keys."""
from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from conversations.tests.factories import PersonaFactory
from devices.models import ActivationCode, Device, DeviceKey
from devices.ratelimit import ACTIVATE_POLLS_PER_ADDRESS
from devices.services import (
    BindError,
    activation_code_issue,
    device_bind,
    device_keys_import,
    device_keys_parse_csv,
)
from devices.tests.factories import (
    ActivationCodeFactory,
    DeviceFactory,
    DeviceKeyFactory,
    UserFactory,
    ota_body,
    ota_headers,
)

pytestmark = pytest.mark.django_db

CLIENT = "7b94d69a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
ACTIVATE = "/xiaozhi/ota/activate"


@pytest.fixture(autouse=True)
def _fresh_rate_limits() -> None:
    cache.clear()


def proof(key_hex: str, challenge: str) -> str:
    return hmac.new(bytes.fromhex(key_hex), challenge.encode(), hashlib.sha256).hexdigest()


def check_in(client: Client, mac: str, serial: str = "") -> dict[str, Any]:
    response = client.post("/xiaozhi/ota/", data=json.dumps(ota_body(mac=mac, client_id=CLIENT)),
                           content_type="application/json",
                           headers=ota_headers(mac=mac, client_id=CLIENT, serial=serial))
    assert response.status_code == 200
    return response.json()


def activate(client: Client, mac: str, body: Any, *, serial: str = "", path: str = ACTIVATE,
             raw: bytes | None = None) -> Any:
    data = raw if raw is not None else json.dumps(body)
    return client.post(path, data=data, content_type="application/json",
                       headers=ota_headers(mac=mac, client_id=CLIENT, serial=serial))


def v2_body(serial: str, challenge: str, key_hex: str) -> dict[str, str]:
    return {"algorithm": "hmac-sha256", "serial_number": serial, "challenge": challenge,
            "hmac": proof(key_hex, challenge)}


# --- Codes --------------------------------------------------------------------------------------


def test_a_device_keeps_its_code_until_it_expires() -> None:
    device = DeviceFactory()
    first = activation_code_issue(device=device)
    assert first.code.isdigit() and len(first.code) == 6
    assert activation_code_issue(device=device).pk == first.pk
    later = timezone.now() + timedelta(days=2)
    renewed = activation_code_issue(device=device, now=later)
    assert renewed.pk != first.pk and renewed.expires_at > later


def test_the_code_lifetime_is_configurable(settings: Any) -> None:
    settings.XIAOZHI_ACTIVATION_CODE_TTL_SECONDS = 600
    code = activation_code_issue(device=DeviceFactory())
    assert timedelta(seconds=590) < code.expires_at - timezone.now() <= timedelta(seconds=600)


def test_usable_codes_are_unique(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = ActivationCodeFactory(code="000001")
    draws = iter([1, 1, 2])  # the first two draws collide with the usable code
    monkeypatch.setattr("devices.services.secrets.randbelow", lambda _: next(draws))
    assert activation_code_issue(device=DeviceFactory()).code == "000002"
    assert taken.code == "000001"


# --- Binding ---------------------------------------------------------------------------------


def test_binding_sets_owner_and_persona_and_uses_the_code() -> None:
    code = ActivationCodeFactory()
    owner, persona = UserFactory(), PersonaFactory()
    device = device_bind(code=code.code, owner=owner, persona=persona)
    assert (device.owner, device.persona) == (owner, persona) and device.bound_at is not None
    code.refresh_from_db()
    assert code.used_at is not None


def test_a_code_binds_only_once() -> None:
    code = ActivationCodeFactory()
    device_bind(code=code.code, owner=UserFactory())
    with pytest.raises(BindError, match="already been used"):
        device_bind(code=code.code, owner=UserFactory())


def test_an_expired_code_does_not_bind() -> None:
    code = ActivationCodeFactory(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(BindError, match="expired"):
        device_bind(code=code.code, owner=UserFactory())
    assert not Device.objects.get().is_bound


def test_an_unknown_code_does_not_bind() -> None:
    with pytest.raises(BindError, match="No device"):
        device_bind(code="123456", owner=UserFactory())


# --- /activate ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/xiaozhi/ota/activate", "/xiaozhi/ota/activate/"])
def test_version_1_is_pending_until_bound_then_done(client: Client, path: str) -> None:
    mac = "aa:bb:cc:00:00:01"
    code = check_in(client, mac)["activation"]["code"]
    assert activate(client, mac, {}, path=path).status_code == 202
    device_bind(code=code, owner=UserFactory())
    response = activate(client, mac, {}, path=path)
    assert response.status_code == 200 and response.json() == {"status": "activated"}
    assert "activation" not in check_in(client, mac)


def test_version_2_with_a_known_key_needs_the_right_hmac(client: Client) -> None:
    mac, key = "aa:bb:cc:00:00:02", DeviceKeyFactory(serial_number="SN-2")
    activation = check_in(client, mac, serial="SN-2")["activation"]
    good = v2_body("SN-2", activation["challenge"], key.key_hex)
    assert activate(client, mac, good, serial="SN-2").status_code == 202
    wrong = {**good, "hmac": proof("00" * 32, activation["challenge"])}
    response = activate(client, mac, wrong, serial="SN-2")
    assert response.status_code == 403 and response.json()["error"] == "bad_hmac"
    for garbage in ("é" * 64, "zz", ""):
        assert activate(client, mac, {**good, "hmac": garbage}, serial="SN-2").status_code in (400, 403)
    device_bind(code=activation["code"], owner=UserFactory())
    assert activate(client, mac, wrong, serial="SN-2").status_code == 403  # binding does not excuse it
    assert activate(client, mac, {**good, "hmac": good["hmac"].upper()}, serial="SN-2").status_code == 200


def test_version_2_with_a_known_key_must_send_the_proof(client: Client) -> None:
    mac = "aa:bb:cc:00:00:03"
    DeviceKeyFactory(serial_number="SN-3")
    check_in(client, mac, serial="SN-3")
    response = activate(client, mac, {}, serial="SN-3")
    assert response.status_code == 400 and response.json()["error"] == "hmac_required"


def test_version_2_cannot_dodge_the_check_by_naming_another_serial(client: Client) -> None:
    mac = "aa:bb:cc:00:00:0b"
    DeviceKeyFactory(serial_number="SN-11")
    activation = check_in(client, mac, serial="SN-11")["activation"]
    body = v2_body("SN-KEYLESS", activation["challenge"], "22" * 32)
    response = activate(client, mac, body, serial="SN-11")
    assert response.status_code == 403 and response.json()["error"] == "serial_mismatch"


def test_version_2_without_a_known_key_is_accepted_unverified(client: Client) -> None:
    mac = "aa:bb:cc:00:00:04"
    activation = check_in(client, mac, serial="SN-UNKNOWN")["activation"]
    body = v2_body("SN-UNKNOWN", activation["challenge"], "11" * 32)
    assert activate(client, mac, body, serial="SN-UNKNOWN").status_code == 202


def test_a_replayed_challenge_is_refused_after_activation(client: Client) -> None:
    mac, key = "aa:bb:cc:00:00:05", DeviceKeyFactory(serial_number="SN-5")
    activation = check_in(client, mac, serial="SN-5")["activation"]
    device_bind(code=activation["code"], owner=UserFactory())
    body = v2_body("SN-5", activation["challenge"], key.key_hex)
    assert activate(client, mac, body, serial="SN-5").status_code == 200
    response = activate(client, mac, body, serial="SN-5")
    assert response.status_code == 409 and response.json()["error"] == "challenge_replayed"


def test_a_challenge_from_another_device_is_refused(client: Client) -> None:
    other = ActivationCodeFactory()
    mac = "aa:bb:cc:00:00:06"
    check_in(client, mac)
    response = activate(client, mac, {"challenge": other.challenge})
    assert response.status_code == 403 and response.json()["error"] == "unknown_challenge"


def test_an_expired_code_is_gone_until_the_next_check(client: Client) -> None:
    mac = "aa:bb:cc:00:00:07"
    challenge = check_in(client, mac)["activation"]["challenge"]
    ActivationCode.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    response = activate(client, mac, {"challenge": challenge})
    assert response.status_code == 410 and response.json()["error"] == "code_expired"
    assert check_in(client, mac)["activation"]["challenge"] != challenge


def test_activate_polls_are_rate_limited_per_address(client: Client) -> None:
    mac = "aa:bb:cc:00:00:08"
    check_in(client, mac)
    statuses = [activate(client, mac, {}).status_code for _ in range(ACTIVATE_POLLS_PER_ADDRESS + 1)]
    assert statuses[:-1] == [202] * ACTIVATE_POLLS_PER_ADDRESS
    last = activate(client, mac, {})
    assert last.status_code == 429 and int(last["Retry-After"]) > 0


# --- /activate bad input --------------------------------------------------------------------------


def test_an_unknown_device_cannot_activate(client: Client) -> None:
    response = activate(client, "aa:bb:cc:00:00:09", {})
    assert response.status_code == 404 and response.json()["error"] == "device_unknown"


@pytest.mark.parametrize("method", ["get", "put", "delete"])
def test_activate_only_takes_post(client: Client, method: str) -> None:
    response = getattr(client, method)(ACTIVATE)
    assert response.status_code == 405 and response.json()["error"] == "method_not_allowed"


@pytest.mark.parametrize("raw,status,error", [
    (b"{oops", 400, "invalid_json"),
    (b"[]", 400, "invalid_body"),
    (b'{"hmac": 12}', 400, "invalid_body"),
    (b'{"challenge": ["x"]}', 400, "invalid_body"),
    (b'{"challenge": "' + b"c" * 65 + b'"}', 400, "invalid_body"),
    (b'{"pad": "' + b"x" * (70 * 1024) + b'"}', 413, "body_too_large"),
])
def test_activate_refuses_malformed_bodies(client: Client, raw: bytes, status: int, error: str) -> None:
    mac = "aa:bb:cc:00:00:0a"
    check_in(client, mac)
    response = activate(client, mac, None, raw=raw)
    assert response.status_code == status and response.json()["error"] == error


def test_activate_refuses_missing_or_bad_headers(client: Client) -> None:
    response = client.post(ACTIVATE, data="{}", content_type="application/json")
    assert response.status_code == 400 and response.json()["error"] == "missing_device_id"
    response = client.post(ACTIVATE, data="{}", content_type="application/json",
                           headers={"Device-Id": "zz:zz", "Client-Id": CLIENT})
    assert response.status_code == 400 and response.json()["error"] == "invalid_device_id"


# --- Device keys ---------------------------------------------------------------------------------


def test_keys_are_imported_and_replaced_by_serial_number() -> None:
    DeviceKeyFactory(serial_number="SN-A", key_hex="aa" * 32)
    rows, errors = device_keys_parse_csv(text=f"serial_number,key_hex\nSN-A,{'BB' * 32}\n\nSN-B,{'cc' * 32}\nSN-C\n")
    result = device_keys_import(rows=[*rows, ("SN-D", "xyz"), ("", "dd" * 32)])
    assert (result.created, result.updated) == (1, 1)
    assert len(errors) == 1 and "line 5" in errors[0]
    assert len(result.errors) == 2
    assert DeviceKey.objects.get(serial_number="SN-A").key_hex == "bb" * 32


def test_the_management_command_imports_a_csv(tmp_path: Path) -> None:
    path = tmp_path / "keys.csv"
    path.write_text(f"SN-X,{'ab' * 32}\nSN-Y,{'cd' * 32}\n")
    call_command("import_device_keys", str(path))
    assert set(DeviceKey.objects.values_list("serial_number", flat=True)) == {"SN-X", "SN-Y"}
    path.write_text("SN-Z,short\n")
    with pytest.raises(CommandError, match="1 line"):
        call_command("import_device_keys", str(path))
    with pytest.raises(CommandError, match="Cannot read"):
        call_command("import_device_keys", str(tmp_path / "missing.csv"))
