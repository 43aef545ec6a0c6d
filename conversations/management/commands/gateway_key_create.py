"""`manage.py gateway_key_create NAME`: create an LLM Gateway API key and print it (once).

For scripts and headless set-ups; the admin does the same under "Gateway API keys".
"""
from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from conversations.gateway.keys import gateway_key_create
from conversations.models import Persona


class Command(BaseCommand):
    help = "Create an LLM Gateway API key; prints the key, which is not stored and cannot be shown again."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="who or what uses the key")
        parser.add_argument("--requests-per-minute", type=int, default=60)
        parser.add_argument("--max-connections", type=int, default=5)
        parser.add_argument("--persona", help="name of a persona whose prompt the key's connections use")

    def handle(self, *args: Any, **options: Any) -> None:
        persona = None
        if options["persona"]:
            persona = Persona.objects.filter(name=options["persona"]).first()
            if persona is None:
                raise CommandError(f"no persona named {options['persona']!r}")
        try:
            _, secret = gateway_key_create(
                name=options["name"],
                persona=persona,
                requests_per_minute=options["requests_per_minute"],
                max_connections=options["max_connections"],
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        self.stdout.write(secret)
