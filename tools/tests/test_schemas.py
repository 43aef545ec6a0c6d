"""tools.schemas: hostile parameter schemas are refused with a clear reason or used safely.

The recording server stands in for an internal service: a schema that makes us fetch it
would leak its content into error messages and stall on a slow target.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.errors import SchemaRefused
from tools.schemas import compile_schema, first_error
from tools.tests.hostile import ARGUMENTS, Hostile, RecordingServer, hostile_schemas, recording_server

LIMITS = {"max_bytes": 64 * 1024, "max_depth": 32}
CORPUS = hostile_schemas("http://127.0.0.1:9")  # only for the ids; each test uses its own server


@pytest.fixture
def recorder() -> Iterator[RecordingServer]:
    with recording_server() as server:
        yield server


def _case(name: str, base: str) -> Hostile:
    return next(h for h in hostile_schemas(base) if h.name == name)


def _in_thread(func, *args):  # type: ignore[no-untyped-def]
    # A regression to a backtracking engine must fail the test, not hang the suite.
    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(func, *args).result(timeout=60)
    finally:
        pool.shutdown(wait=False)


@pytest.mark.parametrize("name", [h.name for h in CORPUS])
def test_hostile_schemas_are_refused_with_a_reason_or_validate_without_fetching(
    name: str, recorder: RecordingServer
) -> None:
    case = _case(name, recorder.url)
    if case.refusal is not None:
        with pytest.raises(SchemaRefused) as refused:
            compile_schema(case.schema, **LIMITS)
        assert refused.value.message == case.refusal
        assert "7f3a" not in str(refused.value)  # nothing read from the target is quoted
    else:
        validator = compile_schema(case.schema, **LIMITS)
        valid, invalid = ARGUMENTS[name]
        assert _in_thread(first_error, validator, valid) is None
        assert _in_thread(first_error, validator, invalid) is not None
    assert recorder.requests == []


def test_a_refusal_says_where_the_problem_is(recorder: RecordingServer) -> None:
    with pytest.raises(SchemaRefused) as refused:
        compile_schema(_case("remote_ref", recorder.url).schema, **LIMITS)
    assert refused.value.details == f"/properties/q: $ref '{recorder.url}/secret.json' is not a local reference ('#/…')"
    with pytest.raises(SchemaRefused) as refused:
        compile_schema(_case("backreference_pattern", recorder.url).schema, **LIMITS)
    assert refused.value.details.startswith("/properties/q: '(a)\\\\1' (invalid escape sequence")


def test_a_catastrophic_pattern_is_matched_in_linear_time() -> None:
    # Python's re needs seconds at 26 characters and doubles per character; RE2 does not care.
    validator = compile_schema({"type": "object", "properties": {"q": {"pattern": "^(a+)+$"}}}, **LIMITS)
    error = _in_thread(first_error, validator, {"q": "a" * 1_000_000 + "!"})
    assert error is not None and "does not match" in error.message


def test_patterns_follow_json_schema_semantics_under_re2() -> None:
    schema = {"type": "object", "properties": {
        "word": {"type": "string", "pattern": "^\\p{L}+$"},  # ECMA-262 Unicode classes work
        "code": {"type": "string", "pattern": "[0-9]{3}"},  # unanchored: search, not match
    }}  # fmt: skip
    validator = compile_schema(schema, **LIMITS)
    assert first_error(validator, {"word": "天气", "code": "ab123cd"}) is None
    assert first_error(validator, {"word": "天气1"}) is not None
    assert first_error(validator, {"code": "12"}) is not None


def test_pattern_properties_and_additional_properties_use_re2() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}},
              "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False}  # fmt: skip
    validator = compile_schema(schema, **LIMITS)
    assert first_error(validator, {"name": "a", "x-one": 1}) is None
    assert "is not of type 'integer'" in first_error(validator, {"x-one": "1"}).message  # type: ignore[union-attr]
    assert first_error(validator, {"other": 1}).message == "Additional properties are not allowed ('other' unexpected)"  # type: ignore[union-attr]
    typed = compile_schema({**schema, "additionalProperties": {"type": "boolean"}}, **LIMITS)
    assert first_error(typed, {"flag": True}) is None and first_error(typed, {"flag": 1}) is not None


def test_a_draft_7_schema_is_validated_as_draft_7_and_an_unknown_draft_as_2020_12() -> None:
    tuple_items = {"type": "object", "properties": {"items": {"type": "array", "items": [{"type": "integer"}]}}}
    draft7 = compile_schema({"$schema": "http://json-schema.org/draft-07/schema#", **tuple_items}, **LIMITS)
    assert first_error(draft7, {"items": [1, "x"]}) is None and first_error(draft7, {"items": ["x"]}) is not None
    with pytest.raises(SchemaRefused):  # 2020-12: `items` must be a schema, not an array
        compile_schema({"$schema": "https://example.invalid/unknown", **tuple_items}, **LIMITS)


@pytest.mark.parametrize(("levels", "accepted"), [(31, True), (32, False)])
def test_the_depth_cap_counts_nested_objects_and_arrays(levels: int, accepted: bool) -> None:
    schema: dict = {}
    for _ in range(levels):
        schema = {"not": schema}
    # `levels` wrappers around the innermost object: levels + 1 nested objects in all.
    if accepted:
        compile_schema(schema, max_bytes=LIMITS["max_bytes"], max_depth=32)
    else:
        with pytest.raises(SchemaRefused, match="nested too deeply"):
            compile_schema(schema, max_bytes=LIMITS["max_bytes"], max_depth=32)


def test_a_schema_nested_past_the_interpreter_recursion_limit_is_refused_not_crashed() -> None:
    schema: dict = {}
    for _ in range(5000):  # built in Python: json.loads itself stops near 1000 levels
        schema = {"not": schema}
    with pytest.raises(SchemaRefused, match="nested too deeply"):
        compile_schema(schema, **LIMITS)


def test_the_size_cap_counts_utf8_bytes() -> None:
    schema = {"type": "object", "description": "天" * 400}  # 1,200 bytes of text
    compile_schema(schema, max_bytes=1300, max_depth=32)
    with pytest.raises(SchemaRefused, match="too large"):
        compile_schema(schema, max_bytes=1000, max_depth=32)


def test_refusals_are_remembered_like_validators() -> None:
    bad = {"type": "object", "properties": {"q": {"$ref": "#/nowhere"}}}
    with pytest.raises(SchemaRefused) as first:
        compile_schema(bad, **LIMITS)
    with pytest.raises(SchemaRefused) as second:
        compile_schema(json.loads(json.dumps(bad)), **LIMITS)
    assert second.value is first.value


# -- fuzz: any JSON as a schema, any JSON as arguments ------------------------------------------

KEYWORDS = ["type", "properties", "items", "prefixItems", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
            "$ref", "$defs", "definitions", "$id", "$anchor", "$dynamicRef", "$dynamicAnchor", "pattern",
            "patternProperties", "additionalProperties", "unevaluatedProperties", "required", "enum", "const",
            "format", "minimum", "maxLength", "$schema", "dependentSchemas", "propertyNames", "contains"]  # fmt: skip
REFS = ["#", "#/$defs/a", "#/properties/x", "#a", "#/definitions/b", "http://127.0.0.1:9/x", "file:///etc/passwd"]
SCALARS = st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(
    ["object", "string", "integer", "array", "^a+$", "(a)\\1", "a{1000}", "date-time", *REFS])
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from([*KEYWORDS, "a", "b", "x"]), inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=JSON, instance=JSON)
def test_any_json_is_either_refused_or_validates_any_arguments_without_raising(schema: object,
                                                                              instance: object) -> None:
    try:
        validator = compile_schema(schema, **LIMITS)
    except SchemaRefused:
        return
    first_error(validator, instance)  # must not raise (no fetch, no recursion, no crash)
