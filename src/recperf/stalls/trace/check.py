"""Checks that per-rank traces can be one run's before any figure is drawn from them: each
thread's iterations in order and apart, every rank tracing the same iterations, one run id, and
clocks that overlap. A trace that fails is one ConfigError naming the file and what is wrong."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from recperf.core.errors import ConfigError
from recperf.stalls.trace.breakdown import RankTrace

OVERLAP_SLACK_S = 1e-6
"""How far one iteration may run into the next on one thread (the traces' microsecond
rounding)."""
MAX_CLOCK_GAP_S = 60.0
"""The most two ranks' traced windows may lie apart: ranks of one run train at the same time,
so a larger gap is two jobs (hosts' clocks agree far better than this)."""


@dataclass(frozen=True, slots=True, order=True)
class Span:
    """One iteration as its trace event gives it."""

    start: float
    """Start, seconds."""
    end: float
    """End, seconds."""
    number: int
    """The step's number (the N of ProfilerStep#N)."""
    index: int
    """The event's index in ``traceEvents``."""
    name: str
    """The event's name."""


def check_order(spans: Sequence[Span], source: str) -> None:
    """One thread's iterations must follow one another: numbers rising with time, each ending
    before the next starts (an iteration cannot nest in, or straddle, another)."""
    ordered = sorted(spans, key=lambda s: (s.start, s.number))
    for prev, cur in itertools.pairwise(ordered):
        where = f"{source}: traceEvents[{cur.index}] ({cur.name})"
        if cur.number <= prev.number:
            raise ConfigError(
                f"{where}.ts: starts after {prev.name} (traceEvents[{prev.index}]) although "
                "numbered before it: the timestamps run backwards"
            )
        if cur.start < prev.end - OVERLAP_SLACK_S:
            raise ConfigError(
                f"{where}.ts: starts {1e3 * (prev.end - cur.start):.3f} ms before {prev.name} "
                f"(traceEvents[{prev.index}]) ends: iterations of one thread cannot overlap"
            )


def check_ranks(traces: Sequence[RankTrace]) -> list[RankTrace]:
    """The traces sorted by rank; each rank once, one world size holding every rank, one
    device."""
    by_rank: dict[int, RankTrace] = {}
    first = traces[0]
    for t in traces:
        if t.rank in by_rank:
            raise ConfigError(f"{t.source}: rank {t.rank} again (also {by_rank[t.rank].source})")
        by_rank[t.rank] = t
        if t.world_size != first.world_size:
            raise ConfigError(
                f"{t.source}: world_size {t.world_size}, but {first.source} has {first.world_size}"
            )
        if t.world_size is not None and not 0 <= t.rank < t.world_size:
            raise ConfigError(f"{t.source}: rank {t.rank} outside world_size {t.world_size}")
        if t.device != first.device:
            raise ConfigError(f"{t.source}: a {t.device} trace among {first.device} ones")
    return [by_rank[r] for r in sorted(by_rank)]


def check_one_run(traces: Sequence[RankTrace]) -> None:
    """The ranks must be one run's: the same iterations, the same run id where the traces name
    one, and traced windows that overlap in time (or nearly)."""
    first = traces[0]
    for t in traces[1:]:
        _same_steps(first, t)
        if first.run_id is not None and t.run_id is not None and t.run_id != first.run_id:
            raise ConfigError(
                f"{t.source}: {t.run_id}, but {first.source} has {first.run_id}: the traces of "
                "two runs, not two ranks of one"
            )
        _same_time(first, t)


def _same_steps(first: RankTrace, t: RankTrace) -> None:
    mine, theirs = [s.index for s in t.steps], [s.index for s in first.steps]
    if mine != theirs:
        raise ConfigError(
            f"{t.source}: steps {_steps(mine)}, but {first.source} has {_steps(theirs)}: ranks "
            "of one run trace the same iterations"
        )


def _steps(numbers: Sequence[int]) -> str:
    if not numbers:
        return "none"
    return f"#{numbers[0]}..#{numbers[-1]} ({len(numbers)})"


def _window(t: RankTrace) -> tuple[float, float] | None:
    if t.epoch_s is None or not t.steps:
        return None
    return t.epoch_s + t.steps[0].start, t.epoch_s + t.steps[-1].end


def _same_time(first: RankTrace, t: RankTrace) -> None:
    a, b = _window(first), _window(t)
    if a is None or b is None:
        return
    gap = max(a[0], b[0]) - min(a[1], b[1])
    if gap > MAX_CLOCK_GAP_S:
        raise ConfigError(
            f"{t.source}: traced from {_utc(b[0])}, but {first.source} from {_utc(a[0])} "
            f"({gap:,.0f} s apart, no overlap): ranks of one run train at the same time; these "
            "are two jobs"
        )


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
