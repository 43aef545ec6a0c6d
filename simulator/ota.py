"""The firmware's OTA check and activation (protocol-reference §3).

`OtaClient` holds what survives between boots and checks (NVS `websocket`/`mqtt`, the last
activation block); the functions below it know the wire: the system-info body, the headers of
Ota::SetupHttp, how a reply is persisted, the activation payloads and version comparison.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

import aiohttp

from simulator.events import DeviceError

HTTP_TIMEOUT_S = 15


@dataclass(frozen=True)
class Identity:
    """What the device says about itself over HTTP."""

    mac: str
    client_id: str
    board: str
    firmware_version: str
    language: str
    serial_number: str | None

    @property
    def activation_version(self) -> int:
        # 2 only when a serial number is burned into eFuse USER_DATA.
        return 2 if self.serial_number else 1


class OtaClient:
    """OTA check + activation of one device; `nvs` keeps stale keys the way NVS does."""

    def __init__(self, base_url: str, identity: Identity, protocol_version: int,
                 hmac_key: bytes | None, log: Callable[[str], None]) -> None:
        self.base_url = base_url.rstrip("/")
        self.identity = identity
        self.hmac_key = hmac_key
        self._log = log
        self.nvs: dict[str, dict[str, Any]] = {"websocket": {"version": protocol_version}, "mqtt": {}}
        self.ota_url = ""
        self.response: dict[str, Any] | None = None
        self.activation: dict[str, Any] | None = None
        self.firmware_update: dict[str, Any] | None = None
        self.transport_choice = ""

    async def check(self, ota_path: str) -> dict[str, Any]:
        """POST the system info; persist websocket/mqtt; remember activation. Returns the reply."""
        self.ota_url = ota_path if "://" in ota_path else self.base_url + ota_path
        body = json.dumps(system_info(self.identity), separators=(",", ":"))
        status, text = await http_post(self.ota_url, body, request_headers(self.identity))
        reply = parse_reply(status, text, self.ota_url)
        self.response = reply
        for section in ("websocket", "mqtt"):
            self.nvs[section].update(nvs_values(reply.get(section)))
        self.activation = parse_activation(reply.get("activation"))
        self.firmware_update = firmware_update(reply.get("firmware"), self.identity.firmware_version)
        self.transport_choice = transport_choice(reply)
        if self.transport_choice == "mqtt":
            self._log("warning: this OTA reply makes a real device use MQTT, not WebSocket")
        return reply

    async def activate(self) -> int:
        """One Ota::Activate: POST <ota_url>activate; returns the HTTP status."""
        challenge = (self.activation or {}).get("challenge")
        if challenge is None:
            raise DeviceError("no activation challenge in the last OTA reply: "
                              "the firmware would not POST /activate")
        body = activation_body(self.identity, challenge, self.hmac_key)
        status, _text = await http_post(activation_url(self.ota_url), body, request_headers(self.identity))
        self._log(f"activate -> HTTP {status}")
        return status

    async def activate_until_done(self, cycles: int, attempts: int, pending_delay: float,
                                  retry_delay: float) -> bool:
        """CheckNewVersion's loop: ≤`attempts` POSTs (202 → 3 s, other → 10 s), then re-check."""
        for _ in range(cycles):
            if self.activation is None:
                return True
            if self.activation.get("challenge") is None:
                await asyncio.sleep(retry_delay)  # Activate() fails without any HTTP request
            else:
                await self._attempts(attempts, pending_delay, retry_delay)
            await self.check(self.ota_url)
        return self.activation is None

    async def _attempts(self, attempts: int, pending_delay: float, retry_delay: float) -> None:
        for _ in range(attempts):
            status = await self.activate()
            if status == 200:
                return
            await asyncio.sleep(pending_delay if status == 202 else retry_delay)


def system_info(identity: Identity) -> dict[str, Any]:
    """Board::GetSystemInfoJson of a Wi-Fi ESP32-S3 board (the OTA POST body)."""
    elf = hashlib.sha256(f"{identity.board}/{identity.firmware_version}".encode()).hexdigest()
    return {
        "version": 2, "language": identity.language, "flash_size": 16777216,
        "minimum_free_heap_size": "123456",  # a string on the wire, really
        "mac_address": identity.mac, "uuid": identity.client_id, "chip_model_name": "esp32s3",
        "chip_info": {"model": 9, "cores": 2, "revision": 2, "features": 18},
        "application": {
            "name": "xiaozhi", "version": identity.firmware_version,
            "compile_time": "Aug  8 2026T08:33:45Z", "idf_version": "v6.0", "elf_sha256": elf,
        },
        "partition_table": [
            {"label": "nvs", "type": 1, "subtype": 2, "address": 36864, "size": 16384},
            {"label": "otadata", "type": 1, "subtype": 0, "address": 53248, "size": 8192},
            {"label": "phy_init", "type": 1, "subtype": 1, "address": 61440, "size": 4096},
            {"label": "ota_0", "type": 0, "subtype": 16, "address": 131072, "size": 4128768},
            {"label": "ota_1", "type": 0, "subtype": 17, "address": 4259840, "size": 4128768},
        ],
        "ota": {"label": "ota_0"},
        "display": {"monochrome": False, "width": 240, "height": 240},
        "board": {
            "type": identity.board, "name": identity.board, "ssid": "MyWiFi", "rssi": -55,
            "channel": 6, "ip": "192.168.1.23", "mac": identity.mac,
        },
    }


