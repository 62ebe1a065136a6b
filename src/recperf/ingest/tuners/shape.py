"""What the tuners share to search thread shapes and in-flight requests beside cuts and workers:
the probe that lets a target measure its stages' GIL fractions, the measured model's best
allocation per thread shape at given cuts, a measured hill climb over one segment's threads at a
time, and the final probe over the in-flight options. On a target whose thread_options is (1,)
and inflight_options (0,) none of them measures anything."""

from __future__ import annotations

import math
from collections.abc import Sequence

from recperf.ingest.base import Allocation, Measurement, Target, segment_caps
from recperf.ingest.sim import model as sim
from recperf.ingest.sim import solve
from recperf.ingest.tuners.base import TuneLog
from recperf.ingest.tuners.model import inflight_options, thread_options, threaded


def gil_measured(ms: Sequence[Measurement]) -> bool:
    """Some window measured a GIL fraction (a worker of several threads ran)."""
    return any(math.isfinite(g) for m in ms for g in m.gil_frac)


def gil_probe(target: Target) -> Allocation | None:
    """The fused chain in several threads of one process, so that a window measures every
    stage's GIL fraction: threads of the consumer's process (one per core) where the target
    runs them, else one worker process of its most threads; None if the target runs neither
    or the fused chain's cap allows no second thread."""
    opts = thread_options(target)
    (cap,) = segment_caps(target.max_workers, ((0, len(target.stage_names)),))
    limit = target.cores if cap is None else min(cap, target.cores)
    if 0 in opts and limit >= 2:
        return Allocation(workers=(limit,), cuts=(), threads=(0,))
    most = max(opts)
    if most >= 2 and (cap is None or most <= cap):
        return Allocation(workers=(1,), cuts=(), threads=(most,))
    return None


def probe_gil(log: TuneLog) -> None:
    """Measure ``gil_probe`` once unless the log already has a GIL fraction (a no-op on a
    target without threads)."""
    if not threaded(log.target) or gil_measured(log.measurements):
        return
    probe = gil_probe(log.target)
    if probe is not None and log.fits_memory(probe):
        log.measure(probe)


def shape_optima(
    spec: sim.PipelineSpec, cuts: Sequence[int] | None, worker_limit: int | None = None
) -> list[tuple[float, Allocation]]:
    """The model's best allocation at ``cuts`` for every thread shape but all 1s, with its
    modelled throughput, best first (ties: fewer tasks, then the earlier shape)."""
    k = spec.n_stages if cuts is None else len(cuts) + 1
    out = []
    for i, t in enumerate(solve.shapes(spec, k)):
        if all(x == 1 for x in t):
            continue
        alloc = solve.pattern_oracle(spec, cuts, worker_limit, t)
        if alloc is not None:
            out.append((spec.throughput(alloc), alloc.total, i, alloc))
    out.sort(key=lambda o: (-o[0], o[1], o[2]))
    return [(thr, alloc) for thr, _, _, alloc in out]


def with_threads(alloc: Allocation, j: int, threads: int, target: Target) -> Allocation | None:
    """``alloc`` with segment ``j`` run in ``threads`` per worker and about as many tasks as
    before (None if its cap allows no worker of that many threads)."""
    n = len(target.stage_names)
    segs = alloc.segments(n)
    (cap,) = segment_caps(target.max_workers, (segs[j],))
    width = max(1, threads)
    tasks = alloc.workers[j] * max(1, alloc.segment_threads()[j])
    w = max(1, math.ceil(tasks / width))
    if cap is not None:
        if width > cap:
            return None
        w = min(w, cap // width)
    shape = list(alloc.segment_threads())
    shape[j] = threads
    workers = list(alloc.workers)
    workers[j] = w
    return Allocation(workers=tuple(workers), cuts=alloc.cuts, threads=tuple(shape),
                      inflight=alloc.inflight).normalized(n)  # fmt: skip


def climb_threads(log: TuneLog, alloc: Allocation, margin: float = 0.02) -> Allocation:
    """Hill climb over the thread shape, one segment at a time (AUTOTUNE's way: a move is kept
    when its measured window beats the current by ``margin``): each other thread option of
    the segment, at about the same tasks. Returns the allocation it ends on."""
    target = log.target
    if not threaded(target):
        return alloc
    current = alloc.normalized(log.n_stages)
    rate = log.mean_throughput(current)
    for j in range(len(current.workers)):
        for t in thread_options(target):
            if t == current.segment_threads()[j]:
                continue
            cand = with_threads(current, j, t, target)
            if cand is None or not log.fits_memory(cand):
                continue
            if not log.can_measure():
                return current
            m = log.measure(cand)
            if m is not None and not m.throughput_rows_per_s <= rate * (1 + margin):
                current, rate = cand, m.throughput_rows_per_s
    return current


def pick_inflight(log: TuneLog, alloc: Allocation) -> Allocation:
    """A final probe of ``alloc`` at each of the target's in-flight options; the one with the
    best measured mean (``alloc`` itself where the target has none to offer)."""
    opts = inflight_options(log.target)
    if opts == (0,):
        return alloc
    best = alloc.normalized(log.n_stages)
    if not log.count(best):
        log.measure(best)
    for o in opts:
        if o == best.inflight or not log.can_measure():
            continue
        cand = alloc.with_shape(inflight=o).normalized(log.n_stages)
        if log.measure(cand) is not None and log.mean_throughput(cand) > log.mean_throughput(best):
            best = cand
    return best
