"""`SimulatedDevice`: a Xiaozhi ESP32 (firmware 2.4.2) on the wire, in pure asyncio.

It reproduces (docs/protocol-reference.md §1–5): the OTA POST and NVS-like persistence of
its reply (absent keys keep stale values), activation v1/v2, the WebSocket handshake
(transport.py), the hello exchange with its 10 s deadline, device JSON built by string
concatenation with `session_id` first, uplink Opus framed for v1/v2/v3 and paced against an
absolute clock, the firmware's state machine (mic off while speaking unless realtime;
`listen start` again after `tts stop` in auto mode once the local playout drained), the
downlink path (speaker.py), the device MCP server (mcp_server.py), and closing by dropping
TCP without a close frame.

Every incoming message, sent text and local incident is recorded in `events` as
`Event(t, kind, payload)` (events.py). Kinds: "json" (incoming JSON object), "text"
(incoming non-JSON text), "audio" (DownlinkFrame), "sent" (outgoing text), "state"
({"from","to"}), "protocol_error" (the shared codec rejected an incoming text), "crash",
"reboot" ("system" | "mcp"), "alert", "error", "closed" ({"code","reason","by"}).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from devices.protocol.audio import pcm_frames, write_wav
from devices.protocol.binary import encode_audio
from devices.protocol.codec import decode_json
from devices.protocol.errors import ProtocolError
from devices.protocol.opus import OpusEncoder
from simulator import ota, transport
from simulator.echo import EchoPath
from simulator.events import (
    DeviceError,
    DeviceTimeout,
    Event,
    EventLog,
    Match,
    predicate,
)
from simulator.mcp_server import DeviceMcpServer
from simulator.speaker import DownlinkFrame, Speaker

UPLINK_RATE = 16000
FRAME_MS = 60
HELLO_TIMEOUT_S = 10.0
MAX_SEND_BYTES = 65535  # esp-ml307 WebSocket::Send fails above this
OPUS_AUTO_BITRATE = -1000  # the firmware leaves the uplink bitrate on auto
REBOOT_DELAY_S = 1.0  # self.reboot schedules the reboot 1 s after replying
LISTEN_MODES = ("auto", "manual", "realtime")
ONSET_LEVEL = 328  # -40 dBFS: where a queued utterance's speech is taken to begin

__all__ = ["DeviceError", "DeviceTimeout", "DownlinkFrame", "Event", "SimulatedDevice"]


class SimulatedDevice:
    """One simulated device. Use `async with SimulatedDevice(...) as device:` or call close()."""

    def __init__(
        self, base_url: str, *, mac: str, client_id: str | None = None,
        board: str = "bread-compact-wifi", firmware_version: str = "2.4.2",
        protocol_version: int = 1, listen_mode: str = "auto", mcp: DeviceMcpServer | None = None,
        serial_number: str | None = None, hmac_key: bytes | None = None,
        log: Callable[[str], None] | None = None, language: str = "zh-CN",
        features: dict[str, Any] | None = None, auto_relisten: bool = True,
        echo: EchoPath | None = None,
    ) -> None:
        if listen_mode not in LISTEN_MODES:
            raise ValueError(f"listen_mode must be one of {LISTEN_MODES}, not {listen_mode!r}")
        self.base_url = base_url.rstrip("/")
        self.identity = ota.Identity(mac.lower(), client_id or str(uuid.uuid4()), board,
                                     firmware_version, language, serial_number)
        self.listen_mode = listen_mode
        self.features = features if features is not None else {"mcp": True}
        self.auto_relisten = auto_relisten
        # The room: downlink audio comes back into the microphone (a `features.aec` board
        # does not cancel it itself). None: a perfectly quiet speaker, as before.
        self.echo = echo
        self._log = log or (lambda _line: None)
        self._events = EventLog()
        self._events.set_logger(self._log)
        self.events: list[Event] = self._events.events
        self.t0 = time.monotonic()
        self.mcp = mcp or DeviceMcpServer.default(board_name=board, firmware_version=firmware_version)
        self._bind_mcp()
        self.ota = ota.OtaClient(self.base_url, self.identity, protocol_version, hmac_key, self._log)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._executor: ThreadPoolExecutor | None = None
        self._encoder: OpusEncoder | None = None
        self._reset_connection_state()

    @property
    def mac(self) -> str:
        return self.identity.mac

    @property
    def client_id(self) -> str:
        return self.identity.client_id

    def _bind_mcp(self) -> None:
        self.mcp.device_id = self.mac
        self.mcp.client_id = self.client_id
        self.mcp.system_info_json = json.dumps(ota.system_info(self.identity), separators=(",", ":"))
        self.mcp.on_reboot = lambda: self._spawn(self._reboot_later())

    def _reset_connection_state(self) -> None:
        """Everything that lives as long as one WebSocket connection."""
        self._ws: ClientConnection | None = None
        self._receiver: asyncio.Task[None] | None = None
        self._connected = self._closing_by_device = self._mic_on = False
        self.ws_version = self.protocol_version
        self.state = "idle"
        self.current_mode = self.listen_mode
        self.session_id = ""  # the firmware sends "session_id":"" until the server hello
        self.server_hello: dict[str, Any] | None = None
        self.speaker = Speaker(self._get_executor, self.echo)
        self._microphone: asyncio.Task[None] | None = None
        self._mic_speech = bytearray()
        self._mic_taken = 0
        self.mic_lag: list[float] = []  # how late each microphone frame was taken (s)
        self._mic_onsets: list[tuple[int, asyncio.Future[float]]] = []
        self.turn_mark = len(self.events)
        self._last_tts_stop = -1
        self.tts_count = self.suppressed_uplink_frames = 0
        self.uplink_times: list[float] = []
        self.alerts: list[dict[str, Any]] = []
        self.reboots: list[str] = []
        self.stt_texts: list[str] = []
        self.subtitles: list[str] = []
        self.emotion = ""

    async def __aenter__(self) -> SimulatedDevice:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # -- OTA and activation (ota.py) -------------------------------------------------------------

    @property
    def nvs(self) -> dict[str, dict[str, Any]]:
        """The persisted `websocket`/`mqtt` settings; absent keys of a new OTA reply keep old values."""
        return self.ota.nvs

    @property
    def activation(self) -> dict[str, Any] | None:
        """`code`/`message`/`challenge` of the last OTA reply, None once activated."""
        return self.ota.activation

    @property
    def protocol_version(self) -> int:
        """NVS websocket.version; 0, absent or non-integer means 1 (GetInt default)."""
        version = self.nvs["websocket"].get("version")
        return version if type(version) is int and version in (1, 2, 3) else 1

    @protocol_version.setter
    def protocol_version(self, version: int) -> None:
        self.nvs["websocket"]["version"] = version

    def system_info(self) -> dict[str, Any]:
        return ota.system_info(self.identity)

    async def ota_check(self, ota_path: str = "/xiaozhi/ota/") -> dict[str, Any]:
        """POST the system info like the firmware; store websocket/mqtt like NVS. Returns the reply."""
        return await self.ota.check(ota_path)

    async def activate(self) -> int:
        """POST <ota_url>activate ({} or the v2 HMAC body); returns the HTTP status (200/202/...)."""
        return await self.ota.activate()

    async def activate_until_done(self, *, cycles: int = 3, attempts: int = 10,
                                  pending_delay: float = 3.0, retry_delay: float = 10.0) -> bool:
        """The firmware's activation loop, re-checking OTA after each cycle; True once activated."""
        return await self.ota.activate_until_done(cycles, attempts, pending_delay, retry_delay)

    # -- connection -----------------------------------------------------------------------------

    async def connect(
        self, url: str | None = None, token: str | None = None, *,
        headers_override: dict[str, str | None] | None = None, query_auth: bool = False,
    ) -> None:
        """Open the socket like the firmware (no hello yet). Override values of None drop a header."""
        if self._connected:
            raise DeviceError("already connected")
        url = url or self.nvs["websocket"].get("url")
        if not url:
            raise DeviceError("no WebSocket URL: run ota_check() first or pass url=")
        token = str(self.nvs["websocket"].get("token", "")) if token is None else token
        headers = transport.handshake_headers(token, self.protocol_version, self.mac, self.client_id)
        if query_auth:
            url, headers = transport.move_auth_to_query(url, headers)
        headers = transport.override_headers(headers, headers_override or {})
        self._reset_connection_state()
        self._set_state("connecting")
        try:
            self._ws = await transport.open_connection(url, headers)
        except DeviceError:
            self._set_state("idle")
            raise
        self._connected = True
        self._receiver = self._spawn(self._receive_loop(self._ws))
        self._log(f"connected to {url} (protocol version {self.ws_version})")

    @property
    def connected(self) -> bool:
        return self._connected

    async def hello(self, timeout: float = HELLO_TIMEOUT_S) -> dict[str, Any]:
        """Send the firmware's hello; wait ≤10 s for a valid server hello (else close and raise)."""
        mark = len(self.events)
        self.server_hello = None  # each OpenAudioChannel waits for a fresh server hello
        await self._send_text(self.hello_text())
        try:
            await self._events.wait_until(lambda: self.server_hello, timeout, "the server hello",
                                          lambda: self._connected)
        except DeviceTimeout:
            self._log("SERVER_TIMEOUT: no valid server hello, closing the channel")
            await self.close()
            raise DeviceTimeout(f"SERVER_TIMEOUT: no valid server hello within {timeout:g} s") from None
        except DeviceError as exc:
            notes = [repr(e.payload) for e in self.events[mark:] if e.kind in ("text", "crash")]
            raise DeviceError(str(exc) + (f" (received: {'; '.join(notes)})" if notes else "")) from None
        return self.server_hello  # type: ignore[return-value]

    def hello_text(self) -> str:
        """WebsocketProtocol::GetHelloMessage (no session_id yet)."""
        audio = {"format": "opus", "sample_rate": UPLINK_RATE, "channels": 1, "frame_duration": FRAME_MS}
        return json.dumps({"type": "hello", "version": self.ws_version, "features": self.features,
                           "transport": "websocket", "audio_params": audio},
                          separators=(",", ":"), ensure_ascii=False)

    async def close(self) -> None:
        """Drop TCP without a close frame (like CloseAudioChannel) and stop background tasks."""
        if self._connected and self._ws is not None:
            self._closing_by_device = True
            self._drop()
        if self._receiver is not None:
            await asyncio.wait({self._receiver}, timeout=5)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = self._encoder = None

    def _drop(self) -> None:
        if self._ws is not None and not transport.drop(self._ws):
            self._spawn(self._ws.close())  # no raw transport: fall back to a normal close

    # -- device → server --------------------------------------------------------------------------

    def _message(self, body: str) -> str:
        # Protocol::Send*: string concatenation, session_id first and unescaped.
        return '{"session_id":"' + self.session_id + '",' + body + "}"

    async def listen_start(self, mode: str | None = None) -> None:
        self._mark_turn()
        await self._send_listen_start(mode or self.listen_mode)

    async def _send_listen_start(self, mode: str) -> None:
        self.current_mode = mode
        await self._send_text(self._message(f'"type":"listen","state":"start","mode":"{mode}"'))
        self._set_state("listening")
        self._mic_on = True

    async def listen_stop(self) -> None:
        """Push-to-talk release: the device is idle immediately (the socket stays open)."""
        await self._send_text(self._message('"type":"listen","state":"stop"'))
        self._mic_on = False
        self._set_state("idle")

    async def listen_detect(self, text: str) -> None:
        """Wake word. The firmware sends ~2 s of pre-roll before (send_audio) and listen start after."""
        self._mark_turn()
        await self._send_text(self._message(f'"type":"listen","state":"detect","text":"{text}"'))

    async def abort(self, reason: str | None = None) -> None:
        """Button (no reason) or wake word (reason) during speaking; the state stays `speaking`."""
        await self._send_text(self._message('"type":"abort"' + (f',"reason":"{reason}"' if reason else "")))

    async def send_raw_text(self, text: str) -> None:
        await self._send_text(text, limit=False)

    async def send_raw_bytes(self, data: bytes) -> None:
        await self._send_binary(data, limit=False)

    async def send_silence(self, ms: int, realtime: bool = True, *, new_turn: bool = True) -> int:
        return await self.send_audio(bytes(UPLINK_RATE * ms // 1000 * 2), realtime=realtime, new_turn=new_turn)

    async def send_audio(self, pcm16k: bytes, realtime: bool = True, *, new_turn: bool = True) -> int:
        """Send 60 ms Opus frames of 16 kHz PCM as the mic would; returns the number sent.

        Frames the firmware would not capture (mic off: not listening, or speaking outside
        realtime mode) are counted in `suppressed_uplink_frames`. Stops quietly on close.
        After a finished answer, audio starts a new turn (`turn_mark`) unless `new_turn` is
        False: `run_turn`'s own silence, which may still be sending as its answer ends.
        """
        self._require_connection()
        if new_turn and self._last_tts_stop >= self.turn_mark:
            self._mark_turn()  # a new user turn after a finished answer
        loop = asyncio.get_running_loop()
        start, sent = loop.time(), 0
        for index, frame in enumerate(pcm_frames(pcm16k, UPLINK_RATE, FRAME_MS)):
            if realtime:  # absolute clock: start + n × 60 ms, so pacing never drifts
                await asyncio.sleep(max(0.0, start + index * FRAME_MS / 1000 - loop.time()))
            if not self._connected:
                break
            if not self._mic_on:
                self.suppressed_uplink_frames += 1
                continue
            packet = await loop.run_in_executor(self._get_executor(), self._capture, frame, time.monotonic())
            if not await self._send_uplink(packet):
                break
            sent += 1
        return sent

    # -- an always-on microphone (realtime mode: the user talks over the reply) ---------------------

    def start_microphone(self) -> None:
        """Stream the mic continuously, 60 ms frames on an absolute clock, like a realtime-mode
        device: silence (plus the room's echo) unless `say_into_microphone` queued speech."""
        self._require_connection()
        if self._microphone is None or self._microphone.done():
            self._mic_speech, self._mic_taken = bytearray(), 0
            self._microphone = self._spawn(self._run_microphone())

    def say_into_microphone(self, pcm16k: bytes) -> asyncio.Future[float]:
        """Queue the user's speech into the running microphone. The future resolves to the
        speech onset (`time.monotonic()` of the first sample above -40 dBFS as captured)."""
        onset: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        samples = np.frombuffer(pcm16k, "<i2")
        loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > ONSET_LEVEL)
        position = self._mic_taken + len(self._mic_speech) // 2 + (int(loud[0]) if loud.size else 0)
        self._mic_onsets.append((position, onset))
        self._mic_speech += pcm16k
        return onset

    async def stop_microphone(self) -> None:
        if self._microphone is not None:
            self._microphone.cancel()
            await asyncio.gather(self._microphone, return_exceptions=True)
            self._microphone = None

    async def _run_microphone(self) -> None:
        # Capture times come from the schedule (frame n covers start + (n-1)·60 ms .. + 60 ms),
        # not from when this task got to run: if the simulator falls behind on a busy machine,
        # its lateness counts against the server (onsets stay where the user spoke).
        loop = asyncio.get_running_loop()
        start, index, size = time.monotonic(), 0, UPLINK_RATE * FRAME_MS // 1000 * 2
        while self._connected:
            index += 1
            captured_to = start + index * FRAME_MS / 1000
            await asyncio.sleep(max(0.0, captured_to - time.monotonic()))
            self.mic_lag.append(time.monotonic() - captured_to)
            frame = bytes(self._mic_speech[:size])
            del self._mic_speech[:size]
            self._resolve_onsets(self._mic_taken, len(frame) // 2, captured_to - FRAME_MS / 1000)
            self._mic_taken += len(frame) // 2  # samples of queued speech captured so far
            if not self._mic_on:
                self.suppressed_uplink_frames += 1
                continue
            frame += bytes(size - len(frame))
            packet = await loop.run_in_executor(self._get_executor(), self._capture, frame, captured_to)
            if not await self._send_uplink(packet, captured_to):
                return

    def _resolve_onsets(self, taken: int, count: int, captured_from: float) -> None:
        while self._mic_onsets and self._mic_onsets[0][0] < taken + count:
            position, onset = self._mic_onsets.pop(0)
            if not onset.done():
                onset.set_result(captured_from + (position - taken) / UPLINK_RATE)

    async def run_turn(self, pcm16k: bytes, *, timeout: float = 30.0) -> Event:
        """One user turn in the current mode; returns the answer's `tts stop` event.

        Starts listening if needed, streams `pcm16k` in real time, then either sends
        `listen stop` (manual) or keeps the mic streaming silence like a real device
        (auto/realtime) until the server's `tts stop`.
        """
        if self.state != "listening":
            await self.listen_start()
        self._mark_turn()
        await self.send_audio(pcm16k)
        if self.current_mode == "manual":
            await self.listen_stop()
            return await self.wait_for_tts_stop(timeout)
        mic = self._spawn(self._stream_silence())
        try:
            return await self.wait_for_tts_stop(timeout)
        finally:
            mic.cancel()
            await asyncio.gather(mic, return_exceptions=True)

    async def _stream_silence(self) -> None:
        while self._connected:
            await self.send_silence(300, new_turn=False)

    def _capture(self, frame: bytes, now: float) -> bytes:
        """The 60 ms the mic captured until `now` (plus the room's echo), Opus-encoded."""
        if self.echo is not None:
            frame = self.echo.mix(now - FRAME_MS / 1000, frame)
        return self._get_encoder().encode(frame)

    async def _send_uplink(self, packet: bytes, captured_to: float | None = None) -> bool:
        # Stamped as the firmware does it: the oldest played frame's v2 timestamp (server AEC).
        stamp = self.speaker.stamps.for_uplink(time.monotonic() if captured_to is None else captured_to)
        try:
            await self._send_binary(encode_audio(packet, self.ws_version, stamp))
        except DeviceError:
            return False
        self.uplink_times.append(time.monotonic())
        return True

    async def _send_text(self, text: str, *, limit: bool = True) -> None:
        ws = self._require_connection()
        if limit and len(text.encode()) > MAX_SEND_BYTES:
            self._record("error", f"text of {len(text.encode())} bytes not sent (limit {MAX_SEND_BYTES})")
            raise DeviceError("message larger than the firmware's 65535-byte WebSocket send limit")
        try:
            await ws.send(text)
        except ConnectionClosed as exc:
            raise DeviceError("connection closed while sending") from exc
        self._record("sent", text)

    async def _send_binary(self, data: bytes, *, limit: bool = True) -> None:
        ws = self._require_connection()
        if limit and len(data) > MAX_SEND_BYTES:
            raise DeviceError("frame larger than the firmware's 65535-byte WebSocket send limit")
        try:
            await ws.send(data)
        except ConnectionClosed as exc:
            raise DeviceError("connection closed while sending") from exc

    def _require_connection(self) -> ClientConnection:
        if not self._connected or self._ws is None:
            raise DeviceError("not connected")
        return self._ws

    def _mark_turn(self) -> None:
        self.turn_mark = len(self.events)

    # -- server → device --------------------------------------------------------------------------

    async def _receive_loop(self, ws: ClientConnection) -> None:
        try:
            async for message in ws:
                try:
                    if isinstance(message, str):
                        self._on_text(message)
                    else:
                        await self._on_binary(bytes(message))
                except Exception as exc:  # noqa: BLE001 - one bad message must not kill the device
                    self._record("error", f"{type(exc).__name__}: {exc}")
        except ConnectionClosed:
            pass
        finally:
            self._on_closed(ws)

    def _on_closed(self, ws: ClientConnection) -> None:
        self._connected = self._mic_on = False
        by = "device" if self._closing_by_device else "server"
        self._record("closed", {"code": ws.close_code, "reason": ws.close_reason or "", "by": by})
        self._set_state("idle")
        self._log(f"connection closed by {by} (code {ws.close_code})")

    def _on_text(self, text: str) -> None:
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            self._record("text", text)  # e.g. PY's "认证失败" just before it closes
            return
        self._record("json", data)
        self._check_codec(text)
        handler = self._handlers().get(data.get("type"))  # type: ignore[arg-type]
        if handler is not None:
            handler(data)

    def _handlers(self) -> dict[str, Callable[[dict[str, Any]], None]]:
        # OnIncomingJson's dispatch; `custom` is compiled out by default, the rest is ignored.
        return {"hello": self._on_server_hello, "tts": self._on_tts, "mcp": self._on_mcp,
                "system": self._on_system, "alert": self._on_alert, "stt": self._on_stt,
                "llm": self._on_llm}

    def _check_codec(self, text: str) -> None:
        """Cross-check with the shared codec: a rejection is worth a look in conformance tests."""
        try:
            decode_json(text)
        except ProtocolError as exc:
            self._record("protocol_error", {"reason": exc.reason, "kind": exc.kind, "text": text[:300]})

    def _on_server_hello(self, data: dict[str, Any]) -> None:
        transport_name = data.get("transport")
        if not isinstance(transport_name, str):
            # ParseServerHello logs transport->valuestring: NULL dereference, the chip reboots.
            self._record("crash", "server hello without a string `transport`: the firmware crashes")
            self._drop()
            return
        if transport_name != "websocket":
            self._log(f"unsupported transport {transport_name!r} in server hello: ignored")
            return
        if isinstance(data.get("session_id"), str):
            self.session_id = data["session_id"]
        params = data.get("audio_params")
        if isinstance(params, dict):
            self._apply_audio_params(params)
        self.server_hello = data
        if self.state == "connecting":
            self._set_state("idle")  # channel open; listen_start() makes it listen

    def _apply_audio_params(self, params: dict[str, Any]) -> None:
        rate, duration = params.get("sample_rate"), params.get("frame_duration")
        if ota.is_number(rate):
            self.speaker.sample_rate = int(rate)
        if ota.is_number(duration):
            self.speaker.frame_duration = int(duration)

    def _on_tts(self, data: dict[str, Any]) -> None:
        state = data.get("state")
        if state == "start":
            self._on_tts_start()
        elif state == "stop":
            self._on_tts_stop()
        elif state == "sentence_start" and isinstance(data.get("text"), str):
            self.subtitles.append(data["text"])

    def _on_tts_start(self) -> None:
        if self.state not in ("idle", "listening"):
            return  # not from connecting; already speaking: nothing changes
        self.tts_count += 1
        self._set_state("speaking")
        if self.current_mode != "realtime":
            self._mic_on = False
        self.speaker.start_answer()

    def _on_tts_stop(self) -> None:
        self._last_tts_stop = len(self.events) - 1
        if self.state != "speaking":
            return
        if self.current_mode == "manual":
            self._set_state("idle")
            return
        self._set_state("listening")
        if self.current_mode == "auto":
            self._spawn(self._relisten_after_playout())

    async def _relisten_after_playout(self) -> None:
        """Auto mode: mic back on and `listen start` only once the local queue has played out."""
        await asyncio.sleep(max(0.0, self.speaker.play_end - time.monotonic()))
        if self.auto_relisten and self.state == "listening" and self._connected:
            try:
                await self._send_listen_start("auto")
            except DeviceError as exc:
                self._log(f"listen start after tts stop not sent: {exc}")

    def _on_mcp(self, data: dict[str, Any]) -> None:
        if isinstance(data.get("payload"), dict):
            self._spawn(self._answer_mcp(data["payload"]))

    async def _answer_mcp(self, payload: dict[str, Any]) -> None:
        reply = await self.mcp.handle(payload)
        if reply is None or not self._connected:
            return
        try:
            await self._send_text(self._message('"type":"mcp","payload":' + reply))
        except DeviceError as exc:
            self._record("error", f"MCP reply not sent: {exc}")

    def _on_system(self, data: dict[str, Any]) -> None:
        if data.get("command") == "reboot":
            self.reboots.append("system")
            self._record("reboot", "system")
            self._drop()

    async def _reboot_later(self) -> None:
        await asyncio.sleep(REBOOT_DELAY_S)
        self.reboots.append("mcp")
        self._record("reboot", "mcp")
        if self._connected:
            self._drop()

    def _on_alert(self, data: dict[str, Any]) -> None:
        if all(isinstance(data.get(k), str) for k in ("status", "message", "emotion")):
            self.alerts.append(data)
            self._record("alert", data)
        else:
            self._log("alert without string status/message/emotion: the firmware only logs it")

    def _on_stt(self, data: dict[str, Any]) -> None:
        if isinstance(data.get("text"), str):
            self.stt_texts.append(data["text"])

    def _on_llm(self, data: dict[str, Any]) -> None:
        if isinstance(data.get("emotion"), str):
            self.emotion = data["emotion"]

    async def _on_binary(self, data: bytes) -> None:
        speaking = self.state == "speaking"
        frame = await self.speaker.receive(time.monotonic(), data, self.ws_version, speaking, self.tts_count)
        self._record("audio", frame)

    # -- events and waiting -----------------------------------------------------------------------

    def add_listener(self, callback: Callable[[Event], None]) -> None:
        """Called synchronously for every recorded event (the CLI prints from here)."""
        self._events.add_listener(callback)

    def _record(self, kind: str, payload: Any) -> Event:
        return self._events.record(kind, payload)

    def _set_state(self, state: str) -> None:
        if state != self.state:
            old, self.state = self.state, state
            self._record("state", {"from": old, "to": state})

    def mark(self) -> int:
        """Index to pass as `since=` to only consider events recorded from now on."""
        return len(self.events)

    async def wait_for(
        self, match: Match = None, state: str | None = None, *, kind: str | None = None,
        timeout: float = 10.0, since: int = 0,
    ) -> Event:
        """First event from index `since` matching a JSON `type` (and `state`), a predicate or a kind.

        Raises DeviceTimeout, or DeviceError as soon as the connection is closed without a match.
        """
        check, what = predicate(match, state, kind)
        return await self._events.wait_until(self._events.finder(check, since), timeout, what,
                                             lambda: self._connected)

    async def wait_for_tts_stop(self, timeout: float = 30.0, since: int | None = None) -> Event:
        """The `tts stop` ending the current turn (searched from `turn_mark`, the turn's start)."""
        return await self.wait_for("tts", "stop", timeout=timeout,
                                   since=self.turn_mark if since is None else since)

    async def wait_closed(self, timeout: float = 10.0) -> Event:
        return await self.wait_for(kind="closed", timeout=timeout)

    # -- downlink results -------------------------------------------------------------------------

    @property
    def downlink_sample_rate(self) -> int:
        return self.speaker.sample_rate

    @property
    def downlink_frames(self) -> list[DownlinkFrame]:
        return self.speaker.frames

    @property
    def stray_frames(self) -> int:
        """Downlink frames received outside `speaking` (the firmware drops them)."""
        return self.speaker.stray_frames

    @property
    def frame_times(self) -> list[float]:
        """Arrival times (monotonic) of the played downlink frames, for pacing assertions."""
        return self.speaker.frame_times

    def downlink_pcm(self, tts_index: int | None = None) -> bytes:
        """PCM (s16le mono at `downlink_sample_rate`) of played frames, optionally of one answer."""
        return self.speaker.pcm(tts_index)

    def save_downlink(self, path: str | Path, tts_index: int | None = None) -> Path:
        write_wav(path, self.downlink_pcm(tts_index), self.downlink_sample_rate)
        return Path(path)

    # -- plumbing ---------------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _get_executor(self) -> ThreadPoolExecutor:
        # One thread: the Opus objects are not thread-safe and must stay off the event loop.
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sim-opus")
        return self._executor

    def _get_encoder(self) -> OpusEncoder:
        if self._encoder is None:
            # AS_OPUS_ENC_CONFIG: 16 kHz, 60 ms, DTX on, complexity 0, bitrate auto.
            self._encoder = OpusEncoder(UPLINK_RATE, FRAME_MS, bitrate=OPUS_AUTO_BITRATE,
                                        application="audio", complexity=0, dtx=True)
        return self._encoder
