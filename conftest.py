"""Root fixtures and the integration-tier switch.

Tiers:
- unit (default): SQLite, in-memory channel layer, no external services.
- integration (`XIAOZHI_INTEGRATION=1` with DATABASE_URL=postgres://… and REDIS_URL=redis://…,
  as `.ci/run` sets): the whole suite runs on PostgreSQL and Redis, and tests marked
  `integration` run too. In that tier a missing service or a skipped integration test fails
  the run instead of passing silently.
"""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

INTEGRATION = os.environ.get("XIAOZHI_INTEGRATION") == "1"
HOW_TO_ENABLE = (
    "integration tier is off: start PostgreSQL and Redis and run with XIAOZHI_INTEGRATION=1 "
    "DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 "
    "make test (this is what .ci/run does)"
)


def _redis_reachable(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def _compile_translations() -> None:
    """Build the .mo catalogues from the committed .po files when they are missing or stale,
    as `make test` does, so a bare `pytest` (and the servers it starts) runs translated."""
    from django.conf import settings
    from django.core.management import call_command

    stale = [
        po for path in settings.LOCALE_PATHS for po in Path(path).glob("*/LC_MESSAGES/*.po")
        if not po.with_suffix(".mo").exists() or po.with_suffix(".mo").stat().st_mtime < po.stat().st_mtime
    ]
    if stale:
        locales = sorted({po.parent.parent.name for po in stale})
        with contextlib.chdir(settings.BASE_DIR):
            call_command("compilemessages", locale=locales, ignore_patterns=[".venv", "var", ".git"], verbosity=0)


def _redis_database_of_this_worker() -> None:
    """Under pytest-xdist (`make test` runs two processes) each test process takes its own Redis
    database, the base one + 1 + its index, so caches (rate limits), channel groups, live
    figures and Celery queues of the two never meet. Settings are already loaded here: the
    values built from REDIS_URL are rewritten, and the environment too, so the servers and
    Celery workers a test starts use the same database."""
    from urllib.parse import urlsplit, urlunsplit

    from django.conf import settings

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not settings.REDIS_URL:
        return
    parts = urlsplit(settings.REDIS_URL)
    base = int(parts.path.strip("/") or 0)
    url = urlunsplit(parts._replace(path=f"/{base + 1 + int(worker[2:])}"))
    os.environ["REDIS_URL"] = url
    for name in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
        if getattr(settings, name) == settings.REDIS_URL:
            setattr(settings, name, url)
            os.environ.pop(name, None)
    settings.CACHES["default"]["LOCATION"] = url
    layer: dict[str, Any] = settings.CHANNEL_LAYERS["default"]
    layer["CONFIG"]["hosts"][0]["address"] = url
    settings.REDIS_URL = url


def _celery_folder_of_this_process() -> None:
    """Without Redis, Celery's queue and results are files under one folder, and every worker
    polling it takes whatever message comes first. Two test processes (or `make run` in the
    same checkout) sharing it run each other's jobs against the wrong database: a sweep sent by
    one test process was taken by the other's worker and answered 0. Each test process gets a
    folder of its own, in the settings and the environment its Celery workers inherit."""
    import shutil
    import tempfile

    from django.conf import settings

    from xiaozhi_site.settings import filesystem_broker_options

    if not settings.CELERY_BROKER_URL.startswith("filesystem://"):
        return
    own = Path(tempfile.mkdtemp(prefix="xiaozhi-celery-"))
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = filesystem_broker_options(own)
    default_results = f"file://{settings.CELERY_DIR / 'results'}"
    if default_results == settings.CELERY_RESULT_BACKEND:  # not set apart from the folder
        settings.CELERY_RESULT_BACKEND = f"file://{own / 'results'}"
    settings.CELERY_DIR = own
    os.environ["XIAOZHI_CELERY_DIR"] = str(own)
    atexit.register(shutil.rmtree, own, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    _compile_translations()
    _redis_database_of_this_worker()
    _celery_folder_of_this_process()
    if not INTEGRATION:
        return
    from django.conf import settings

    problems = []
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        problems.append("DATABASE_URL must point to PostgreSQL")
    if not settings.REDIS_URL or not _redis_reachable(settings.REDIS_URL):
        problems.append("REDIS_URL must point to a running Redis")
    if problems:
        raise pytest.UsageError("XIAOZHI_INTEGRATION=1 but " + "; ".join(problems))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if INTEGRATION:
        return
    skip = pytest.mark.skip(reason=HOW_TO_ENABLE)
    for item in items:
        if "integration" in item.keywords:
            item.add_marker(skip)


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Tests marked `virtual_time` run on the virtual-time loop (testing/virtual_time.py)."""
    if item.get_closest_marker("virtual_time") is not None:
        from testing.virtual_time import VirtualTimeLoop

        return {"virtual_time": VirtualTimeLoop}
    return {"asyncio": asyncio.new_event_loop}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                               call: pytest.CallInfo) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    # With the tier on, nothing in it may be skipped: a skip would hide a broken service.
    if INTEGRATION and report.skipped and "integration" in item.keywords:
        report.outcome = "failed"
        report.longrepr = f"integration test skipped while XIAOZHI_INTEGRATION=1: {report.longrepr}"
    return report


@pytest.fixture(autouse=True, scope="session")
def _audio_writer_in_this_process() -> None:
    """Turn audio is written by a thread here: a writer process would read the settings'
    database, not the test database pytest-django substitutes in this process. The servers
    the end-to-end tests start keep the default (a writer process)."""
    from django.conf import settings

    settings.XIAOZHI_AUDIO_WRITER = "thread"


@pytest.fixture(autouse=True)
def _default_language() -> Iterator[None]:
    """A request with Accept-Language leaves its language active in the test's thread
    (LocaleMiddleware never deactivates it); reset so the next test starts in the default."""
    yield
    from django.utils import translation

    translation.deactivate()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    """pytest-django's, plus: the device threads' kept connections (xiaozhi_site/db_threads.py)
    are closed before the test database is dropped (PostgreSQL refuses while they are open)."""
    yield
    from xiaozhi_site.db_threads import close_kept_connections

    close_kept_connections()


@pytest.fixture
def redis_url() -> str:
    from django.conf import settings

    if not settings.REDIS_URL:
        pytest.skip(HOW_TO_ENABLE)
    return settings.REDIS_URL


@pytest.fixture(scope="module")
def fake() -> Iterator[Any]:
    """A local OpenAI-compatible server (testing/fake_openai.py) with the default scripted
    reply, shared by a module's tests (call `fake.reset()` per test where it matters). A
    module that needs other replies or a fresh server per test defines its own `fake`."""
    from testing.fake_openai import FakeOpenAI

    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def asgi_server_factory(transactional_db: None) -> Iterator:
    """Start real daphne servers sharing the test database; stopped after the test."""
    from django.db import connection

    from testing.server import AsgiServer, database_url

    servers: list[AsgiServer] = []

    def start(**env: str) -> AsgiServer:
        merged = {"DATABASE_URL": database_url(connection.settings_dict), **env}
        server = AsgiServer(env=merged).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def asgi_server(asgi_server_factory):  # noqa: ANN001, ANN201
    return asgi_server_factory()


@pytest.fixture
def browser_factory(tmp_path) -> Iterator:  # noqa: ANN001
    """`browser_factory(base_url, language="zh-CN", width=390)` → a headless Chromium
    (testing/browser.py); screenshots go to `<tmp_path>/screenshots`. Quit after the test."""
    from testing.browser import HOW_TO_INSTALL, Browser, chromium_available

    if not chromium_available():
        pytest.skip(HOW_TO_INSTALL)
    browsers: list[Browser] = []

    def make(base_url: str, **options: object) -> Browser:
        browser = Browser(base_url, tmp_path / "screenshots", **options)  # type: ignore[arg-type]
        browsers.append(browser)
        return browser

    yield make
    for browser in browsers:
        browser.close()


@pytest.fixture
def staff_user(transactional_db: None):  # noqa: ANN201
    """A superuser `alice` / `alice-password` in the committed test database."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_superuser("alice", "alice@example.com", "alice-password")


@pytest.fixture
def gateway_key(transactional_db: None) -> str:
    """An LLM Gateway API key (committed, so a server subprocess sees it) whose limits stay
    out of the way of tests about something else. Send it as `Authorization: Bearer <key>`
    or `?token=<key>`; tests of the keys themselves are in test_gateway_auth.py."""
    from conversations.gateway.keys import gateway_key_create

    return gateway_key_create(name="tests", requests_per_minute=100_000, max_connections=500)[1]


@pytest.fixture
def celery_worker_factory(transactional_db: None) -> Iterator:
    """`celery_worker_factory(**env)` starts a real Celery worker process (solo pool) on the
    test database, with extra environment; stopped after the test."""
    import subprocess
    import sys

    from django.db import connection

    from testing.server import BASE_DIR, database_url

    workers: list[subprocess.Popen] = []

    def start(**env: str) -> subprocess.Popen:
        merged = {**os.environ, "DATABASE_URL": database_url(connection.settings_dict), **env}
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "xiaozhi_site", "worker", "--pool=solo",
             "--without-mingle", "--without-gossip", "-l", "warning"],
            cwd=BASE_DIR, env=merged, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        workers.append(process)
        return process

    yield start
    for process in workers:
        process.terminate()
        process.wait(timeout=20)
