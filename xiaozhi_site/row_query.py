"""One row by one column, with the ORM's SQL built once instead of on every call.

A reboot storm reads the device row by its MAC twice per device (the OTA check, then the
WebSocket authentication), thousands of times a second. `Model.objects.filter(...)[:1]` spends
most of its ~0.5 ms building the same SQL (query, compiler, expressions) every time; the query
itself is microseconds. `OneRow` asks the ORM for that SQL once per database connection, then
runs it with the value and builds the instance exactly as the ORM's iterator does (the same
converters, `Model.from_db`), so the result is the ORM's: same fields, same types, deferred
nothing, `_state.db` set.

The plan is kept per database alias (the SQL is its backend's); every call runs it on the
calling thread's own connection. The backend's converters are bound to the connection the
plan was built on, and read only what every connection of the alias shares (the time zone
from settings), as they would for any thread.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, TypeVar, cast

from django.db import connections, router
from django.db.models import Field, Model

M = TypeVar("M", bound=Model)

_SENTINEL = "\x00one-row-parameter\x00"


@dataclass(frozen=True)
class _Plan:
    sql: str
    init_list: list[str]
    converters: list[tuple[int, tuple[list[Any], Any]]]  # (column, (converters, expression))


class OneRow(Generic[M]):
    """`model.objects.filter(<field>=value).order_by()[:1]`, as an instance or None."""

    def __init__(self, model: type[M], field: str) -> None:
        self.model = model
        self._lookup = field
        self._plans: dict[str, _Plan] = {}

    @cached_property
    def field(self) -> Field:  # looked up at first use: the app registry is ready by then
        return cast(Field, self.model._meta.get_field(self._lookup))

    def get(self, value: object) -> M | None:
        alias = router.db_for_read(self.model)
        connection = connections[alias]
        plan = self._plans.get(alias)
        if plan is None:
            plan = self._plans[alias] = self._plan(alias)
        param = self.field.get_db_prep_value(self.field.get_prep_value(value), connection, prepared=True)
        with connection.cursor() as cursor:
            cursor.execute(plan.sql, (param,))
            row = cursor.fetchone()
        if row is None:
            return None
        values = list(row)
        for position, (converters, expression) in plan.converters:  # SQLCompiler.apply_converters
            for converter in converters:
                values[position] = converter(values[position], expression, connection)
        return self.model.from_db(alias, plan.init_list, values)  # type: ignore[return-value]

    def _plan(self, alias: str) -> _Plan:
        queryset = self.model._default_manager.using(alias).filter(**{self._lookup: _SENTINEL}).order_by()[:1]
        compiler = queryset.query.get_compiler(using=alias)
        sql, params = compiler.as_sql()
        if list(params) != [_SENTINEL]:  # e.g. a backend that inlines or transforms the value
            raise RuntimeError(f"OneRow cannot prepare {self.model.__name__}.{self._lookup}: parameters {params!r}")
        select, klass_info = compiler.select, compiler.klass_info
        fields = klass_info["select_fields"]
        if fields != list(range(len(select))):  # only the model's own columns, in order
            raise RuntimeError(f"OneRow expects the model's columns only, got {klass_info!r}")
        init_list = [column[0].target.attname for column in select]
        converters = compiler.get_converters([column[0] for column in select])
        return _Plan(sql, init_list, list(converters.items()))
