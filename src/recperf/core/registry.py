"""A name -> factory registry for every pluggable kind; also resolves ``package.module:attr``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from recperf.core.errors import RegistryError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to factories returning a ``T``; ``get`` also accepts ``"module:attr"``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator that registers a factory (usually a class) under ``name``."""

        def deco(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise RegistryError(f"{self.kind} {name!r} is registered twice")
            self._factories[name] = factory
            return factory

        return deco

    def names(self) -> list[str]:
        return sorted(self._factories)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def factory(self, name: str) -> Callable[..., T]:
        """The factory for ``name``, or for a ``package.module:attr`` entry point."""
        if name in self._factories:
            return self._factories[name]
        if ":" in name:
            module_name, _, attr = name.partition(":")
            try:
                module = importlib.import_module(module_name)
            except (ImportError, ValueError, TypeError) as exc:  # bad, empty or relative name
                raise RegistryError(
                    f"{self.kind} {name!r}: cannot import {module_name!r}: {exc}"
                ) from None
            try:
                obj: Callable[..., T] = getattr(module, attr)
            except AttributeError:
                raise RegistryError(
                    f"{self.kind} {name!r}: {module_name!r} has no {attr!r}"
                ) from None
            return obj
        allowed = ", ".join(self.names())
        raise RegistryError(f"unknown {self.kind} {name!r}; allowed: {allowed} or 'module:attr'")

    def create(self, name: str, *args: object, **kwargs: object) -> T:
        return self.factory(name)(*args, **kwargs)
