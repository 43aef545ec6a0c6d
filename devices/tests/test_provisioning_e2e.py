"""End to end over real HTTP (and WebSocket) against daphne: boot, activate, bind, get a token.

The server runs in a subprocess sharing the test database, so data must be committed
(transactional tests) and both processes share SECRET_KEY (env or $XIAOZHI_DATA_DIR/secret_key).
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import importlib.util
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from devices.models import Device
from devices.services import device_bind
from devices.tests.factories import DeviceKeyFactory, FirmwareReleaseFactory, UserFactory, ota_body, ota_headers
from devices.tokens import token_sign, token_verify

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MAC = "02:00:00:e2:e2:01"
CLIENT = "7b94d69a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
SERIAL = "SN-E2E-0001"
FIRMWARE_HELLO = {"type": "hello", "version": 1, "features": {"mcp": True}, "transport": "websocket",
                  "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60}}
CONSUMER_MISSING = importlib.util.find_spec("conversations.consumers") is None


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> Reply:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return Reply(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, dict(error.headers), error.read())


def firmware_headers() -> dict[str, str]:
    return {**ota_headers(mac=MAC, client_id=CLIENT, serial=SERIAL), "Content-Type": "application/json"}


def check_for_updates(base: str) -> dict[str, Any]:
    reply = http("POST", f"{base}/xiaozhi/ota/", ota_body(mac=MAC, client_id=CLIENT), firmware_headers())
    assert reply.status == 200, reply.body
    return reply.json()


def poll_activation(base: str, challenge: str, key_hex: str) -> int:
    proof = hmac.new(bytes.fromhex(key_hex), challenge.encode(), hashlib.sha256).hexdigest()
    body = {"algorithm": "hmac-sha256", "serial_number": SERIAL, "challenge": challenge, "hmac": proof}
    # The firmware appends "activate" to its OTA URL.
    return http("POST", f"{base}/xiaozhi/ota/activate", body, firmware_headers()).status


def provision(base: str) -> dict[str, Any]:
    """The firmware's boot sequence with an operator binding it halfway; returns the last OTA reply."""
    key = DeviceKeyFactory(serial_number=SERIAL)
    first = check_for_updates(base)
    activation = first["activation"]
    assert activation["code"].isdigit() and len(activation["code"]) == 6
    assert poll_activation(base, activation["challenge"], key.key_hex) == 202
    device_bind(code=activation["code"], owner=UserFactory(), persona=None)  # what the admin form calls
    assert poll_activation(base, activation["challenge"], key.key_hex) == 200
    return check_for_updates(base)


def test_a_device_boots_gets_activated_and_receives_a_token(asgi_server_factory: Any, tmp_path: Path,
                                                            settings: Any) -> None:
    settings.MEDIA_ROOT = tmp_path
    server = asgi_server_factory(XIAOZHI_MEDIA_ROOT=str(tmp_path))
    release = FirmwareReleaseFactory(version="2.5.0", rollout_percent=100)
    assert http("GET", f"{server.http_url}/xiaozhi/ota").status == 200

    final = provision(server.http_url)

    assert "activation" not in final
    websocket = final["websocket"]
    assert websocket["url"] == f"{server.ws_url}/xiaozhi/v1/" and websocket["version"] == 1
    check = token_verify(websocket["token"], secret=settings.SECRET_KEY, client_id=CLIENT, device_id=MAC,
                         generation=0, ttl_seconds=settings.XIAOZHI_TOKEN_TTL_SECONDS, now=time.time())
    assert check.ok
    device = Device.objects.get(mac=MAC)
    assert device.is_bound and device.serial_number == SERIAL and device.last_ip == "127.0.0.1"
    # The offered firmware downloads with a Content-Length, which the firmware requires.
    firmware = final["firmware"]
    assert firmware["version"] == "2.5.0" and firmware["url"].startswith(server.http_url)
    download = http("GET", firmware["url"])
    assert download.status == 200 and int(download.headers["Content-Length"]) == len(download.body) == release.size


def test_bad_requests_get_json_errors_from_the_real_server(asgi_server: Any) -> None:
    base = asgi_server.http_url
    no_id = {k: v for k, v in firmware_headers().items() if k != "Device-Id"}
    reply = http("POST", f"{base}/xiaozhi/ota/", ota_body(mac=MAC, client_id=CLIENT), no_id)
    assert reply.status == 400 and reply.json()["error"] == "missing_device_id"
    huge = {"pad": "x" * (100 * 1024)}
    assert http("POST", f"{base}/xiaozhi/ota/", huge, firmware_headers()).json()["error"] == "body_too_large"
    assert http("PUT", f"{base}/xiaozhi/ota/activate", {}, firmware_headers()).status == 405


# --- WebSocket (needs conversations/consumers.py and its /xiaozhi/v1/ route) -------------------------


async def _server_hello(url: str, headers: dict[str, str]) -> dict[str, Any]:
    from websockets.asyncio.client import connect

    async with connect(url, additional_headers=headers, compression=None, open_timeout=10) as socket:
        await socket.send(json.dumps(FIRMWARE_HELLO, separators=(",", ":")))
        return json.loads(await asyncio.wait_for(socket.recv(), 10))


async def _close_code(url: str, headers: dict[str, str]) -> int | str | None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    try:
        async with connect(url, additional_headers=headers, compression=None, open_timeout=10) as socket:
            try:
                await socket.send(json.dumps(FIRMWARE_HELLO, separators=(",", ":")))
            except ConnectionClosed:
                pass  # closed before the device spoke: fine, recv() reports the code
            message = await asyncio.wait_for(socket.recv(), 10)
            return f"unexpected message before close: {message!r}"
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd else None


def ws_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Protocol-Version": "1", "Device-Id": MAC, "Client-Id": CLIENT}


@pytest.mark.skipif(CONSUMER_MISSING, reason="conversations/consumers.py (the device WebSocket) has not landed yet")
def test_the_ota_token_opens_the_websocket_and_a_bad_one_does_not(asgi_server: Any) -> None:
    final = provision(asgi_server.http_url)
    url, token = final["websocket"]["url"], final["websocket"]["token"]

    hello = asyncio.run(_server_hello(url, ws_headers(token)))
    assert hello["type"] == "hello" and hello["transport"] == "websocket" and hello["session_id"]

    signature, issued_at = token.split(".")
    tampered = ("A" if signature[0] != "A" else "B") + signature[1:] + "." + issued_at
    assert asyncio.run(_close_code(url, ws_headers(tampered))) == 4001
    expired = token_sign(secret=settings.SECRET_KEY, client_id=CLIENT, device_id=MAC, generation=0,
                         issued_at=int(time.time()) - settings.XIAOZHI_TOKEN_TTL_SECONDS - 60)
    assert asyncio.run(_close_code(url, ws_headers(expired))) == 4001
