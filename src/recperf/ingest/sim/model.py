"""Analytic model of a chained ingestion pipeline cut into fused segments: per-segment worker
pools of processes or threads, the GIL each process shares among its threads, bottleneck
throughput and memory. The LP upper bound and the exact integer oracle over every cut pattern
and thread shape, which tuners are judged against, are in ``solve`` (re-exported here)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from recperf.core.config import check_range, from_mapping, load_toml
from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, check_threads, segment_caps
from recperf.ingest.data.limits import BUNDLED_SPECS

MIB = 2**20
GIB = 2**30
C = TypeVar("C")
Segments = tuple[tuple[int, int], ...]
COST_US_RANGE = (1e-6, 1e9)
"""A stage's or a hand-off's CPU cost per row, microseconds: a picosecond to 1,000 s. Beyond it
a value is a unit mistake, and the model's rows/s underflow to 0 or overflow to inf."""
MAX_MEMORY_MIB = 1e9
"""The most memory a worker or a batch may take, MiB (about a petabyte)."""
MAX_BUDGET_GIB = 1e6
"""The largest memory budget, GiB (about a petabyte)."""
DEFAULT_GIL_FRAC = 1.0
"""A stage's GIL fraction when its spec does not say: pure Python, the conservative guess (its
threads never run in parallel; only more processes speed it up)."""
HANDOFF_GIL_FRAC = 1.0
"""Share of a hand-off (pickling or copying a batch to the next process) that holds the GIL."""
THREAD_BATCHES = 2
"""Batches a worker thread holds at once (the one it reads and the one it hands on): an extra
thread's working set is this many ``memory_mib_per_batch``."""


@dataclass(kw_only=True, slots=True, frozen=True)
class StageSpec:
    """One logical pipeline stage; a worker process runs it, fused with its segment's others."""

    name: str
    """Unique stage name (e.g. ``decode``)."""
    cost_us_per_row: float
    """CPU time one worker spends per row on this stage, microseconds (1e-6..1e9)."""
    max_workers: int | None = None
    """Most workers that help this stage (>= 1); ``None`` for no cap. A segment holding the
    stage inherits the cap (its workers all run the stage)."""
    memory_mib_per_worker: float = 0.0
    """Resident memory this stage adds to a worker process that runs it, MiB (0..1e9)."""
    gil_frac: float = DEFAULT_GIL_FRAC
    """Fraction of the stage's time that holds the GIL, 0..1 (1: pure Python, 0.1: mostly in
    numpy or a parser that releases it); its threads in one process share one GIL."""
    start_s: float = 0.0
    """Seconds a new worker of this stage takes to start (a model load, a connection), 0..3600.
    The model here ignores it (workers are started once); on the Ray engine a stage with
    ``start_s > 0`` runs as an actor pool whose actors sleep this long in their constructor
    (the slow actor start of ray-project/ray#65540)."""
    out_bytes_per_row: float = 0.0
    """Bytes per row this stage hands on (0..1e9); the placement bound's network rows count them
    where the next stage runs on another node."""

    def __post_init__(self) -> None:
        check_range("cost_us_per_row", self.cost_us_per_row, *COST_US_RANGE)
        check_range("start_s", self.start_s, 0.0, 3600.0)
        check_range("out_bytes_per_row", self.out_bytes_per_row, 0.0, 1e9)
        if self.max_workers is not None:
            check_range("max_workers", self.max_workers, 1, None)
        check_range("memory_mib_per_worker", self.memory_mib_per_worker, 0.0, MAX_MEMORY_MIB)
        check_range("gil_frac", self.gil_frac, 0.0, 1.0)

    @property
    def gil_us_per_row(self) -> float:
        return self.gil_frac * self.cost_us_per_row


def no_copy(threads: Sequence[int], j: int) -> bool:
    """Segment ``j`` of a chain run with ``threads`` is consumer threads handing on to consumer
    threads or to the consumer: no copy, no hand-off cost."""
    return threads[j] == 0 and (j + 1 == len(threads) or threads[j + 1] == 0)


