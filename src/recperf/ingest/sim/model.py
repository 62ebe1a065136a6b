"""Analytic model of a chained ingestion pipeline cut into fused segments: per-segment worker
pools, bottleneck throughput, memory, the LP upper bound and the exact integer oracle over every
cut pattern, which tuners are judged against."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from recperf.core.config import check_range, from_mapping, load_toml
from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, cut_patterns, segment_caps

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
    """Resident memory this stage adds to a worker that runs it, MiB (0..1e9)."""

    def __post_init__(self) -> None:
        check_range("cost_us_per_row", self.cost_us_per_row, *COST_US_RANGE)
        if self.max_workers is not None:
            check_range("max_workers", self.max_workers, 1, None)
        check_range("memory_mib_per_worker", self.memory_mib_per_worker, 0.0, MAX_MEMORY_MIB)


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

    def __post_init__(self) -> None:
        check_range("cores", self.cores, 1, 1024)
        check_range("memory_budget_gib", self.memory_budget_gib, 0.0, MAX_BUDGET_GIB, lo_open=True)
        check_range("transfer_us_per_row", self.transfer_us_per_row, 0.0, COST_US_RANGE[1])
        check_range("memory_mib_per_batch", self.memory_mib_per_batch, 0.0, MAX_MEMORY_MIB)
        check_range("batch_rows", self.batch_rows, 1, None)
        check_range("queue_batches", self.queue_batches, 0, None)
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

    def segment_costs_us(self, segs: Segments) -> tuple[float, ...]:
        """Per-row cost of each segment: its stages' costs plus one hand-off."""
        return tuple(
            sum(s.cost_us_per_row for s in self.stages[a:b]) + self.transfer_us_per_row
            for a, b in segs
        )

    def segment_caps(self, segs: Segments) -> tuple[int | None, ...]:
        return segment_caps([s.max_workers for s in self.stages], segs)

    def segment_memory_mib(self, segs: Segments) -> tuple[float, ...]:
        """Memory of one worker of each segment: the sum of its stages' (see the class doc)."""
        return tuple(sum(s.memory_mib_per_worker for s in self.stages[a:b]) for a, b in segs)

    def segment_label(self, seg: tuple[int, int]) -> str:
        """e.g. ``read+dense``."""
        return "+".join(s.name for s in self.stages[seg[0] : seg[1]])

    def contention(self, alloc: AllocLike) -> float:
        """Factor (<= 1) every segment's capacity is scaled by when workers outnumber cores."""
        total = sum(self.layout(alloc)[1])
        return 1.0 if total <= self.cores else self.cores / total

    def capacities(self, alloc: AllocLike) -> tuple[float, ...]:
        """Rows/s each segment could sustain alone under ``alloc`` (contention included)."""
        segs, w = self.layout(alloc)
        scale = self.contention(alloc)
        out = []
        caps, costs = self.segment_caps(segs), self.segment_costs_us(segs)
        for wi, cap, cost in zip(w, caps, costs, strict=True):
            useful = wi if cap is None else min(wi, cap)
            out.append(max(useful, 0) * 1e6 / cost * scale)
        return tuple(out)

    def throughput(self, alloc: AllocLike) -> float:
        """Pipeline rows/s: the slowest segment of the chain."""
        return min(self.capacities(alloc))

    def bottleneck(self, alloc: AllocLike) -> str:
        """Label of the slowest segment, e.g. ``read+dense`` (the first one on ties)."""
        caps = self.capacities(alloc)
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
        mib = sum(wi * m for wi, m in zip(w, self.segment_memory_mib(segs), strict=True))
        return (mib + self.buffer_mib(len(segs))) * MIB

    def check_allocation(self, alloc: AllocLike) -> None:
        """Raise ConfigError if a segment has < 1 or more than its cap of workers, or memory is
        over the budget."""
        segs, w = self.layout(alloc)
        for seg, wi, cap in zip(segs, w, self.segment_caps(segs), strict=True):
            what = "stage" if seg[1] - seg[0] == 1 else "segment"
            if wi < 1:
                raise ConfigError(
                    f"allocation: {what} {self.segment_label(seg)!r} has {wi} workers; needs >= 1"
                )
            if cap is not None and wi > cap:
                raise ConfigError(
                    f"allocation: {what} {self.segment_label(seg)!r} has {wi} workers, over its "
                    f"max_workers = {cap}"
                )
        total_mib = self.memory_bytes(alloc) / MIB
        if total_mib > self.memory_budget_gib * 1024 * (1 + 1e-12):
            buf = self.buffer_mib(len(segs))
            raise ConfigError(
                f"allocation needs {total_mib:.1f} MiB (worker memory {total_mib - buf:.1f} MiB "
                f"+ buffers {buf:.1f} MiB), over memory_budget_gib = {self.memory_budget_gib:g} "
                f"GiB ({self.memory_budget_gib * 1024:.1f} MiB)"
            )

    def fits(self, alloc: AllocLike) -> bool:
        """True if ``alloc`` passes check_allocation and uses at most ``cores`` workers."""
        try:
            self.check_allocation(alloc)
        except ConfigError:
            return False
        return sum(self.layout(alloc)[1]) <= self.cores

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


