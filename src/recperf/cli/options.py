"""The options every command group shares, declared once: ``--config FILE.toml``, ``--set
SCOPE.KEY=VALUE``, ``--out`` and ``--json``, and typed shortcut flags (``--jobs``) that are
aliases of one ``--set``. A command declares its own few options; ``@command`` adds the rest and
hands the command one ``Settings`` that merges the TOML tables, the ``--set`` pairs and the
shortcut flags by scope (a plug-in name or a config section), flags winning over TOML.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import typer

from recperf.cli.common import STDOUT, one_line_errors
from recperf.core.config import Options, load_toml, parse_sets
from recperf.core.errors import ConfigError
from recperf.core.files import check_input, check_name
from recperf.core.results import dumps_json, write_json

OutKind = Literal["required", "optional", "none"]


@dataclass(frozen=True, slots=True)
class Flag:
    """A typed shortcut for ``--set SCOPE.KEY=value``, declared once and shared by commands."""

    param: str
    """The command-function parameter name and the Config field (``--jobs`` -> ``jobs``)."""
    scope: str
    """The config section or plug-in name the value goes to."""
    annotation: Any
    """The flag's type, ``X | None`` (None: not given)."""
    help: str
    """The help text (``--set SCOPE.KEY=...`` is appended)."""
    names: tuple[str, ...] = ()
    """The flag's spellings; default ``--param-with-dashes``."""

    @property
    def key(self) -> str:
        return self.param

    def parameter(self) -> inspect.Parameter:
        names = self.names or (f"--{self.param.replace('_', '-')}",)
        text = f"{self.help} (= --set {self.scope}.{self.key}=...)"
        return inspect.Parameter(
            self.param,
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, *names, help=text, show_default=False),
            annotation=self.annotation,
        )


@dataclass(frozen=True, slots=True)
class Settings:
    """What the shared options say for one invocation."""

    config: Path | None = None
    """The --config TOML file."""
    tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Its tables, by scope."""
    sets: tuple[str, ...] = ()
    """The raw --set pairs."""
    aliases: tuple[tuple[str, str], ...] = ()
    """(flag, SCOPE.KEY=VALUE) pairs that alias flags (``--opt``, ``--option``) stand for."""
    flags: Mapping[tuple[str, str], Any] = field(default_factory=dict)
    """Shortcut flags given: (scope, key) -> value."""
    out: Path | None = None
    """The --out directory (or file, for commands that write one file)."""
    json: bool = False
    """Whether --json prints the result document to stdout."""

    def resolve(
        self, scopes: Sequence[str], renamed: Mapping[str, str] | None = None
    ) -> dict[str, dict[str, Any]]:
        """Options by scope for this run, TOML < --set < flags. ``scopes`` are the sections and
        plug-in names this run has; ``renamed`` maps a TOML table's old name to its scope (e.g.
        ``[scheduler]`` -> the scheduler's name). An unknown scope is one error naming them, and
        so are two command-line values for one key that disagree (--set twice, a flag and
        --set, an alias and --set): which should win is the user's call, not ours."""
        allowed = list(dict.fromkeys(scopes))
        merged = {s: Options() for s in allowed}
        self._merge_tables(merged, dict(renamed or {}))
        for (scope, key), (_, value) in self._command_line(allowed).items():
            merged[scope][key] = value
        out: dict[str, dict[str, Any]] = {**merged}  # each an Options, a dict to its readers
        return out

    def _merge_tables(self, merged: dict[str, Options], renamed: Mapping[str, str]) -> None:
        """The --config file's tables into ``merged``, each value typed and located."""
        for table, values in self.tables.items():
            scope = renamed.get(table, table)
            names = ", ".join([*merged, *renamed]) or "none"
            if not isinstance(values, Mapping):
                raise ConfigError(
                    f"{self.config}: {table!r} must sit in a [SCOPE] table; scopes: {names}"
                )
            if scope not in merged:
                raise ConfigError(f"{self.config}: unknown table [{table}]; allowed: {names}")
            for key, value in values.items():
                merged[scope].set_typed(key, value, f"{self.config}: [{table}] {key}")

    def _command_line(self, allowed: list[str]) -> dict[tuple[str, str], tuple[str, Any]]:
        """(scope, key) -> (what said it, value) from the --set pairs, the alias flags' pairs
        and the shortcut flags, refusing two that give one key different values."""
        said: dict[tuple[str, str], tuple[str, Any]] = {}
        for flag, pair in (*(("--set", p) for p in self.sets), *self.aliases):
            for scope, values in parse_sets([pair], allowed, flag).items():
                for key, value in values.items():
                    _agree(said, (scope, key), f"{flag} {pair.strip()}", value)
        for (scope, key), value in self.flags.items():
            if scope not in allowed:
                raise ConfigError(
                    f"{_flag_name(key)} (= --set {scope}.{key}) only applies when {scope!r} is "
                    f"part of the run; scopes here: {', '.join(allowed) or 'none'}"
                )
            _agree(said, (scope, key), f"{_flag_name(key)} {value}", value)
        return said

    def with_sets(self, pairs: Iterable[str], flag: str = "--set") -> Settings:
        """These settings with more ``SCOPE.KEY=VALUE`` pairs given by ``flag`` (an alias such
        as ``--opt``, named in a disagreement's error) after the given ones."""
        return dataclasses.replace(self, aliases=(*self.aliases, *((flag, p) for p in pairs)))

    def replace_out(self, out: Path) -> Settings:
        """These settings writing to ``out`` (a command's default when --out is not given)."""
        return dataclasses.replace(self, out=out)

    def emit(self, document: Mapping[str, Any], name: str | None = "summary.json") -> Path | None:
        """Write ``document`` atomically as ``--out/name`` (when --out is given and ``name`` is
        not None: None when the library wrote it) and print it to stdout with --json; return the
        path written."""
        path = None
        if self.out is not None and name is not None:
            path = write_json(self.out / name, document)
        if self.json:
            typer.echo(dumps_json(document), nl=False)
        return path


