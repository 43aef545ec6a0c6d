"""PostgreSQL only: trigram indexes so searching transcripts ("kitchen light" anywhere in what
was said or replied) stays fast with millions of turns. The expressions match what Django's
`icontains` compiles to (UPPER(col::text) LIKE UPPER('%…%')). Other databases, or a role
that may not create the pg_trgm extension, keep working without them (searches then scan).
"""
from __future__ import annotations

import logging

from django.db import migrations, transaction

logger = logging.getLogger(__name__)

INDEXES = {
    "turn_user_text_trgm": "user_text",
    "turn_reply_text_trgm": "reply_text",
}


def create(apps, schema_editor) -> None:  # noqa: ANN001
    if schema_editor.connection.vendor != "postgresql":
        return
    try:
        with transaction.atomic(using=schema_editor.connection.alias):  # a savepoint: a refusal stays contained
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except Exception:
        logger.warning("pg_trgm not available: transcript search will scan the turns table")
        return
    for name, column in INDEXES.items():
        schema_editor.execute(
            f'CREATE INDEX IF NOT EXISTS {name} ON conversations_turn USING gin (UPPER("{column}"::text) gin_trgm_ops)'
        )


def drop(apps, schema_editor) -> None:  # noqa: ANN001
    if schema_editor.connection.vendor == "postgresql":
        for name in INDEXES:
            schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("conversations", "0004_turn_audio_review_retention")]
    operations = [migrations.RunPython(create, drop, elidable=False)]
