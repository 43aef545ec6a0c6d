"""GatewaySession: one text client's connection to the LLM Gateway, in plain asyncio.

The consumer hands every frame to `feed()`, which checks the size, parses, and answers
`ping` and `tool_result` at once (a turn waiting on a client tool must see its result).
Everything else goes, in arrival order, into a bounded command queue drained by one worker
task, so a connection runs one command at a time: a `text_input` sent while a turn runs
waits its turn instead of being refused (at most `max_queued_requests` may wait; more are
refused with INVALID_MESSAGE), and a `configure` or `start_session` sent after a
`text_input` applies after that turn, exactly in the order the client wrote them.

Every queued `text_input` produces `processing`, then tool messages, then `llm_response` or
an `error`, then `idle`. Finished turns go to `hooks.turn_finished`, which only enqueues.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import asdict
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from conversations.gateway import protocol
from conversations.gateway.client_tools import ClientToolSource
from conversations.gateway.protocol import (
    CLOSE_IDLE,
    CLOSE_TAKEN_OVER,
    CLOSE_TOO_BIG,
    Configure,
    EndSession,
    ErrorCode,
    GatewayError,
    Ping,
    RegisterTools,
    StartSession,
    TextInput,
    ToolResult,
)
from conversations.gateway.session_config import SERVER_TOOLS, GatewayConfig
from conversations.gateway.store import ChatOptions, SessionRecord, SessionStore
from conversations.gateway.turn import TurnRunner, TurnSettings, tool_summary
from conversations.pipeline.aio import TaskSet, cancel_and_wait
from conversations.pipeline.fallback import ProviderChain
from conversations.pipeline.text import clean_for_speech
from conversations.turns.record import TurnRecord
from conversations.turns.tool_loop import Thought
from conversations.turns.transport import Transport
from tools.builtin import SUPPORTED_LANGUAGES, BuiltinToolSource, SessionToolState
from tools.registry import Toolset

log = logging.getLogger(__name__)


class GatewayHooks(Protocol):
    """Persistence. Called on the reply path, so they must return at once (enqueue); the
    consumer's hooks hand everything to the process's HistoryWriter (conversations/turns/)."""

    def turn_finished(self, turn: TurnRecord) -> None: ...

    def session_ended(self, session_id: str) -> None: ...


class GatewaySession:
    """One connection. `start()` after accept, `feed()`/`feed_bytes()` per frame, `aclose()`
    on disconnect. Talks to the world only through its transport, store, LLM chain (the
    fallback chain of pipeline/fallback.py, as the device's) and hooks."""

    def __init__(
        self, transport: Transport, config: GatewayConfig, store: SessionStore, llm: ProviderChain,
        hooks: GatewayHooks,
    ) -> None:
        self._transport = transport
        self._config = config
        self._store = store
        self._llm = llm
        self._hooks = hooks
        self._limits = protocol.Limits(max_tokens=config.max_tokens_limit)
        self._owner = object()  # identifies this connection to the store
        self._client_tools = ClientToolSource(
            self.send,
            timeout=config.client_tool_timeout,
            max_tools=config.client_tools_max,
            enabled=config.client_tools_enabled,
        )
        self._builtin = BuiltinToolSource(self._tool_state(), SERVER_TOOLS, config.server_tool_timeout)
        self._toolset = Toolset([self._builtin, self._client_tools])
        self._record: SessionRecord | None = None
        self._commands: asyncio.Queue[Any] = asyncio.Queue(config.max_queued_requests)
        self._worker: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._tasks = TaskSet("gateway-session")
        self._last_seen = time.monotonic()
        self._busy = False
        self._closing = False  # a close was requested: ignore what still arrives
        self._closed = False

    @property
    def session_id(self) -> str:
        return self._record.session_id if self._record else ""

    @property
    def client_tools(self) -> ClientToolSource:
        return self._client_tools

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """After accept: a new session, `status: connected`, and the session's tasks."""
        await self._toolset.refresh()
        self._use(self._new_record(self._default_options()))
        self._worker = asyncio.create_task(self._work_forever(), name="gateway-worker")
        self._watchdog = asyncio.create_task(self._watch_idle(), name="gateway-idle")
        await self.send(protocol.status_connected(self.session_id))

    async def aclose(self) -> None:
        """The socket is gone: stop the turn (it is recorded as interrupted), drop the
        client's tools, and let go of the session so it can be resumed."""
        self._closed = True
        await cancel_and_wait(self._worker, self._watchdog)
        self._client_tools.close()
        await self._tasks.aclose()
        if self._record is not None:
            self._store.detach(self._record, self._owner)

    # -- input ----------------------------------------------------------------------------------

    async def feed(self, text: str) -> None:
        """One text frame: never blocks on a turn."""
        self._last_seen = time.monotonic()
        if self._closing:
            return
        if _too_large(text, self._config.max_message_bytes):
            await self._refuse_large(len(text.encode("utf-8", "surrogatepass")))
            return
        try:
            message = protocol.parse_client_message(text, self._limits)
            await self._dispatch(message)
        except GatewayError as exc:
            log.info("gateway message refused", extra={"code": str(exc.code)})
            await self.send(protocol.error_from(exc))

    async def feed_bytes(self, data: bytes) -> None:
        self._last_seen = time.monotonic()
        if self._closing:
            return
        if len(data) > self._config.max_message_bytes:
            await self._refuse_large(len(data))
            return
        await self.send(protocol.error(ErrorCode.INVALID_MESSAGE, "Binary frames are not supported", "send JSON text"))

    async def _refuse_large(self, size: int) -> None:
        limit = self._config.max_message_bytes
        log.warning("gateway message too large", extra={"bytes": size, "limit": limit})
        details = f"{size} bytes; the limit is {limit} bytes"
        await self.send(protocol.error(ErrorCode.INVALID_MESSAGE, "Message too large", details))
        await self._close(CLOSE_TOO_BIG)

    async def _close(self, code: int) -> None:
        self._closing = True
        await self._transport.close(code, "")  # the seed's clients see the code alone, as ever

    async def _dispatch(self, message: Any) -> None:
        if isinstance(message, Ping):
            await self.send(protocol.pong())
        elif isinstance(message, ToolResult):
            self._client_tools.resolve(message)
        else:
            try:
                self._commands.put_nowait(message)
            except asyncio.QueueFull:
                limit = self._config.max_queued_requests
                raise GatewayError(
                    ErrorCode.INVALID_MESSAGE, "Too many pending requests", f"at most {limit} may wait"
                ) from None

    async def send(self, message: dict[str, Any]) -> None:
        if self._closed:
            return
        try:
            await self._transport.send_text(protocol.encode(message))
        except Exception:
            # The socket went away under us; disconnect() will clean up.
            log.info("gateway send failed", extra={"type": message.get("type")})

    # -- the command worker -----------------------------------------------------------------

    async def _work_forever(self) -> None:
        while True:
            command = await self._commands.get()
            try:
                await self._handle(command)
            except GatewayError as exc:
                await self.send(protocol.error_from(exc))
            except Exception:
                log.exception("gateway command failed", extra={"command": type(command).__name__})
                await self.send(protocol.error(ErrorCode.INTERNAL_ERROR, "Internal error"))

    async def _handle(self, command: Any) -> None:
        if isinstance(command, TextInput):
            await self._turn(command)
        elif isinstance(command, Configure):
            self._configure(command)
        elif isinstance(command, StartSession):
            await self._start_session(command.session_id)
        elif isinstance(command, EndSession):
            await self._end_session()
        elif isinstance(command, RegisterTools):
            await self._register_tools(command)

    def _configure(self, command: Configure) -> None:
        # No reply on success: the seed's clients send configure without reading an answer.
        options = self._current().options
        if command.temperature is not None:
            options.temperature = command.temperature
        if command.max_tokens is not None:
            options.max_tokens = command.max_tokens
        if command.enable_context is not None:
            options.enable_context = command.enable_context

    async def _register_tools(self, command: RegisterTools) -> None:
        registration = await self._client_tools.register(command.tools)
        if any(r["status"] == "registered" for r in registration.results):
            await self._toolset.add_source(self._client_tools)
        # Errors first: a client that reads one reply after register_tools (seed §10.1)
        # still finds tools_registered among what follows.
        for failure in registration.errors:
            await self.send(protocol.error_from(failure))
        await self.send(protocol.tools_registered(registration.results))

    # -- sessions -------------------------------------------------------------------------------

    def _default_options(self) -> ChatOptions:
        config = self._config
        return ChatOptions(config.temperature, config.max_tokens, config.enable_context)

    def _tool_state(self) -> SessionToolState:
        config = self._config
        state = SessionToolState(timezone=config.timezone, characters=list(config.characters))
        if config.weather_base_url:
            state.weather_base_url = config.weather_base_url
        if config.geocoding_url:
            state.geocoding_url = config.geocoding_url
        return state

    def _new_record(self, options: ChatOptions) -> SessionRecord:
        return self._store.create(options, self._tool_state())

    def _current(self) -> SessionRecord:
        if self._record is None:
            raise GatewayError(ErrorCode.SESSION_ERROR, "No active session")
        return self._record

    def _use(self, record: SessionRecord) -> None:
        if self._record is not None and self._record is not record:
            self._store.detach(self._record, self._owner)
        self._record = record
        self._store.attach(record, self._owner, self._taken_over)
        self._builtin.state = record.tool_state

    async def _start_session(self, session_id: str | None) -> None:
        """Seed §4.3/§9.6: resume a session by id, or start a new one; `connected` either way."""
        if session_id is None:
            # A new conversation keeps the connection's LLM options, not its history.
            self._use(self._new_record(ChatOptions(**asdict(self._current().options))))
            await self.send(protocol.status_connected(self.session_id))
            return
        if session_id != self.session_id:
            self._use(self._store.get(session_id))
        await self.send(protocol.status_connected(self.session_id, resumed=True))

    async def _end_session(self) -> None:
        ended = self._current()
        self._store.remove(ended.session_id)
        self._hooks.session_ended(ended.session_id)
        self._record = None
        self._use(self._new_record(ChatOptions(**asdict(ended.options))))
        await self.send(protocol.status_idle(self.session_id, ended_session_id=ended.session_id))

    def _taken_over(self) -> None:
        """Called by the store when another connection resumes our session."""
        log.info("gateway session resumed elsewhere, closing")
        self._record = None
        if not self._closed:  # called from the other connection: never raise into it
            self._tasks.create(self._close_taken_over(), name="gateway-taken-over")

    async def _close_taken_over(self) -> None:
        details = "another connection resumed this session"
        await self.send(protocol.error(ErrorCode.SESSION_ERROR, "Session taken over", details))
        await self._close(CLOSE_TAKEN_OVER)

    # -- turns ------------------------------------------------------------------------------------

    async def _turn(self, command: TextInput) -> None:
        self._busy = True
        try:
            if command.session_id and command.session_id != self.session_id:
                await self._start_session(command.session_id)
            await self._run_turn(self._current(), command.text)
        except GatewayError as exc:
            await self.send(protocol.error_from(exc))
        except Exception:
            log.exception("gateway turn failed")
            await self.send(protocol.error(ErrorCode.INTERNAL_ERROR, "Internal error"))
        finally:
            self._busy = False
            self._last_seen = time.monotonic()
            await self.send(protocol.status_idle(self.session_id))

    async def _run_turn(self, record: SessionRecord, text: str) -> None:
        started = time.perf_counter()
        await self.send(protocol.status_processing())
        runner = TurnRunner(
            llm=self._llm, toolset=self._toolset, send=self.send, settings=self._turn_settings(), options=record.options
        )
        try:
            thought = await runner.run(self._messages(record, text))
        except GatewayError as exc:
            await self.send(protocol.error_from(exc))
            self._finished(record, text, runner.thought, started, error=f"{exc.code}: {exc.details}")
            return
        except asyncio.CancelledError:
            self._finished(record, text, runner.thought, started, error="interrupted", interrupted=True)
            raise
        content = clean_for_speech(thought.answer_text)
        summaries = [tool_summary(r) for r in thought.tool_calls]
        await self.send(protocol.llm_response(content, summaries))
        if content and record.owner is self._owner:
            record.add_exchange(text, content, self._config.history_messages)
        self._finished(record, text, thought, started, reply=content)

    def _turn_settings(self) -> TurnSettings:
        config = self._config
        return TurnSettings(config.model, config.llm_timeout, config.max_tool_rounds, config.client_tool_timeout,
                            config.llm_inter_token_timeout)

    def _messages(self, record: SessionRecord, text: str) -> list[dict[str, Any]]:
        """Seed §6.3: with enable_context the history comes before the new message."""
        history = list(record.history) if record.options.enable_context else []
        system = {"role": "system", "content": self._system_prompt(record.tool_state)}
        return [system, *history, {"role": "user", "content": text}]

    def _system_prompt(self, state: SessionToolState) -> str:
        now = dt.datetime.now(_zone(state.timezone)).strftime("%Y-%m-%d %H:%M:%S")
        prompt = self._config.system_prompt.replace("{current_time}", now).strip()
        if state.language != "zh":
            prompt += f"\nReply in {SUPPORTED_LANGUAGES.get(state.language, state.language)}."
        if state.roleplay:
            prompt += f"\nYou are now role-playing {state.roleplay}; stay in character."
        return prompt

    def _finished(
        self,
        record: SessionRecord,
        text: str,
        thought: Thought,
        started: float,
        *,
        reply: str = "",
        error: str = "",
        interrupted: bool = False,
    ) -> None:
        self._store.touch(record)
        record.turns += 1
        total_ms = (time.perf_counter() - started) * 1000
        timings = {"llm_ms": round(thought.llm_seconds * 1000, 3), "total_ms": round(total_ms, 3)}
        turn = TurnRecord(
            session_id=record.session_id,
            index=record.turns - 1,
            user_text=text,
            reply_text=reply,
            tool_calls=thought.tool_call_dicts(),
            providers={"llm": ",".join(thought.providers or self._llm.kinds[:1]), "model": self._config.model},
            timings=timings,
            error=error,
            interrupted=interrupted,
            provider_attempts=thought.attempts.as_json(),
        )
        self._hooks.turn_finished(turn)

    # -- background -------------------------------------------------------------------------------

    async def _watch_idle(self) -> None:
        """Seed §11.1: close a connection that has sent nothing for CLOUD_PING_TIMEOUT."""
        timeout = self._config.idle_timeout
        interval = min(self._config.idle_check_interval, timeout)
        while True:
            await asyncio.sleep(interval)
            if not self._busy and time.monotonic() - self._last_seen > timeout:
                log.info("gateway connection idle, closing", extra={"idle_timeout": timeout})
                await self._close(CLOSE_IDLE)
                return


def _too_large(text: str, limit: int) -> bool:
    # A UTF-8 character is at most 4 bytes: most frames are decided without encoding.
    if len(text) * 4 <= limit:
        return False
    return len(text) > limit or len(text.encode("utf-8", "surrogatepass")) > limit


def _zone(name: str) -> dt.tzinfo:
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError):
        return dt.UTC
