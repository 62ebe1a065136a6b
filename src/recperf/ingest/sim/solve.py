"""The LP upper bound and the exact integer oracle of the ingestion model (``model``) over every
cut pattern and thread shape: what tuners are judged against."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, cut_patterns
from recperf.ingest.sim.model import HANDOFF_GIL_FRAC, PipelineSpec, Segments, no_copy

Binding = Literal["cores", "max_workers", "memory", "gil", "consumer"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Bound:
    """The LP relaxation's optimum: real-valued workers, no floor of one worker per segment."""

    throughput_rows_per_s: float
    """Highest throughput any allocation (even fractional) with these cuts can reach."""
    workers: tuple[float, ...]
    """The real-valued workers per segment that reach it (the least such)."""
    binding: Binding
    """The constraint that limits the throughput (``gil``: the consumer process's GIL;
    ``consumer``: the consumer's own thread)."""
    binding_stage: str | None = None
    """For ``max_workers``, the capped stage that binds (the most capped of its segment)."""
    cuts: tuple[int, ...] | None = None
    """Where the chain is cut (as ``Allocation.cuts``; None: every stage its own segment)."""
    threads: tuple[int, ...] | None = None
    """Threads of each segment's workers (as ``Allocation.threads``; None: 1 everywhere)."""


def segments_of(n_stages: int, cuts: Sequence[int] | None) -> Segments:
    """``(first, stop)`` stages of each segment of a chain of ``n_stages`` cut at ``cuts``
    (valid cuts, as ``Allocation.cuts``; None: before every stage but the first)."""
    inner = range(1, n_stages) if cuts is None else cuts
    return tuple(itertools.pairwise((0, *inner, n_stages)))


def _normal(n_stages: int, cuts: Sequence[int] | None) -> tuple[int, ...] | None:
    """``cuts`` with a cut between every pair of stages spelled None (as Allocation.normalized)."""
    return None if cuts is None or len(cuts) == n_stages - 1 else tuple(cuts)


def _threads(threads: Sequence[int] | None, k: int) -> tuple[int, ...]:
    return (1,) * k if threads is None else tuple(threads)


def _spelled(threads: Sequence[int] | None) -> tuple[int, ...] | None:
    """``threads`` as Allocation.normalized spells them (None for 1s everywhere)."""
    return None if threads is None or all(t == 1 for t in threads) else tuple(threads)


def shapes(spec: PipelineSpec, k: int) -> Iterator[tuple[int, ...]]:
    """Every thread shape of ``k`` segments from ``spec.thread_options`` (in its order)."""
    return itertools.product(spec.thread_options, repeat=k)


@dataclass(frozen=True, slots=True)
class _Terms:
    """One segment's part of the LP at one thread count: its worker's µs per row (``worker_us``),
    its core-µs per row (the rows' cost), its thread-µs per row (what a cap on threads
    counts), a worker's memory, its cap and the stage that sets it, its GIL-held
    µs per row in the consumer's process (0 unless consumer threads)."""

    per: float
    work: float
    slots: float
    mem: float
    cap: int | None
    cap_stage: str | None
    consumer_gil: float


@functools.lru_cache(maxsize=32)
def _table(spec: PipelineSpec) -> dict[tuple[int, int, int, bool], _Terms]:
    """A cache of ``_terms`` per spec (the oracle asks for the same segments many times)."""
    return {}


def _terms(spec: PipelineSpec, seg: tuple[int, int], t: int, copy: bool) -> _Terms:
    """``_Terms`` of segment ``seg`` run with ``t`` threads, handing on with a copy or not,
    computed as the model computes them (``segment_costs_us``, ``segment_gil_us``,
    ``worker_us``, ``segment_memory_mib``: the same bits)."""
    table = _table(spec)
    key = (seg[0], seg[1], t, copy)
    found = table.get(key)
    if found is not None:
        return found
    stages = spec.stages[seg[0] : seg[1]]
    work = spec.in_process(sum(st.cost_us_per_row for st in stages), t)
    cost = work + spec.transfer_us_per_row if copy else work
    gil = spec.in_process(sum(st.gil_us_per_row for st in stages), t) + HANDOFF_GIL_FRAC * (
        spec.transfer_us_per_row if copy else 0.0
    )
    per = max(cost / t, gil) if t >= 2 else cost
    (cap,) = spec.segment_caps((seg,))
    stage = None if cap is None else next(st.name for st in stages if st.max_workers == cap)
    (mem,) = spec.segment_memory_mib((seg,), None if t == 1 else (t,))
    # task-µs per row: the rows' cost whatever the threads (a thread waiting for the GIL uses
    # no core), as ``task_widths`` counts a worker's tasks
    out = _Terms(per, cost, per * max(1, t), mem, cap, stage, gil if t == 0 else 0.0)
    table[key] = out
    return out


