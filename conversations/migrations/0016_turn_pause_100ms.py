"""Smart turn detection asks the model after 100 ms of quiet instead of 200 ms.

Measured with bench/p9_turn_taking.py on two 2-core machines (docs/performance.md, P9): at
100 ms no paused sentence was cut and complete turns ended 330-470 ms sooner than the 600 ms
window; at 200 ms 269-352 ms sooner, and one run of three on the faster machine cut 2 of 10
paused sentences at a natural pause. Personas still at the old default move with it.
"""
from django.db import migrations, models
import django.core.validators


def forwards(apps, schema_editor):
    apps.get_model("conversations", "Persona").objects.filter(turn_pause_ms=200).update(turn_pause_ms=100)


def backwards(apps, schema_editor):
    apps.get_model("conversations", "Persona").objects.filter(turn_pause_ms=100).update(turn_pause_ms=200)


class Migration(migrations.Migration):

    dependencies = [
        ("conversations", "0015_llm_model_help_texts"),
    ]

    operations = [
        migrations.AlterField(
            model_name="persona",
            name="turn_pause_ms",
            field=models.PositiveIntegerField(
                default=100,
                help_text="Smart turn detection: the quiet after which the end-of-turn model is asked.",
                validators=[django.core.validators.MinValueValidator(60), django.core.validators.MaxValueValidator(2000)],
                verbose_name="pause before asking (ms)",
            ),
        ),
        migrations.RunPython(forwards, backwards),
    ]