def _flag_name(key: str) -> str:
    return f"--{key.replace('_', '-')}"


def _agree(
    said: dict[tuple[str, str], tuple[str, Any]], at: tuple[str, str], source: str, value: Any
) -> None:
    """Record that ``source`` gives ``at`` ``value``, or fail if an earlier source gave it
    another (``"8"`` from --set and ``8`` from a flag are the same value)."""
    if at in said and not _same(said[at][1], value):
        raise ConfigError(
            f"{said[at][0]} and {source} give {at[0]}.{at[1]} different values; give one"
        )
    said[at] = (source, value)


def _same(a: Any, b: Any) -> bool:
    """Whether two command-line values are one value (text or typed, ``0.5`` == ``"0.50"``)."""
    if a == b or str(a).strip().lower() == str(b).strip().lower():
        return True
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def check_out_dir(out: Path) -> None:
    """Fail before any work when ``out`` cannot hold results (a file, unwritable, /proc ...)."""
    check_name(out, "--out")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create the directory: {exc.strerror}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: the directory is not writable")


def command(
    app: typer.Typer,
    name: str,
    *,
    writes: str,
    out: OutKind = "optional",
    json_help: str = "Print the result document (what --out holds) as JSON.",
    scopes_help: str | None = None,
    flags: Sequence[Flag] = (),
    out_is_dir: bool = True,
    toml: bool = True,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register ``fn(settings, **own)`` as command ``name`` with the shared options added:
    ``--out`` (as ``out`` says; ``writes`` names what it holds), ``--json``, and, with
    ``scopes_help``, ``--set`` (whose help lists the scopes) and ``--config`` / ``--config-file``
    for the TOML file (only ``--config-file`` when ``toml`` is False: a command whose
    ``--config`` predates this and means something else); plus the shortcut ``flags``. Errors
    print one line."""
    out_help = f"Directory for {writes}." if out_is_dir else f"File to write: {writes}."

    def deco(fn: Callable[..., None]) -> Callable[..., None]:
        own = _own_parameters(fn)
        shared = _shared_parameters(out, out_help, json_help, scopes_help, toml)
        extra = [f.parameter() for f in flags]
        taken = {p.name for p in own} | {d for p in own for d in _flag_names(p)}
        clash = [d for p in (*shared, *extra) for d in (p.name, *_flag_names(p)) if d in taken]
        if clash:
            raise TypeError(f"command {name!r}: {clash[0]!r} is shared; drop it or rename it")

        @functools.wraps(fn)
        def wrapper(**kwargs: Any) -> None:
            settings = _settings(kwargs, flags, out_is_dir)
            fn(settings, **kwargs)

        params = [*own, *shared, *extra]
        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__  # typer must read the new signature, not fn's
        app.command(name)(one_line_errors(wrapper))
        return fn

    return deco


def _flag_names(param: inspect.Parameter) -> list[str]:
    """The ``--spellings`` of a typer option parameter."""
    decls = getattr(param.default, "param_decls", None) or ()
    return [n for d in decls for n in str(d).split("/") if n.startswith("--")]


def _own_parameters(fn: Callable[..., None]) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].name != "settings":
        raise TypeError(f"{fn.__name__}: the first parameter must be `settings: Settings`")
    return [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
        for p in params[1:]
    ]


def _shared_parameters(
    out: OutKind, out_help: str, json_help: str, scopes_help: str | None, toml: bool
) -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    params = []
    if out != "none":
        default = ... if out == "required" else None
        annotation = Path if out == "required" else Path | None
        params.append(
            inspect.Parameter(
                "out_path",
                kw,
                default=typer.Option(default, "--out", help=out_help),
                annotation=annotation,
            )
        )
    params.append(
        inspect.Parameter(
            "json_out", kw, default=typer.Option(False, "--json", help=json_help), annotation=bool
        )
    )
    if scopes_help is not None:
        config_help = (
            f"TOML file with one table per scope ({scopes_help}), each of Config fields; "
            "--set and flags override it."
        )
        set_help = f"SCOPE.KEY=VALUE: set one Config field (repeatable); scopes: {scopes_help}."
        names = ("--config", "--config-file") if toml else ("--config-file",)
        params += [
            inspect.Parameter(
                "config_file", kw, default=typer.Option(None, *names, help=config_help),
                annotation=Path | None,
            ),
            inspect.Parameter(
                "set_pairs", kw, default=typer.Option(None, "--set", help=set_help),
                annotation=list[str] | None,
            ),
        ]  # fmt: skip
    return params


def _settings(kwargs: dict[str, Any], flags: Sequence[Flag], out_is_dir: bool) -> Settings:
    """Pop the shared options out of ``kwargs`` and check --out before any work."""
    out: Path | None = kwargs.pop("out_path", None)
    config: Path | None = kwargs.pop("config_file", None)
    given = {(f.scope, f.key): v for f in flags if (v := kwargs.pop(f.param)) is not None}
    if out is not None:
        check_out_dir(out if out_is_dir else check_name(out, "--out").parent)
    STDOUT.json = bool(kwargs.get("json_out"))
    return Settings(
        config=config,
        tables=load_toml(check_input(config, "--config")) if config is not None else {},
        sets=tuple(kwargs.pop("set_pairs", None) or ()),
        flags=given,
        out=out,
        json=kwargs.pop("json_out"),
    )
