"""Build the frozen ``Config`` dataclasses from TOML files or CLI ``key=value`` flags, strictly."""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from recperf.core.errors import ConfigError

C = TypeVar("C")


def load_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; a syntax error becomes a one-line ConfigError naming the file."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from None


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check (and for CLI strings, convert) ``value`` against the field type ``tp``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin is tuple:
        args = typing.get_args(tp)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item_tp = args[0] if args else Any
        return tuple(_coerce(v, item_tp, where) for v in value)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(repr, allowed))}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def from_mapping(cls: type[C], data: Mapping[str, Any], source: str = "config") -> C:
    """Build dataclass ``cls`` from ``data``; unknown keys and bad types raise ConfigError."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{source}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(fields))}"
        )
    kwargs = {k: _coerce(v, hints[k], f"{source}: {k}") for k, v in data.items()}
    return cls(**kwargs)


def parse_overrides(pairs: list[str] | None, source: str = "--set") -> dict[str, str]:
    """Turn ``["key=value", ...]`` CLI flags into a mapping (values converted by from_mapping)."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{source}: expected key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def check_range(
    name: str,
    value: float,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
) -> None:
    """Raise ConfigError naming ``name`` and the allowed range if ``value`` is outside it."""
    bad = (lo is not None and (value <= lo if lo_open else value < lo)) or (
        hi is not None and value > hi
    )
    if bad:
        lo_s = "-inf" if lo is None else f"{lo:g}"
        hi_s = "inf" if hi is None else f"{hi:g}"
        bracket = "(" if lo_open else "["
        raise ConfigError(
            f"{name} = {value!r} is outside the allowed range {bracket}{lo_s}, {hi_s}]"
        )
