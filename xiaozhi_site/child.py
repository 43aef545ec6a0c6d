"""Start-up of the helper processes a web process spawns (the turn audio writer,
conversations/recording.py). A spawned child unpickles its initializer before anything else
runs, so this module must import without Django's apps being ready; the jobs it then runs
may import models."""
from __future__ import annotations

import os
import signal

import django


def django_child() -> None:
    """Django from the parent's settings module and environment (a spawned child inherits
    both), at background priority, keeping its database connections between jobs."""
    # Ctrl-C reaches the whole process group; the parent decides when its helper stops, after
    # the work it was given (the executor's exit joins the child).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _background_priority()
    django.setup()
    from django.db import connections  # noqa: PLC0415 - needs the settings django.setup() loaded

    for connection in connections.all(initialized_only=False):
        # One job after another in one process: reconnecting per job (CONN_MAX_AGE=0 suits
        # requests) would cost more than the job. Jobs call close_old_connections(), which
        # still replaces a connection that failed.
        connection.settings_dict["CONN_MAX_AGE"] = None


def _background_priority() -> None:
    # Helpers do work nobody waits for. On a busy machine the kernel must run the web
    # process (event loop, hearing threads) first: SCHED_IDLE gives the helper only the CPU
    # nobody else wants; where that policy does not exist, the lowest nice value.
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
