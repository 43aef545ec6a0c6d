"""Server settings for the benchmarks: the normal settings plus one log handler.

The pipeline logs per-session figures (e.g. "hearing stats": uplink packets, drops and the
arrival → decoded-and-VAD-checked lag histogram) with their numbers in `extra`, which the
plain console format leaves out. Benchmarks start the server with
DJANGO_SETTINGS_MODULE=bench.server_settings and BENCH_STATS_FILE=<path>, and this handler
writes those records, extras included, as JSON lines to that file. Nothing else changes.
"""
from __future__ import annotations

import json
import logging
import os

from xiaozhi_site.settings import *  # noqa: F403
from xiaozhi_site.settings import LOGGING

STATS_MESSAGES = ("hearing stats",)
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class StatsFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg in STATS_MESSAGES


class JsonExtraFormatter(logging.Formatter):
    """One JSON object per record: time, logger, message and every `extra` field."""

    def format(self, record: logging.LogRecord) -> str:
        extra = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        return json.dumps({"t": record.created, "logger": record.name, "message": record.getMessage(), **extra},
                          default=str)


LOGGING = {
    **LOGGING,
    "filters": {"bench_stats": {"()": StatsFilter}},
    "formatters": {**LOGGING["formatters"], "bench_json": {"()": JsonExtraFormatter}},
    "handlers": {
        **LOGGING["handlers"],
        "bench_stats": {
            "class": "logging.FileHandler", "filename": os.environ.get("BENCH_STATS_FILE", os.devnull),
            "formatter": "bench_json", "filters": ["bench_stats"],
        },
    },
    "loggers": {
        **LOGGING.get("loggers", {}),
        "conversations.pipeline": {"handlers": ["bench_stats"], "level": "INFO"},
    },
}
