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


MAX_THREADS = 64
"""The most threads one worker of a segment may run."""
MAX_INFLIGHT = 256
"""The most storage requests one reading worker may keep in flight."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Allocation:
    """Workers per segment of the stage chain, and the shape of each worker. A segment is a
    contiguous run of stages that one worker runs fused (no hand-off between them); a cut
    between two stages hands each batch over to the next segment's workers.

    A segment's ``workers`` W and ``threads`` T: with T >= 1 it runs in W worker processes of T
    threads each (W * T tasks at once); with T = 0 its W workers are threads of the consumer's
    own process (no worker process, no copy into shared memory), as a DataLoader with
    ``num_workers=0`` or torchdata.nodes with thread workers runs."""

    workers: tuple[int, ...]
    """Workers of each segment, in chain order."""
    cuts: tuple[int, ...] | None = None
    """Stage indices where a new segment begins (increasing, each >= 1); None: every stage is a
    segment of its own (a cut between every pair of stages)."""
    threads: tuple[int, ...] | None = None
    """Threads of each segment's workers (0..MAX_THREADS; 0: threads of the consumer's process);
    None: 1 everywhere (single-threaded worker processes)."""
    inflight: int = 0
    """Storage requests each worker of the reading segment keeps in flight (1..MAX_INFLIGHT),
    overlapped by asynchronous I/O inside the worker; 0: the pipeline's configured
    ``read_concurrency``."""

    def __post_init__(self) -> None:
        if self.threads is not None:
            if len(self.threads) != len(self.workers):
                raise ConfigError(
                    f"allocation has {len(self.threads)} thread counts for "
                    f"{len(self.workers)} segments"
                )
            for i, t in enumerate(self.threads):
                check_threads(t, f"allocation threads of segment {i}")
        if self.inflight:
            check_inflight(self.inflight, "allocation inflight")
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
        """Tasks the allocation runs at once: each segment's workers times its threads (a
        thread of the consumer's process counts as one)."""
        return sum(w * max(1, t) for w, t in zip(self.workers, self.segment_threads(),
                                                 strict=True))  # fmt: skip

    def segment_threads(self) -> tuple[int, ...]:
        """Threads of each segment's workers (``threads`` with None spelled out as 1s)."""
        return (1,) * len(self.workers) if self.threads is None else self.threads

    @property
    def processes(self) -> int:
        """Worker processes the allocation runs (segments of consumer threads have none)."""
        return sum(w for w, t in zip(self.workers, self.segment_threads(), strict=True) if t)

    def with_shape(
        self, threads: Sequence[int] | None = None, inflight: int | None = None
    ) -> Allocation:
        """The same cuts and workers with other threads and/or in-flight requests."""
        t = self.threads if threads is None else tuple(threads)
        return Allocation(
            workers=self.workers,
            cuts=self.cuts,
            threads=None if t is not None and all(x == 1 for x in t) else t,
            inflight=self.inflight if inflight is None else inflight,
        )

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
        threads = (
            None if self.threads is None or all(t == 1 for t in self.threads) else (self.threads)
        )
        norm = None if len(cuts) == n_stages - 1 else cuts
        if norm == self.cuts and threads == self.threads:
            return self
        return Allocation(workers=self.workers, cuts=norm, threads=threads, inflight=self.inflight)

    def stage_workers(self, n_stages: int) -> tuple[int, ...]:
        """Each stage's workers (those of its segment)."""
        out: list[int] = []
        for w, (a, b) in zip(self.workers, self.segments(n_stages), strict=True):
            out += [w] * (b - a)
        return tuple(out)

    def stage_threads(self, n_stages: int) -> tuple[int, ...]:
        """Each stage's threads per worker (those of its segment)."""
        out: list[int] = []
        for t, (a, b) in zip(self.segment_threads(), self.segments(n_stages), strict=True):
            out += [t] * (b - a)
        return tuple(out)

    def label(self, stage_names: Sequence[str]) -> str:
        """e.g. ``read+dense+sparse x2 | shuffle+collate x1``: ``x2`` is two single-threaded
        worker processes, ``x2*4t`` two processes of four threads, ``x2t`` two threads of the
        consumer's process; `` [inflight 16]`` ends it when the in-flight requests are set."""
        segs = self.segments(len(stage_names))
        text = " | ".join(
            f"{'+'.join(stage_names[a:b])} x{w}{shape_suffix(t)}"
            for w, t, (a, b) in zip(self.workers, self.segment_threads(), segs, strict=True)
        )
        return f"{text} [inflight {self.inflight}]" if self.inflight else text


def shape_suffix(threads: int) -> str:
    """How a label marks a worker's threads: nothing for 1, ``*4t`` for 4, ``t`` for 0."""
    return "" if threads == 1 else "t" if threads == 0 else f"*{threads}t"


def check_threads(value: object, field: str) -> None:
    """One line naming ``field`` unless ``value`` is a thread count 0..MAX_THREADS."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_THREADS:
        raise ConfigError(
            f"{field} = {value!r}: expected 0..{MAX_THREADS} threads per worker "
            "(0: threads of the consumer's own process)"
        )


def check_inflight(value: object, field: str) -> None:
    """One line naming ``field`` unless ``value`` is an in-flight count 1..MAX_INFLIGHT."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_INFLIGHT:
        raise ConfigError(
            f"{field} = {value!r}: expected 1..{MAX_INFLIGHT} storage requests in flight"
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
    stage_wall_s: tuple[float, ...] = ()
    """Wall seconds tasks spent in each stage in the window, storage waits excluded (with
    ``cpu_s``: a stage whose threads wait for the GIL has wall well above CPU); () if unknown."""
    gil_frac: tuple[float, ...] = ()
    """Estimated fraction of each stage's time that holds the GIL (0..1), from per-thread CPU
    versus wall time of its threads; NaN where the window had no multi-threaded worker of it;
    () if unknown."""
    throughput_ci: tuple[float, float] = (float("nan"), float("nan"))
    """90% confidence interval of ``throughput_rows_per_s`` over the window's sub-windows (NaN
    when the window was not repeated)."""
    samples: int = 1
    """Sub-windows the throughput is estimated from."""
    other_load_cores: float = float("nan")
    """Cores that processes other than the pipeline kept busy during the window (NaN: not
    measured): the noisy neighbours' load."""


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

    @property
    def thread_options(self) -> tuple[int, ...]:
        """Threads per worker the target can run (see ``Allocation.threads``; (1,): processes
        of one thread only)."""
        ...

    @property
    def inflight_options(self) -> tuple[int, ...]:
        """In-flight storage request counts worth trying ((0,): storage waits do not matter,
        keep the configured default)."""
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
