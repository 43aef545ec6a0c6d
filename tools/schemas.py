"""Tool parameter schemas from untrusted sources, checked once and validated safely.

Gateway clients, devices and remote MCP servers send JSON Schemas that we compile and later
validate the LLM's arguments against. Left to itself, jsonschema would fetch a `$ref` to
`http://…` or `file:///…` (with no timeout, on the event loop, and quote what it read in
its error), recurse until RecursionError on a deep schema, and match `pattern` with
Python's backtracking `re`, where a crafted pattern takes seconds per character. Here:

- size and nesting are capped before anything else looks at the schema;
- only references inside the schema itself (`#…`) are accepted, and the validator's
  registry refuses every retrieval anyway, so nothing is ever fetched or read from disk;
- references must resolve, must not form cycles and must not expand the schema past a
  budget (tools/schema_inspect.py), so validating any instance takes bounded time;
- patterns are compiled and matched with RE2 (google-re2: linear time, no backtracking);
  a pattern RE2 cannot run (look-around, back-references) is refused with a clear reason;
- the schema must pass its draft's metaschema (`check_schema`).

`compile_schema` raises `SchemaRefused` or returns a validator, and remembers the outcome
per distinct schema (every device of a firmware lists the same ones). It costs up to tens of
milliseconds for a big schema, so callers run it in `SCHEMA_EXECUTOR` (`in_schema_thread`),
as they do argument validation, never on the event loop.
"""
from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import re2
from jsonschema import Draft202012Validator, FormatChecker, ValidationError
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import (
    Draft4Validator,
    Draft6Validator,
    Draft7Validator,
    Draft201909Validator,
    extend,
    validator_for,
)
from referencing import Registry
from referencing.exceptions import NoSuchResource

from tools.errors import SchemaRefused
from tools.schema_inspect import inspect_schema

_T = TypeVar("_T")

_MAX_CACHED = 2048

# Schema work of every session shares two threads: a schema that is slow to check can only
# delay other schema work, never the event loop or the audio pools.
SCHEMA_EXECUTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tool-schema")


async def in_schema_thread(func: Callable[..., _T], *args: Any) -> _T:
    """Run schema work (compiling, validating) off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(SCHEMA_EXECUTOR, func, *args)


# -- regular expressions (RE2) ---------------------------------------------------------------

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is reported to the sender, not to stderr


@functools.lru_cache(maxsize=1024)
def regex(pattern: str) -> Any:
    """The compiled RE2 pattern; `re2.error` if RE2 cannot run it."""
    return re2.compile(pattern, options=_RE2_OPTIONS)


def _re2_compiles(value: object) -> bool:
    if isinstance(value, str):
        regex(value)
    return True


def _pattern(validator: Any, pattern: str, instance: object, schema: dict) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: dict, instance: object, schema: dict) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():  # type: ignore[attr-defined]
            if regex(pattern).search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, allowed: object, instance: object,
                           schema: dict) -> Iterator[ValidationError]:
    """jsonschema's `additionalProperties`, with patternProperties matched by RE2."""
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = [regex(p) for p in schema.get("patternProperties", {})]
    extras = sorted(
        (k for k in instance if k not in properties and not any(p.search(k) for p in patterns)),  # type: ignore[attr-defined]
        key=str,
    )
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)  # type: ignore[index]
    elif not allowed and extras:
        joined = ", ".join(repr(extra) for extra in extras)
        yield ValidationError(f"Additional properties are not allowed ({joined} unexpected)")


_SAFE_KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}


def _meta_format_checker(cls: Any) -> FormatChecker:
    """The draft's format checker for `check_schema`, with `regex` judged by RE2, so a
    pattern is accepted exactly when it will be matched later."""
    checker = FormatChecker(formats=())
    checker.checkers = {**cls.FORMAT_CHECKER.checkers, "regex": (_re2_compiles, re2.error)}
    return checker


# Draft 3 is left out on purpose: its legacy keywords match patterns with Python's `re`
# (validator_for returns Draft3Validator only for its own $schema).
_SAFE_VALIDATORS: dict[type, tuple[Any, FormatChecker]] = {
    cls: (extend(cls, _SAFE_KEYWORDS), _meta_format_checker(cls))
    for cls in (Draft4Validator, Draft6Validator, Draft7Validator, Draft201909Validator, Draft202012Validator)
}


def _refuse_retrieval(uri: str) -> Any:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # referencing's attrs-made __init__ is invisible to mypy


# Resolves nothing but the schema itself (and jsonschema's bundled metaschemas): no network,
# no files, whatever a `$ref` or `$id` says.
NO_RETRIEVAL = Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]


# -- checking ---------------------------------------------------------------------------------


def compile_schema(schema: object, *, max_bytes: int, max_depth: int) -> Validator:
    """A validator for `schema` (a JSON object); SchemaRefused saying why not. Cached."""
    if not isinstance(schema, dict):
        raise SchemaRefused("Tool parameters must be a JSON Schema object")
    try:
        text = json.dumps(schema, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except RecursionError:
        raise SchemaRefused("Tool parameters are nested too deeply", f"more than {max_depth} levels") from None
    except (TypeError, ValueError):
        raise SchemaRefused("Tool parameters are not JSON") from None
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise SchemaRefused("Tool parameters are too large", f"{size} bytes; the limit is {max_bytes}")
    key = f"{max_depth}:{text}"
    with _lock:
        outcome = _cache.get(key)
    if outcome is None:
        outcome = _check(schema, max_depth)
        with _lock:
            if len(_cache) >= _MAX_CACHED:
                _cache.pop(next(iter(_cache)))
            _cache[key] = outcome
    if isinstance(outcome, SchemaRefused):
        raise outcome
    return outcome


_lock = threading.Lock()
_cache: dict[str, Validator | SchemaRefused] = {}


def _check(schema: dict, max_depth: int) -> Validator | SchemaRefused:
    try:
        _check_patterns(inspect_schema(schema, max_depth))
    except SchemaRefused as refused:
        return refused
    if not isinstance(schema.get("$schema", ""), str):
        return SchemaRefused("Tool parameters are not a valid JSON Schema", "$schema must be a string")
    base = validator_for(schema, default=Draft202012Validator)  # an unknown $schema: 2020-12
    if base not in _SAFE_VALIDATORS:
        return SchemaRefused("Tool parameters use an unsupported JSON Schema draft", f"$schema {schema['$schema']!r}")
    cls, meta_formats = _SAFE_VALIDATORS[base]
    try:
        cls.check_schema(schema, format_checker=meta_formats)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        return SchemaRefused("Tool parameters are not a valid JSON Schema", f"{where}: {exc.message}")
    return cls(schema, registry=NO_RETRIEVAL)  # type: ignore[no-any-return]


def _check_patterns(patterns: list[tuple[str, str]]) -> None:
    for where, pattern in patterns:
        try:
            regex(pattern)
        except re2.error as exc:
            reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
            raise SchemaRefused(
                "Tool parameters use a pattern the server cannot run",
                f"{where or '(root)'}: {pattern[:100]!r} ({reason}; look-around and back-references are not supported)",
            ) from None


def first_error(validator: Validator, instance: Any) -> ValidationError | None:  # any parsed JSON
    """The first validation error, or None (run it in the schema thread)."""
    return next(iter(validator.iter_errors(instance)), None)
