"""The default persona speaks Edge online, then Piper offline, then espeak-ng (issue 14).

Only the shipped English persona changes, and only while its TTS list is still the shipped
["edge", "espeak"]: an operator's own choice is kept. The Chinese persona keeps its list,
since Piper has no bundled Chinese voice (it would only fail over to espeak-ng).
"""
from __future__ import annotations

from django.db import migrations

OLD = ["edge", "espeak"]
NEW = ["edge", "piper", "espeak"]


def add_piper(apps, schema_editor) -> None:
    Persona = apps.get_model("conversations", "Persona")
    for persona in Persona.objects.filter(name="Xiaozhi"):
        if persona.tts_providers == OLD:
            persona.tts_providers = NEW
            persona.save(update_fields=["tts_providers"])


def remove_piper(apps, schema_editor) -> None:
    Persona = apps.get_model("conversations", "Persona")
    for persona in Persona.objects.filter(name="Xiaozhi"):
        if persona.tts_providers == NEW:
            persona.tts_providers = OLD
            persona.save(update_fields=["tts_providers"])


class Migration(migrations.Migration):
    dependencies = [("conversations", "0009_dashboard_indexes")]
    operations = [migrations.RunPython(add_piper, remove_piper)]
