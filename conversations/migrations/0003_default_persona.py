from __future__ import annotations

from django.db import migrations


def create_default_persona(apps, schema_editor) -> None:
    Persona = apps.get_model("conversations", "Persona")
    if not Persona.objects.filter(is_default=True).exists():
        Persona.objects.get_or_create(
            name="Xiaozhi",
            defaults={
                "description": "The default friendly assistant.",
                "is_default": True,
                "greeting": "Hi, I'm listening.",
                "exit_phrases": ["goodbye", "bye bye", "再见", "退出"],
            },
        )


class Migration(migrations.Migration):
    dependencies = [("conversations", "0002_initial")]
    operations = [migrations.RunPython(create_default_persona, migrations.RunPython.noop)]