def copying_segments(threads: Sequence[int]) -> int:
    """Segments of a chain run with ``threads`` that pay a hand-off."""
    return sum(not no_copy(threads, j) for j in range(len(threads)))


AllocLike = Allocation | Sequence[int]
"""An Allocation, or plain per-stage worker counts (every stage its own segment)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class PipelineSpec:
    """A chain of stages sharing ``cores`` CPU cores and a memory budget.

    The model of an allocation: a segment (a contiguous run of stages, fused in one worker
    process) costs the sum of its stages' per-row costs plus one hand-off of its output
    (``transfer_us_per_row``: to the next segment or to the consumer); its useful workers are
    capped by its stages' least cap; each segment sustains useful workers / cost rows per
    microsecond, all scaled by cores / workers when the workers outnumber the cores; the chain
    runs at its slowest segment. A fused worker's memory is the sum of its stages' (conservative:
    a fused worker may share buffers between its stages, the model assumes it does not); buffers
    sit only at the cuts. With every stage its own segment this is the per-stage model.

    Threads (``Allocation.threads``, from ``thread_options``): a process of T threads has T tasks
    but one GIL, so it serves at most 1e6 / g rows/s, g its segment's GIL-held µs per row (each
    stage's ``gil_frac`` x cost, plus the hand-off at ``HANDOFF_GIL_FRAC``). Threads of the
    consumer's process (T = 0) share ONE GIL across every such segment and the consumer's own
    work (``consumer_us_per_row`` at ``consumer_gil_frac``): the GIL limit there is joint. Such a
    segment hands on without a copy (no ``transfer_us_per_row``) when the next segment is also
    consumer threads or it is the last. Contention counts tasks (``Allocation.total``; the
    consumer's own thread limits only through its rate and its GIL) against the cores. A worker
    process costs its stages' memory and each extra thread ``THREAD_BATCHES`` batches; a
    consumer thread costs only those batches.
    """

    name: str = "custom"
    """Label used in results."""
    cores: int
    """CPU cores the stages share (1..1024)."""
    memory_budget_gib: float
    """Memory the workers and inter-segment buffers may use, GiB (> 0, at most 1e6)."""
    stages: tuple[StageSpec, ...]
    """The stages, in pipeline order (at least one)."""
    transfer_us_per_row: float = 0.0
    """CPU cost of handing a row over at a cut or to the consumer, microseconds, charged once
    per segment (0..1e9)."""
    memory_mib_per_batch: float = 0.0
    """Size of one buffered batch, MiB (0..1e9)."""
    batch_rows: int = 8192
    """Rows per batch (>= 1); informational here, used by the executor and env."""
    queue_batches: int = 2
    """Batches buffered at each cut between two segments (>= 0)."""
    consumer_us_per_row: float = 0.0
    """CPU the consumer's own thread spends per row taking batches, µs (0..1e9); one thread,
    in the process that consumer-thread segments share."""
    consumer_gil_frac: float = DEFAULT_GIL_FRAC
    """Fraction of the consumer's per-row work that holds the GIL, 0..1."""
    thread_options: tuple[int, ...] = (1,)
    """Threads per worker the pipeline can run (see ``Allocation.threads``; 0: threads of the
    consumer's process); (1,): single-threaded worker processes only."""
    memory_mib_per_thread: float | None = None
    """Working set one worker thread adds, MiB (0..1e9; None: ``THREAD_BATCHES`` x
    ``memory_mib_per_batch``)."""
    process_cost_factor: float = 1.0
    """Stage cost (and GIL-held time) in a worker process relative to ``cost_us_per_row`` in
    the consumer's process (0.1..10; the live pipeline measures it: a forked worker's stages
    cost more, every array there starting on fresh pages)."""

    def __post_init__(self) -> None:
        check_range("cores", self.cores, 1, 1024)
        check_range("memory_budget_gib", self.memory_budget_gib, 0.0, MAX_BUDGET_GIB, lo_open=True)
        check_range("transfer_us_per_row", self.transfer_us_per_row, 0.0, COST_US_RANGE[1])
        check_range("memory_mib_per_batch", self.memory_mib_per_batch, 0.0, MAX_MEMORY_MIB)
        check_range("batch_rows", self.batch_rows, 1, None)
        check_range("queue_batches", self.queue_batches, 0, None)
        check_range("consumer_us_per_row", self.consumer_us_per_row, 0.0, COST_US_RANGE[1])
        check_range("consumer_gil_frac", self.consumer_gil_frac, 0.0, 1.0)
        if not self.thread_options or len(set(self.thread_options)) != len(self.thread_options):
            raise ConfigError(
                f"thread_options = {list(self.thread_options)}: expected distinct thread counts"
            )
        for t in self.thread_options:
            check_threads(t, "thread_options")
        if self.memory_mib_per_thread is not None:
            check_range("memory_mib_per_thread", self.memory_mib_per_thread, 0.0, MAX_MEMORY_MIB)
        check_range("process_cost_factor", self.process_cost_factor, 0.1, 10.0)
        if not self.stages:
            raise ConfigError("stage: the pipeline needs at least one [[stage]]")
        seen: set[str] = set()
        for st in self.stages:
            if st.name in seen:
                raise ConfigError(f"stage: duplicate stage name {st.name!r}")
            seen.add(st.name)

    # -- the model ---------------------------------------------------------------------------

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def row_costs_us(self) -> tuple[float, ...]:
        """Per-row cost of each stage as its own segment (its cost plus one hand-off)."""
        return tuple(s.cost_us_per_row + self.transfer_us_per_row for s in self.stages)

    def layout(self, alloc: AllocLike) -> tuple[Segments, tuple[int, ...]]:
        """The ``(first, stop)`` stages of each segment of ``alloc`` and its workers, checked to
        match the chain (ConfigError otherwise)."""
        a = alloc if isinstance(alloc, Allocation) else Allocation(workers=tuple(alloc))
        if a.cuts is None and len(a.workers) != self.n_stages:
            raise ConfigError(
                f"allocation has {len(a.workers)} entries; the pipeline has {self.n_stages}"
            )
        segs = a.segments(self.n_stages)
        if len(segs) != len(a.workers):
            raise ConfigError(
                f"allocation has {len(a.workers)} worker counts for {len(segs)} segments"
            )
        return segs, a.workers

    def shape(self, alloc: AllocLike) -> tuple[int, ...]:
        """Threads of each segment's workers (1s for plain worker counts)."""
        if isinstance(alloc, Allocation):
            return alloc.segment_threads()
        return (1,) * len(alloc)

    def segment_costs_us(
        self, segs: Segments, threads: Sequence[int] | None = None
    ) -> tuple[float, ...]:
        """Per-row cost of each segment: its stages' costs plus one hand-off (none where
        consumer threads hand on in their own process)."""
        t = (1,) * len(segs) if threads is None else threads
        out = []
        for j, (a, b) in enumerate(segs):
            work = self.in_process(sum(s.cost_us_per_row for s in self.stages[a:b]), t[j])
            out.append(work if no_copy(t, j) else work + self.transfer_us_per_row)
        return tuple(out)

    def in_process(self, us: float, threads: int) -> float:
        """``us`` of stage work as a worker with ``threads`` threads spends it: scaled by
        ``process_cost_factor`` in a worker process, as is in the consumer's (threads 0)."""
        if threads == 0 or self.process_cost_factor == 1.0:
            return us
        return us * self.process_cost_factor

    def segment_gil_us(self, segs: Segments, threads: Sequence[int]) -> tuple[float, ...]:
        """GIL-held µs per row of each segment: its stages' share and its hand-off's."""
        out = []
        for j, (a, b) in enumerate(segs):
            held = self.in_process(sum(s.gil_us_per_row for s in self.stages[a:b]), threads[j])
            copy = 0.0 if no_copy(threads, j) else self.transfer_us_per_row
            out.append(held + HANDOFF_GIL_FRAC * copy)
        return tuple(out)

    def worker_us(self, segs: Segments, threads: Sequence[int]) -> tuple[float, ...]:
        """µs per row of one worker of each segment alone (1e6 / its rows/s): a process of T
        threads the more of cost / T (its cores) and its GIL-held time (its GIL); a thread of
        the consumer's process its cost (the consumer's GIL is ``consumer_limit``'s)."""
        costs = self.segment_costs_us(segs, threads)
        if all(t in (0, 1) for t in threads):
            return costs
        gils = self.segment_gil_us(segs, threads)
        return tuple(
            max(c / t, g) if t >= 2 else c for c, g, t in zip(costs, gils, threads, strict=True)
        )

    def consumer_gil_us(self, segs: Segments, threads: Sequence[int]) -> float:
        """GIL-held µs per row in the consumer's process: its consumer-thread segments' and
        its own work's."""
        gils = self.segment_gil_us(segs, threads) if 0 in threads else ()
        own = self.consumer_gil_frac * self.consumer_us_per_row if self.consumer_us_per_row else 0.0
        return sum(g for g, t in zip(gils, threads, strict=False) if t == 0) + own

    def consumer_limit(self, alloc: AllocLike) -> float:
        """Rows/s the consumer's process allows (its shared GIL, its own thread), contention
        included; inf when it has no per-row work and no consumer threads."""
        segs, _ = self.layout(alloc)
        t = self.shape(alloc)
        scale = self.contention(alloc)
        out = math.inf
        gil = self.consumer_gil_us(segs, t)
        if gil > 0:
            out = 1e6 / gil * scale
        if self.consumer_us_per_row > 0:
            out = min(out, 1e6 / self.consumer_us_per_row * scale)
        return out

    def thread_mib(self) -> float:
        """Working set of one worker thread, MiB (see ``memory_mib_per_thread``)."""
        if self.memory_mib_per_thread is not None:
            return self.memory_mib_per_thread
        return THREAD_BATCHES * self.memory_mib_per_batch

    def segment_caps(self, segs: Segments) -> tuple[int | None, ...]:
        return segment_caps([s.max_workers for s in self.stages], segs)

    def segment_memory_mib(
        self, segs: Segments, threads: Sequence[int] | None = None
    ) -> tuple[float, ...]:
        """Memory of one worker of each segment: a process the sum of its stages' (see the
        class doc) plus a thread's working set per extra thread; a consumer thread only that."""
        procs = tuple(sum(s.memory_mib_per_worker for s in self.stages[a:b]) for a, b in segs)
        if threads is None or all(t == 1 for t in threads):
            return procs
        th = self.thread_mib()
        return tuple(m + (t - 1) * th if t else th for m, t in zip(procs, threads, strict=True))

    def segment_label(self, seg: tuple[int, int]) -> str:
        """e.g. ``read+dense``."""
        return "+".join(s.name for s in self.stages[seg[0] : seg[1]])

    def task_widths(self, segs: Segments, threads: Sequence[int]) -> tuple[float, ...]:
        """Cores one worker of each segment can keep busy: 1 for a single-threaded process or
        a consumer thread; for a process of T threads min(T, cost / GIL-held µs per row), since
        a thread waiting for the GIL sleeps and uses no core (a GIL-bound process keeps
        cost / GIL cores busy however many threads it has)."""
        if all(t in (0, 1) for t in threads):
            return (1.0,) * len(segs)
        costs = self.segment_costs_us(segs, threads)
        gils = self.segment_gil_us(segs, threads)
        return tuple(
            min(float(t), c / g) if t >= 2 and g > 0 else float(max(1, t))
            for c, g, t in zip(costs, gils, threads, strict=True)
        )

    def consumer_width(self, segs: Segments, threads: Sequence[int]) -> float:
        """Cores the consumer's process can keep busy with its worker threads: all of them
        share its one GIL, so at most their cost / the process's GIL-held µs per row (inf
        when no segment runs there or nothing holds the GIL)."""
        if 0 not in threads:
            return math.inf
        costs = self.segment_costs_us(segs, threads)
        gil = self.consumer_gil_us(segs, threads)
        cost = sum(c for c, t in zip(costs, threads, strict=True) if t == 0)
        return cost / gil if gil > 0 else math.inf

    def tasks(self, alloc: AllocLike) -> float:
        """Tasks competing for the cores: every worker thread that can run (a worker process
        counts its ``task_widths``, the consumer's worker threads together at most its
        ``consumer_width``; the consumer's own thread is not counted, as before threads: it
        limits only through ``consumer_limit``)."""
        segs, w = self.layout(alloc)
        t = self.shape(alloc)
        if all(ti == 1 for ti in t):
            return sum(w)
        widths = self.task_widths(segs, t)
        procs = sum(wi * x for wi, x, ti in zip(w, widths, t, strict=True) if ti != 0)
        mine = sum(wi for wi, ti in zip(w, t, strict=True) if ti == 0)
        return procs + min(float(mine), self.consumer_width(segs, t)) if mine else procs

    def contention(self, alloc: AllocLike) -> float:
        """Factor (<= 1) every segment's capacity is scaled by when tasks outnumber cores."""
        total = self.tasks(alloc)
        return 1.0 if total <= self.cores else self.cores / total

    def capacities(self, alloc: AllocLike) -> tuple[float, ...]:
        """Rows/s each segment could sustain alone under ``alloc`` (contention included; the
        consumer's shared GIL is ``consumer_limit``)."""
        segs, w = self.layout(alloc)
        t = self.shape(alloc)
        scale = self.contention(alloc)
        out = []
        caps, costs = self.segment_caps(segs), self.segment_costs_us(segs, t)
        gils = self.segment_gil_us(segs, t) if any(x >= 2 for x in t) else (0.0,) * len(segs)
        for wi, ti, cap, cost, gil in zip(w, t, caps, costs, gils, strict=True):
            tasks = wi * max(1, ti)
            useful = tasks if cap is None else min(tasks, cap)
            rate = max(useful, 0) * 1e6 / cost * scale
            if ti >= 2 and gil > 0:  # one GIL per process
                rate = min(rate, max(wi, 0) * 1e6 / gil * scale)
            out.append(rate)
        return tuple(out)

    def throughput(self, alloc: AllocLike) -> float:
        """Pipeline rows/s: the slowest segment of the chain, or the consumer's process."""
        return min(min(self.capacities(alloc)), self.consumer_limit(alloc))

    def bottleneck(self, alloc: AllocLike) -> str:
        """Label of the slowest segment, e.g. ``read+dense`` (the first one on ties), or
        ``consumer`` when the consumer's process (its GIL or its thread) limits."""
        caps = self.capacities(alloc)
        if self.consumer_limit(alloc) < min(caps):
            return "consumer"
        segs, _ = self.layout(alloc)
        return self.segment_label(segs[caps.index(min(caps))])

    def buffer_mib(self, n_segments: int | None = None) -> float:
        """Memory of the batches queued at the cuts between ``n_segments`` segments (default:
        every stage its own segment), MiB."""
        k = self.n_stages if n_segments is None else n_segments
        return (k - 1) * self.queue_batches * self.memory_mib_per_batch

    def memory_bytes(self, alloc: AllocLike) -> float:
        """Workers' memory plus the buffers at the cuts, bytes."""
        segs, w = self.layout(alloc)
        per = self.segment_memory_mib(segs, self.shape(alloc))
        mib = sum(wi * m for wi, m in zip(w, per, strict=True))
        return (mib + self.buffer_mib(len(segs))) * MIB

    def check_allocation(self, alloc: AllocLike) -> None:
        """Raise ConfigError if a segment has < 1 worker, more tasks than its cap or threads
        the pipeline cannot run, or memory is over the budget."""
        segs, w = self.layout(alloc)
        t = self.shape(alloc)
        for seg, wi, ti, cap in zip(segs, w, t, self.segment_caps(segs), strict=True):
            what = "stage" if seg[1] - seg[0] == 1 else "segment"
            label = f"{what} {self.segment_label(seg)!r}"
            if wi < 1:
                raise ConfigError(f"allocation: {label} has {wi} workers; needs >= 1")
            if ti not in self.thread_options:
                raise ConfigError(
                    f"allocation: {label} has {ti} threads per worker; the pipeline runs "
                    f"{', '.join(map(str, self.thread_options))} (thread_options)"
                )
            if cap is not None and wi * max(1, ti) > cap:
                tasks = f"{wi} workers" if ti == 1 else f"{wi} workers x {max(1, ti)} threads"
                raise ConfigError(f"allocation: {label} has {tasks}, over its max_workers = {cap}")
        total_mib = self.memory_bytes(alloc) / MIB
        if total_mib > self.memory_budget_gib * 1024 * (1 + 1e-12):
            buf = self.buffer_mib(len(segs))
            raise ConfigError(
                f"allocation needs {total_mib:.1f} MiB (worker memory {total_mib - buf:.1f} MiB "
                f"+ buffers {buf:.1f} MiB), over memory_budget_gib = {self.memory_budget_gib:g} "
                f"GiB ({self.memory_budget_gib * 1024:.1f} MiB)"
            )

    def fits(self, alloc: AllocLike) -> bool:
        """True if ``alloc`` passes check_allocation and runs at most ``cores`` threads (each
        worker's, as ``Allocation.total`` counts them)."""
        try:
            self.check_allocation(alloc)
        except ConfigError:
            return False
        _, w = self.layout(alloc)
        return sum(wi * max(1, ti) for wi, ti in zip(w, self.shape(alloc), strict=True)) <= (
            self.cores
        )

    def with_(self, **changes: Any) -> PipelineSpec:
        return dataclasses.replace(self, **changes)


# -- loading ----------------------------------------------------------------------------------


def _build(cls: type[C], data: Mapping[str, Any], source: str) -> C:
    """``from_mapping`` plus missing-key checks, with every error prefixed by ``source``."""
    required = [
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    for key in required:
        if key not in data:
            raise ConfigError(f"{source}: missing required key {key!r}")
    try:
        return from_mapping(cls, data, source=source)
    except ConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def spec_from_mapping(data: Mapping[str, Any], source: str = "spec") -> PipelineSpec:
    """Build a PipelineSpec from a TOML-shaped mapping (``[[stage]]`` tables under ``stage``)."""
    top = dict(data)
    if "stages" in top:
        raise ConfigError(f"{source}: unknown key 'stages'; declare stages as [[stage]] tables")
    raw = top.pop("stage", None)
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ConfigError(f"{source}: stage: expected one or more [[stage]] tables")
    stages = []
    for i, table in enumerate(raw):
        label = f"stage[{i}]" + (
            f" {table['name']!r}" if isinstance(table.get("name"), str) else ""
        )
        stages.append(_build(StageSpec, table, f"{source}: {label}"))
    return _build(PipelineSpec, {**top, "stages": tuple(stages)}, source)


BUNDLED = BUNDLED_SPECS


def load_spec(spec: str | Path) -> PipelineSpec:
    """A bundled spec name (see ``BUNDLED``) or a path to a TOML spec file."""
    if isinstance(spec, str) and spec in BUNDLED:
        ref = resources.files("recperf").joinpath(f"data/ingest/{spec}.toml")
        with resources.as_file(ref) as path:
            data = load_toml(path)
        return spec_from_mapping({"name": spec, **data}, source=f"{spec}.toml")
    path = Path(spec)
    data = load_toml(path)
    return spec_from_mapping({"name": path.stem, **data}, source=str(path))
