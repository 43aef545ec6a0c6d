"""A Twisted reactor that only records which selectables want to read and write, for tests
that drive real sockets through Twisted's own classes and call each read or write themselves."""
from __future__ import annotations

from typing import Any


class RecordingReactor:
    """Registered readers and writers, in order; adding twice or removing what is absent does
    nothing, as with Twisted's reactors."""

    def __init__(self) -> None:
        self.readers: list[Any] = []
        self.writers: list[Any] = []

    def addReader(self, selectable: Any) -> None:  # noqa: N802 - Twisted's interface
        _add(self.readers, selectable)

    def removeReader(self, selectable: Any) -> None:  # noqa: N802
        _remove(self.readers, selectable)

    def addWriter(self, selectable: Any) -> None:  # noqa: N802
        _add(self.writers, selectable)

    def removeWriter(self, selectable: Any) -> None:  # noqa: N802
        _remove(self.writers, selectable)


def _add(registered: list[Any], selectable: Any) -> None:
    if selectable not in registered:
        registered.append(selectable)


def _remove(registered: list[Any], selectable: Any) -> None:
    if selectable in registered:
        registered.remove(selectable)
