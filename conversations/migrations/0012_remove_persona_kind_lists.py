"""The personas' kind-list columns, replaced by PersonaProvider chains in 0011."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0011_provider_configs'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='persona',
            name='asr_providers',
        ),
        migrations.RemoveField(
            model_name='persona',
            name='llm_providers',
        ),
        migrations.RemoveField(
            model_name='persona',
            name='tts_providers',
        ),
    ]