def request_headers(identity: Identity) -> dict[str, str]:
    """Ota::SetupHttp, in the firmware's order (used for both the check and /activate)."""
    headers = {
        "Activation-Version": str(identity.activation_version),
        "Device-Id": identity.mac,
        "Client-Id": identity.client_id,
    }
    if identity.serial_number:
        headers["Serial-Number"] = identity.serial_number
    headers["User-Agent"] = f"{identity.board}/{identity.firmware_version}"
    headers["Accept-Language"] = identity.language
    headers["Content-Type"] = "application/json"
    return headers


def activation_url(ota_url: str) -> str:
    # The firmware adds the slash itself: …/ota and …/ota/ both lead to …/ota/activate.
    return (ota_url if ota_url.endswith("/") else ota_url + "/") + "activate"


def activation_body(identity: Identity, challenge: str, hmac_key: bytes | None) -> str:
    """`{}` for Activation-Version 1; HMAC-SHA256(eFuse key, challenge) for version 2.

    Without a key the simulator uses 32 zero bytes, so a v2 server can still be exercised.
    """
    if identity.activation_version == 1:
        return "{}"
    key = hmac_key if hmac_key is not None else bytes(32)
    digest = hmac.new(key, challenge.encode(), hashlib.sha256).hexdigest()
    return json.dumps({"algorithm": "hmac-sha256", "serial_number": identity.serial_number,
                       "challenge": challenge, "hmac": digest}, separators=(",", ":"))


async def http_post(url: str, body: str, headers: dict[str, str]) -> tuple[int, str]:
    """POST like esp_http_client (no Accept/Accept-Encoding); DeviceError on network failure."""
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    skip = ("Accept", "Accept-Encoding")
    try:
        async with (aiohttp.ClientSession(timeout=timeout, skip_auto_headers=skip) as session,
                    session.post(url, data=body.encode(), headers=headers) as response):
            return response.status, await response.text(errors="replace")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise DeviceError(f"HTTP POST {url} failed: {exc or type(exc).__name__}") from exc


def parse_reply(status: int, text: str, url: str) -> dict[str, Any]:
    """Status must be 200 and the body JSON; cJSON reads sections from any parsed value."""
    if status != 200:
        raise DeviceError(f"OTA check failed: HTTP {status} from {url}")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DeviceError(f"OTA check failed: the reply from {url} is not JSON") from exc
    return data if isinstance(data, dict) else {}


def nvs_values(section: Any) -> dict[str, Any]:
    """Strings stored as strings, numbers via SetInt (valueint); anything else is skipped."""
    if not isinstance(section, dict):
        return {}
    values: dict[str, Any] = {}
    for key, value in section.items():
        if isinstance(value, str):
            values[key] = value
        elif is_number(value):
            values[key] = int(value)
    return values


def transport_choice(reply: dict[str, Any]) -> str:
    """InitializeProtocol: `mqtt` wins, then `websocket`, else (even after a failure) MQTT."""
    if isinstance(reply.get("mqtt"), dict) or not isinstance(reply.get("websocket"), dict):
        return "mqtt"
    return "websocket"


def parse_activation(section: Any) -> dict[str, Any] | None:
    """The activation block, or None when it has neither `code` nor `challenge`."""
    if not isinstance(section, dict):
        return None
    info = {k: section[k] for k in ("code", "message", "challenge") if isinstance(section.get(k), str)}
    if is_number(section.get("timeout_ms")):
        info["timeout_ms"] = int(section["timeout_ms"])  # parsed, unused by 2.4.2
    return info if ("code" in info or "challenge" in info) else None


def firmware_update(section: Any, current: str) -> dict[str, Any] | None:
    """The upgrade a real device would start (newer version, or force == 1), else None."""
    if not isinstance(section, dict):
        return None
    version, url, force = section.get("version"), section.get("url"), section.get("force")
    if not (isinstance(version, str) and isinstance(url, str)):
        return None
    if (is_number(force) and int(force) == 1) or is_newer(version, current):
        return {"version": version, "url": url}
    return None


def is_newer(candidate: str, current: str) -> bool:
    """Ota::IsNewVersionAvailable: numeric per dot segment; longer wins on a tie."""
    new, old = _version_parts(candidate), _version_parts(current)
    for a, b in zip(new, old, strict=False):
        if a != b:
            return a > b
    return len(new) > len(old)


def _version_parts(version: str) -> list[int]:
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece.strip() if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return parts


def is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
