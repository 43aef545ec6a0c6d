"""factory_boy factories typed as what they make.

`DeviceFactory(mac=...)` returns a Device, but factory_boy's metaclass `__call__` is untyped, so
mypy sees the factory class instead: every attribute of the result is then an error (or a
`factory.Sequence`). The tests call a `ModelFactory` wrapping the factory class instead; the
factory classes stay as factory_boy wants them (SubFactory, subclassing)."""
from __future__ import annotations

from typing import Any, Generic, TypeVar

from factory.django import DjangoModelFactory

M = TypeVar("M")


class ModelFactory(Generic[M]):
    def __init__(self, factory: type[DjangoModelFactory[M]]) -> None:
        self.factory = factory

    def __call__(self, **kwargs: Any) -> M:
        return self.factory.create(**kwargs)

    def create_batch(self, size: int, **kwargs: Any) -> list[M]:
        return self.factory.create_batch(size, **kwargs)
