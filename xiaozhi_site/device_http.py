"""The firmware's HTTP routes (`/xiaozhi/ota/…`) served as a WSGI worker serves a request:
middleware and view together, in one hop to a long-lived thread.

Django's ASGI handler runs every request in a thread made for it (`ThreadSensitiveContext`),
and with this project's middleware (WhiteNoise is sync-only, the others async-capable
`MiddlewareMixin`s that call their sync hooks through `sync_to_async`) a request crosses
between the event loop and that thread about fifteen times, then opens a database connection
the thread takes with it. For the OTA check of a reboot storm that was most of its cost
(docs/performance.md, P10). Here the same `settings.MIDDLEWARE`, loaded in sync mode, and the
same URLconf run in one call on the kept-connection threads of db_threads.py; the
`request_started` / `request_finished` signals fire in that thread, as under WSGI, so
`close_old_connections` keeps its connection or replaces a broken or old one. Everything
else (the admin, async views) stays on Django's ASGI handler.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from asgiref.sync import SyncToAsync
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http.response import HttpResponseBase
from django.urls import set_script_prefix

from xiaozhi_site.db_threads import kept_connections_executor

# As django-stubs types ASGIHandler.__call__.
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEVICE_HTTP_PREFIXES = ("/xiaozhi/ota",)  # devices/urls.py: check-in, activation, firmware
DEVICE_HTTP_THREADS = 4


class SyncRequestHandler(ASGIHandler):
    """An ASGI app for Django requests whose middleware chain and view run synchronously,
    in one call on `executor`; a streaming body is sent, then closed in a second call."""

    def __init__(self, executor: ThreadPoolExecutor) -> None:
        base.BaseHandler.__init__(self)  # not ASGIHandler.__init__: it loads the chain async
        self.load_middleware(is_async=False)
        self._respond = SyncToAsync(self._response_for, thread_sensitive=False, executor=executor)
        self._close = SyncToAsync(self._close_response, thread_sensitive=False, executor=executor)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # type: ignore[override]
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        response = await self._respond(scope, body_file)
        try:
            await self.send_response(response, send)
        finally:
            if response.streaming:
                await self._close(response, body_file)

    def _response_for(self, scope: Scope, body_file: IO[bytes]) -> HttpResponseBase:
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        response = self.get_response(request) if request is not None else error_response
        assert response is not None  # create_request returns a request or an error response
        response._handler_class = self.__class__  # type: ignore[attr-defined]  # as Django's handlers do
        if not response.streaming:
            # The body is in memory: finish the request here (request_finished keeps or
            # closes this thread's connection) rather than hop back after sending.
            self._close_response(response, body_file)
        return response

    @staticmethod
    def _close_response(response: HttpResponseBase, body_file: IO[bytes]) -> None:
        try:
            response.close()
        finally:
            body_file.close()


class DeviceHttpRouter:
    """HTTP for the device routes to `device_app`, everything else to `default_app`."""

    def __init__(self, device_app: ASGIApp, default_app: ASGIApp,
                 prefixes: tuple[str, ...] = DEVICE_HTTP_PREFIXES) -> None:
        self.device_app = device_app
        self.default_app = default_app
        self.prefixes = prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.device_app if str(scope.get("path", "")).startswith(self.prefixes) else self.default_app
        await app(scope, receive, send)


def device_http_application(default_app: ASGIApp) -> DeviceHttpRouter:
    executor = kept_connections_executor("device-http", DEVICE_HTTP_THREADS)
    return DeviceHttpRouter(SyncRequestHandler(executor), default_app)
