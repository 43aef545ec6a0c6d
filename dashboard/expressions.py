"""SQL for reading single values out of Turn's JSON columns, so figures never parse whole
JSON documents in Python (the last hour can hold thousands of turns)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db.models import F, FloatField, Func

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models.sql.compiler import SQLCompiler


class JsonNumber(Func):
    """The number under `key` of a JSON object column; NULL for anything else (a missing key,
    a string, a list instead of an object), never an error, so one odd row cannot break a page.
    PostgreSQL and SQLite, the two databases the project runs on."""

    output_field = FloatField()

    def __init__(self, column: str, key: str) -> None:
        if not key.replace("_", "").isalnum():
            raise ValueError("JSON keys here are identifiers")
        self.key = key
        super().__init__(F(column))

    def as_postgresql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper,
                      **extra: Any) -> tuple[str, tuple[Any, ...]]:
        column, params = compiler.compile(self.source_expressions[0])
        sql = f"CASE WHEN jsonb_typeof({column} -> %s) = 'number' THEN ({column} ->> %s)::double precision END"
        return sql, (*params, self.key, *params, self.key)

    def as_sqlite(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper,
                  **extra: Any) -> tuple[str, tuple[Any, ...]]:
        column, params = compiler.compile(self.source_expressions[0])
        path = f'$."{self.key}"'
        sql = f"CASE WHEN json_type({column}, %s) IN ('integer', 'real') THEN json_extract({column}, %s) END"
        return sql, (*params, path, *params, path)

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, function: str | None = None,
               template: str | None = None, arg_joiner: str | None = None,
               **extra: Any) -> tuple[str, tuple[Any, ...]]:
        raise NotImplementedError(f"JsonNumber supports PostgreSQL and SQLite, not {connection.vendor}")