def pattern_bound(
    spec: PipelineSpec, cuts: Sequence[int] | None, threads: Sequence[int] | None = None
) -> Bound:
    """Solve max T s.t. T*x_j/1e6 <= w_j, tasks <= cap_j, sum tasks <= cores, memory(w) <=
    budget and the consumer process's limits for the segments of ``cuts`` run with ``threads``.

    A worker of segment j serves 1e6 / x_j rows/s (``worker_us``: x_j = c_j for a
    single-threaded process or a consumer thread, max(c_j / T, g_j) for T threads sharing a
    GIL), keeps c_j / x_j cores busy (``task_widths``) and holds max(1, T) threads (what a cap
    counts), so the least workers for throughput T are linear in T, the cores it keeps busy
    sum to T * sum c_j / 1e6, and every constraint caps T on its own; T* is the smallest of
    those caps."""
    segs = segments_of(spec.n_stages, cuts)
    t = _threads(threads, len(segs))
    terms = [
        _terms(spec, seg, tj, not no_copy(t, j))
        for j, (seg, tj) in enumerate(zip(segs, t, strict=True))
    ]
    own = spec.consumer_us_per_row
    limits: list[tuple[float, Binding, str | None]] = [
        (spec.cores * 1e6 / sum(x.work for x in terms), "cores", None)
    ]
    for x in terms:
        if x.cap is not None:
            limits.append((x.cap * 1e6 / x.slots, "max_workers", x.cap_stage))
    mib_per_rate = sum(x.per * x.mem for x in terms)
    free_mib = spec.memory_budget_gib * 1024 - spec.buffer_mib(len(segs))
    if free_mib < 0:
        limits.append((0.0, "memory", None))
    elif mib_per_rate > 0:
        limits.append((free_mib * 1e6 / mib_per_rate, "memory", None))
    gil = sum(x.consumer_gil for x in terms) + (spec.consumer_gil_frac * own if own else 0.0)
    if gil > 0:
        limits.append((1e6 / gil, "gil", None))
    if own > 0:
        limits.append((1e6 / own, "consumer", None))
    best, binding, binding_stage = min(limits, key=lambda lim: lim[0])
    return Bound(
        throughput_rows_per_s=best,
        workers=tuple(best * x.per / 1e6 for x in terms),
        binding=binding,
        binding_stage=binding_stage,
        cuts=_normal(spec.n_stages, cuts),
        threads=_spelled(threads),
    )


def lp_bound(spec: PipelineSpec) -> Bound:
    """The best ``pattern_bound`` over every cut pattern and thread shape (fewest cuts, then
    the earlier shape of ``shapes``, on ties)."""
    best: Bound | None = None
    for cuts in cut_patterns(spec.n_stages):
        for t in shapes(spec, len(cuts) + 1):
            b = pattern_bound(spec, cuts, t)
            if best is None or b.throughput_rows_per_s > best.throughput_rows_per_s * (1 + 1e-12):
                best = b
    assert best is not None  # a chain has at least the fused pattern
    return best


OVERSUBSCRIBE = 8
"""Default most workers per uncapped segment, as a multiple of the cores (see ``oracle``)."""


