"""The simulated pipeline as a tuning ``Target``: measures allocations (any cuts) on the analytic
model with seeded multiplicative noise and a simulated clock, reporting per stage as the live
pipeline does."""

from __future__ import annotations

import numpy as np

from recperf.core import exact
from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, AllocationRefused, Measurement
from recperf.ingest.sim.model import PipelineSpec

QUEUE_FULL = 0.95
"""Input-queue fill of a segment that is the bottleneck or sits before it (backpressure)."""


class SimTarget:
    """A ``Target`` over a PipelineSpec: each measure() advances a simulated clock by its window.

    Per-stage vectors, as a fused worker that times each of its stages reports them: a stage's
    busy fraction is its segment's; its cost is its own per-row cost (no hand-off), and the
    hand-off is ``handoff_us_per_row``; both carry independent noise. Queue fill (only the first
    stage of a segment after the first has an input queue; 0 elsewhere): if the bottleneck is
    that segment or a later one, upstream produces faster than it drains (directly, or through
    backpressure), so its queue sits near full (``QUEUE_FULL``); if the bottleneck is earlier, it
    is starved and its queue fill is half its busy fraction (a near-bottleneck keeps a backlog).

    Threads: a stage's CPU is the rows it ran times its cost (threads waiting for the GIL burn
    none); its wall time is its segment's tasks' busy time, shared by cost. Its GIL fraction is
    reported, with noise, only when its worker runs several threads (T >= 2, or threads of the
    consumer's process), NaN otherwise, as the live target can measure it; the consumer's cost
    only when the spec has one. Neither draws noise otherwise, so a spec without threads sees
    the same draws as before.
    """

    def __init__(
        self, spec: PipelineSpec, *, seed: int = 0, noise: float = 0.02, window_s: float = 1.0
    ) -> None:
        check_range("noise", noise, 0.0, 0.5)
        check_range("window_s", window_s, 0.0, None, lo_open=True)
        self.spec = spec
        self.noise = noise
        self.window_s = window_s
        self._rng = np.random.default_rng(seed)
        self._clock_s = 0.0
        self.peak_memory_bytes = 0.0
        self.measurements = 0
        self.current: Allocation | None = None

    @property
    def stage_names(self) -> tuple[str, ...]:
        return self.spec.stage_names

    @property
    def cores(self) -> int:
        return self.spec.cores

    @property
    def max_workers(self) -> tuple[int | None, ...]:
        return tuple(s.max_workers for s in self.spec.stages)

    @property
    def thread_options(self) -> tuple[int, ...]:
        return self.spec.thread_options

    @property
    def inflight_options(self) -> tuple[int, ...]:
        return (0,)

    @property
    def memory_budget_bytes(self) -> float:
        return self.spec.memory_budget_gib * 2**30

    def memory_bytes(self, alloc: Allocation) -> float:
        return self.spec.memory_bytes(alloc)

    def elapsed_s(self) -> float:
        return self._clock_s

    def _factor(self, size: int | None = None) -> np.ndarray:
        """Multiplicative measurement noise: lognormal, median 1 (one draw: a 0-d array)."""
        draws = exact.lognormal(self._rng, 0.0, self.noise, 1 if size is None else size)
        return draws.reshape(()) if size is None else draws

    def _per_stage(
        self, alloc: Allocation, caps: tuple[float, ...], window: float
    ) -> tuple[list[float], list[float], list[float], list[float]]:
        """Busy fraction, queue fill, CPU and wall seconds of each stage (see the class doc),
        from the segments' capacities ``caps``; a stage's CPU is its share of its segment's
        cost."""
        spec = self.spec
        segs, workers = spec.layout(alloc)
        threads = spec.shape(alloc)
        thr = min(min(caps), spec.consumer_limit(alloc))
        neck = caps.index(min(caps)) if thr == min(caps) else len(caps)
        scale = spec.contention(alloc)
        busy: list[float] = []
        fill: list[float] = []
        cpu: list[float] = []
        wall: list[float] = []
        for j, ((a, b), w, t, cap, cost) in enumerate(
            zip(segs, workers, threads, spec.segment_caps(segs),
                spec.segment_costs_us(segs, threads), strict=True)
        ):  # fmt: skip
            seg_busy = min(1.0, thr / caps[j])
            queue = 0.0 if j == 0 else (QUEUE_FULL if neck >= j else 0.5 * seg_busy)
            tasks = w * max(1, t)
            useful = tasks if cap is None else min(tasks, cap)
            cpu_s = seg_busy * useful * scale * window
            wall_s = seg_busy * useful * window
            if t != 1:  # threads waiting for a GIL burn no CPU: the rows' cost is the CPU
                cpu_s = thr * cost / 1e6 * window
            for i in range(a, b):
                share = spec.stages[i].cost_us_per_row / cost
                busy.append(seg_busy)
                fill.append(queue if i == a else 0.0)
                cpu.append(cpu_s * share)
                wall.append(wall_s * share)
        return busy, fill, cpu, wall

    def _gil(self, alloc: Allocation) -> tuple[float, ...]:
        """Measured GIL fraction of each stage: noisy where its worker runs several threads
        (no draw, and NaN, elsewhere)."""
        n = self.spec.n_stages
        seen = [t != 1 for t in alloc.stage_threads(n)]
        if not any(seen):
            return (float("nan"),) * n
        noisy = [s.gil_frac for s in self.spec.stages] * self._factor(n)
        return tuple(min(1.0, float(g)) if ok else float("nan")
                     for g, ok in zip(noisy, seen, strict=True))  # fmt: skip

    def measure(self, alloc: Allocation, window_s: float | None = None) -> Measurement:
        """Run ``alloc`` for ``window_s`` simulated seconds (default: this target's window)."""
        window = self.window_s if window_s is None else window_s
        if not window > 0:
            raise ConfigError(f"window_s = {window!r} must be > 0")
        spec = self.spec
        try:
            spec.check_allocation(alloc)
        except ConfigError as exc:
            raise AllocationRefused(str(exc)) from None
        caps = spec.capacities(alloc)
        thr = spec.throughput(alloc)
        busy, fill, cpu, wall = self._per_stage(alloc, caps, window)
        noisy = thr * float(self._factor())
        stage_costs = np.array([s.cost_us_per_row for s in spec.stages])
        costs = stage_costs * self._factor(spec.n_stages)
        handoff = spec.transfer_us_per_row * float(self._factor())
        gil = self._gil(alloc)
        own = spec.consumer_us_per_row
        consumer = own * float(self._factor()) if own > 0 else float("nan")
        mem = spec.memory_bytes(alloc)
        self._clock_s += window
        self.measurements += 1
        self.current = alloc
        self.peak_memory_bytes = max(self.peak_memory_bytes, mem)
        return Measurement(
            allocation=alloc,
            throughput_rows_per_s=noisy,
            stage_rows_per_s=(noisy,) * spec.n_stages,
            busy_frac=tuple(busy),
            queue_fill=tuple(fill),
            cpu_s=tuple(cpu),
            cost_us_per_row=tuple(float(c) for c in costs),
            memory_bytes=mem,
            window_s=window,
            handoff_us_per_row=handoff,
            consumer_us_per_row=consumer,
            stage_wall_s=tuple(wall),
            gil_frac=gil,
        )
