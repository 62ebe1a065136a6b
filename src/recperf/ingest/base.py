"""The shared vocabulary of the ingestion capability: an ``Allocation`` (where the stage chain
is cut into segments and how many workers run each), the ``Target`` a tuner measures (the
simulator or the live pipeline), a ``Measurement`` of one window, and the one even split."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from recperf.core.errors import ConfigError

MAX_CORES = 1024


def check_cores(cores: int | None) -> None:
    """``cores`` is None (all of this machine's) or 1..MAX_CORES; 0 never means all."""
    if cores is not None and not 1 <= cores <= MAX_CORES:
        raise ConfigError(
            f"cores = {cores!r}: expected 1..{MAX_CORES}, or leave it out for all cores"
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class Allocation:
    """Workers per segment of the stage chain. A segment is a contiguous run of stages that one
    worker process runs fused (no hand-off between them); a cut between two stages hands each
    batch over in shared memory to the next segment's workers."""

    workers: tuple[int, ...]
    """Workers of each segment, in chain order."""
    cuts: tuple[int, ...] | None = None
    """Stage indices where a new segment begins (increasing, each >= 1); None: every stage is a
    segment of its own (a cut between every pair of stages)."""

    def __post_init__(self) -> None:
        if self.cuts is None:
            return
        c = self.cuts
        if any(b <= a for a, b in itertools.pairwise(c)) or (c and c[0] < 1):
            raise ConfigError(f"allocation cuts {list(c)}: expected increasing stage indices >= 1")
        if len(self.workers) != len(c) + 1:
            raise ConfigError(
                f"allocation has {len(self.workers)} worker counts for {len(c) + 1} segments "
                f"(cuts {list(c)})"
            )

    @property
    def total(self) -> int:
        return sum(self.workers)

    def cut_points(self, n_stages: int) -> tuple[int, ...]:
        """The cuts, with None spelled out for a chain of ``n_stages``."""
        if self.cuts is None:
            return tuple(range(1, n_stages))
        if self.cuts and self.cuts[-1] >= n_stages:
            raise ConfigError(f"allocation cut at stage {self.cuts[-1]}: the chain has {n_stages}")
        return self.cuts

    def segments(self, n_stages: int) -> tuple[tuple[int, int], ...]:
        """``(first, stop)`` stage indices of each segment."""
        edges = (0, *self.cut_points(n_stages), n_stages)
        return tuple(itertools.pairwise(edges))

    def normalized(self, n_stages: int) -> Allocation:
        """The same allocation with ``cuts`` None when every stage is its own segment."""
        cuts = self.cut_points(n_stages)
        if len(self.workers) != len(cuts) + 1:
            raise ConfigError(
                f"allocation has {len(self.workers)} worker counts; the chain of {n_stages} "
                f"stages cut at {list(cuts)} has {len(cuts) + 1} segments"
            )
        if len(cuts) == n_stages - 1:
            return self if self.cuts is None else Allocation(workers=self.workers)
        return self if self.cuts is not None else Allocation(workers=self.workers, cuts=cuts)

    def stage_workers(self, n_stages: int) -> tuple[int, ...]:
        """Each stage's workers (those of its segment)."""
        out: list[int] = []
        for w, (a, b) in zip(self.workers, self.segments(n_stages), strict=True):
            out += [w] * (b - a)
        return tuple(out)

    def label(self, stage_names: Sequence[str]) -> str:
        """e.g. ``read+dense+sparse x2 | shuffle+collate x1``."""
        segs = self.segments(len(stage_names))
        return " | ".join(
            f"{'+'.join(stage_names[a:b])} x{w}"
            for w, (a, b) in zip(self.workers, segs, strict=True)
        )


def cut_patterns(n_stages: int) -> Iterator[tuple[int, ...]]:
    """Every way to cut a chain of ``n_stages`` (2 ** (n - 1) of them), fewest cuts first."""
    inner = range(1, n_stages)
    for k in range(n_stages):
        yield from itertools.combinations(inner, k)


def segment_caps(
    caps: Sequence[int | None], segments: Sequence[tuple[int, int]]
) -> tuple[int | None, ...]:
    """A segment's cap is its most capped stage's (a fused worker runs every stage)."""
    out = []
    for a, b in segments:
        vals = [c for c in caps[a:b] if c is not None]
        out.append(min(vals) if vals else None)
    return tuple(out)


class AllocationRefused(ConfigError):
    """The target refused an allocation (over its memory budget, a segment under 1 worker or over
    its cap). Tuners catch it and try another allocation; nothing was changed."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Measurement:
    """What one measurement window of an allocation saw, per stage in pipeline order (a fused
    worker times each of its stages, so the stages stay visible whatever the cuts)."""

    allocation: Allocation
    """The allocation that ran during the window."""
    throughput_rows_per_s: float
    """Rows/s leaving the last stage."""
    stage_rows_per_s: tuple[float, ...]
    """Rows/s each stage finished."""
    busy_frac: tuple[float, ...]
    """Fraction of its workers' wall time each stage's segment spent working (0..1)."""
    queue_fill: tuple[float, ...]
    """Mean fill (0..1) of each stage's input queue; 0 for the first stage and inside a segment."""
    cpu_s: tuple[float, ...]
    """CPU seconds spent on each stage in the window."""
    cost_us_per_row: tuple[float, ...]
    """Measured CPU microseconds per row of each stage (its cpu_s / rows); NaN if no rows."""
    memory_bytes: float
    """Memory of the workers plus buffers during the window."""
    window_s: float
    """Length of the window, seconds (simulated seconds on the simulator)."""
    handoff_us_per_row: float = float("nan")
    """CPU per row of handing a batch over at a cut or to the consumer (writing it to shared
    memory and mapping it on the other side), microseconds; NaN if not measured."""
    consumer_us_per_row: float = float("nan")
    """CPU per row the consumer's process spent taking batches (and the coordinator), µs."""


@runtime_checkable
class Target(Protocol):
    """A pipeline a tuner may reconfigure and measure: the simulator or the live pipeline."""

    @property
    def stage_names(self) -> tuple[str, ...]: ...

    @property
    def cores(self) -> int: ...

    @property
    def max_workers(self) -> tuple[int | None, ...]:
        """Per-stage worker cap (None: no cap); a segment's cap is its stages' least."""
        ...

    @property
    def memory_budget_bytes(self) -> float: ...

    def memory_bytes(self, alloc: Allocation) -> float:
        """Predicted memory (workers + buffers) of ``alloc``, bytes."""
        ...

    def measure(self, alloc: Allocation, window_s: float) -> Measurement:
        """Apply ``alloc`` (raise AllocationRefused, changing nothing, if it cannot run) and
        return what a window of ``window_s`` seconds saw."""
        ...

    def elapsed_s(self) -> float:
        """Seconds of tuning spent so far on this target (simulated on the simulator)."""
        ...


class Shape(Protocol):
    """What the even and fused splits need to know of a target."""

    @property
    def stage_names(self) -> tuple[str, ...]: ...

    @property
    def cores(self) -> int: ...

    @property
    def max_workers(self) -> tuple[int | None, ...]: ...

    @property
    def memory_budget_bytes(self) -> float: ...

    def memory_bytes(self, alloc: Allocation) -> float: ...


def even_split(target: Shape) -> Allocation:
    """The one even split: every stage its own segment with one worker, then the rest of the
    cores dealt round-robin from the first stage, skipping stages at their cap or whose next
    worker would go over the memory budget."""
    n = len(target.stage_names)
    w = [1] * n
    if target.memory_bytes(Allocation(workers=tuple(w))) > target.memory_budget_bytes:
        raise ConfigError("even split: one worker per stage is already over the memory budget")
    left = target.cores - n
    while left > 0:
        gave = False
        for i, cap in enumerate(target.max_workers):
            if left == 0:
                break
            if cap is not None and w[i] >= cap:
                continue
            w[i] += 1
            if target.memory_bytes(Allocation(workers=tuple(w))) > target.memory_budget_bytes:
                w[i] -= 1
                continue
            left -= 1
            gave = True
        if not gave:
            break
    return Allocation(workers=tuple(w))


def fused(target: Shape) -> Allocation:
    """One segment of every stage with a worker per core (fewer if capped or out of memory)."""
    (cap,) = segment_caps(target.max_workers, ((0, len(target.stage_names)),))
    w = max(1, target.cores if cap is None else min(cap, target.cores))
    while w > 1 and target.memory_bytes(Allocation(workers=(w,), cuts=())) > (
        target.memory_budget_bytes
    ):
        w -= 1
    return Allocation(workers=(w,), cuts=())