def segment_limits(
    spec: PipelineSpec,
    segs: Segments,
    worker_limit: int | None = None,
    threads: Sequence[int] | None = None,
) -> list[int]:
    """Most workers each segment may get: its cap over its threads (the cap counts tasks),
    else ``worker_limit`` (default 8 x cores)."""
    limit = OVERSUBSCRIBE * spec.cores if worker_limit is None else worker_limit
    t = _threads(threads, len(segs))
    return [
        limit if cap is None else min(cap // max(1, ti), limit)
        for cap, ti in zip(spec.segment_caps(segs), t, strict=True)
    ]


def pattern_oracle(
    spec: PipelineSpec,
    cuts: Sequence[int] | None,
    worker_limit: int | None = None,
    threads: Sequence[int] | None = None,
) -> Allocation | None:
    """The best integer allocation of the segments of ``cuts`` run with ``threads`` within caps
    and memory (ties go to fewer workers); None if none fits.

    Exact for the min-of-segments model: take an optimum w* and r = min_j w*_j / x_j (one of
    the candidates w / x_j, x_j a worker's µs per row as in ``pattern_bound``); the least
    workers reaching r, ceil(r * x_j), are <= w* everywhere, so they reach at least r with no
    more tasks (no more contention) and no more memory, and the consumer's limits do not depend
    on the workers. Every candidate's least workers are computed at once; they grow with r, so
    the first near-best candidate has the fewest workers.
    """
    segs = segments_of(spec.n_stages, cuts)
    t = _threads(threads, len(segs))
    lim = np.asarray(segment_limits(spec, segs, worker_limit, t), dtype=float)
    if (lim < 1).any():
        return None
    costs = np.asarray(spec.worker_us(segs, t))
    ratios = np.unique(
        np.concatenate([np.arange(1, n + 1) / c for n, c in zip(lim, costs, strict=True)])
    )
    x = ratios[:, None] * costs[None, :]
    w = np.maximum(1.0, np.ceil(x - 1e-9 * np.maximum(1.0, x)))
    per_worker = np.asarray(spec.segment_memory_mib(segs, t))
    mib = (w * per_worker).sum(axis=1) + spec.buffer_mib(len(segs))  # no BLAS: same bits anywhere
    ok = (w <= lim).all(axis=1) & (mib <= spec.memory_budget_gib * 1024 * (1 + 1e-12))
    if not ok.any():
        return None
    w = w[ok]
    width = np.asarray(spec.task_widths(segs, t), dtype=float)
    mine = np.asarray([ti == 0 for ti in t])
    if mine.any():  # the consumer's worker threads keep at most its consumer_width cores busy
        procs = (w[:, ~mine] * width[~mine]).sum(axis=1)
        total = procs + np.minimum(w[:, mine].sum(axis=1), spec.consumer_width(segs, t))
    else:
        total = (w * width).sum(axis=1) if (width != 1).any() else w.sum(axis=1)
    scale = np.where(total <= spec.cores, 1.0, spec.cores / total)
    thr = (w * 1e6 / costs * scale[:, None]).min(axis=1)
    own = _consumer_rate(spec, segs, t)
    if math.isfinite(own):
        thr = np.minimum(thr, own * scale)
    i = int(np.argmax(thr >= thr.max() * (1 - 1e-9)))
    workers = tuple(int(v) for v in w[i])
    return Allocation(workers=workers, cuts=_normal(spec.n_stages, cuts), threads=_spelled(t))


def _consumer_rate(spec: PipelineSpec, segs: Segments, threads: Sequence[int]) -> float:
    """Rows/s the consumer's process allows without contention (inf: no limit)."""
    out = math.inf
    gil = spec.consumer_gil_us(segs, threads)
    if gil > 0:
        out = 1e6 / gil
    if spec.consumer_us_per_row > 0:
        out = min(out, 1e6 / spec.consumer_us_per_row)
    return out


def oracle(spec: PipelineSpec, worker_limit: int | None = None) -> Allocation:
    """The best integer allocation over every cut pattern and thread shape within caps and
    memory; ties go to fewer tasks, then fewer segments, then the earlier pattern of
    ``cut_patterns``, then the earlier shape of ``shapes``.

    Workers may outnumber the cores (the model then scales every segment by cores / tasks),
    so each uncapped segment is limited to ``worker_limit`` workers (default 8 x cores).
    Patterns and shapes are solved (``pattern_oracle``) in decreasing order of their LP bound,
    and the search stops at the first whose bound is below the best found (no allocation of it
    or of a later one can come near), which keeps the 32 patterns of a 6-stage chain to a few.
    """
    order = [
        (i, j, cuts, t)
        for i, cuts in enumerate(cut_patterns(spec.n_stages))
        for j, t in enumerate(shapes(spec, len(cuts) + 1))
    ]
    bounds = {(i, j): pattern_bound(spec, cuts, t).throughput_rows_per_s for i, j, cuts, t in order}
    order.sort(key=lambda o: (-bounds[o[0], o[1]], o[0], o[1]))
    found: list[tuple[float, int, int, int, int, Allocation]] = []
    best_t = -math.inf
    for i, j, cuts, t in order:
        if bounds[i, j] < best_t * (1 - 1e-9):
            break
        alloc = pattern_oracle(spec, cuts, worker_limit, t)
        if alloc is None:
            continue
        thr = spec.throughput(alloc)
        found.append((thr, alloc.total, len(alloc.workers), i, j, alloc))
        best_t = max(best_t, thr)
    if not found:
        raise ConfigError(
            f"{spec.name}: no allocation of >= 1 worker per segment fits the caps and "
            f"memory_budget_gib = {spec.memory_budget_gib:g}, whatever the cuts"
        )
    near = [f for f in found if f[0] >= best_t * (1 - 1e-9)]
    return min(near, key=lambda f: f[1:5])[5]
