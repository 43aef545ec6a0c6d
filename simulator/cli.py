"""Command-line front end of the simulator (used by `manage.py simulate_device`).

One voice turn, as a real device does it: OTA check (prints the activation code), WebSocket
with the device headers, hello, MCP answered in the background, the WAV (or espeak speech)
streamed as real-time 60 ms Opus frames, then trailing silence (auto/realtime, the mic keeps
running until the server answers) or `listen stop` (manual), wait for `tts stop`, save the
downlink audio. Every message is printed as one line with ms since start.

Exit codes: 0 turn completed, 1 connection/protocol failure, 2 timeout, 3 activation
needed, 4 bad input (missing WAV, espeak-ng not installed).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simulator.device import SimulatedDevice
from simulator.echo import EchoPath, parse_taps
from simulator.events import DeviceError, DeviceTimeout, Event
from simulator.mcp_server import DeviceMcpServer
from simulator.speaker import DownlinkFrame

EXIT_OK, EXIT_ERROR, EXIT_TIMEOUT, EXIT_ACTIVATION, EXIT_INPUT = 0, 1, 2, 3, 4
MAX_LINE = 240  # long lines (MCP tool lists) are cut unless --verbose
Output = Callable[[str], None]


@dataclass
class CliResult:
    code: int
    message: str = ""


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default="http://127.0.0.1:8000", help="HTTP base URL of the server")
    parser.add_argument("--mac", default="", help="Device-Id (default: a random locally administered MAC)")
    parser.add_argument("--client-id", default="", help="Client-Id UUID (default: random)")
    parser.add_argument("--board", default="bread-compact-wifi")
    parser.add_argument("--firmware-version", default="2.4.2")
    parser.add_argument("--ota-path", default="/xiaozhi/ota/")
    parser.add_argument("--ws-url", default="", help="connect here instead of the OTA's websocket.url")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--wav", help="speech to send (any WAV; resampled to 16 kHz mono)")
    source.add_argument("--say", help="text spoken by espeak-ng and sent as speech")
    source.add_argument("--detect", help="send a wake-word `listen detect` with this text instead of speech")
    parser.add_argument("--voice", default="en", help="espeak-ng voice for --say")
    parser.add_argument("--mode", choices=("auto", "manual", "realtime"), default=None,
                        help="listen mode (default: auto, or realtime with --aec)")
    parser.add_argument("--protocol-version", type=int, choices=(1, 2, 3), default=None,
                        help="binary framing (default: what the OTA reply says)")
    parser.add_argument("--extra-tools", type=int, default=0, help="extra MCP tools (multi-page tools/list)")
    parser.add_argument("--save-downlink", default="", help="write the received speech to this WAV")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for `tts stop`")
    parser.add_argument("--wait-activation", type=float, default=0.0,
                        help="poll /activate for up to this many seconds instead of exiting")
    parser.add_argument("--ignore-activation", action="store_true",
                        help="connect even while unbound (a real device would keep polling /activate)")
    parser.add_argument("--verbose", action="store_true", help="print every audio frame and full lines")
    echo = parser.add_argument_group("server-side echo cancellation")
    echo.add_argument("--aec", action="store_true",
                      help="announce features.aec (a CONFIG_USE_SERVER_AEC build): binary protocol v2 "
                           "unless --protocol-version says otherwise, realtime mode unless --mode does")
    echo.add_argument("--echo", action="store_true",
                      help="play the downlink back into the microphone through the room below")
    echo.add_argument("--echo-delay-ms", type=float, default=60.0,
                      help="speaker-to-microphone delay of the direct path (default 60)")
    echo.add_argument("--echo-gain", type=float, default=0.5, help="level of the direct path (default 0.5)")
    echo.add_argument("--echo-taps", default="0:1,7:0.45,19:0.25,37:0.12",
                      help="room response as 'extra ms:relative gain' pairs (default: four decaying taps)")


class EventPrinter:
    """Prints events as one line each; runs of downlink frames are summarized."""

    def __init__(self, out: Output, t0: float, verbose: bool) -> None:
        self.out, self.t0, self.verbose = out, t0, verbose
        self._run: list[DownlinkFrame] = []

    def line(self, t: float, text: str) -> None:
        if not self.verbose and len(text) > MAX_LINE:
            text = text[:MAX_LINE] + f"… ({len(text)} chars)"
        self.out(f"[{(t - self.t0) * 1000:8.0f} ms] {text}")

    def note(self, text: str) -> None:
        self.line(time.monotonic(), f"· {text}")  # monotonic: the clock of the events

    def __call__(self, event: Event) -> None:
        if event.kind == "audio":
            self._on_audio(event)
            return
        self.flush()
        text = _describe(event)
        if text:
            self.line(event.t, text)

    def _on_audio(self, event: Event) -> None:
        frame: DownlinkFrame = event.payload
        if self.verbose:
            status = "played" if frame.accepted else f"dropped: {frame.reason}"
            self.line(event.t, f"← audio {frame.size} B ts={frame.timestamp} {status}")
        self._run.append(frame)

    def flush(self) -> None:
        if not self._run:
            return
        run, self._run = self._run, []
        played = sum(1 for f in run if f.accepted)
        size = sum(f.size for f in run)
        dropped = len(run) - played
        extra = f", {dropped} dropped ({run[-1].reason or 'see --verbose'})" if dropped else ""
        self.line(run[-1].t, f"← audio ×{len(run)} frames, {size} bytes, {played} played{extra}")


def _describe(event: Event) -> str:
    payload = event.payload
    if event.kind == "json":
        return "← " + json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    if event.kind == "text":
        return f"← text {payload!r}"
    if event.kind == "sent":
        return f"→ {payload}"
    if event.kind == "state":
        return f"· state {payload['from']} → {payload['to']}"
    if event.kind == "closed":
        return f"! closed by {payload['by']} (code {payload['code']}) {payload['reason']}".rstrip()
    return f"! {event.kind}: {payload}"


def load_speech(options: argparse.Namespace) -> bytes:
    """16 kHz PCM from --wav or --say (empty for --detect)."""
    if options.wav:
        from devices.protocol.audio import read_wav, resample  # noqa: PLC0415

        try:
            pcm, rate = read_wav(options.wav)
        except Exception as exc:  # noqa: BLE001 - OSError, wave errors, AudioError: all unreadable
            raise CliError(f"cannot read {options.wav}: {exc}", EXIT_INPUT) from exc
        return resample(pcm, rate, 16000)
    if options.say:
        from simulator import speech  # noqa: PLC0415 - needs espeak-ng only for --say

        if not speech.espeak_available():
            raise CliError("--say needs espeak-ng (apt-get install espeak-ng)", EXIT_INPUT)
        return speech.speak(options.say, rate=16000, voice=options.voice)
    return b""


def build_device(options: argparse.Namespace, log: Output) -> SimulatedDevice:
    mcp = DeviceMcpServer.default(board_name=options.board, firmware_version=options.firmware_version)
    if options.extra_tools:
        mcp.with_extra_tools(options.extra_tools)
    aec = bool(getattr(options, "aec", False))
    options.mode = getattr(options, "mode", None) or ("realtime" if aec else "auto")
    if aec and not getattr(options, "protocol_version", None):
        options.protocol_version = 2  # only v2 frames carry the timestamps AEC needs
    return SimulatedDevice(
        options.server, mac=options.mac or _random_mac(), client_id=options.client_id or None,
        board=options.board, firmware_version=options.firmware_version,
        listen_mode=options.mode, mcp=mcp, log=log,
        features={"mcp": True, **({"aec": True} if aec else {})}, echo=_echo_path(options),
    )


def _echo_path(options: argparse.Namespace) -> EchoPath | None:
    if not getattr(options, "echo", False):
        return None
    try:
        taps = parse_taps(getattr(options, "echo_taps", "0:1"))
    except ValueError as exc:
        raise CliError(f"--echo-taps: {exc}", EXIT_INPUT) from exc
    delay, gain = float(getattr(options, "echo_delay_ms", 60.0)), float(getattr(options, "echo_gain", 0.5))
    if not 0 <= delay <= 2000 or not 0 <= gain <= 4:
        raise CliError("--echo-delay-ms must be 0-2000 and --echo-gain 0-4", EXIT_INPUT)
    return EchoPath(delay_ms=delay, gain=gain, taps=taps)


def _random_mac() -> str:
    # Locally administered, unicast: never collides with a real vendor MAC.
    octets = [0x02] + list(uuid.uuid4().bytes[:5])
    return ":".join(f"{octet:02x}" for octet in octets)


async def setup_device(device: SimulatedDevice, options: argparse.Namespace, out: Output) -> None:
    """OTA check (and activation), then connect and hello."""
    reply = await device.ota_check(options.ota_path)
    out(f"OTA reply: {json.dumps(reply, ensure_ascii=False)[:MAX_LINE]}")
    if device.activation:
        await _handle_activation(device, options, out)
    if options.protocol_version:
        device.protocol_version = options.protocol_version
    await device.connect(options.ws_url or None)
    hello = await device.hello()
    out(f"session {hello.get('session_id')!r}, downlink {device.downlink_sample_rate} Hz")


async def _handle_activation(device: SimulatedDevice, options: argparse.Namespace, out: Output) -> None:
    activation = device.activation or {}
    out(f"ACTIVATION CODE: {activation.get('code', '(none)')}  {activation.get('message', '')!r}")
    if options.ignore_activation:
        out("connecting anyway (--ignore-activation): not what the firmware does")
        return
    if options.wait_activation <= 0:
        raise CliError(
            f"device needs activation (code {activation.get('code')}); bind it and re-run, "
            "or pass --wait-activation SECONDS", EXIT_ACTIVATION)
    cycles = max(1, int(options.wait_activation // 30))  # one firmware cycle ≈ 30 s
    if not await device.activate_until_done(cycles=cycles):
        raise CliError("device still not activated", EXIT_ACTIVATION)
    out("activated")


async def run_turn(device: SimulatedDevice, pcm: bytes, options: argparse.Namespace, out: Output) -> Event:
    """One turn (speech, or a wake word); returns the `tts stop` event."""
    if options.detect:
        await device.listen_detect(options.detect)
        await device.listen_start(options.mode)  # the firmware's order: detect, then start
        return await device.wait_for_tts_stop(options.timeout)
    await device.listen_start(options.mode)
    out(f"sending {len(pcm) / 32000:.2f} s of speech in real time"
        + ("" if options.mode == "manual" else ", then silence until the server answers"))
    return await device.run_turn(pcm, timeout=options.timeout)


def summary(device: SimulatedDevice) -> list[str]:
    speaker = device.speaker
    seconds = len(speaker.pcm()) / 2 / speaker.sample_rate
    lines = [
        f"stt: {' | '.join(device.stt_texts) or '(none)'}",
        f"subtitles: {' | '.join(device.subtitles) or '(none)'}",
        f"downlink: {len(speaker.frame_times)} frames, {seconds:.2f} s at {speaker.sample_rate} Hz; "
        f"stray {speaker.stray_frames}, overflow {speaker.overflow_frames}, "
        f"underruns {speaker.underruns}, decode errors {speaker.decode_errors}, bad frames {speaker.bad_frames}",
    ]
    if device.mcp.calls:
        lines.append("mcp calls: " + ", ".join(name for name, _args in device.mcp.calls))
    return lines


async def simulate(options: argparse.Namespace, out: Output) -> CliResult:
    """The whole run; never raises for expected failures (they become the exit code)."""
    try:
        # espeak-ng and resampling block: keep them off the event loop.
        pcm = await asyncio.to_thread(load_speech, options)
    except CliError as exc:
        return CliResult(exc.code, str(exc))
    printer = EventPrinter(out, time.monotonic(), options.verbose)
    try:
        device = build_device(options, log=printer.note)
    except CliError as exc:
        return CliResult(exc.code, str(exc))
    device.add_listener(printer)
    try:
        await setup_device(device, options, printer.note)
        await run_turn(device, pcm, options, printer.note)
    except CliError as exc:
        return CliResult(exc.code, str(exc))
    except DeviceTimeout as exc:
        return CliResult(EXIT_TIMEOUT, f"{exc} ({_progress(device)})")
    except DeviceError as exc:
        return CliResult(EXIT_ERROR, str(exc))
    finally:
        printer.flush()
        await device.close()
        printer.flush()
    for line in summary(device):
        out(line)
    if options.save_downlink:
        out(f"saved {device.save_downlink(options.save_downlink)}")
    return CliResult(EXIT_OK, "turn completed")


def _progress(device: SimulatedDevice) -> str:
    return (f"state {device.state}, stt {len(device.stt_texts)}, tts starts {device.tts_count}, "
            f"downlink frames {len(device.frame_times)}")


def run(options: argparse.Namespace | dict[str, Any], out: Output = print) -> CliResult:
    """Synchronous entry point for the management command."""
    namespace = options if isinstance(options, argparse.Namespace) else argparse.Namespace(**options)
    try:
        return asyncio.run(simulate(namespace, out))
    except KeyboardInterrupt:
        return CliResult(130, "interrupted")


def main(argv: list[str] | None = None) -> int:
    """`python -m simulator.cli …` without Django."""
    parser = argparse.ArgumentParser(prog="simulate_device", description=__doc__.split("\n")[0])
    add_arguments(parser)
    result = run(parser.parse_args(argv))
    if result.code:
        print(f"error: {result.message}", file=sys.stderr)
    return result.code


if __name__ == "__main__":
    sys.exit(main())
