"""Build the frozen ``Config`` dataclasses from TOML files or CLI ``--set scope.key=value``
flags, strictly, and read the few list-shaped flag values (seeds, numbers, names) one way."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from recperf.core.errors import ConfigError
from recperf.core.files import check_input
from recperf.core.text import read_utf8

C = TypeVar("C")


def load_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; a syntax error becomes a one-line ConfigError naming the file."""
    p = check_input(path, "TOML file")
    try:
        return tomllib.loads(read_utf8(p))
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, not a TOML file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None


def load_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON file holding one object; unreadable, not JSON or not an object is one ConfigError
    ``PATH: not WHAT: why``."""
    p = check_input(path, what)
    try:
        data = json.loads(read_utf8(p))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"{p}: not {what}: {why}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: not {what}: expected a JSON object, got {type(data).__name__}")
    return data


class Options(dict[str, Any]):
    """One scope's options: a plain dict to its readers that also records which values came
    from a typed file (a ``--config`` TOML table), each with where it was written (``FILE:
    [table] key``). ``from_mapping`` holds those to their field's type (TOML has numbers, so
    ``"100"`` there is a mistake, not a number) and names the file in the error; a value set
    again by item assignment (a flag overriding the file) is no longer typed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.typed: dict[str, str] = {}
        """Key -> where in which file it was written, for the values that came from a file."""

    def __setitem__(self, key: str, value: Any) -> None:
        self.typed.pop(key, None)
        super().__setitem__(key, value)

    def set_typed(self, key: str, value: Any, where: str) -> None:
        """Set ``key`` to a value read from a typed file at ``where``."""
        super().__setitem__(key, value)
        self.typed[key] = where


