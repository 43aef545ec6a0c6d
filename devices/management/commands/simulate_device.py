"""`manage.py simulate_device`: run one simulated Xiaozhi device turn against a server.

Thin wrapper: all logic lives in simulator/cli.py (Django-free).
"""
from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from simulator import cli


class Command(BaseCommand):
    help = (
        "Simulate a Xiaozhi ESP32 device: OTA check, WebSocket hello, MCP, one voice turn "
        "(--wav, --say or --detect); exits non-zero if the turn does not complete."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        cli.add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        result = cli.run(options, out=self.stdout.write)
        if result.code:
            raise CommandError(result.message, returncode=result.code)
