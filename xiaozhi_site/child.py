"""Start-up of the helper processes a web process spawns (the turn audio writer,
conversations/recording.py). A spawned child unpickles its initializer before anything else
runs, so this module must import without Django's apps being ready; the jobs it then runs
may import models."""
from __future__ import annotations

import os
import signal
import threading
import time

import django


def django_child() -> None:
    """Django from the parent's settings module and environment (a spawned child inherits
    both), at background priority, keeping its database connections between jobs (db_threads.py)."""
    # Ctrl-C reaches the whole process group; the parent decides when its helper stops, after
    # the work it was given (the executor's exit joins the child).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent()
    _background_priority()
    django.setup()
    from xiaozhi_site.db_threads import keep_connections  # noqa: PLC0415 - after django.setup()

    # One job after another in one process: reconnecting per job (CONN_MAX_AGE=0 suits
    # requests) would cost more than the job; kept connections are still replaced when old
    # or broken.
    keep_connections()


def _exit_with_parent() -> None:
    # A pool's child holds both ends of its own job queue, so it never sees the queue close
    # when the parent is killed (SIGKILL, out of memory): without this it would outlive it,
    # holding a database connection.
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _background_priority() -> None:
    # Helpers do work nobody waits for. On a busy machine the kernel must run the web
    # process (event loop, hearing threads) first: SCHED_IDLE gives the helper only the CPU
    # nobody else wants; where that policy does not exist, the lowest nice value.
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
