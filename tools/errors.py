"""The one error type every tool source raises.

A ToolError carries text meant for the LLM: it is put verbatim into the tool result, so it
must say what went wrong in words the model can act on (retry, ask the user, give up), and
must never contain secrets or stack traces.
"""
from __future__ import annotations


class ToolError(Exception):
    """A tool could not do its job; `str(error)` is shown to the LLM as the tool result."""


class SchemaRefused(ValueError):
    """A tool's parameter schema we will not use (tools.schemas says why): `message` is
    short and fixed, `details` says where and what, for the sender or the log."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(f"{message}: {details}" if details else message)
        self.message = message
        self.details = details
