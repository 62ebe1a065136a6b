"""One road from a name to a running plug-in: a registry entry carries the factory, its ``Config``
class and its tunable space, and ``build(name, options)`` validates the options and builds.

Built-ins register with a decorator next to each implementation; the registry imports the package
that holds them the first time it is asked for a name, so no caller imports a package only for its
side effects. ``package.module:attr`` names a user's own implementation without editing recperf;
its Config is found on the class (a nested ``Config``, or the class itself when it is a frozen
dataclass).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from recperf.core.config import from_mapping
from recperf.core.errors import ConfigError, RegistryError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    """What the registry knows of one plug-in."""

    name: str
    """The registered name, or the ``package.module:attr`` it was found by."""
    factory: Callable[..., T]
    """Called as ``factory(*args, config=cfg, **data)``, or ``factory(*args, **data)`` without a
    Config; a dataclass plug-in that is its own Config is built by ``from_mapping`` alone."""
    config: type[Any] | None
    """The frozen Config dataclass its options build, or None when it takes none."""
    space: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    """Tunable Config fields and their candidate values, for autotuners."""
    traits: Any = None
    """What the kind's callers need to know of this plug-in beyond its Config (a frozen
    dataclass the kind defines, e.g. the row formats an embedding kernel reads), or None."""

    @property
    def self_configured(self) -> bool:
        """Whether the plug-in is its own Config (a dataclass built from the options)."""
        return self.config is self.factory

    def options(self, options: Mapping[str, Any] | None, source: str | None = None) -> Any:
        """The validated Config for ``options`` (None when the plug-in takes no Config)."""
        where = source or self.name
        if self.config is None:
            if options:
                raise ConfigError(f"{where}: takes no options (got {', '.join(sorted(options))})")
            return None
        return from_mapping(self.config, options or {}, where)


def config_of(factory: object) -> type[Any] | None:
    """The Config class found on ``factory``: its nested ``Config``, or itself when it is a
    dataclass, else None."""
    nested = getattr(factory, "Config", None)
    if isinstance(nested, type) and dataclasses.is_dataclass(nested):
        return nested
    if isinstance(factory, type) and dataclasses.is_dataclass(factory):
        return factory
    return None


class Registry(Generic[T]):
    """Maps names to entries for one kind of plug-in; ``package`` holds the built-ins."""

    def __init__(self, kind: str, package: str | None = None) -> None:
        self.kind = kind
        self.package = package
        self._entries: dict[str, Entry[T]] = {}
        self._loaded = package is None

    def register(
        self,
        name: str,
        *,
        config: type[Any] | None = None,
        space: Mapping[str, tuple[Any, ...]] | None = None,
        traits: Any = None,
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator registering a factory (usually a class) under ``name``; its Config defaults
        to the one found on it (``config_of``), ``space`` lists its tunable fields and
        ``traits`` is what the kind records of it (None: read off the factory's ``traits``
        attribute, which a ``package.module:attr`` plug-in also uses)."""

        def deco(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries:
                raise RegistryError(f"{self.kind} {name!r} is registered twice")
            cfg = config if config is not None else config_of(factory)
            bad = sorted(set(space or {}) - _field_names(cfg))
            if bad:
                raise RegistryError(f"{self.kind} {name!r}: tunable {bad[0]!r} is no Config field")
            found = traits if traits is not None else getattr(factory, "traits", None)
            self._entries[name] = Entry(name, factory, cfg, dict(space or {}), found)
            return factory

        return deco

    def unregister(self, name: str) -> None:
        """Forget ``name`` (a test's throw-away plug-in, or one re-registered after a reload)."""
        self._load()
        if self._entries.pop(name, None) is None:
            raise RegistryError(f"{self.kind} {name!r} is not registered")

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True  # first, so a module that looks itself up does not recurse
            assert self.package is not None
            importlib.import_module(self.package)

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def entry(self, name: str) -> Entry[T]:
        """The entry for a registered ``name`` or a ``package.module:attr`` entry point."""
        self._load()
        if name in self._entries:
            return self._entries[name]
        if ":" in name:
            obj = self._import(name)
            space = dict(getattr(obj, "SPACE", {}) or {})
            return Entry(name, obj, config_of(obj), space, getattr(obj, "traits", None))
        allowed = ", ".join(self.names())
        raise RegistryError(f"unknown {self.kind} {name!r}; allowed: {allowed} or 'module:attr'")

    def _import(self, name: str) -> Callable[..., T]:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except (ImportError, ValueError, TypeError) as exc:  # bad, empty or relative name
            raise RegistryError(
                f"{self.kind} {name!r}: cannot import {module_name!r}: {exc}"
            ) from None
        obj = getattr(module, attr, None)
        if obj is None:
            raise RegistryError(f"{self.kind} {name!r}: {module_name!r} has no {attr!r}")
        if not isinstance(obj, type):  # a function such as os.path:join builds nothing useful
            raise RegistryError(
                f"{self.kind} {name!r}: {attr!r} is a {type(obj).__name__}, not a class"
            )
        factory: Callable[..., T] = obj
        return factory

    def factory(self, name: str) -> Callable[..., T]:
        """The factory for ``name`` (checks the name; builds nothing)."""
        return self.entry(name).factory

    def config(self, name: str, options: Mapping[str, Any] | None = None) -> Any:
        """The validated Config ``options`` give plug-in ``name`` (None when it takes none)."""
        return self.entry(name).options(options, f"{self.kind} {name!r}")

    def build(
        self, name: str, options: Mapping[str, Any] | None = None, *args: Any, **data: Any
    ) -> T:
        """Validate ``options`` against ``name``'s Config and build it; ``args`` and ``data`` are
        the run's inputs (tables, hot rows ...), not options."""
        entry = self.entry(name)
        cfg = entry.options(options, f"{self.kind} {name!r}")
        if entry.self_configured:
            built: T = cfg
            return built
        if cfg is None:
            return entry.factory(*args, **data)
        return entry.factory(*args, config=cfg, **data)


def _field_names(cls: type[Any] | None) -> set[str]:
    if cls is None or not dataclasses.is_dataclass(cls):
        return set()
    return {f.name for f in dataclasses.fields(cls)}
