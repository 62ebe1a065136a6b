"""The ``oracle`` tuner, for evaluation: the best integer allocation over every cut pattern and
thread shape (the exact solver on the simulator; on any other target, candidate allocations
measured best modelled first, from a cost model of a first measurement and, on a target that
runs threads, of a probe that measures the stages' GIL fractions)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, Target, cut_patterns, even_split
from recperf.ingest.sim import model as sim
from recperf.ingest.sim import solve
from recperf.ingest.tuners.base import TUNERS, TuneLog, TuneResult, check_window
from recperf.ingest.tuners.model import inflight_options, measured_spec
from recperf.ingest.tuners.shape import pick_inflight, probe_gil, shape_optima

Key = tuple[float, int, int, int]
"""Rank of a candidate, higher is better: (modelled rows/s, -workers, -segments, -pattern)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class OracleConfig:
    """Options of the oracle tuner."""

    window_s: float = 1.0
    """Length of each measurement window, seconds."""
    max_total: int | None = None
    """Most workers in all for targets without a model (default: segments + cores), 1..4096."""
    worker_limit: int | None = None
    """Most workers of an uncapped segment for the exact solver (default: 8 x cores)."""

    def __post_init__(self) -> None:
        check_window("window_s", self.window_s)
        if self.max_total is not None:
            check_range("max_total", self.max_total, 1, 4096)
        if self.worker_limit is not None:
            check_range("worker_limit", self.worker_limit, 1, 65536)


class _Search:
    """Branch and bound over one cut pattern's worker counts, keeping the ``limit`` best
    candidates (by ``Key``) in a shared min-heap. A partial assignment's modelled rate can only
    fall as segments are added (the min over more segments, more contention), so it bounds
    every completion; a branch whose bound ranks below the heap's worst is cut."""

    def __init__(self, spec: sim.PipelineSpec, limit: int, max_total: int | None) -> None:
        self.spec = spec
        self.limit = limit
        self.max_total = max_total
        self.heap: list[tuple[Key, int, Allocation]] = []
        self.found = 0  # ties of Key rank the earlier found first

    def pattern(self, index: int, cuts: tuple[int, ...]) -> None:
        spec = self.spec
        segs = solve.segments_of(spec.n_stages, cuts)
        self.k, self.index, self.cuts = len(segs), index, cuts
        self.costs = spec.segment_costs_us(segs)
        self.caps = spec.segment_caps(segs)
        self.mem = spec.segment_memory_mib(segs)
        self.free_mib = spec.memory_budget_gib * 1024 * (1 + 1e-12) - spec.buffer_mib(len(segs))
        total = spec.cores + self.k if self.max_total is None else self.max_total
        self._extend([], float("inf"), total, 0.0)

    def _key(self, rate: float, workers: int) -> Key:
        scale = 1.0 if workers <= self.spec.cores else self.spec.cores / workers
        return (rate * 1e6 * scale, -workers, -self.k, -self.index)

    def _extend(self, w: list[int], rate: float, left: int, mib: float) -> None:
        j, rest = len(w), self.k - len(w) - 1
        if j == self.k:
            self.found += 1
            item = (
                self._key(rate, sum(w)),
                -self.found,
                Allocation(workers=tuple(w), cuts=self.cuts),
            )
            if len(self.heap) < self.limit:
                heapq.heappush(self.heap, item)
            elif item[:2] > self.heap[0][:2]:
                heapq.heapreplace(self.heap, item)
            return
        cap = self.caps[j]
        rest_mib = sum(self.mem[j + 1 :])
        for x in range(1, (left - rest if cap is None else min(cap, left - rest)) + 1):
            if mib + x * self.mem[j] + rest_mib > self.free_mib:
                break  # memory only grows with x
            r = min(rate, x / self.costs[j])
            full = len(self.heap) >= self.limit
            if full and self._key(r, sum(w) + x + rest) < self.heap[0][0]:
                continue
            self._extend([*w, x], r, left - x, mib + x * self.mem[j])


def ranked_candidates(
    spec: sim.PipelineSpec, limit: int, max_total: int | None = None
) -> list[Allocation]:
    """The ``limit`` best allocations under the model ``spec`` over every cut pattern, each
    segment within its cap, at most ``max_total`` workers in all (default: segments + cores)
    and within the model's memory; best modelled first (ties: fewer workers, fewer segments,
    the earlier pattern of ``cut_patterns``)."""
    search = _Search(spec, max(1, limit), max_total)
    for i, cuts in enumerate(cut_patterns(spec.n_stages)):
        search.pattern(i, cuts)
    ranked = sorted(search.heap, key=lambda item: item[:2], reverse=True)
    return [alloc.normalized(spec.n_stages) for _, _, alloc in ranked]


@TUNERS.register("oracle")
class Oracle:
    """Exhaustive: exact on a target with a ``.spec`` model, measured otherwise."""

    name: str = "oracle"
    Config = OracleConfig

    def __init__(self, config: OracleConfig | None = None) -> None:
        self.config = config or OracleConfig()

    def tune(self, target: Target, budget_s: float, seed: int = 0) -> TuneResult:
        log = TuneLog(target, budget_s, self.config.window_s)
        spec = getattr(target, "spec", None)
        if isinstance(spec, sim.PipelineSpec):
            best = solve.oracle(spec, worker_limit=self.config.worker_limit)
            log.measure(best)
            return log.result(self.name, pick_inflight(log, best))
        first = log.measure(even_split(target))
        if first is None:
            return log.result(self.name)
        probe_gil(log)  # measures nothing on a target without threads
        model = measured_spec(target, log.measurements, name="oracle")
        keep = len(inflight_options(target)) - 1  # windows for the in-flight probe, if any
        windows = int((budget_s - log.spent_s()) / log.window_s + 1e-9) - keep
        allocs = self._candidates(model, windows)
        if not allocs:
            raise ConfigError("oracle: no allocation fits the caps, max_total and memory")
        for alloc in allocs:
            if log.spent_s() + (1 + keep) * log.window_s > budget_s * (1 + 1e-9):
                break
            if log.fits_memory(alloc):
                log.measure(alloc)
        return log.result(self.name, pick_inflight(log, log.best()))

    def _candidates(self, model: sim.PipelineSpec, limit: int) -> list[Allocation]:
        """The ``limit`` best allocations of the model: worker processes over every cut
        pattern (``ranked_candidates``) and, where the model runs threads, every pattern's
        best allocation of each thread shape, merged best modelled first."""
        allocs = ranked_candidates(model, limit, self.config.max_total)
        if not model.thread_options or tuple(model.thread_options) == (1,):
            return allocs
        ranked = [(model.throughput(a), i, a) for i, a in enumerate(allocs)]
        n = len(allocs)
        for cuts in cut_patterns(model.n_stages):
            for thr, alloc in shape_optima(model, cuts, self.config.max_total):
                n += 1
                ranked.append((thr, n, alloc.normalized(model.n_stages)))
        ranked.sort(key=lambda r: (-r[0], r[1]))
        return [a for _, _, a in ranked[: max(1, limit)]]
