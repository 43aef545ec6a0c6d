"""The device threads keep their database connections between calls (xiaozhi_site/db_threads.py),
yet still drop an old one and survive the database closing it."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from channels.db import DatabaseSyncToAsync
from django.db import connection
from django.db.backends.signals import connection_created

from xiaozhi_site.db_threads import close_kept_connections, kept_connections_executor

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def opened() -> Iterator[list[str]]:
    """The threads that opened a database connection, in order."""
    threads: list[str] = []

    def record(**_: object) -> None:
        threads.append(threading.current_thread().name)

    connection_created.connect(record)
    yield threads
    connection_created.disconnect(record)


@pytest.fixture
def on_kept_thread() -> Iterator[Callable[[Callable[[], Any]], Any]]:
    """Run a function through database_sync_to_async on a one-thread kept-connection pool."""
    executor = kept_connections_executor("test-db", 1)

    def run(func: Callable[[], Any]) -> Any:
        return DatabaseSyncToAsync(func, thread_sensitive=False, executor=executor)()

    yield run
    close_kept_connections()
    executor.shutdown()


def query() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


async def test_calls_reuse_the_threads_connection(on_kept_thread: Callable, opened: list[str]) -> None:
    for _ in range(3):
        await on_kept_thread(query)
    assert len(opened) == 1 and opened[0].startswith("test-db")


async def test_a_connection_past_its_age_is_replaced_at_the_next_call(
    on_kept_thread: Callable, opened: list[str],
) -> None:
    await on_kept_thread(query)

    def age() -> None:
        connection.close_at = time.monotonic() - 1  # as if KEPT_CONNECTION_MAX_AGE had passed

    await on_kept_thread(age)
    await on_kept_thread(query)
    assert len(opened) == 2 and all(name.startswith("test-db") for name in opened)


@pytest.mark.integration
async def test_a_kept_connection_survives_the_database_dropping_it(on_kept_thread: Callable) -> None:
    """PostgreSQL only: the server ends the kept connection (as a restart does); the next
    call notices (health check) and opens a new one instead of failing."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")

    def backend_pid() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return int(cursor.fetchone()[0])

    def terminate(pid: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])

    pid = await on_kept_thread(backend_pid)
    await DatabaseSyncToAsync(terminate, thread_sensitive=False)(pid)
    assert await on_kept_thread(backend_pid) != pid