BUNDLED = ("criteo-16", "udf-64", "membound-128", "live-2", "udfcut-4")


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


# -- bound and oracle -------------------------------------------------------------------------

Binding = Literal["cores", "max_workers", "memory"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Bound:
    """The LP relaxation's optimum: real-valued workers, no floor of one worker per segment."""

    throughput_rows_per_s: float
    """Highest throughput any allocation (even fractional) with these cuts can reach."""
    workers: tuple[float, ...]
    """The real-valued workers per segment that reach it (the least such)."""
    binding: Binding
    """The constraint that limits the throughput."""
    binding_stage: str | None = None
    """For ``max_workers``, the capped stage that binds (the most capped of its segment)."""
    cuts: tuple[int, ...] | None = None
    """Where the chain is cut (as ``Allocation.cuts``; None: every stage its own segment)."""


def segments_of(n_stages: int, cuts: Sequence[int] | None) -> Segments:
    """``(first, stop)`` stages of each segment of a chain of ``n_stages`` cut at ``cuts``
    (valid cuts, as ``Allocation.cuts``; None: before every stage but the first)."""
    inner = range(1, n_stages) if cuts is None else cuts
    return tuple(itertools.pairwise((0, *inner, n_stages)))


def _normal(n_stages: int, cuts: Sequence[int] | None) -> tuple[int, ...] | None:
    """``cuts`` with a cut between every pair of stages spelled None (as Allocation.normalized)."""
    return None if cuts is None or len(cuts) == n_stages - 1 else tuple(cuts)


def pattern_bound(spec: PipelineSpec, cuts: Sequence[int] | None) -> Bound:
    """Solve max T s.t. T*c_j/1e6 <= w_j <= cap_j, sum w <= cores, memory(w) <= budget for the
    segments of ``cuts``.

    The least workers for throughput T are w_j = T*c_j/1e6, linear in T, so every constraint
    caps T on its own and T* is the smallest of those caps.
    """
    segs = segments_of(spec.n_stages, cuts)
    costs = spec.segment_costs_us(segs)
    limits: list[tuple[float, Binding, str | None]] = [
        (spec.cores * 1e6 / sum(costs), "cores", None)
    ]
    for (a, b), c, cap in zip(segs, costs, spec.segment_caps(segs), strict=True):
        if cap is not None:
            stage = next(s.name for s in spec.stages[a:b] if s.max_workers == cap)
            limits.append((cap * 1e6 / c, "max_workers", stage))
    mem = spec.segment_memory_mib(segs)
    mib_per_rate = sum(c * m for c, m in zip(costs, mem, strict=True))
    free_mib = spec.memory_budget_gib * 1024 - spec.buffer_mib(len(segs))
    if free_mib < 0:
        limits.append((0.0, "memory", None))
    elif mib_per_rate > 0:
        limits.append((free_mib * 1e6 / mib_per_rate, "memory", None))
    t, binding, binding_stage = min(limits, key=lambda lim: lim[0])
    return Bound(
        throughput_rows_per_s=t,
        workers=tuple(t * c / 1e6 for c in costs),
        binding=binding,
        binding_stage=binding_stage,
        cuts=_normal(spec.n_stages, cuts),
    )


def lp_bound(spec: PipelineSpec) -> Bound:
    """The best ``pattern_bound`` over every cut pattern (fewest cuts on ties)."""
    best: Bound | None = None
    for cuts in cut_patterns(spec.n_stages):
        b = pattern_bound(spec, cuts)
        if best is None or b.throughput_rows_per_s > best.throughput_rows_per_s * (1 + 1e-12):
            best = b
    assert best is not None  # a chain has at least the fused pattern
    return best


OVERSUBSCRIBE = 8
"""Default most workers per uncapped segment, as a multiple of the cores (see ``oracle``)."""


def segment_limits(
    spec: PipelineSpec, segs: Segments, worker_limit: int | None = None
) -> list[int]:
    """Most workers each segment may get: its cap, else ``worker_limit`` (default 8 x cores)."""
    limit = OVERSUBSCRIBE * spec.cores if worker_limit is None else worker_limit
    return [limit if cap is None else min(cap, limit) for cap in spec.segment_caps(segs)]


def pattern_oracle(
    spec: PipelineSpec, cuts: Sequence[int] | None, worker_limit: int | None = None
) -> Allocation | None:
    """The best integer allocation of the segments of ``cuts`` within caps and memory (ties go
    to fewer workers); None if none fits.

    Exact for the min-of-segments model: take an optimum w* and r = min_j w*_j / c_j (one of the
    candidates w / c_j); the least workers reaching r, ceil(r * c_j), are <= w* everywhere, so
    they reach at least r with no more workers (no more contention) and no more memory. Every
    candidate's least workers are computed at once; they grow with r, so the first near-best
    candidate has the fewest workers.
    """
    segs = segments_of(spec.n_stages, cuts)
    costs = np.asarray(spec.segment_costs_us(segs))
    lim = np.asarray(segment_limits(spec, segs, worker_limit), dtype=float)
    ratios = np.unique(
        np.concatenate([np.arange(1, n + 1) / c for n, c in zip(lim, costs, strict=True)])
    )
    x = ratios[:, None] * costs[None, :]
    w = np.maximum(1.0, np.ceil(x - 1e-9 * np.maximum(1.0, x)))
    per_worker = np.asarray(spec.segment_memory_mib(segs))
    mib = (w * per_worker).sum(axis=1) + spec.buffer_mib(len(segs))  # no BLAS: same bits anywhere
    ok = (w <= lim).all(axis=1) & (mib <= spec.memory_budget_gib * 1024 * (1 + 1e-12))
    if not ok.any():
        return None
    w = w[ok]
    total = w.sum(axis=1)
    scale = np.where(total <= spec.cores, 1.0, spec.cores / total)
    t = (w * 1e6 / costs * scale[:, None]).min(axis=1)
    i = int(np.argmax(t >= t.max() * (1 - 1e-9)))
    workers = tuple(int(v) for v in w[i])
    return Allocation(workers=workers, cuts=_normal(spec.n_stages, cuts))


def oracle(spec: PipelineSpec, worker_limit: int | None = None) -> Allocation:
    """The best integer allocation over every cut pattern within caps and memory; ties go to
    fewer workers, then fewer segments, then the earlier pattern of ``cut_patterns``.

    Workers may outnumber the cores (the model then scales every segment by cores / workers),
    so each uncapped segment is limited to ``worker_limit`` workers (default 8 x cores).
    Patterns are solved (``pattern_oracle``) in decreasing order of their LP bound, and the
    search stops at the first whose bound is below the best found (no allocation of it or of a
    later one can come near), which keeps the 32 patterns of a 6-stage chain to a few.
    """
    order = list(enumerate(cut_patterns(spec.n_stages)))
    bounds = {i: pattern_bound(spec, cuts).throughput_rows_per_s for i, cuts in order}
    order.sort(key=lambda ic: (-bounds[ic[0]], ic[0]))
    found: list[tuple[float, int, int, int, Allocation]] = []
    best_t = -math.inf
    for i, cuts in order:
        if bounds[i] < best_t * (1 - 1e-9):
            break
        alloc = pattern_oracle(spec, cuts, worker_limit)
        if alloc is None:
            continue
        t = spec.throughput(alloc)
        found.append((t, alloc.total, len(alloc.workers), i, alloc))
        best_t = max(best_t, t)
    if not found:
        raise ConfigError(
            f"{spec.name}: no allocation of >= 1 worker per segment fits the caps and "
            f"memory_budget_gib = {spec.memory_budget_gib:g}, whatever the cuts"
        )
    near = [f for f in found if f[0] >= best_t * (1 - 1e-9)]
    return min(near, key=lambda f: f[1:4])[4]
