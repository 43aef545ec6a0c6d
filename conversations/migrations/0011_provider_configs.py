"""Provider configurations as records (issue 14): ProviderConfig and the ordered
PersonaProvider chains, seeded from what the environment and the personas' kind lists said.

Each kind known when this migration was written gets one configuration whose fields are
empty (so it keeps following LLM_BASE_URL, LLM_MODEL, … at run time) and whose API key, if
the kind has one, is a reference (`env:LLM_API_KEY`): no secret is copied into the
database. Each persona's kind lists become chains over those configurations, in the same
order; a kind without an entry here (a plugin's) gets a configuration named after it.
The kind-list columns go in 0012, a migration of their own (PostgreSQL refuses to alter a
table with pending deferred-constraint events in the same transaction).
"""

import conversations.models
import django.core.validators
import django.db.models.deletion
from django.db import migrations, models


# A frozen copy of conversations.provider_configs.ENV_DEFAULTS: (stage, kind) -> (name, key).
ENV_DEFAULTS = {
    ("asr", "faster_whisper"): ("Whisper (local)", ""),
    ("asr", "openai"): ("ASR OpenAI-compatible (environment)", "env:ASR_OPENAI_API_KEY"),
    ("llm", "openai"): ("LLM (environment)", "env:LLM_API_KEY"),
    ("tts", "edge"): ("Edge TTS", ""),
    ("tts", "openai"): ("TTS OpenAI-compatible (environment)", "env:TTS_OPENAI_API_KEY"),
    ("tts", "piper"): ("Piper (offline)", ""),
    ("tts", "espeak"): ("espeak-ng (offline)", ""),
}
STAGE_FIELDS = {"asr": "asr_providers", "llm": "llm_providers", "tts": "tts_providers"}


def seed_provider_configs(apps, schema_editor) -> None:  # noqa: ANN001
    ProviderConfig = apps.get_model("conversations", "ProviderConfig")
    Persona = apps.get_model("conversations", "Persona")
    PersonaProvider = apps.get_model("conversations", "PersonaProvider")

    def config_for(stage: str, kind: str):  # noqa: ANN202
        name, key = ENV_DEFAULTS.get((stage, kind), (f"{stage.upper()} {kind}", ""))
        config, _ = ProviderConfig.objects.get_or_create(
            name=name, defaults={"stage": stage, "kind": kind, "api_key": key})
        return config

    for stage, kind in ENV_DEFAULTS:
        config_for(stage, kind)
    for persona in Persona.objects.all():
        for stage, field in STAGE_FIELDS.items():
            kinds = getattr(persona, field) or []
            kinds = [kind for kind in kinds if isinstance(kind, str) and kind] if isinstance(kinds, list) else []
            for position, kind in enumerate(dict.fromkeys(kinds)):
                PersonaProvider.objects.get_or_create(
                    persona=persona, config=config_for(stage, kind), defaults={"position": position})


def unseed_provider_configs(apps, schema_editor) -> None:  # noqa: ANN001
    """Back to kind lists: each persona's chains as the kinds of their configurations."""
    Persona = apps.get_model("conversations", "Persona")
    PersonaProvider = apps.get_model("conversations", "PersonaProvider")
    for persona in Persona.objects.all():
        for stage, field in STAGE_FIELDS.items():
            links = PersonaProvider.objects.filter(persona=persona, config__stage=stage).order_by("position", "pk")
            kinds = list(dict.fromkeys(link.config.kind for link in links))
            if kinds:
                setattr(persona, field, kinds)
        persona.save()


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0010_default_persona_piper'),
    ]

    operations = [
        migrations.CreateModel(
            name='ProviderConfig',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True, verbose_name='name')),
                ('stage', models.CharField(choices=[('asr', 'Speech recognition (ASR)'), ('llm', 'Language model (LLM)'), ('tts', 'Speech synthesis (TTS)'), ('vision', 'Vision')], max_length=10, verbose_name='stage')),
                ('kind', models.CharField(help_text='The provider implementation.', max_length=40, verbose_name='kind')),
                ('base_url', models.CharField(blank=True, help_text="e.g. https://api.deepseek.com/v1. Empty: the environment's default for this kind.", max_length=300, validators=[conversations.models.validate_base_url], verbose_name='base URL')),
                ('api_key', models.CharField(blank=True, max_length=500, validators=[conversations.models.validate_api_key], verbose_name='API key')),
                ('model', models.CharField(blank=True, help_text='LLM: the model name; ASR faster_whisper: a model directory. Empty: the default.', max_length=200, verbose_name='model')),
                ('voice', models.CharField(blank=True, help_text='TTS: used when the persona names no voice.', max_length=100, verbose_name='voice')),
                ('timeout', models.FloatField(blank=True, help_text="Empty: the stage's default (ASR_TIMEOUT, LLM_TIMEOUT, TTS_TIMEOUT).", null=True, validators=[django.core.validators.MinValueValidator(0.5), django.core.validators.MaxValueValidator(600.0)], verbose_name='timeout (seconds)')),
                ('options', models.JSONField(blank=True, default=dict, help_text='Options only this kind understands, as a JSON object.', verbose_name='options')),
                ('created_at', models.DateTimeField(auto_now_add=True, verbose_name='created at')),
                ('updated_at', models.DateTimeField(auto_now=True, verbose_name='updated at')),
            ],
            options={
                'verbose_name': 'provider configuration',
                'verbose_name_plural': 'provider configurations',
                'ordering': ['stage', 'name'],
            },
        ),
        migrations.CreateModel(
            name='PersonaProvider',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('position', models.PositiveSmallIntegerField(default=0, verbose_name='position')),
                ('persona', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='provider_links', to='conversations.persona', verbose_name='persona')),
                ('config', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='persona_links', to='conversations.providerconfig', verbose_name='provider configuration')),
            ],
            options={
                'verbose_name': 'provider in the chain',
                'verbose_name_plural': 'providers in the chain',
                'ordering': ['persona', 'position', 'pk'],
                'constraints': [models.UniqueConstraint(fields=('persona', 'config'), name='persona_provider_once')],
            },
        ),
        migrations.RunPython(seed_provider_configs, unseed_provider_configs),
    ]
