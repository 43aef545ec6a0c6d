"""SimulatedDevice against small scripted servers: what arrives on the wire is what firmware sends."""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from websockets.asyncio.server import Server, ServerConnection, serve

from devices.protocol.binary import decode_audio, encode_audio
from devices.protocol.opus import OpusDecoder, OpusEncoder
from simulator import cli
from simulator.device import DeviceError, DeviceTimeout, SimulatedDevice

MAC = "AA:BB:CC:DD:EE:01"
CLIENT_ID = "7b94d69a-0000-4000-8000-000000000001"
SESSION = "5d6f1c2e-aaaa-4bbb-8ccc-000000000001"


def tone(ms: int, rate: int = 16000) -> bytes:
    t = np.arange(rate * ms // 1000) / rate
    return (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()


def server_hello(**overrides: Any) -> str:
    hello: dict[str, Any] = {
        "type": "hello", "transport": "websocket", "session_id": SESSION,
        "audio_params": {"format": "opus", "sample_rate": 24000, "channels": 1, "frame_duration": 60},
    }
    hello.update(overrides)
    return json.dumps({k: v for k, v in hello.items() if v is not None})


def downlink_packets(count: int, rate: int = 24000) -> list[bytes]:
    encoder = OpusEncoder(rate, 60)
    pcm = tone(60 * count, rate)
    size = encoder.frame_bytes
    return [encoder.encode(pcm[i * size:(i + 1) * size]) for i in range(count)]


class ScriptedServer:
    """A websockets server whose connections the test drives by hand."""

    def __init__(self) -> None:
        self.connections: asyncio.Queue[ServerConnection] = asyncio.Queue()
        self._server: Server | None = None
        self.port = 0

    async def start(self) -> ScriptedServer:
        self._server = await serve(self._handler, "127.0.0.1", 0, compression=None)
        self.port = next(iter(self._server.sockets)).getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handler(self, connection: ServerConnection) -> None:
        await self.connections.put(connection)
        await connection.wait_closed()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/xiaozhi/v1/"

    async def accept(self) -> ServerConnection:
        return await asyncio.wait_for(self.connections.get(), 5)


async def recv_text(conn: ServerConnection) -> str:
    """Next text frame, skipping uplink audio."""
    while True:
        message = await asyncio.wait_for(conn.recv(), 5)
        if isinstance(message, str):
            return message


async def recv_json(conn: ServerConnection) -> dict[str, Any]:
    return json.loads(await recv_text(conn))


@pytest.fixture
async def ws_server() -> AsyncIterator[ScriptedServer]:
    server = await ScriptedServer().start()
    yield server
    await server.stop()


def make_device(**kwargs: Any) -> SimulatedDevice:
    kwargs.setdefault("mac", MAC)
    kwargs.setdefault("client_id", CLIENT_ID)
    return SimulatedDevice("http://127.0.0.1:1", **kwargs)


async def open_session(server: ScriptedServer, device: SimulatedDevice, hello: str | None = None,
                       token: str = "tok") -> ServerConnection:
    await device.connect(server.url, token)
    conn = await server.accept()
    waiting = asyncio.create_task(device.hello())
    await recv_json(conn)
    await conn.send(hello or server_hello())
    await waiting
    return conn


# -- handshake and hello -------------------------------------------------------------------------


async def test_the_handshake_carries_the_four_firmware_headers_and_nothing_browser_like(
        ws_server: ScriptedServer) -> None:
    async with make_device(protocol_version=2) as device:
        await device.connect(ws_server.url, "abc.123")
        conn = await ws_server.accept()
        headers = conn.request.headers  # type: ignore[union-attr]
        assert headers["Authorization"] == "Bearer abc.123"
        assert headers["Protocol-Version"] == "2"
        assert headers["Device-Id"] == "aa:bb:cc:dd:ee:01"
        assert headers["Client-Id"] == CLIENT_ID
        assert headers["Host"] == "127.0.0.1"  # esp-ml307 leaves the port out
        for absent in ("Origin", "User-Agent", "Sec-WebSocket-Extensions", "Sec-WebSocket-Protocol"):
            assert absent not in headers
        assert conn.request.path == "/xiaozhi/v1/"  # type: ignore[union-attr]


@pytest.mark.parametrize(("token", "expected"), [("has space", "has space"), ("", None)])
async def test_tokens_with_spaces_go_raw_and_empty_tokens_are_omitted(
        ws_server: ScriptedServer, token: str, expected: str | None) -> None:
    async with make_device() as device:
        await device.connect(ws_server.url, token)
        headers = (await ws_server.accept()).request.headers  # type: ignore[union-attr]
        assert headers.get("Authorization") == expected


async def test_query_auth_and_header_overrides(ws_server: ScriptedServer) -> None:
    async with make_device() as device:
        await device.connect(ws_server.url, "tok", query_auth=True, headers_override={"X-Extra": "1"})
        request = (await ws_server.accept()).request
        assert request is not None
        assert request.path == ("/xiaozhi/v1/?device-id=aa%3Abb%3Acc%3Add%3Aee%3A01"
                                f"&client-id={CLIENT_ID}&authorization=Bearer+tok")
        assert "Device-Id" not in request.headers and "Authorization" not in request.headers
        assert request.headers["X-Extra"] == "1"
    async with make_device() as device:
        await device.connect(ws_server.url, "tok", headers_override={"device-id": None})
        assert "Device-Id" not in (await ws_server.accept()).request.headers  # type: ignore[union-attr]


async def test_hello_exchange_records_the_session_and_downlink_rate(ws_server: ScriptedServer) -> None:
    async with make_device(protocol_version=3) as device:
        await device.connect(ws_server.url, "tok")
        conn = await ws_server.accept()
        waiting = asyncio.create_task(device.hello())
        assert await recv_text(conn) == (
            '{"type":"hello","version":3,"features":{"mcp":true},"transport":"websocket",'
            '"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}')
        await conn.send(server_hello(audio_params={"sample_rate": 16000, "frame_duration": 60}))
        reply = await waiting
        assert reply["session_id"] == SESSION
        assert (device.session_id, device.downlink_sample_rate, device.state) == (SESSION, 16000, "idle")
        await device.listen_start()
        assert await recv_text(conn) == (
            f'{{"session_id":"{SESSION}","type":"listen","state":"start","mode":"auto"}}')
        await device.listen_detect("你好小智")
        await device.abort("wake_word_detected")
        await device.listen_stop()
        assert [await recv_text(conn) for _ in range(3)] == [
            f'{{"session_id":"{SESSION}","type":"listen","state":"detect","text":"你好小智"}}',
            f'{{"session_id":"{SESSION}","type":"abort","reason":"wake_word_detected"}}',
            f'{{"session_id":"{SESSION}","type":"listen","state":"stop"}}',
        ]
        assert not [e for e in device.events if e.kind == "protocol_error"]


async def test_a_server_hello_without_audio_params_means_24000(ws_server: ScriptedServer) -> None:
    async with make_device() as device:
        await open_session(ws_server, device, hello=server_hello(audio_params=None))
        assert device.downlink_sample_rate == 24000


async def test_a_server_hello_without_transport_crashes_the_device(ws_server: ScriptedServer) -> None:
    async with make_device() as device:
        await device.connect(ws_server.url, "tok")
        conn = await ws_server.accept()
        waiting = asyncio.create_task(device.hello())
        await recv_json(conn)
        await conn.send(server_hello(transport=None))
        with pytest.raises(DeviceError, match="crash"):
            await waiting
        assert [e.kind for e in device.events if e.kind in ("crash", "closed")] == ["crash", "closed"]


async def test_no_server_hello_times_out_and_drops_the_channel(ws_server: ScriptedServer) -> None:
    async with make_device() as device:
        await device.connect(ws_server.url, "tok")
        conn = await ws_server.accept()
        with pytest.raises(DeviceTimeout, match="SERVER_TIMEOUT"):
            await device.hello(timeout=0.3)
        await asyncio.wait_for(conn.wait_closed(), 5)
        assert not device.connected


async def test_close_drops_tcp_without_a_close_frame(ws_server: ScriptedServer) -> None:
    device = make_device()
    conn = await open_session(ws_server, device)
    await device.close()
    await asyncio.wait_for(conn.wait_closed(), 5)
    assert conn.close_code == 1006
    assert device.events[-1].payload["by"] == "device"


# -- uplink audio -----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 3])
async def test_uplink_audio_is_framed_for_the_negotiated_version(
        ws_server: ScriptedServer, version: int) -> None:
    async with make_device(protocol_version=version) as device:
        conn = await open_session(ws_server, device)
        assert conn.request.headers["Protocol-Version"] == str(version)  # type: ignore[union-attr]
        await device.listen_start()
        await recv_json(conn)
        sent = await device.send_audio(tone(300), realtime=False)
        assert sent == 5
        decoder = OpusDecoder(16000)
        for _ in range(sent):
            frame = await asyncio.wait_for(conn.recv(), 5)
            assert isinstance(frame, bytes)
            packet = decode_audio(frame, version)
            assert len(decoder.decode(packet.payload)) == 960 * 2  # 60 ms at 16 kHz
        if version == 3:
            assert frame[:2] == b"\x00\x00"
        if version == 2:
            assert frame[:4] == b"\x00\x02\x00\x00"


async def test_realtime_audio_is_paced_at_60_ms_per_frame(ws_server: ScriptedServer) -> None:
    async with make_device() as device:
        conn = await open_session(ws_server, device)
        await device.listen_start()
        await recv_json(conn)
        sending = asyncio.create_task(device.send_silence(600))
        loop = asyncio.get_running_loop()
        arrivals = []
        for _ in range(10):
            await asyncio.wait_for(conn.recv(), 5)
            arrivals.append(loop.time())
        assert await sending == 10
        assert 0.50 <= arrivals[-1] - arrivals[0] <= 0.70


async def test_the_mic_is_off_while_speaking_and_before_listening(ws_server: ScriptedServer) -> None:
    async with make_device() as device:
        conn = await open_session(ws_server, device)
        assert await device.send_audio(tone(120), realtime=False) == 0  # idle: mic off
        await device.listen_start()
        await conn.send(json.dumps({"type": "tts", "state": "start", "session_id": SESSION}))
        await device.wait_for("tts", "start")
        assert await device.send_audio(tone(120), realtime=False) == 0
        assert device.suppressed_uplink_frames == 4


# -- downlink audio and turn states ----------------------------------------------------------------


async def test_downlink_frames_outside_speaking_are_counted_as_stray(ws_server: ScriptedServer) -> None:
    async with make_device() as device:
        conn = await open_session(ws_server, device)
        await device.listen_start()
        packets = downlink_packets(6)
        await conn.send(packets[0])  # before tts start: dropped by the firmware
        await conn.send(json.dumps({"type": "tts", "state": "start", "session_id": SESSION}))
        for packet in packets[1:5]:
            await conn.send(packet)
        await conn.send(json.dumps({"type": "tts", "state": "stop", "session_id": SESSION}))
        stop = await device.wait_for("tts", "stop")
        await conn.send(packets[5])  # after tts stop: dropped too
        await device.wait_for(kind="audio", since=device.events.index(stop))
        assert device.stray_frames == 2
        assert len(device.frame_times) == 4
        assert len(device.downlink_pcm()) == 4 * 1440 * 2  # 60 ms at the announced 24 kHz


async def test_auto_mode_sends_listen_start_again_after_tts_stop(ws_server: ScriptedServer) -> None:
    async with make_device() as device:
        conn = await open_session(ws_server, device)
        await device.listen_start()
        await recv_json(conn)
        await conn.send(json.dumps({"type": "tts", "state": "start"}))
        for packet in downlink_packets(3):
            await conn.send(packet)
        await conn.send(json.dumps({"type": "tts", "state": "stop"}))
        stop = await device.wait_for_tts_stop(timeout=5)
        again = await recv_json(conn)
        assert again == {"session_id": SESSION, "type": "listen", "state": "start", "mode": "auto"}
        # Not before the local playout (3 × 60 ms from the first frame) drained.
        sent = next(e for e in device.events if e.kind == "sent" and e.t > stop.t)
        assert sent.t - device.frame_times[0] >= 0.17
        assert device.state == "listening"


async def test_manual_mode_goes_idle_after_tts_stop_without_listening_again(
        ws_server: ScriptedServer) -> None:
    async with make_device(listen_mode="manual") as device:
        conn = await open_session(ws_server, device)
        await device.listen_start()
        await device.send_audio(tone(120), realtime=False)
        await device.listen_stop()
        await conn.send(json.dumps({"type": "tts", "state": "start"}))
        await conn.send(json.dumps({"type": "tts", "state": "stop"}))
        await device.wait_for_tts_stop(timeout=5)
        await asyncio.sleep(0.1)
        assert device.state == "idle"
        sent = [json.loads(e.payload) for e in device.events if e.kind == "sent"]
        assert [m.get("state") for m in sent if m["type"] == "listen"] == ["start", "stop"]


async def test_a_downlink_burst_beyond_the_decode_queue_is_dropped(ws_server: ScriptedServer) -> None:
    async with make_device() as device:
        conn = await open_session(ws_server, device)
        await device.listen_start()
        await conn.send(json.dumps({"type": "tts", "state": "start"}))
        for packet in downlink_packets(45):
            await conn.send(packet)
        await conn.send(json.dumps({"type": "tts", "state": "stop"}))
        await device.wait_for_tts_stop(timeout=5)
        # The first 40 fill the queue; of the 5 beyond it, one may find a slot freed when the
        # first frame's 60 ms of playout ended before it arrived (a busy machine reads slowly).
        speaker = device.speaker
        assert all(f.accepted for f in speaker.frames[:40])
        assert 1 <= speaker.overflow_frames <= 5
        assert len(device.frame_times) + speaker.overflow_frames == 45


async def test_v2_downlink_timestamps_are_echoed_on_uplink_for_server_aec(
        ws_server: ScriptedServer) -> None:
    async with make_device(protocol_version=2, listen_mode="realtime") as device:
        conn = await open_session(ws_server, device)
        await device.listen_start()
        await recv_json(conn)
        await conn.send(json.dumps({"type": "tts", "state": "start"}))
        await conn.send(encode_audio(downlink_packets(1)[0], 2, timestamp=4242))
        await device.wait_for(kind="audio")
        await device.send_audio(tone(60), realtime=False)  # realtime mode: mic stays on
        frame = await asyncio.wait_for(conn.recv(), 5)
        assert decode_audio(frame, 2).timestamp == 4242  # type: ignore[arg-type]


async def test_run_turn_keeps_the_mic_streaming_silence_until_the_answer(ws_server: ScriptedServer) -> None:
    async with make_device() as device:
        conn = await open_session(ws_server, device)
        turn = asyncio.create_task(device.run_turn(tone(120), timeout=5))
        assert (await recv_json(conn))["state"] == "start"
        for _ in range(6):  # 2 speech frames, then silence that keeps coming
            assert isinstance(await asyncio.wait_for(conn.recv(), 5), bytes)
        await conn.send(json.dumps({"type": "tts", "state": "start"}))
        await conn.send(json.dumps({"type": "tts", "state": "stop"}))
        stop = await turn
        assert stop.payload == {"type": "tts", "state": "stop"}
        assert len(device.uplink_times) >= 6
        # The turn's silence may still be sending as the answer ends (CI: the turn was marked
        # anew, past its own `tts stop`): it never starts a new turn, later audio does.
        await device.send_silence(60, new_turn=False)
        assert await device.wait_for_tts_stop(timeout=1) is stop
        await device.send_silence(60)
        assert device.turn_mark > device.events.index(stop)


async def test_run_turn_in_manual_mode_ends_with_listen_stop(ws_server: ScriptedServer) -> None:
    async with make_device(listen_mode="manual") as device:
        conn = await open_session(ws_server, device)
        turn = asyncio.create_task(device.run_turn(tone(180), timeout=5))
        assert (await recv_json(conn))["mode"] == "manual"
        assert (await recv_json(conn)) == {"session_id": SESSION, "type": "listen", "state": "stop"}
        assert len(device.uplink_times) == 3
        await conn.send(json.dumps({"type": "tts", "state": "start"}))
        await conn.send(json.dumps({"type": "tts", "state": "stop"}))
        await turn
        assert device.state == "idle"


# -- MCP, system, alert ------------------------------------------------------------------------------


async def test_mcp_requests_are_answered_over_the_socket(ws_server: ScriptedServer) -> None:
    async with make_device() as device:
        conn = await open_session(ws_server, device)
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "capabilities": {"vision": {"url": "http://x/explain", "token": "t"}}}}
        await conn.send(json.dumps({"type": "mcp", "payload": init}))
        reply = await recv_text(conn)
        assert reply.startswith(f'{{"session_id":"{SESSION}","type":"mcp","payload":{{"jsonrpc":"2.0","id":1,')
        assert json.loads(reply)["payload"]["result"]["serverInfo"]["name"] == "bread-compact-wifi"
        # A string id gets no reply at all: the next reply on the socket answers id 3.
        for request_id in ("2", 3):
            await conn.send(json.dumps({"type": "mcp", "payload": {
                "jsonrpc": "2.0", "id": request_id, "method": "tools/list",
                "params": {"withUserTools": True}}}))
        listed = (await recv_json(conn))["payload"]
        assert listed["id"] == 3
        assert any(t["name"] == "self.reboot" for t in listed["result"]["tools"])
        assert device.mcp.vision_url == "http://x/explain"


