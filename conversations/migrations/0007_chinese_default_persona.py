"""Ship a Chinese persona (小智) beside the English default one (issue 12).

It speaks Mandarin with the Edge voice zh-CN-XiaoxiaoNeural and falls back to espeak-ng's
`cmn` voice offline (the espeak provider maps language zh to `cmn`). On a server whose
DJANGO_LANGUAGE_CODE is Chinese it also becomes the default persona, unless an operator has
already chosen a default other than the shipped English one.
"""
from __future__ import annotations

from django.conf import settings
from django.db import migrations

NAME = "小智"
PROMPT = (
    "你是{persona_name}，一个装在小设备里的语音助手，性格亲切、活泼。"
    "请用简短、口语化的句子回答，不要使用 Markdown、列表或代码。"
    "每次回答都以一个表示心情的表情符号开头。"
    "回答语言：{language}。当前时间：{current_time}。设备名称：{device_name}。所在位置：{location}。"
)


def create_chinese_persona(apps, schema_editor) -> None:  # noqa: ANN001
    Persona = apps.get_model("conversations", "Persona")
    persona, created = Persona.objects.get_or_create(
        name=NAME,
        defaults={
            "description": "默认的中文语音助手。",
            "system_prompt": PROMPT,
            "language": "zh",
            "voice": "zh-CN-XiaoxiaoNeural",
            "tts_providers": ["edge", "espeak"],
            "greeting": "你好，我在听。",
            "farewell": "再见！",
            "exit_phrases": ["再见", "拜拜", "退出", "退下吧", "goodbye"],
        },
    )
    if created and settings.LANGUAGE_CODE.lower().startswith("zh"):
        current = Persona.objects.filter(is_default=True)
        if not current.exists() or list(current.values_list("name", flat=True)) == ["Xiaozhi"]:
            current.update(is_default=False)
            Persona.objects.filter(pk=persona.pk).update(is_default=True)


class Migration(migrations.Migration):
    dependencies = [("conversations", "0006_translatable_labels")]
    operations = [migrations.RunPython(create_chinese_persona, migrations.RunPython.noop)]
