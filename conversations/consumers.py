"""DeviceConsumer: the thin Channels adapter between a device socket and its VoiceSession.

`connect` asks admission and takes a connection slot first (no database: a refusal in a
storm costs nothing else), then authenticates the handshake (devices/auth.py), loads the
session configuration and claims the device in one DB hop, then accepts; a previous socket
of the same device, in this process or another, is told to close (`device.replaced`). So by
the time the device can send its hello the session is ready to answer it at once. An unbound
device's session is set up in a second hop, once its smaller share of slots is checked.

Channels awaits one handler at a time per consumer (socket frames and channel-layer events
share one queue), so every handler here returns quickly: frames are handed to the session,
commands run in tasks.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.layers import get_channel_layer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from conversations.admission import admission
from conversations.pipeline.aio import TaskSet
from conversations.pipeline.config import SessionConfig
from conversations.pipeline.contracts import EngineContext, VoiceEngine
from conversations.pipeline.engine import VoiceEngine as FullVoiceEngine
from conversations.pipeline.session import VoiceSession
from conversations.pipeline.states import SessionState
from conversations.selectors import persona_for_device_cached, request_base_url, session_config_for
from conversations.services import DbSessionHooks
from dashboard.live import REGISTRY as LIVE_FIGURES
from devices.addresses import header_value, scope_client_address
from devices.auth import DeviceAuthResult, device_authenticate_scope
from devices.presence import TOUCH_INTERVAL_SECONDS, device_connection_claim
from devices.presence_writer import offline_writer
from devices.protocol.close_codes import CloseCode
from devices.protocol.commands import command_name, mcp_result, replaced_event
from xiaozhi_site.db_threads import device_db
from xiaozhi_site.ws_fastpath import BINARY_TAP

if TYPE_CHECKING:
    from asgiref.typing import WebSocketDisconnectEvent

    from devices.models import Device

logger = logging.getLogger(__name__)

# How long a closing socket waits for its offline write (the writer carries on regardless).
OFFLINE_WAIT_SECONDS = 5.0


Receive = Callable[[], Awaitable[dict[str, Any]]]


async def dispatch_serially(sources: list[Receive], dispatch: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """Channels' `await_many_dispatch` for the uplink's rate: one reader task per source,
    each dispatching under one lock, so handlers still run one at a time and each source's
    messages in order.

    Channels' loop costs, per message, an `asyncio.wait` over every source (a waiter future
    and callbacks on each task) and a new task for the next receive: at ~17 frames a second
    per device that was ~4 event-loop callbacks and a task creation per audio frame; here a
    frame wakes its reader once (issue 17). Returns or raises when a reader stops
    (StopConsumer, an error), after cancelling the others."""
    lock = asyncio.Lock()
    stopped = False  # a handler raised: nothing more is dispatched, as in Channels

    async def read(receive: Receive) -> None:
        nonlocal stopped
        while True:
            message = await receive()
            async with lock:  # not contended in the common case: no suspension
                if stopped:
                    return
                try:
                    await dispatch(message)
                except BaseException:
                    stopped = True
                    raise

    tasks = [asyncio.ensure_future(read(receive)) for receive in sources]
    try:
        done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()  # StopConsumer or the handler's error, as Channels would raise it
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def voice_engine_factory(ctx: EngineContext) -> VoiceEngine:
    return FullVoiceEngine(ctx)


Prepared = tuple[SessionConfig, int, str]  # the config, the persona id, the channel replaced


def _prepare(auth: DeviceAuthResult, scope: Mapping[str, Any], channel_name: str) -> Prepared:
    """Session configuration, and the device claimed for this socket (sync, ORM).

    Returns the config, the persona id and the channel of the connection this one replaces.
    """
    device = auth.device
    assert device is not None
    persona = persona_for_device_cached(device)
    config = session_config_for(device, auth, persona=persona, request_base_url=request_base_url(scope))
    # The row was read a moment ago by the authentication: its channel is the likely previous one.
    previous = device_connection_claim(device_id=device.pk, session_id=config.session_id, channel_name=channel_name,
                                       expected=device.channel_name)
    return config, persona.pk, previous


def _authenticate_and_prepare(scope: Mapping[str, Any], channel_name: str) -> tuple[DeviceAuthResult, Prepared | None]:
    """The handshake's decision and, for a bound device let in, its session set up (sync, ORM).

    One hop instead of two: waking a database thread costs ~0.15 ms of the event loop's CPU
    and a reboot storm makes thousands (docs/performance.md, P10). An unbound device is not
    set up here: its smaller share of slots is checked first, on the loop."""
    auth = device_authenticate_scope(scope)
    if not auth.ok or auth.device is None or not auth.bound:
        return auth, None
    return auth, _prepare(auth, scope, channel_name)


class DeviceConsumer(AsyncWebsocketConsumer):
    """`/xiaozhi/v1/`: one device, one VoiceSession. Implements the session's Transport."""

    # Per process. Over the limit new sockets get 1013; unbound devices have their own,
    # smaller limit so the rest of the slots stay reserved for bound devices.
    active_connections: ClassVar[int] = 0
    unbound_connections: ClassVar[int] = 0
    engine_factory = staticmethod(voice_engine_factory)
    # While a handler runs (it may be awaiting) or a socket message is taken and not yet
    # handled, frames queue behind it instead of taking the direct path (`_binary_now`).
    _dispatching = False
    _frames_in_hand = 0
    _tap: Any = None  # the server's direct path for binary frames, when it offers one

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """AsyncConsumer.__call__ with `dispatch_serially` for Channels' dispatch loop."""
        self.scope = scope
        layer: Any = get_channel_layer(self.channel_layer_alias)
        self.channel_layer = layer
        sources: list[Receive] = [functools.partial(self._take_frame, receive)]
        if layer is not None:
            self.channel_name = await layer.new_channel()
            self.channel_receive = functools.partial(layer.receive, self.channel_name)
            sources.append(self.channel_receive)
        self.base_send = send
        try:
            await dispatch_serially(sources, self.dispatch)
        except StopConsumer:
            pass

    async def connect(self) -> None:
        self.session: VoiceSession | None = None
        self._open = False
        self._slot: bool | None = None  # the `bound` flag of the slot this socket holds
        self._claimed: str | None = None  # session id written on the device row
        self._commands = TaskSet("device commands")
        self._admitted = False  # counted by admission as about to stream
        self._admitted_at = asyncio.get_running_loop().time()
        busy = admission().admit(self)
        if busy is not None:  # past capacity: the devices already here stay real time
            await self._refuse(CloseCode.TRY_AGAIN_LATER, busy)
            return
        self._admitted = True
        if not self._take_slot(bound=True):  # an unbound device's own limit: after authentication
            await self._refuse_no_slot(bound=True)
            return
        delay = admission().setup_delay(self._admitted_at)
        if delay:  # one of the last places: its set-up waits its turn (admission's "Set-ups")
            self._admitted_at += delay  # the place is held while it waits
            # The upgrade now: daphne rejects one not accepted within 5 s; the firmware then
            # waits 10 s for the server's hello.
            await self._accept_once()
            await asyncio.sleep(delay)
        try:
            await self._authenticate_and_start()
        except Exception:  # e.g. the database or the channel layer is unreachable
            logger.exception("device session start failed")
            await self._refuse(CloseCode.INTERNAL_ERROR, "internal error")

    async def _authenticate_and_start(self) -> None:
        # On the device threads (kept connections), never queued behind sync views.
        auth, prepared = await device_db(_authenticate_and_prepare)(self.scope, self.channel_name)
        if not auth.ok or auth.device is None:
            await self._refuse(auth.close_code or CloseCode.AUTH_FAILED, auth.reason or "refused")
            return
        if prepared is None:  # unbound: its own, smaller share of slots, then its set-up
            self._release_slot()
            if not self._take_slot(bound=False):
                await self._refuse_no_slot(bound=False)
                return
            prepared = await device_db(_prepare)(auth, self.scope, self.channel_name)
        config, persona_id, previous = prepared
        self._claimed = config.session_id
        await self._start(auth.device, config, persona_id)
        if previous and previous != self.channel_name:
            await self._replace(previous, config.session_id)  # never raises: logs instead

    async def _refuse_no_slot(self, bound: bool) -> None:
        logger.warning("device connection refused: too many connections", extra={"bound": bound})
        await self._refuse(CloseCode.TRY_AGAIN_LATER, "too many connections")

    def holds_streaming_place(self, now: float, arriving_s: float) -> bool:
        """Admission's count: listening, or admitted less than `arriving_s` ago and still on
        its way to its first `listen start` (a refused socket holds none)."""
        state = self.session.state if self.session is not None else None
        if state is SessionState.LISTENING:
            return True
        arriving = state in (None, SessionState.CONNECTING, SessionState.IDLE)
        return self._admitted and arriving and now - self._admitted_at < arriving_s

    def _take_slot(self, bound: bool) -> bool:
        cls = DeviceConsumer
        if cls.active_connections >= settings.XIAOZHI_MAX_DEVICE_CONNECTIONS:
            return False
        if not bound and cls.unbound_connections >= settings.XIAOZHI_MAX_UNBOUND_DEVICE_CONNECTIONS:
            return False
        cls.active_connections += 1
        cls.unbound_connections += 0 if bound else 1
        self._slot = bound
        return True

    def _release_slot(self) -> None:
        if self._slot is None:
            return
        DeviceConsumer.active_connections -= 1
        DeviceConsumer.unbound_connections -= 0 if self._slot else 1
        self._slot = None

    async def _refuse(self, code: int, reason: str) -> None:
        self._release_slot()  # a refused socket holds no slot, even before it disconnects
        if self._admitted:  # nor a place with admission: it will not stream
            self._admitted = False
            admission().withdraw()
        await self._accept_once()  # first: a close before accept is an HTTP 403 without code or reason
        await self.close(code=code, reason=reason)

    async def _accept_once(self) -> None:
        """The upgrade, unless this socket has had it (a device waiting for its set-up)."""
        if not self._open:
            await self.accept()
            self._open = True

    async def _start(self, device: Device, config: SessionConfig, persona_id: int | None) -> None:
        # The tool list stored on the row, so a reconnecting device's unchanged list is not rewritten.
        hooks = DbSessionHooks(device_id=device.pk, persona_id=persona_id,
                               client_address=scope_client_address(self.scope),
                               stored_tools=(device.mcp_server_info, device.mcp_tools))
        self.session = VoiceSession(self, config, hooks, self.engine_factory,
                                    protocol_header=header_value(self.scope, b"protocol-version") or None,
                                    touch_interval=TOUCH_INTERVAL_SECONDS)
        LIVE_FIGURES.track_device(self)  # the dashboard counts sessions by state
        self._tap = (self.scope.get("extensions") or {}).get(BINARY_TAP)
        if self._tap is not None:
            self._tap.sink = self._binary_now
        await self._accept_once()
        await self.session.start()

    async def _replace(self, previous: str, session_id: str) -> None:
        try:
            await self.channel_layer.send(previous, replaced_event(session_id))
        except Exception as exc:  # the old socket then lives on until its own timeouts
            logger.warning("could not close the replaced connection", extra={"error": repr(exc)})

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch without its `aclose_old_connections()` before every handler.

        That call hops to the single thread-sensitive sync thread: once per audio frame
        (~17/s per device, shared by all devices), and it stalls behind any blocking sync
        view; an admin action waiting for a device tool call would deadlock with it until
        the timeout. This consumer never uses the ORM directly: its DB work goes through
        `database_sync_to_async` (xiaozhi_site/db_threads.py), which cleans up connections itself. Unknown channel-layer
        events are logged instead of killing the device's connection.
        """
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            logger.warning("device consumer ignored an unknown event", extra={"event_type": message.get("type")})
            return
        self._dispatching = True
        try:
            await handler(message)
        finally:
            self._dispatching = False
            if message["type"].startswith("websocket."):
                self._frames_in_hand -= 1

    async def _take_frame(self, receive: Receive) -> dict[str, Any]:
        """The socket's next message (the server's queue); in hand until its handler returns."""
        message = await receive()
        self._frames_in_hand += 1
        return message

    def _binary_now(self, data: bytes) -> bool:
        """The server's direct path (`BINARY_TAP`): an audio frame handed over as it is read,
        without the ASGI queue, a task wake-up and Channels' dispatch (~20 us of the event
        loop per frame, issue 17). Only when nothing is ahead of it (the server checks its
        queue, this a handler still running), so frames keep their order; False: the frame
        goes the usual way."""
        session = self.session
        if self._dispatching or self._frames_in_hand or session is None:
            return False
        return session.feed_audio_now(data)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        session = self.session
        if session is None:
            return
        if text_data is not None:
            await session.feed_text(text_data)
        elif bytes_data is not None:
            await session.feed_bytes(bytes_data)

    async def websocket_disconnect(self, message: WebSocketDisconnectEvent) -> None:
        # As dispatch above: no trip through the sync thread before the session is closed,
        # so a tool call waiting on this device fails at once instead of at its timeout.
        await self.disconnect(message.get("code", 1006))
        raise StopConsumer()

    async def disconnect(self, code: int) -> None:
        self._open = False
        if self._tap is not None:
            self._tap.sink = None
        try:
            if self.session is not None:
                await self.session.aclose()  # fails pending tool calls: their callers hear it now
            await self._commands.aclose()
        finally:
            self._release_slot()
            await self._mark_offline()

    async def _mark_offline(self) -> None:
        """Hand the session to the loop's offline writer, which outlives this consumer: even
        when thousands of sockets close at once, every device ends offline."""
        if self._claimed is None:
            return
        written = offline_writer().submit(self._claimed)
        self._claimed = None
        await asyncio.wait({written}, timeout=OFFLINE_WAIT_SECONDS)

    # -- Transport ---------------------------------------------------------------------------

    async def send_text(self, text: str) -> None:
        if self._open:
            await self.send(text_data=text)

    async def send_bytes(self, data: bytes) -> None:
        if self._open:
            await self.send(bytes_data=data)

    async def close(self, code: int | None = None, reason: str | None = None) -> None:
        if not self._open:
            return
        self._open = False
        # A plain int: autobahn refuses an IntEnum such as CloseCode.
        await super().close(code=None if code is None else int(code), reason=reason)

    # -- channel-layer events (devices/protocol/commands.py) ---------------------------------

    async def device_replaced(self, event: dict[str, Any]) -> None:
        """A newer socket of this device connected (maybe in another process): give way."""
        if self.session is not None and event.get("session_id") != self.session.session_id:
            logger.info("device connection replaced by a new one", extra={"session_id": self.session.session_id})
            await self.close(code=CloseCode.REPLACED, reason="replaced by a new connection")

    async def device_command(self, event: dict[str, Any]) -> None:
        if self.session is None:
            return
        try:
            self._commands.create(self._run_command(self.session, event), name="device-command")
        except RuntimeError:  # the socket is closing
            logger.info("device command dropped: the connection is closing")

    async def _run_command(self, session: VoiceSession, event: dict[str, Any]) -> None:
        reply_channel = event.get("reply_channel")
        try:
            result = await session.handle_command(event)
        except asyncio.CancelledError:
            if command_name(event) == "mcp_call":
                await self._reply(reply_channel, mcp_result(error="the device disconnected", offline=True))
            raise
        await self._reply(reply_channel, result)

    async def _reply(self, reply_channel: object, result: dict[str, Any] | None) -> None:
        if result is None or not isinstance(reply_channel, str) or not reply_channel:
            return
        try:
            await self.channel_layer.send(reply_channel, result)
        except Exception:
            logger.warning("device command result could not be delivered", exc_info=True)
