"""Database work of the device paths on a few long-lived threads that keep their connections.

Under ASGI Django closes the database connection at the end of every request
(`CONN_MAX_AGE=0`, as its documentation asks: each ASGI request gets a thread of its own that
dies with it, and a kept connection would leak). A reboot storm makes five or six database
hops per device (the OTA check-in, authentication, session set-up, presence, the tool list),
and opening a SQLite connection (the file, WAL, Django's SQL functions registered one by one)
costs ~0.75 ms of CPU, more than the query it serves (docs/performance.md, P10).

The threads here live as long as the process, so each keeps its own connection, the way a
WSGI worker thread does: `close_old_connections()` still runs before and after every call
(channels' `database_sync_to_async`, or the request signals of xiaozhi_site/device_http.py),
and closes a connection that is older than `KEPT_CONNECTION_MAX_AGE` or broke on an error;
health checks are on, so a connection the database dropped (a restart) is noticed at its next
use and replaced instead of failing the call.
"""
from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar, cast

from channels.db import DatabaseSyncToAsync
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend

P = ParamSpec("P")
T = TypeVar("T")

KEPT_CONNECTION_MAX_AGE = 300  # seconds; a connection is reopened at its next use after this
DEVICE_DB_THREADS = 4  # SQLite serialises writes anyway; PostgreSQL gets at most this many per process

_kept: list[BaseDatabaseWrapper] = []
_kept_lock = threading.Lock()


def keep_connections() -> None:
    """Thread initializer: this thread's connections outlive each call (and each request)."""
    for alias in connections:
        settings_dict = {**connections.settings[alias], "CONN_MAX_AGE": KEPT_CONNECTION_MAX_AGE,
                         "CONN_HEALTH_CHECKS": True}
        wrapper = load_backend(settings_dict["ENGINE"]).DatabaseWrapper(settings_dict, alias)
        connections[alias] = wrapper
        with _kept_lock:
            _kept.append(wrapper)


def kept_connections_executor(name: str, workers: int = DEVICE_DB_THREADS) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name, initializer=keep_connections)


def close_kept_connections() -> None:
    """Close every kept connection now, from any thread (tests, before the test database is
    dropped); each thread opens a new one at its next call."""
    with _kept_lock:
        wrappers = list(_kept)
    for wrapper in wrappers:
        wrapper.inc_thread_sharing()
        try:
            wrapper.close()
        finally:
            wrapper.dec_thread_sharing()


DEVICE_DB = kept_connections_executor("device-db")


def device_db(func: Callable[P, T]) -> Callable[P, Awaitable[T]]:
    """`database_sync_to_async(func)` on the device threads: not thread-sensitive, so a
    connecting device never queues behind a sync view or an admin page."""
    return cast(Callable[P, Awaitable[T]], DatabaseSyncToAsync(func, thread_sensitive=False, executor=DEVICE_DB))