async def test_system_reboot_drops_the_connection_and_alerts_are_recorded(
        ws_server: ScriptedServer) -> None:
    async with make_device() as device:
        conn = await open_session(ws_server, device)
        alert = {"type": "alert", "status": "Warning", "message": "Low battery", "emotion": "sad"}
        await conn.send(json.dumps(alert))
        await conn.send(json.dumps({"type": "alert", "status": "x"}))  # incomplete: only logged
        await conn.send(json.dumps({"type": "system", "command": "reboot"}))
        await device.wait_closed()
        await asyncio.wait_for(conn.wait_closed(), 5)
        assert device.alerts == [alert]
        assert device.reboots == ["system"]
        assert conn.close_code == 1006


async def test_waiting_fails_fast_when_the_server_closes(ws_server: ScriptedServer) -> None:
    async with make_device() as device:
        conn = await open_session(ws_server, device)
        await device.listen_start()
        await conn.send("认证失败")
        await conn.close()
        with pytest.raises(DeviceError, match="connection closed"):
            await device.wait_for_tts_stop(timeout=5)
        assert any(e.kind == "text" and e.payload == "认证失败" for e in device.events)
        closed = await device.wait_closed()
        assert closed.payload == {"code": 1000, "reason": "", "by": "server"}


# -- OTA and activation --------------------------------------------------------------------------------


