"""Helpers shared by the CLI command groups: error handling and result tables."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from recperf.core.errors import RecperfError

P = ParamSpec("P")
R = TypeVar("R")

console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)


def one_line_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn a RecperfError into one line on stderr and exit code 2; other errors keep tracebacks."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except RecperfError as exc:
            # the message is data, not markup: brackets and emoji codes print as they are
            line = Text.assemble(("error:", "bold red"), " ", str(exc))
            err_console.print(line, highlight=False, soft_wrap=True, emoji=False)
            raise typer.Exit(2) from None

    return wrapper


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


LEFT_COLUMNS = ("scheduler", "trace", "name", "variant", "result", "instance", "method")
"""Text columns, aligned left; the rest are numbers."""


class _Stdout:
    """Who owns stdout in this invocation: the result tables, or (with --json) the document."""

    json = False


STDOUT = _Stdout()


def print_table(title: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    """A rich table with one row per mapping, on stdout (on stderr when stdout carries JSON)."""
    table = Table(title=Text(title))  # titles hold user paths: never markup
    for col in columns:
        table.add_column(col, justify="left" if col in LEFT_COLUMNS else "right")
    for row in rows:
        table.add_row(*(Text(fmt(row.get(col, ""))) for col in columns))
    show(table)


def show(table: Table) -> None:
    """A result table: on stdout, unless --json owns stdout (then on stderr)."""
    (err_console if STDOUT.json else console).print(table)
