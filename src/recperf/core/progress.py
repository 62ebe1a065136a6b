"""A rich progress bar for long work, silent when output is not a terminal or when disabled."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

ProgressFn = Callable[[float], None]
"""Called with the fraction done, 0 to 1."""


@contextmanager
def progress_bar(description: str, enabled: bool = True) -> Iterator[ProgressFn]:
    """Yield a callback taking the fraction done; draws on stderr only when it is a terminal."""
    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield lambda _frac: None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as prog:
        task = prog.add_task(description, total=1.0)
        yield lambda frac: prog.update(task, completed=min(max(frac, 0.0), 1.0))
