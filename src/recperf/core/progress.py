"""Progress for long work on stderr: a rich bar on a terminal, plain timestamped lines
otherwise (CI, nohup, a pipe), so long work is never silent; nothing when disabled. Work of
countable parts (a sweep's runs) shows parts done, parts left and the estimated time left."""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

ProgressFn = Callable[[float], None]
"""Called with the fraction done, 0 to 1."""


@dataclass(frozen=True, slots=True)
class Count:
    """How far work of countable parts is."""

    done: int
    """Parts finished (a resumed sweep's kept runs included)."""
    total: int
    """Parts in all."""
    eta_s: float | None = None
    """Estimated seconds left, as of this update; None: no estimate yet."""
    eta_partial: bool = False
    """Whether parts of a kind none of which has finished yet are counted at the others' cost
    (shown ``ETA >11m50s``: the slow kinds tend to finish last)."""

    @property
    def left(self) -> int:
        return self.total - self.done


CountFn = Callable[[Count], None]
"""Called with a Count each time a part finishes (and once as the work begins)."""
T = TypeVar("T")


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


def progress_from_first_update(description: str) -> AbstractContextManager[ProgressFn]:
    """``progress_bar`` that appears at the first update, so that bad input the library finds
    before any work is the only line printed."""
    return _from_first_update(lambda: progress_bar(description))


def counts_from_first_update(description: str, unit: str) -> AbstractContextManager[CountFn]:
    """``count_progress`` that appears at the first update, as ``progress_from_first_update``."""
    return _from_first_update(lambda: count_progress(description, unit))


@contextmanager
def _from_first_update(
    open_bar: Callable[[], AbstractContextManager[Callable[[T], None]]],
) -> Iterator[Callable[[T], None]]:
    with ExitStack() as stack:
        bar: Callable[[T], None] | None = None

        def update(value: T) -> None:
            nonlocal bar
            if bar is None:
                bar = stack.enter_context(open_bar())
            bar(value)

        yield update


@contextmanager
def _lines(description: str) -> Iterator[ProgressFn]:
    """Timestamped ``HH:MM:SS description: NN%`` lines on stderr, and one when done."""
    t0 = last_t = time.monotonic()
    last = 0.0

    def update(frac: float) -> None:
        nonlocal last, last_t
        frac = min(max(frac, 0.0), 1.0)
        now = time.monotonic()
        step = int(frac / LINE_STEP + 1e-9) > int(last / LINE_STEP + 1e-9)
        if frac < 1.0 and (step or now - last_t >= LINE_EVERY_S):
            last, last_t = frac, now
            _say(description, f"{frac:.0%}")

    _say(description, "started")
    yield update
    _say(description, f"done in {time.monotonic() - t0:.1f} s")


def _say(description: str, text: str) -> None:
    """One ``HH:MM:SS description: text`` line on stderr."""
    print(f"{time.strftime('%H:%M:%S')} {description}: {text}", file=sys.stderr, flush=True)


COUNT_GAP_S = 3.0
"""Off a terminal, at most one line per this many seconds (a later part waits) ..."""
COUNT_HEARTBEAT_S = 10.0
"""... and at least one this often, with the time left counted down, while the work goes on."""


def duration_text(seconds: float | None) -> str:
    """``45s``, ``12m04s``, ``2h03m``; ``?`` without an estimate."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _eta_text(count: Count, at: float) -> str:
    """The estimate of ``count``, made at monotonic time ``at``, counted down to now."""
    if count.eta_s is None:
        return "?"
    text = duration_text(max(count.eta_s - (time.monotonic() - at), 0.0))
    return f">{text}" if count.eta_partial else text


@contextmanager
def count_progress(description: str, unit: str, enabled: bool = True) -> Iterator[CountFn]:
    """Yield a callback taking a Count: a bar with ``done/total UNIT``, the parts left and the
    time left on a terminal; else ``HH:MM:SS description: 37/120 runs done, 83 left, ETA
    11m50s`` lines on stderr, throttled to one per COUNT_GAP_S and at least one per
    COUNT_HEARTBEAT_S."""
    console = Console(stderr=True)
    if not enabled:
        yield lambda _count: None
        return
    if not console.is_terminal:
        with _count_lines(description, unit) as fn:
            yield fn
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} " + unit + ", {task.fields[left]} left"),
        TimeElapsedColumn(),
        _EtaColumn(),
        console=console,
        transient=True,
    ) as prog:
        task = prog.add_task(description, total=1, visible=False, left="?", count=None, at=0.0)

        def update(count: Count) -> None:
            prog.update(
                task, total=count.total, completed=count.done, visible=True, left=count.left,
                count=count, at=time.monotonic(),
            )  # fmt: skip

        yield update


class _EtaColumn(ProgressColumn):
    """``ETA 11m50s`` from the last Count's estimate, counted down between updates."""

    def render(self, task: Task) -> Text:
        count = task.fields.get("count")
        eta = _eta_text(count, task.fields["at"]) if isinstance(count, Count) else "?"
        return Text(f"ETA {eta}", style="progress.remaining")


class _CountLines:
    """The off-terminal lines of ``count_progress``, printed by updates and a heartbeat thread."""

    def __init__(self, description: str, unit: str) -> None:
        self.description, self.unit = description, unit
        self.lock = threading.Lock()
        self.count: Count | None = None
        self.at = self.said_at = 0.0
        self.said: Count | None = None

    def update(self, count: Count) -> None:
        with self.lock:
            self.count, self.at = count, time.monotonic()
            due = self.said is None or self.at - self.said_at >= COUNT_GAP_S
            if due or count.left == 0:
                self._say_count()

    def tick(self) -> None:
        """Say what an update held back, once the gap has passed, or the countdown."""
        with self.lock:
            if self.count is None or self.count.left == 0:
                return
            since = time.monotonic() - self.said_at
            if (self.said is not self.count and since >= COUNT_GAP_S) or since >= COUNT_HEARTBEAT_S:
                self._say_count()

    def _say_count(self) -> None:
        count = self.count
        assert count is not None
        eta = _eta_text(count, self.at)
        text = f"{count.done}/{count.total} {self.unit} done, {count.left} left, ETA {eta}"
        _say(self.description, text)
        self.said, self.said_at = count, time.monotonic()


@contextmanager
def _count_lines(description: str, unit: str) -> Iterator[CountFn]:
    lines = _CountLines(description, unit)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(1.0):
            lines.tick()

    t0 = time.monotonic()
    thread = threading.Thread(target=beat, name="progress-lines", daemon=True)
    thread.start()
    try:
        yield lines.update
    finally:
        stop.set()
        thread.join()
    _say(description, f"done in {time.monotonic() - t0:.1f} s")
