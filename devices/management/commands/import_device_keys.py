"""Import per-device HMAC keys (Activation-Version 2) from a CSV of serial_number,key_hex."""
from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from devices.services import device_keys_import, device_keys_parse_csv


class Command(BaseCommand):
    help = "Import device HMAC keys from a CSV file (serial_number,key_hex; header optional)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("csv_path", type=Path)

    def handle(self, *args: object, csv_path: Path, **options: object) -> None:
        try:
            text = csv_path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(_("Cannot read %(path)s: %(error)s") % {"path": csv_path, "error": exc}) from None
        rows, errors = device_keys_parse_csv(text=text)
        result = device_keys_import(rows=rows)
        for error in [*errors, *result.errors]:
            self.stderr.write(error)
        self.stdout.write(_("Imported keys: %(created)d new, %(updated)d replaced.") % {
            "created": result.created, "updated": result.updated})
        if errors or result.errors:
            failed = len(errors) + len(result.errors)
            message = ngettext("%(count)d line was not imported.", "%(count)d lines were not imported.", failed)
            raise CommandError(message % {"count": failed})
