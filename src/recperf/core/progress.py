"""Progress for long work on stderr: a rich bar on a terminal, plain timestamped lines
otherwise (CI, nohup, a pipe), so long work is never silent; nothing when disabled."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

ProgressFn = Callable[[float], None]
"""Called with the fraction done, 0 to 1."""


LINE_STEP = 0.1
"""Off a terminal, a line each time another tenth is done ..."""
LINE_EVERY_S = 30.0
"""... or when this long has passed since the last line."""


@contextmanager
def progress_bar(description: str, enabled: bool = True) -> Iterator[ProgressFn]:
    """Yield a callback taking the fraction done; a bar on a terminal, else plain lines."""
    console = Console(stderr=True)
    if not enabled:
        yield lambda _frac: None
        return
    if not console.is_terminal:
        with _lines(description) as fn:
            yield fn
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


@contextmanager
def progress_from_first_update(description: str) -> Iterator[ProgressFn]:
    """``progress_bar`` that appears at the first update, so that bad input the library finds
    before any work is the only line printed."""
    with ExitStack() as stack:
        bar: ProgressFn | None = None

        def update(frac: float) -> None:
            nonlocal bar
            if bar is None:
                bar = stack.enter_context(progress_bar(description))
            bar(frac)

        yield update


@contextmanager
def _lines(description: str) -> Iterator[ProgressFn]:
    """Timestamped ``HH:MM:SS description: NN%`` lines on stderr, and one when done."""
    t0 = last_t = time.monotonic()
    last = 0.0

    def say(text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {description}: {text}", file=sys.stderr, flush=True)

    def update(frac: float) -> None:
        nonlocal last, last_t
        frac = min(max(frac, 0.0), 1.0)
        now = time.monotonic()
        step = int(frac / LINE_STEP + 1e-9) > int(last / LINE_STEP + 1e-9)
        if frac < 1.0 and (step or now - last_t >= LINE_EVERY_S):
            last, last_t = frac, now
            say(f"{frac:.0%}")

    say("started")
    yield update
    say(f"done in {time.monotonic() - t0:.1f} s")
