"""Static checks of an untrusted JSON Schema, before jsonschema ever sees it.

Validation time must be bounded by what we accept here, whatever the LLM later sends. Three
things would break that: references that leave the document (fetches), reference cycles
(infinite recursion), and reference fan-out (`a1 = allOf[a0, a0]`, `a2 = allOf[a1, a1]`, …
is a small schema that expands to 2^n checks of any instance: a "billion laughs" for
validators). So every reference must be local and must resolve, the reference graph must
be acyclic, and the schema expanded along its references must stay under a node budget.

Nothing here recurses: a schema nested thousands deep is refused by the depth cap, never by
RecursionError. Every object is looked at, values of unknown keywords included, because a
local `$ref` may point anywhere in the document.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote

from tools.errors import SchemaRefused

REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
ANCHOR_KEYWORDS = ("$anchor", "$dynamicAnchor")
MAX_EXPANDED_NODES = 20_000  # objects and arrays, counting each reference as a copy of its target

Node = dict | list


@dataclass
class _Document:
    root: dict
    paths: dict[int, str] = field(default_factory=dict)  # id(node) -> JSON pointer, for messages
    anchors: dict[str, list[Node]] = field(default_factory=dict)
    refs: list[tuple[dict, str, str]] = field(default_factory=list)  # (node, keyword, reference)
    patterns: list[tuple[str, str]] = field(default_factory=list)  # (where, pattern)
    pattern_properties: bool = False
    unevaluated_properties: bool = False


def inspect_schema(schema: dict, max_depth: int) -> list[tuple[str, str]]:
    """Raise SchemaRefused for anything unsafe; return the (where, pattern) pairs to compile."""
    document = _walk(schema, max_depth)
    if document.pattern_properties and document.unevaluated_properties:
        # jsonschema matches patternProperties with Python's `re` inside unevaluatedProperties.
        raise SchemaRefused(
            "Tool parameters combine unevaluatedProperties with patternProperties", "use additionalProperties"
        )
    targets = {id(node): _resolve(document, ref) or _dangling(document, node, keyword, ref)
               for node, keyword, ref in document.refs}  # fmt: skip
    _check_expansion(document, targets)
    return document.patterns


def _walk(schema: dict, max_depth: int) -> _Document:
    document = _Document(schema)
    stack: list[tuple[object, str, int]] = [(schema, "", 1)]
    while stack:
        node, path, depth = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if depth > max_depth:
            raise SchemaRefused("Tool parameters are nested too deeply", f"more than {max_depth} levels")
        document.paths[id(node)] = path
        if isinstance(node, list):
            stack.extend((item, f"{path}/{i}", depth + 1) for i, item in enumerate(node))
            continue
        _note(document, node, path)
        stack.extend((value, f"{path}/{_escape(str(key))}", depth + 1) for key, value in node.items())
    return document


def _note(document: _Document, node: dict, path: str) -> None:
    for keyword in REF_KEYWORDS:
        ref = node.get(keyword)
        if isinstance(ref, str):
            if not ref.startswith("#"):
                raise SchemaRefused(
                    "Tool parameters may only refer to their own definitions",
                    f"{path or '(root)'}: {keyword} {ref[:100]!r} is not a local reference ('#/…')",
                )
            document.refs.append((node, keyword, ref))
    for keyword in ANCHOR_KEYWORDS:
        if isinstance(node.get(keyword), str):
            document.anchors.setdefault(node[keyword], []).append(node)
    _note_id(document, node, path)
    if isinstance(node.get("pattern"), str):
        document.patterns.append((path, node["pattern"]))
    if isinstance(node.get("patternProperties"), dict):
        document.pattern_properties = True
        document.patterns.extend((f"{path}/patternProperties", p) for p in node["patternProperties"])
    document.unevaluated_properties = document.unevaluated_properties or "unevaluatedProperties" in node


def _note_id(document: _Document, node: dict, path: str) -> None:
    """`$id` at the root may be anything (it is only a name; nothing is fetched). Inside, only
    the draft 6/7 anchor form `#name`: an embedded resource would give the `#…` references
    under it another base than the document, and this check resolves against the document."""
    schema_id = node.get("$id")
    if not isinstance(schema_id, str) or node is document.root:
        return
    if not schema_id.startswith("#"):
        raise SchemaRefused(
            "Tool parameters may not embed other schema documents", f"{path}: $id {schema_id[:100]!r}"
        )
    document.anchors.setdefault(schema_id[1:], []).append(node)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _resolve(document: _Document, ref: str) -> list[Node]:
    """The nodes a local reference may lead to ([] when it leads nowhere). A `$dynamicRef`
    or `$recursiveRef` may land on any anchor of its name: all of them count."""
    fragment = unquote(ref[1:])
    if not fragment:
        return [document.root]
    if not fragment.startswith("/"):
        return list(document.anchors.get(fragment, []))
    node: object = document.root
    for raw in fragment[1:].split("/"):
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return []
    if isinstance(node, (dict, list)):
        return [node]
    if isinstance(node, bool):
        return [{}]  # a boolean schema: a leaf
    return []


def _dangling(document: _Document, node: dict, keyword: str, ref: str) -> list[Node]:
    where = document.paths.get(id(node)) or "(root)"
    raise SchemaRefused(
        "Tool parameters refer to a definition that does not exist", f"{where}: {keyword} {ref[:100]!r}"
    )


def _children(node: Node, targets: dict[int, list[Node]]) -> Iterator[Node]:
    values = node.values() if isinstance(node, dict) else node
    yield from (value for value in values if isinstance(value, (dict, list)))
    yield from targets.get(id(node), [])


def _check_expansion(document: _Document, targets: dict[int, list[Node]]) -> None:
    """Depth-first over structure and references: a node met again while it is still open
    closes a cycle; sizes add up bottom-up, each reference counting its target in full."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[Node, bool]] = [(document.root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(child)] for child in _children(node, targets))
            if size[key] > MAX_EXPANDED_NODES:
                raise SchemaRefused(
                    "Tool parameters expand too much through their references",
                    f"more than {MAX_EXPANDED_NODES} schema objects once references are followed",
                )
            continue
        if key in size:
            continue
        if key in open_nodes:
            where = document.paths.get(key) or "(root)"
            raise SchemaRefused("Tool parameters refer to themselves (recursive schemas are not supported)", where)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node, targets))