def _coerce(value: Any, tp: Any, where: str, typed: bool = False) -> Any:
    """Check (and for CLI strings, convert) ``value`` against the field type ``tp``; a ``typed``
    value (read from TOML) must already have the type: a string is not converted."""
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
                return _coerce(value, arg, where, typed)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {value!r}")
    if typed and isinstance(value, str) and (origin is tuple or tp in _TYPE_NAMES):
        kind = "a list" if origin is tuple else _TYPE_NAMES[tp]
        raise ConfigError(f"{where}: expected {kind}, got the string {value!r}")
    if origin is tuple:
        args = typing.get_args(tp)
        if isinstance(value, str):  # "1,2" or "[1, 2]"
            text = value.strip()
            text = text[1:-1] if text.startswith("[") and text.endswith("]") else text
            value = [v.strip() for v in text.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item_tp = args[0] if args else Any
        return tuple(_coerce(v, item_tp, where, typed) for v in value)
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
        number: float | None = None
        if isinstance(value, int | float):
            number = float(value)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is not None and math.isfinite(number):
            return number
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


_TYPE_NAMES: dict[Any, str] = {bool: "true or false", int: "an integer", float: "a number"}
"""How an error names the scalar types a typed (TOML) string is refused for."""


def required_keys(cls: type[Any]) -> list[str]:
    """The init fields of dataclass ``cls`` that have no default."""
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def from_mapping(cls: type[C], data: Mapping[str, Any], source: str = "config") -> C:
    """Build dataclass ``cls`` from ``data``: an unknown key, a missing required key or a bad
    type is one ConfigError naming the key and the allowed keys; values convert from CLI strings."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    allowed = ", ".join(sorted(fields))
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r}; allowed: {allowed}")
    missing = [k for k in required_keys(cls) if k not in data]
    if missing:
        raise ConfigError(f"{source}: missing required key {missing[0]!r}; allowed: {allowed}")
    typed: Mapping[str, str] = getattr(data, "typed", {})
    kwargs = {
        k: _coerce(v, hints[k], typed.get(k, f"{source}: {k}"), k in typed) for k, v in data.items()
    }
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def parse_sets(
    pairs: Sequence[str] | None, scopes: Sequence[str], flag: str = "--set"
) -> dict[str, dict[str, str]]:
    """``SCOPE.key=value`` flags -> ``{scope: {key: value}}``. SCOPE is one of ``scopes`` (a
    plug-in name or a config section), matched as the longest listed prefix, so a
    ``pkg.mod:Cls.key=value`` works; values stay strings, converted later by ``from_mapping``."""
    out: dict[str, dict[str, str]] = {}
    for pair in pairs or []:
        target, sep, value = pair.partition("=")
        target = target.strip()
        matches = [s for s in scopes if target.startswith(f"{s}.") and len(target) > len(s) + 1]
        if not sep or not matches:
            head = target.rpartition(".")[0] if "." in target else target
            why = (
                "expected SCOPE.key=value"
                if not sep or "." not in target
                else f"unknown scope {head!r}"
            )
            raise ConfigError(f"{flag} {pair!r}: {why}; scopes here: {', '.join(scopes) or 'none'}")
        scope = max(matches, key=len)
        out.setdefault(scope, {})[target[len(scope) + 1 :]] = value.strip()
    return out


def parse_seeds(text: str, flag: str = "--seeds") -> tuple[int, ...]:
    """``0-4``, ``0,3,7`` or a mix like ``0-2,9`` -> the seeds in the order given."""
    seeds: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        where = repr(item) if item == text.strip() else f"{item!r} in {text!r}"
        lo, dash, hi = item.partition("-")
        try:
            first, last = int(lo), int(hi if dash else lo)
        except ValueError:
            raise ConfigError(
                f"{flag}: cannot read {where}; expected e.g. 0-4, 0,3,7 or 0-2,9"
            ) from None
        if first < 0 or last < first:
            raise ConfigError(f"{flag}: {where} is not a range of seeds >= 0 (low-high)")
        seeds.extend(range(first, last + 1))
    return tuple(seeds)


def parse_floats(text: str, flag: str) -> tuple[float, ...]:
    """A comma list of finite numbers, e.g. ``1,2,4``."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(map(math.isfinite, values)):
        raise ConfigError(f"{flag}: expected comma-separated numbers, got {text!r}")
    return values


def parse_ints(text: str, flag: str) -> tuple[int, ...]:
    """A comma list of integers, e.g. ``16,32,64``."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values:
        raise ConfigError(f"{flag}: expected comma-separated integers, got {text!r}")
    return values


def parse_names(text: str, flag: str) -> tuple[str, ...]:
    """A comma list of names (spaces trimmed); an empty list is an error naming the flag."""
    items = tuple(s.strip() for s in text.split(",") if s.strip())
    if not items:
        raise ConfigError(f"{flag} is empty")
    return items


MAX_SEED = 2**63 - 1
"""Seeds are whole numbers from 0 to 2**63 - 1 (what numpy's and torch's generators take)."""


def check_seed(seed: int, name: str = "seed") -> None:
    """A seed must be a whole number in [0, MAX_SEED]."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{name} = {seed!r}: seeds must be whole numbers from 0 to 2**63-1")


def check_range(
    name: str,
    value: float,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
) -> None:
    """Raise ConfigError naming ``name`` and the allowed range unless ``value`` is a finite
    number (not a bool) within it: the one finite-number rule for flags, TOML, specs and
    catalogs alike (NaN compares false with every bound, so it is checked first)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name} = {value!r}: expected a finite number in "
                          f"{_allowed(lo, hi, lo_open)}")  # fmt: skip
    bad = (lo is not None and (value <= lo if lo_open else value < lo)) or (
        hi is not None and value > hi
    )
    if bad:
        raise ConfigError(
            f"{name} = {value!r} is outside the allowed range {_allowed(lo, hi, lo_open)}"
        )


def _allowed(lo: float | None, hi: float | None, lo_open: bool) -> str:
    """The range as errors name it, ``[lo, hi]`` or ``(lo, hi]`` (made only on a failure: the
    check runs on every embedding call)."""
    lo_s = "-inf" if lo is None else f"{lo:g}"
    hi_s = "inf" if hi is None else f"{hi:g}"
    return f"{'(' if lo_open else '['}{lo_s}, {hi_s}]"
