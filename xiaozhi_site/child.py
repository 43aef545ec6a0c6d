"""Start-up of the helper processes a web process spawns (the turn audio writer,
conversations/recording.py). A spawned child unpickles its initializer before anything else
runs, so this module must import without Django's apps being ready; the jobs it then runs
may import models."""
from __future__ import annotations

import signal

import django


def django_child() -> None:
    """Django from the parent's settings module and environment (a spawned child inherits both)."""
    # Ctrl-C reaches the whole process group; the parent decides when its helper stops, after
    # the work it was given (the executor's exit joins the child).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    django.setup()
