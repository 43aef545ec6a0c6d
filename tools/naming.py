"""Tool names: client-side validation and the reversible map to LLM function names.

Sources name their tools freely (the device uses dots: `self.audio_speaker.set_volume`, MCP
servers may use anything), but OpenAI-compatible APIs only accept `^[a-zA-Z0-9_-]{1,64}$`.
`NameMap` gives every (source, name) pair a safe, unique LLM name and maps it back when the
model calls it. The mapping depends only on the *set* of tools, never on listing order, so
the same catalogue always produces the same names (stable prompts, stable history).
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

LLM_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_LLM_NAME = 64

_CLIENT_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_UNSAFE_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
_HASH_LEN = 8

# Lower rank keeps the plain name when two sources offer the same one: our own server tools
# first (their names appear in prompts), then the device, remote MCP servers, gateway clients.
_KIND_RANK = {"server": 0, "device": 1, "mcp": 2, "client": 3}


def validate_client_tool_name(name: object) -> str | None:
    """Check a gateway client's tool name against the published rules (seed 001, §4.6).

    Returns a human-readable error, or None when the name is valid.
    """
    if not isinstance(name, str) or not name:
        return "tool name must be a non-empty string"
    if len(name) > MAX_LLM_NAME:
        return f"tool name must be at most {MAX_LLM_NAME} characters"
    if not (name[0].isascii() and (name[0].isalpha() or name[0] == "_")):
        return "tool name must start with a letter or an underscore"
    if not _CLIENT_NAME_RE.match(name):
        return "tool name may contain only letters, digits, underscores and dots"
    if name.endswith("."):
        return "tool name must not end with a dot"
    if ".." in name:
        return "tool name must not contain consecutive dots"
    return None


def sanitize(name: str) -> str:
    """Turn any source name into a valid LLM name (not yet unique)."""
    safe = _UNSAFE_CHARS.sub("_", name)
    if not safe.strip("_-"):
        # Nothing readable survived (e.g. a name written in Chinese): a hash keeps it distinct.
        return f"tool_{_short_hash(name)}"
    if len(safe) > MAX_LLM_NAME:
        # The hash of the full original keeps two long names with a common prefix apart.
        return f"{safe[: MAX_LLM_NAME - _HASH_LEN - 1]}_{_short_hash(name)}"
    return safe


def _short_hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:_HASH_LEN]


def _with_suffix(base: str, n: int) -> str:
    suffix = f"_{n}"
    return base[: MAX_LLM_NAME - len(suffix)] + suffix


def source_rank(source_key: str) -> int:
    """Priority of a source key such as "server", "device", "mcp:weather" or "client#2"."""
    kind = re.split(r"[:#]", source_key, maxsplit=1)[0]
    return _KIND_RANK.get(kind, len(_KIND_RANK))


class NameMap:
    """A reversible mapping between (source key, source name) pairs and LLM names.

    Collisions (after sanitising) are resolved by source priority, then source key, then
    name: the first pair keeps the plain name, the next ones get `_2`, `_3`, ... A suffixed
    name never steals another tool's plain name because all pairs are placed in that order.
    """

    def __init__(self, entries: Iterable[tuple[str, str]]) -> None:
        self._to_llm: dict[tuple[str, str], str] = {}
        self._from_llm: dict[str, tuple[str, str]] = {}
        ordered = sorted(set(entries), key=lambda e: (source_rank(e[0]), e[0], e[1]))
        taken = self._plain_names_in_use(ordered)
        for entry in ordered:
            self._place(entry, taken)

    def _plain_names_in_use(self, ordered: list[tuple[str, str]]) -> dict[str, int]:
        """Count how many pairs want each plain name, so suffixes avoid all of them."""
        counts: dict[str, int] = {}
        for _, name in ordered:
            plain = sanitize(name)
            counts[plain] = counts.get(plain, 0) + 1
        return counts

    def _place(self, entry: tuple[str, str], wanted: dict[str, int]) -> None:
        base = sanitize(entry[1])
        llm_name = base
        n = 1
        while llm_name in self._from_llm or (n > 1 and llm_name in wanted):
            n += 1
            llm_name = _with_suffix(base, n)
        self._to_llm[entry] = llm_name
        self._from_llm[llm_name] = entry

    def to_llm(self, source: str, name: str) -> str:
        """LLM name of a source's tool; KeyError if the pair is not in the map."""
        return self._to_llm[(source, name)]

    def from_llm(self, llm_name: str) -> tuple[str, str]:
        """(source key, source name) for an LLM name; KeyError if unknown."""
        return self._from_llm[llm_name]

    def __contains__(self, llm_name: object) -> bool:
        return llm_name in self._from_llm

    def __len__(self) -> int:
        return len(self._from_llm)

    def llm_names(self) -> list[str]:
        return sorted(self._from_llm)
