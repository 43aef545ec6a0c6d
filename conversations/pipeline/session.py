"""VoiceSession: the device side of one WebSocket (hello, limits, state machine, MCP, commands).

Plain asyncio, no Django: the consumer passes frames in (`feed_text`, `feed_bytes`) and
implements `Transport`; persistence goes through `SessionHooks`; hearing, thinking and
speaking belong to the engine built by `engine_factory` after the hello.

The session is the one owner of the session's state (states.py) and the device's listen
mode. The engine reads the mode and reports what its replies do (`ReplyEvents`); the
session turns that into states and into the `tts start`/`tts stop` the device hears, one
`tts stop` per reply, sent when the reply ends however it ends.

Frame handling never waits on slow work. The hello is answered inline (the transport send
is its only await); everything that takes time (MCP setup, DB writes, speaking) runs in
tasks the session owns and cancels in `aclose()`. Incoming frames pass `FrameGate` first
(limits.py); timers live in `Watchdog` (watchdog.py); close codes in `CloseCode` (states.py).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from conversations.pipeline import phrases
from conversations.pipeline.aio import TaskSet
from conversations.pipeline.commands import (
    BadCommand,
    activation_text,
    call_request,
    command_message,
    command_name,
    mcp_result,
    say_text,
)
from conversations.pipeline.config import SessionConfig, SessionInfo
from conversations.pipeline.contracts import (
    EngineContext,
    EngineFactory,
    NullEngine,
    NullHooks,
    SessionHooks,
    Transport,
    VoiceEngine,
    null_engine_factory,
)
from conversations.pipeline.device_mcp import DeviceMcpLink
from conversations.pipeline.echo import DownlinkStamps
from conversations.pipeline.limits import FrameGate
from conversations.pipeline.ordered_jobs import OrderedJobs
from conversations.pipeline.states import (
    TRANSITIONS,
    CloseCode,
    IllegalTransition,
    SessionState,
    check_transition,
)
from conversations.pipeline.toolset import build_toolset
from conversations.pipeline.watchdog import Watchdog
from devices.protocol.binary import AudioPacket, encode_audio, negotiate_version
from devices.protocol.codec import encode_json
from devices.protocol.messages import (
    Abort,
    AudioParams,
    Goodbye,
    Hello,
    ListenDetect,
    ListenStart,
    ListenStop,
    Mcp,
    Message,
    ServerHello,
    TtsStart,
    TtsStop,
)
from tools.errors import ToolError
from tools.mcp.device import DISCONNECTED

__all__ = [
    "TRANSITIONS", "CloseCode", "EngineContext", "IllegalTransition", "NullEngine", "NullHooks",
    "SessionHooks", "SessionState", "SessionStats", "Transport", "VoiceSession",
]

logger = logging.getLogger(__name__)
S = SessionState

TOUCH_INTERVAL = 60.0  # presence: last_seen written at most this often
FAREWELL_TIMEOUT = 15.0  # the idle farewell may take this long before we close anyway
ENGINE_CLOSE_TIMEOUT = 5.0
PERSIST_DRAIN_TIMEOUT = 5.0  # queued DB writes (offline!) get this long at disconnect


@dataclass
class SessionStats:
    audio_to_engine: int = 0
    audio_dropped_in: int = 0  # uplink audio outside LISTENING (e.g. wake-word pre-roll)
    audio_sent: int = 0
    audio_dropped_out: int = 0  # engine audio outside SPEAKING: the device would drop it


class VoiceSession:
    """One device connection. See docs/architecture.md "conversations/pipeline/"."""

    def __init__(
        self,
        transport: Transport,
        config: SessionConfig,
        hooks: SessionHooks | None = None,
        engine_factory: EngineFactory = null_engine_factory,
        *,
        protocol_header: str | None = None,
        clock: Callable[[], float] | None = None,
        touch_interval: float = TOUCH_INTERVAL,
    ) -> None:
        clock = clock or asyncio.get_running_loop().time  # the loop's clock: tests can make it virtual
        self.config = config
        self.stats = SessionStats()
        self._transport = transport
        self._hooks: SessionHooks = hooks or NullHooks()
        self._engine_factory = engine_factory
        self._protocol_header = protocol_header
        self._state = S.CONNECTING
        self._engine: VoiceEngine | None = None
        self._version: int | None = None  # binary framing; None until the hello
        self._mode = "auto"
        self._features: dict[str, Any] = {}
        self._server_aec = False  # features.aec over v2: frames stamped and reported to the engine
        self._stamps = DownlinkStamps()
        self._clock = clock
        self._tts_open = False  # `tts start` sent, its `tts stop` not yet
        self._send_failures = 0
        self._closed = False
        self._code_only = not config.device.bound and config.unbound_policy == "speak_code"
        self._code_pending = True
        self._gate = FrameGate(config, self._close, clock)
        self._watchdog = Watchdog(
            idle_timeout=config.idle_timeout, hard_timeout=config.hard_timeout,
            touch_interval=touch_interval, clock=clock, idle_allowed=self._idle_may_close,
            on_idle=self._on_idle, on_hard=self._on_hard, on_touch=self._on_touch,
        )
        self._tasks = TaskSet(f"session {config.session_id}")
        self._persist = OrderedJobs(f"session {config.session_id} persistence")
        self.toolset, self.tool_state = build_toolset(config)
        self._mcp = DeviceMcpLink(self._send_mcp, config, self.toolset, self._tools_listed)
        self._handlers: dict[type, Callable[[Any], Coroutine[Any, Any, None]]] = {
            ListenStart: self._on_listen_start, ListenStop: self._on_listen_stop,
            ListenDetect: self._on_listen_detect, Abort: self._on_abort,
            Mcp: self._on_mcp, Goodbye: self._on_goodbye,
        }

    # -- public surface ------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self.config.session_id

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def engine(self) -> VoiceEngine | None:
        return self._engine

    @property
    def protocol_errors(self) -> int:
        return self._gate.errors

    @property
    def listen_mode(self) -> str:
        """The device's listen mode ("auto", "manual", "realtime"), from its `listen start`."""
        return self._mode

    @property
    def info(self) -> SessionInfo:
        return SessionInfo(self.session_id, self.config.device.id, self._version or 1, self._mode)

    async def start(self) -> None:
        """Arm the hello timer; call right after the socket was accepted."""
        self._tasks.create(self._hello_deadline(), name="session-hello-timeout")

    async def feed_text(self, text: str) -> None:
        """One text frame: check, decode, hand over, return. Never raises."""
        if self._state is not S.CLOSING:
            await self._guard(self._feed_text(text))

    async def feed_bytes(self, data: bytes) -> None:
        """One binary frame (Opus under the negotiated framing). Never raises.

        The uplink's hot path (~17 frames a second per device), so written out flat: gate
        (flood, size, framing), then the user's audio to the engine's hearing queue."""
        if self._state is S.CLOSING:
            return
        try:
            packet = await self._gate.binary(data, self._version)
            if packet is not None:
                self._audio(packet)
        except Exception:
            await self._failed()

    def feed_audio_now(self, data: bytes) -> bool:
        """`feed_bytes` without awaiting, for a frame the gate lets through as it is (the
        server's direct path, xiaozhi_site/ws_fastpath.py): True when the frame is dealt with,
        False when it needs `feed_bytes` (a close or a protocol error to send), nothing done."""
        if self._state is S.CLOSING:
            return True
        packet = self._gate.binary_now(data, self._version)
        if packet is None:
            return False
        try:
            self._audio(packet)
        except Exception:
            self._tasks.create(self._failed(), name="session-failed")
        return True

    def _audio(self, packet: AudioPacket) -> None:
        # Audio is the user's turn while listening, and in realtime mode while speaking
        # too; an unbound device hears its code and nothing it says is processed.
        state, engine = self._state, self._engine
        listening = state is S.LISTENING or (state is S.SPEAKING and self._mode == "realtime")
        if listening and engine is not None and not self._code_only:
            self.stats.audio_to_engine += 1
            engine.on_audio(packet.payload, packet.timestamp)
        else:
            self.stats.audio_dropped_in += 1

    async def handle_command(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """A channel-layer command; returns the `device.mcp_result` event for mcp_call.

        May take long (speaking, waiting for a tool): the consumer runs it in a task.
        """
        command = command_name(event)
        try:
            if command == "mcp_call":
                return await self._command_mcp_call(event)
            await self._command(command, event)
        except BadCommand as exc:
            logger.warning("device command rejected", extra={"command": command, "error": str(exc)})
            if command == "mcp_call":
                return mcp_result(error=str(exc))
        return None

    async def aclose(self) -> None:
        """The socket is gone: stop every task, close the engine, record presence offline."""
        if self._closed:
            return
        self._closed = True
        self._set_state(S.CLOSING)
        self._mcp.close()
        await self._tasks.aclose()
        if self._engine is not None:
            await self._close_engine(self._engine)
        if self._version is not None:  # session_started was queued at hello
            info = self.info
            self._persist.submit(lambda: self._hooks.session_closed(info))
        await self._persist.aclose(PERSIST_DRAIN_TIMEOUT)

    # -- incoming frames -------------------------------------------------------------------

    async def _guard(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except Exception:
            await self._failed()

    def _failed(self) -> Coroutine[Any, Any, None]:
        """Log the exception being handled and return the close that follows (awaited, or run
        as a task where the caller cannot await). A bug, not bad input (bad input never raises
        here): close instead of leaving a half-working session behind."""
        logger.exception("device session failed on a frame", extra={"session_id": self.session_id})
        return self._close(CloseCode.INTERNAL_ERROR, "internal error")

    async def _feed_text(self, text: str) -> None:
        message = await self._gate.text(text)
        if message is None:
            return
        if isinstance(message, Hello | ServerHello):
            await self._on_hello(_as_device_hello(message))
        elif self._state is S.CONNECTING:
            await self._gate.protocol_error("message before hello", "invalid_field")
        elif (handler := self._handlers.get(type(message))) is not None:
            await handler(message)
        else:
            await self._gate.protocol_error("server message type sent by the device", "unknown_type")

    # -- device messages -----------------------------------------------------------------

    async def _on_hello(self, hello: Hello) -> None:
        if self._version is not None:
            # One hello per socket in the firmware; answer a repeat, restart nothing.
            await self._send_server_hello()
            return
        if self._protocol_header not in (None, str(hello.version)):
            logger.info("Protocol-Version header differs from the hello version; hello wins")
        self._version = negotiate_version(self._protocol_header, hello.version)
        self._features = hello.features
        self._server_aec = self._wants_server_aec()
        if self._server_aec:
            # The firmware listens in realtime mode when it has AEC (GetDefaultListeningMode)
            # and says so in its `listen start`; until then assume it, too.
            self._mode = "realtime"
        self._set_state(S.IDLE)
        await self._send_server_hello()
        self._after_hello()

    def _wants_server_aec(self) -> bool:
        if self._features.get("aec") is not True or not self.config.aec:
            return False
        if self._version != 2:
            # Only v2 frames carry the timestamps that align the echo with what was played.
            logger.warning("device asks for server AEC without binary protocol v2; not cancelling",
                           extra={"session_id": self.session_id, "version": self._version})
            return False
        return True

    async def _send_server_hello(self) -> None:
        params = AudioParams(sample_rate=self.config.downlink_sample_rate, frame_duration=60)
        await self._send(ServerHello(transport="websocket", audio_params=params))

    def _after_hello(self) -> None:
        """Everything slow starts here, after the hello is on the wire."""
        self._watchdog.restart()
        self._engine = self._engine_factory(self._engine_context())
        info = self.info
        self._persist.submit(lambda: self._hooks.session_started(info))
        self._tasks.create(self._watchdog.run(), name="session-watchdog")
        wants_mcp = self._features.get("mcp") is True and not self._code_only
        if wants_mcp:
            self._mcp.activate()
        self._tasks.create(self._prepare_tools(wants_mcp), name="session-tools")

    async def _on_listen_start(self, message: ListenStart) -> None:
        self._mode = message.mode
        if self._state in (S.THINKING, S.SPEAKING):
            await self._interrupt("listen_start")  # barge-in: stop the reply, then listen
        self._set_state(S.LISTENING)
        if not self._code_only:
            self._require_engine().on_listen_start()
        elif self._code_pending:
            self._code_pending = False
            text = activation_text(self.config.device.activation_code, self.config.persona.language)
            self._tasks.create(self._require_engine().say(text), name="session-activation-code")

    async def _on_listen_stop(self, message: ListenStop) -> None:
        was = self._state
        if was is S.SPEAKING:
            await self._interrupt("listen_stop")
        if was is S.THINKING:
            return  # a late repeat: the utterance is already being answered
        self._set_state(S.IDLE)  # the device is idle already (reference gotcha 10)
        if was is S.LISTENING and not self._code_only:
            self._require_engine().on_listen_stop()

    async def _on_listen_detect(self, message: ListenDetect) -> None:
        self._watchdog.activity()
        if self._code_only:
            self._code_pending = True  # woken again: say the code at the next listen start
        else:
            self._require_engine().on_listen_detect(message.text)

    async def _on_abort(self, message: Abort) -> None:
        await self._interrupt(message.reason)

    async def _on_mcp(self, message: Mcp) -> None:
        self._mcp.feed(message.payload)

    async def _on_goodbye(self, message: Goodbye) -> None:
        await self._close(CloseCode.NORMAL, "goodbye")

    async def _interrupt(self, reason: str | None) -> None:
        """Stop the running reply and wait for its end, which sends the `tts stop`: the
        device leaves `speaking` only on `tts stop` (gotcha 8)."""
        await self._require_engine().interrupt(reason)

    def _rest_state(self) -> SessionState:
        """Where the device goes after `tts stop`: idle in manual mode, listening otherwise."""
        return S.IDLE if self._mode == "manual" else S.LISTENING

    # -- what the engine's replies report (contracts.ReplyEvents) ---------------------------

    def reply_started(self, kind: str) -> None:
        """A reply began; a turn's (an utterance ended) means ASR and LLM run now."""
        if kind == "turn" and self._state is not S.CLOSING:
            self._set_state(S.THINKING)

    async def reply_speaking(self) -> None:
        """The reply's first words are due: `tts start`, and downlink audio is allowed."""
        if self._state is S.CLOSING or self._tts_open:
            return
        self._tts_open = True
        self._set_state(S.SPEAKING)
        await self._send(TtsStart())

    async def reply_ended(self, interrupted: bool) -> None:
        """The one place `tts stop` is sent: the reply is over, however it ended."""
        if self._state is S.CLOSING:
            return
        if self._tts_open:
            self._tts_open = False
            self._set_state(self._rest_state())  # first: the reply's late frames are dropped
            await self._send(TtsStop())
        elif self._state is S.THINKING:
            self._set_state(self._rest_state())  # nothing was said: quietly back

    # -- outgoing --------------------------------------------------------------------------

    async def _send(self, message: Message) -> None:
        """Every JSON message to the device, with the session id filled in."""
        if self._state is S.CLOSING:
            return
        if message.session_id is None:
            message = replace(message, session_id=self.session_id)
        await self._send_raw(encode_json(message))

    async def _engine_send(self, message: Message) -> None:
        if isinstance(message, TtsStart | TtsStop):
            raise ValueError("tts start/stop are the session's: report reply_speaking()/reply_ended()")
        await self._send(message)

    async def _send_audio(self, opus: bytes) -> None:
        if self._state is not S.SPEAKING or self._version is None:
            self.stats.audio_dropped_out += 1  # the firmware drops audio outside speaking
            return
        self._watchdog.activity()  # long answers must not trip the idle timer
        self.stats.audio_sent += 1
        # v2 frames carry a timestamp the device echoes on its uplink while playing the frame.
        stamp = self._stamps.next(int(self._clock() * 1000)) if self._version == 2 else 0
        if self._server_aec and self._engine is not None:
            self._engine.on_audio_sent(opus, stamp)
        await self._send_raw(encode_audio(opus, self._version, stamp))

    async def _send_mcp(self, payload: dict) -> None:
        await self._send(Mcp(payload=payload))

    async def _send_raw(self, frame: str | bytes) -> None:
        try:
            if isinstance(frame, str):
                await self._transport.send_text(frame)
            else:
                await self._transport.send_bytes(frame)
        except Exception as exc:
            # The socket is going away; the disconnect cleans up. Once per session is enough.
            self._send_failures += 1
            level = logging.WARNING if self._send_failures == 1 else logging.DEBUG
            logger.log(level, "send to device failed", extra={
                "session_id": self.session_id, "error": type(exc).__name__, "failures": self._send_failures,
            })

    async def _close(self, code: int, reason: str) -> None:
        if self._state is S.CLOSING:
            return
        self._set_state(S.CLOSING)
        logger.info("device session closing",
                    extra={"session_id": self.session_id, "code": int(code), "reason": reason})
        self._mcp.close()
        try:
            await self._transport.close(int(code), reason)
        except Exception:
            logger.warning("closing the device socket failed", exc_info=True)

    # -- engine context and state ----------------------------------------------------------

    def _engine_context(self) -> EngineContext:
        return EngineContext(
            config=self.config, toolset=self.toolset, send=self._engine_send,
            send_audio=self._send_audio, replies=self, listen_mode=lambda: self._mode,
            hooks=self._hooks, voice_activity=self._watchdog.activity, request_close=self._request_close,
            tool_state=self.tool_state, server_aec=self._server_aec,
        )

    def _require_engine(self) -> VoiceEngine:
        if self._engine is None:
            raise RuntimeError("the engine exists only after the hello")
        return self._engine

    def _set_state(self, target: SessionState) -> None:
        current = self._state
        if check_transition(current, target):
            self._state = target
            # DEBUG: 3-4 transitions a turn, every turn of every device (at P1's 200 devices
            # ~270 lines a second, formatted and written from the event loop); the session's
            # opening, closing and failures stay at INFO. XIAOZHI_LOG_LEVEL=DEBUG shows them.
            logger.debug("device session state changed",
                         extra={"session_id": self.session_id, "from": current.value, "to": target.value})

    def _request_close(self, reason: str) -> None:
        if self._state is not S.CLOSING and not self._closed:
            self._tasks.create(self._close(CloseCode.NORMAL, (reason or "bye")[:100]))

    def _tools_listed(self, server_info: dict, tools: list[dict]) -> None:
        self._persist.submit(lambda: self._hooks.tools_listed(server_info, tools))

    # -- background tasks ------------------------------------------------------------------

    async def _hello_deadline(self) -> None:
        await asyncio.sleep(self.config.hello_timeout)
        if self._state is S.CONNECTING:
            await self._close(CloseCode.HELLO_TIMEOUT, "hello timeout")

    async def _prepare_tools(self, with_device: bool) -> None:
        await self.toolset.refresh()
        if with_device:
            await self._mcp.setup()

    def _idle_may_close(self) -> bool:
        # Not while a reply is being prepared or spoken: that is not the user being away.
        return self._state in (S.IDLE, S.LISTENING)

    def _on_idle(self) -> None:
        self._tasks.create(self._farewell(), name="session-farewell")

    async def _on_hard(self) -> None:
        await self._close(CloseCode.TIMEOUT, "hard timeout")

    def _on_touch(self) -> None:
        self._persist.submit(self._hooks.touch)

    async def _farewell(self) -> None:
        language = self.tool_state.language or self.config.persona.language
        text = phrases.farewell(self.config.persona.farewell, language)
        if text:
            try:
                async with asyncio.timeout(FAREWELL_TIMEOUT):
                    await self._require_engine().say(text)
            except TimeoutError:
                logger.warning("idle farewell did not finish in time")
            except Exception:
                logger.exception("idle farewell failed")
        await self._close(CloseCode.TIMEOUT, "idle timeout")

    async def _close_engine(self, engine: VoiceEngine) -> None:
        try:
            async with asyncio.timeout(ENGINE_CLOSE_TIMEOUT):
                await engine.aclose()
        except Exception:
            logger.exception("engine close failed", extra={"session_id": self.session_id})

    # -- commands --------------------------------------------------------------------------

    async def _command(self, command: str, event: dict[str, Any]) -> None:
        if self._version is None or self._state is S.CLOSING:
            logger.warning("device command while not connected, dropped", extra={"command": command})
            return
        if command != "say":
            await self._send(command_message(command, event))
            return
        text = say_text(event)
        if self._state in (S.THINKING, S.SPEAKING):
            await self._interrupt("command")  # a command's text replaces the running reply
        await self._require_engine().say(text, record=True)  # the operator's words: a turn of the history

    async def _command_mcp_call(self, event: dict[str, Any]) -> dict[str, Any]:
        name, arguments, timeout = call_request(event)
        if self._version is None or self._state is S.CLOSING:
            return mcp_result(error="the device is not connected", offline=True)
        try:
            text = await self._mcp.call(name, arguments, timeout)
        except ToolError as exc:
            gone = str(exc) == DISCONNECTED
            return mcp_result(error=str(exc) or "the device tool failed", offline=gone)
        return mcp_result(result=text)


def _as_device_hello(message: Hello | ServerHello) -> Hello:
    """A hello without `features` decodes as the server shape; from a client it is a hello."""
    if isinstance(message, Hello):
        return message
    return Hello(version=1, features={}, transport=message.transport, session_id=message.session_id)
