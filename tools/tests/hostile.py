"""Hostile tool schemas and a loopback HTTP server that records whether anyone fetched them.

Shared by the tools and gateway tests: every source of tool schemas (gateway clients,
devices, remote MCP servers) is fed the same corpus, and each test ends by asserting that
the recording server saw no request at all.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SECRET_SCHEMA = {"type": "string", "description": "internal secret 7f3a"}


class RecordingServer:
    """Answers every GET with a schema (as an internal service would) and records it."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                recorder.requests.append(self.path)
                body = json.dumps(SECRET_SCHEMA).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    def start(self) -> RecordingServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def recording_server() -> Iterator[RecordingServer]:
    server = RecordingServer().start()
    try:
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class Hostile:
    name: str
    schema: Any
    refusal: str | None  # the SchemaRefused message, or None when the schema is accepted


def _nested(levels: int) -> dict:
    schema: dict = {"type": "object"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def _laughs(levels: int) -> dict:
    defs: dict[str, Any] = {"a0": {"type": "string"}}
    for i in range(1, levels + 1):
        defs[f"a{i}"] = {"allOf": [{"$ref": f"#/$defs/a{i - 1}"}, {"$ref": f"#/$defs/a{i - 1}"}]}
    return {"type": "object", "$defs": defs, "properties": {"q": {"$ref": f"#/$defs/a{levels}"}}}


def hostile_schemas(base: str) -> list[Hostile]:
    """`base` is the recording server's URL: any fetch of it is a failure."""
    local = "Tool parameters may only refer to their own definitions"
    recursive = "Tool parameters refer to themselves (recursive schemas are not supported)"
    pattern = "Tool parameters use a pattern the server cannot run"
    string_q = {"q": {"type": "string"}}
    return [
        Hostile("remote_ref", {"type": "object", "properties": {"q": {"$ref": f"{base}/secret.json"}}}, local),
        Hostile("file_ref", {"type": "object", "properties": {"q": {"$ref": "file:///etc/passwd"}}}, local),
        Hostile("remote_dynamic_ref",
                {"type": "object", "properties": {"q": {"$dynamicRef": f"{base}/d.json"}}}, local),
        Hostile("relative_ref_under_remote_id",
                {"$id": f"{base}/root.json", "type": "object", "properties": {"q": {"$ref": "other.json"}}}, local),
        Hostile("embedded_remote_id",
                {"type": "object", "properties": {"q": {"$id": f"{base}/inner.json", "type": "string"}}},
                "Tool parameters may not embed other schema documents"),
        Hostile("remote_id_with_local_refs",
                {"$id": f"{base}/root.json", "type": "object", "$defs": {"s": {"type": "string"}},
                 "properties": {"q": {"$ref": "#/$defs/s"}}}, None),
        Hostile("remote_metaschema", {"$schema": f"{base}/meta.json", "type": "object", "properties": string_q}, None),
        Hostile("ref_cycle", {"type": "object", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                              "properties": {"q": {"$ref": "#/$defs/a"}}}, recursive),
        Hostile("ref_to_root", {"type": "object", "properties": {"q": {"$ref": "#"}}}, recursive),
        Hostile("recursive_tree", {"type": "object", "$defs": {"node": {"type": "object", "properties": {
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "properties": {"tree": {"$ref": "#/$defs/node"}}}, recursive),
        Hostile("dynamic_ref_cycle", {"$dynamicAnchor": "meta", "type": "object",
                                      "properties": {"q": {"$dynamicRef": "#meta"}}}, recursive),
        Hostile("recursive_ref", {"$recursiveAnchor": True, "type": "object",
                                  "properties": {"q": {"$recursiveRef": "#"}}}, recursive),
        Hostile("dangling_ref", {"type": "object", "properties": {"q": {"$ref": "#/$defs/missing"}}},
                "Tool parameters refer to a definition that does not exist"),
        Hostile("billion_laughs", _laughs(40), "Tool parameters expand too much through their references"),
        Hostile("deeply_nested", _nested(40), "Tool parameters are nested too deeply"),
        Hostile("huge", {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * 100}
                                                          for i in range(1000)}},
                "Tool parameters are too large"),
        Hostile("boolean_schema", True, "Tool parameters must be a JSON Schema object"),
        Hostile("boolean_subschemas", {"type": "object", "properties": {"yes": True, "no": False}}, None),
        Hostile("unknown_format", {"type": "object", "properties": {"q": {"type": "string", "format": "x-made-up"}}},
                None),
        Hostile("catastrophic_pattern", {"type": "object", "properties": {"q": {"type": "string",
                                                                                "pattern": "^(a+)+$"}}}, None),
        Hostile("lookahead_pattern", {"type": "object", "properties": {"q": {"pattern": "^(?=a)a$"}}}, pattern),
        Hostile("backreference_pattern", {"type": "object", "properties": {"q": {"pattern": "(a)\\1"}}}, pattern),
        Hostile("catastrophic_pattern_properties",
                {"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "integer"}},
                 "additionalProperties": False}, None),
        Hostile("unevaluated_with_pattern_properties",
                {"type": "object", "patternProperties": {"^x": {}}, "unevaluatedProperties": False},
                "Tool parameters combine unevaluatedProperties with patternProperties"),
        Hostile("draft_3", {"$schema": "http://json-schema.org/draft-03/schema#", "type": "object"},
                "Tool parameters use an unsupported JSON Schema draft"),
        Hostile("invalid_keyword_value", {"type": "object", "properties": {"q": {"type": 12}}},
                "Tool parameters are not a valid JSON Schema"),
        Hostile("schema_keyword_not_a_string", {"$schema": ["x"], "type": "object"},
                "Tool parameters are not a valid JSON Schema"),
    ]  # fmt: skip


# Arguments for the accepted ones: (valid, invalid), checked after acceptance.
ARGUMENTS: dict[str, tuple[dict, dict]] = {
    "remote_id_with_local_refs": ({"q": "ok"}, {"q": 1}),
    "remote_metaschema": ({"q": "ok"}, {"q": 1}),
    "boolean_subschemas": ({"yes": 1}, {"no": 1}),
    "unknown_format": ({"q": "anything"}, {"q": 2}),
    "catastrophic_pattern": ({"q": "aaaa"}, {"q": "a" * 100_000 + "b"}),
    "catastrophic_pattern_properties": ({"aaaa": 1}, {"a" * 100_000 + "b": 1}),
}