class OtaServer:
    """A tiny aiohttp OTA endpoint returning scripted firmware-shaped replies."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], str]] = []
        self.replies: list[dict[str, Any]] = []
        self.activate_statuses: list[int] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> OtaServer:
        app = web.Application()
        app.router.add_post("/xiaozhi/ota/", self._ota)
        app.router.add_post("/xiaozhi/ota", self._ota)
        app.router.add_post("/xiaozhi/ota/activate", self._activate)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _record(self, request: web.Request) -> None:
        self.requests.append((request.path, dict(request.headers), await request.text()))

    async def _ota(self, request: web.Request) -> web.Response:
        await self._record(request)
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        return web.json_response(reply)

    async def _activate(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(status=self.activate_statuses.pop(0), text="ok")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
async def ota_server() -> AsyncIterator[OtaServer]:
    server = await OtaServer().start()
    yield server
    await server.stop()


def ota_reply(**sections: Any) -> dict[str, Any]:
    reply: dict[str, Any] = {
        "server_time": {"timestamp": 1786000000000, "timezone_offset": 480},
        "firmware": {"version": "2.4.2", "url": ""},
        "websocket": {"url": "ws://127.0.0.1:9/xiaozhi/v1/", "token": "tok-1", "version": 1},
    }
    reply.update(sections)
    return {k: v for k, v in reply.items() if v is not None}


async def test_ota_check_sends_the_firmware_headers_and_body(ota_server: OtaServer) -> None:
    ota_server.replies = [ota_reply()]
    device = SimulatedDevice(ota_server.base_url, mac=MAC, client_id=CLIENT_ID)
    reply = await device.ota_check()
    path, headers, body = ota_server.requests[0]
    assert path == "/xiaozhi/ota/"
    assert headers["Activation-Version"] == "1"
    assert headers["Device-Id"] == "aa:bb:cc:dd:ee:01"
    assert headers["Client-Id"] == CLIENT_ID
    assert headers["User-Agent"] == "bread-compact-wifi/2.4.2"
    assert headers["Accept-Language"] == "zh-CN"
    assert headers["Content-Type"] == "application/json"
    assert "Serial-Number" not in headers
    info = json.loads(body)
    assert isinstance(info["minimum_free_heap_size"], str)
    assert info["application"]["version"] == "2.4.2"
    assert info["board"]["type"] == "bread-compact-wifi"
    assert info["mac_address"] == "aa:bb:cc:dd:ee:01" and info["uuid"] == CLIENT_ID
    assert reply["websocket"]["token"] == "tok-1"
    assert device.ota.transport_choice == "websocket" and device.activation is None


async def test_ota_values_persist_like_nvs_when_keys_are_absent(ota_server: OtaServer) -> None:
    ota_server.replies = [
        ota_reply(websocket={"url": "ws://a/", "token": "t1", "version": 3}),
        ota_reply(websocket={"url": "ws://b/"}),
    ]
    device = SimulatedDevice(ota_server.base_url, mac=MAC)
    await device.ota_check()
    await device.ota_check()
    assert device.nvs["websocket"] == {"url": "ws://b/", "token": "t1", "version": 3}
    assert device.protocol_version == 3


async def test_activation_v1_posts_empty_json_until_200(ota_server: OtaServer) -> None:
    activation = {"code": "123456", "message": "http://x\n123456", "challenge": "aa:bb:cc:dd:ee:01"}
    ota_server.replies = [ota_reply(activation=activation), ota_reply()]
    ota_server.activate_statuses = [202, 200]
    device = SimulatedDevice(ota_server.base_url, mac=MAC)
    await device.ota_check()
    assert device.activation == activation
    assert await device.activate_until_done(pending_delay=0.01, retry_delay=0.01)
    activates = [r for r in ota_server.requests if r[0].endswith("/activate")]
    assert [body for _path, _headers, body in activates] == ["{}", "{}"]
    assert ota_server.requests[-1][0] == "/xiaozhi/ota/"  # re-checked after the 200


async def test_activation_v2_sends_the_hmac_of_the_challenge(ota_server: OtaServer) -> None:
    ota_server.replies = [ota_reply(activation={"code": "1", "challenge": "ch-42"})]
    ota_server.activate_statuses = [202]
    key = b"k" * 32
    device = SimulatedDevice(ota_server.base_url, mac=MAC, serial_number="SN-1", hmac_key=key)
    await device.ota_check("/xiaozhi/ota")  # no trailing slash: activate still goes to …/ota/activate
    assert await device.activate() == 202
    path, headers, body = ota_server.requests[-1]
    assert path == "/xiaozhi/ota/activate"
    assert (headers["Activation-Version"], headers["Serial-Number"]) == ("2", "SN-1")
    assert json.loads(body) == {
        "algorithm": "hmac-sha256", "serial_number": "SN-1", "challenge": "ch-42",
        "hmac": hmac.new(key, b"ch-42", hashlib.sha256).hexdigest(),
    }


async def test_activate_without_a_challenge_refuses_like_the_firmware(ota_server: OtaServer) -> None:
    ota_server.replies = [ota_reply(activation={"code": "123456"})]
    device = SimulatedDevice(ota_server.base_url, mac=MAC)
    await device.ota_check()
    with pytest.raises(DeviceError, match="challenge"):
        await device.activate()


async def test_ota_failures_are_clear_errors(ota_server: OtaServer) -> None:
    device = SimulatedDevice(ota_server.base_url, mac=MAC)
    with pytest.raises(DeviceError, match="HTTP 404"):
        await device.ota_check("/nope/")
    ota_server.replies = [ota_reply(websocket=None)]
    await device.ota_check()
    assert device.ota.transport_choice == "mqtt"  # no websocket section: a real device goes MQTT


# -- command line -------------------------------------------------------------------------------------


def cli_options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


async def test_the_cli_completes_a_wake_word_turn_and_prints_each_message(
        ota_server: OtaServer, ws_server: ScriptedServer, tmp_path: Path) -> None:
    ota_server.replies = [ota_reply(websocket={"url": ws_server.url, "token": "t", "version": 1})]

    async def script() -> None:
        conn = await ws_server.accept()
        await recv_json(conn)
        await conn.send(server_hello())
        assert (await recv_json(conn))["state"] == "detect"
        assert (await recv_json(conn))["state"] == "start"
        await conn.send(json.dumps({"type": "tts", "state": "start"}))
        for packet in downlink_packets(3):
            await conn.send(packet)
        await conn.send(json.dumps({"type": "tts", "state": "stop"}))
        await conn.wait_closed()

    server_side = asyncio.create_task(script())
    lines: list[str] = []
    wav = tmp_path / "out.wav"
    result = await cli.simulate(cli_options(
        "--server", ota_server.base_url, "--mac", MAC, "--detect", "你好小智",
        "--save-downlink", str(wav), "--timeout", "5"), lines.append)
    await asyncio.wait_for(server_side, 5)
    assert result.code == cli.EXIT_OK, result.message
    assert any('← {"type":"tts","state":"stop"}' in line for line in lines)
    assert any("← audio ×3 frames" in line for line in lines)
    assert any(line.startswith("downlink: 3 frames") for line in lines)
    assert wav.stat().st_size == 44 + 3 * 1440 * 2


async def test_the_cli_prints_the_activation_code_and_exits_3(ota_server: OtaServer) -> None:
    ota_server.replies = [ota_reply(activation={"code": "654321", "message": "bind me"})]
    lines: list[str] = []
    result = await cli.simulate(cli_options("--server", ota_server.base_url, "--detect", "hi"), lines.append)
    assert result.code == cli.EXIT_ACTIVATION
    assert any("ACTIVATION CODE: 654321" in line for line in lines)
