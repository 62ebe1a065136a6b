"""The simulated pipeline as a tuning ``Target``: measures allocations on the analytic model
with seeded multiplicative noise and a simulated clock."""

from __future__ import annotations

import math

import numpy as np

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, AllocationRefused, Measurement
from recperf.ingest.sim.model import PipelineSpec

QUEUE_FULL = 0.95
"""Input-queue fill of a stage that is the bottleneck or sits before it (backpressure)."""


class SimTarget:
    """A ``Target`` over a PipelineSpec: each measure() advances a simulated clock by its window.

    Queue fill (stage i > 0 reads the queue from stage i-1): if the bottleneck is stage i or
    later, upstream produces faster than stage i drains (directly, or through backpressure), so
    its queue sits near full (``QUEUE_FULL``); if the bottleneck is earlier, stage i is starved
    and its queue fill is half its busy fraction (a near-bottleneck stage keeps some backlog).
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
        return tuple(s.name for s in self.spec.stages)

    @property
    def cores(self) -> int:
        return self.spec.cores

    @property
    def max_workers(self) -> tuple[int | None, ...]:
        return tuple(s.max_workers for s in self.spec.stages)

    @property
    def memory_budget_bytes(self) -> float:
        return self.spec.memory_budget_gib * 2**30

    def memory_bytes(self, alloc: Allocation) -> float:
        return self.spec.memory_bytes(alloc)

    def elapsed_s(self) -> float:
        return self._clock_s

    def _factor(self, size: int | None = None) -> np.ndarray:
        return np.exp(self._rng.normal(0.0, self.noise, size=size))

    def measure(self, alloc: Allocation, window_s: float | None = None) -> Measurement:
        """Run ``alloc`` for ``window_s`` simulated seconds (default: this target's window)."""
        window = self.window_s if window_s is None else window_s
        if not window > 0:
            raise ConfigError(f"window_s = {window!r} must be > 0")
        try:
            self.spec.check_allocation(alloc)
        except ConfigError as exc:
            raise AllocationRefused(str(exc)) from None
        spec = self.spec
        caps = spec.capacities(alloc)
        thr = min(caps)
        neck = caps.index(thr)
        scale = spec.contention(alloc)
        noisy = thr * float(self._factor())
        busy = tuple(min(1.0, thr / c) for c in caps)
        fill = tuple(
            0.0 if i == 0 else (QUEUE_FULL if neck >= i else 0.5 * busy[i])
            for i in range(spec.n_stages)
        )
        effective = [
            min(w, s.max_workers or w) * scale
            for w, s in zip(alloc.workers, spec.stages, strict=True)
        ]
        costs = np.asarray(spec.row_costs_us()) * self._factor(spec.n_stages)
        mem = spec.memory_bytes(alloc)
        self._clock_s += window
        self.measurements += 1
        self.current = alloc
        self.peak_memory_bytes = max(self.peak_memory_bytes, mem)
        return Measurement(
            allocation=alloc,
            throughput_rows_per_s=noisy,
            stage_rows_per_s=(noisy,) * spec.n_stages,
            busy_frac=busy,
            queue_fill=fill,
            cpu_s=tuple(b * e * window for b, e in zip(busy, effective, strict=True)),
            cost_us_per_row=tuple(float(c) if math.isfinite(c) else math.nan for c in costs),
            memory_bytes=mem,
            window_s=window,
        )
