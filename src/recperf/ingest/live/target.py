"""The live pipeline as a tuning ``Target`` (windows of sub-windows with a stated confidence) and
calibration of the simulator from measured stage costs (allocation files: ``allocfile``)."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from recperf.core import hostload
from recperf.core.confidence import interval
from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.ingest.base import (
    MAX_INFLIGHT,
    MAX_THREADS,
    Allocation,
    AllocationRefused,
    Measurement,
    segment_caps,
)
from recperf.ingest.live.batch import Snapshot, rate
from recperf.ingest.live.dispatch import MIB
from recperf.ingest.live.executor import Pipeline
from recperf.ingest.live.gil import gil_fractions
from recperf.ingest.live.items import item_bytes
from recperf.ingest.sim.model import DEFAULT_GIL_FRAC, PipelineSpec, StageSpec, copying_segments


def window_measurement(a: Snapshot, b: Snapshot, alloc: Allocation) -> Measurement:
    """What happened between two snapshots; stage costs are CPU per row of pipeline output."""
    dt = b.t - a.t
    out_rows = b.rows_out - a.rows_out
    stage_rows = [rate(x.rows, y.rows, dt) for x, y in zip(a.stages, b.stages, strict=True)]
    cpu = [y.cpu_s - x.cpu_s for x, y in zip(a.stages, b.stages, strict=True)]
    busy = []
    for x, y in zip(a.stages, b.stages, strict=True):
        ws = y.worker_s - x.worker_s
        busy.append(min(1.0, (y.busy_s - x.busy_s) / ws) if ws > 0 else 0.0)
    fill = [min(1.0, (y.queue_fill_s - x.queue_fill_s) / dt) if dt > 0 else 0.0
            for x, y in zip(a.stages, b.stages, strict=True)]  # fmt: skip
    handoff = (b.handoff_cpu_s - a.handoff_cpu_s) / out_rows * 1e6 if out_rows else math.nan
    consumer = (b.consumer_cpu_s - a.consumer_cpu_s) / out_rows * 1e6 if out_rows else math.nan
    wall = [y.wall_s - x.wall_s for x, y in zip(a.stages, b.stages, strict=True)]
    busy_s = [y.busy_s - x.busy_s for x, y in zip(a.stages, b.stages, strict=True)]
    n = len(a.stages)
    gil = gil_fractions(alloc.segments(n), alloc.workers, alloc.segment_threads(), cpu, wall,
                        busy_s, dt)  # fmt: skip
    return Measurement(
        allocation=alloc,
        throughput_rows_per_s=out_rows / dt if dt > 0 else 0.0,
        stage_rows_per_s=tuple(stage_rows),
        busy_frac=tuple(busy),
        queue_fill=tuple(fill),
        cpu_s=tuple(cpu),
        cost_us_per_row=tuple(c / out_rows * 1e6 if out_rows else math.nan for c in cpu),
        memory_bytes=max(a.memory_bytes, b.memory_bytes),
        window_s=dt,
        handoff_us_per_row=handoff,
        consumer_us_per_row=consumer,
        stage_wall_s=tuple(wall),
        gil_frac=gil,
    )


def repeated_measurement(
    snaps: Sequence[Snapshot], alloc: Allocation, other_load_cores: float = math.nan
) -> Measurement:
    """The window from the first to the last of ``snaps`` (``window_measurement``), its
    throughput stated with the 90% interval over the sub-windows between consecutive
    snapshots (Student's t on their rates, centred on the whole window's rate) and their count,
    and the other load on the machine."""
    whole = window_measurement(snaps[0], snaps[-1], alloc)
    rates = subwindow_rates(snaps, alloc)
    return replace(
        whole,
        throughput_ci=interval(whole.throughput_rows_per_s, rates),
        samples=len(rates),
        other_load_cores=other_load_cores,
    )


def subwindow_rates(snaps: Sequence[Snapshot], alloc: Allocation) -> list[float]:
    """Throughput of each sub-window between consecutive snapshots, rows/s."""
    return [
        window_measurement(a, b, alloc).throughput_rows_per_s
        for a, b in itertools.pairwise(snaps)
        if b.t > a.t
    ]


def check_window_options(
    *, subwindow_s: float = 0.5, min_samples: int = 3, rel_tol: float = 0.05,
    max_extend: float = 3.0,
) -> None:  # fmt: skip
    """One line naming the option unless LiveTarget's window options are in range."""
    check_range("subwindow_s", subwindow_s, 0.0, None, lo_open=True)
    check_range("min_samples", min_samples, 2, 10_000)
    check_range("rel_tol", rel_tol, 0.0, None)
    check_range("max_extend", max_extend, 1.0, 100.0)


class LiveTarget:
    """A ``Target`` over a running Pipeline (made to repeat its epochs): measure() resizes the
    pools, consumes batches for ``settle_s`` so the new workers fill their queues, then for the
    window, and reports what the pipeline counters saw. The consumer discards batches, standing
    in for a trainer that is never the bottleneck.

    A window is cut into sub-windows of about ``subwindow_s`` (at least ``min_samples``); the
    throughput is stated with its 90% interval over them, and while the interval's half-width
    is above ``rel_tol`` of the throughput the window grows a sub-window at a time, up to
    ``max_extend`` times the length asked for (a noisy machine costs time, not a wrong
    choice). The other load on the machine (busy CPU outside this process and its workers)
    over the window is reported with it."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        settle_s: float = 0.5,
        warmup_s: float = 2.0,
        max_workers: int | None = None,
        subwindow_s: float = 0.5,
        min_samples: int = 3,
        rel_tol: float = 0.05,
        max_extend: float = 3.0,
    ) -> None:
        check_range("settle_s", settle_s, 0.0, None)
        check_range("warmup_s", warmup_s, 0.0, None)
        check_window_options(subwindow_s=subwindow_s, min_samples=min_samples, rel_tol=rel_tol,
                             max_extend=max_extend)  # fmt: skip
        if pipeline.config.epochs is not None:
            raise ConfigError("LiveTarget needs a pipeline with epochs = None (it repeats)")
        self.pipeline = pipeline
        self.settle_s = settle_s
        self.subwindow_s = subwindow_s
        self.min_samples = min_samples
        self.rel_tol = rel_tol
        self.max_extend = max_extend
        cap = max_workers if max_workers is not None else max(2, 2 * pipeline.cores)
        self._caps = tuple(cap for _ in pipeline.stage_names)
        self._iter = iter(pipeline)
        # Warm up before the tuning clock starts: the first row groups are read and every
        # buffer fills, so the first window measures the allocation, not the start-up.
        next(self._iter)
        self._consume(warmup_s)
        self._t0 = time.monotonic()
        self.measurements: list[Measurement] = []
        self.peak_memory_bytes = 0.0
        self.on_measure: Callable[[Measurement], None] | None = None

    @property
    def stage_names(self) -> tuple[str, ...]:
        return self.pipeline.stage_names

    @property
    def cores(self) -> int:
        return self.pipeline.cores

    @property
    def max_workers(self) -> tuple[int | None, ...]:
        return self._caps

    @property
    def thread_options(self) -> tuple[int, ...]:
        """Threads of the consumer's process, and processes of 1, 2 or 4 threads."""
        return tuple(t for t in (0, 1, 2, 4) if t <= MAX_THREADS)

    @property
    def inflight_options(self) -> tuple[int, ...]:
        """Storage requests in flight per reading worker worth trying: only when storage has
        latency (local files: the configured default)."""
        if self.pipeline.config.read_latency_ms > 0:
            return tuple(k for k in (4, 16, 64) if k <= MAX_INFLIGHT)
        return (0,)

    @property
    def memory_budget_bytes(self) -> float:
        return self.pipeline.memory_budget_bytes

    def memory_bytes(self, alloc: Allocation) -> float:
        return self.pipeline.memory_bytes(alloc)

    def elapsed_s(self) -> float:
        return time.monotonic() - self._t0

    def _consume(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            next(self._iter)

    def measure(self, alloc: Allocation, window_s: float) -> Measurement:
        alloc = self._apply(alloc)
        m, peak = self._window(alloc, window_s)
        self.peak_memory_bytes = max(self.peak_memory_bytes, peak)
        self.measurements.append(m)
        if self.on_measure is not None:
            self.on_measure(m)
        return m

    def _apply(self, alloc: Allocation) -> Allocation:
        """Run ``alloc`` (normalized) and let it settle; AllocationRefused changes nothing."""
        n = len(self.stage_names)
        try:
            alloc = alloc.normalized(n)
        except ConfigError as exc:
            raise AllocationRefused(str(exc)) from None
        segs = alloc.segments(n)
        for w, cap, (i, j) in zip(alloc.workers, segment_caps(self._caps, segs), segs,
                                  strict=True):  # fmt: skip
            if cap is not None and w > cap:
                name = "+".join(self.stage_names[i:j])
                raise AllocationRefused(f"allocation: segment {name!r} has {w} workers, cap {cap}")
        if alloc != self.pipeline.allocation:
            self.pipeline.resize(alloc)  # AllocationRefused leaves everything as it was
            self._consume(self.settle_s)
        return alloc

    def _window(self, alloc: Allocation, window_s: float) -> tuple[Measurement, float]:
        """Sub-windows until the interval is within ``rel_tol`` or the window reaches
        ``max_extend`` times ``window_s``; the measurement and the peak memory seen."""
        n = max(self.min_samples, round(window_s / self.subwindow_s))
        most = max(n, int(n * self.max_extend + 1e-9))
        sub = window_s / n
        load_a = hostload.sample()
        snaps = [self.pipeline.snapshot()]
        while True:
            self._consume(sub)
            snaps.append(self.pipeline.snapshot(memory=False))
            if len(snaps) - 1 < n:
                continue
            m = repeated_measurement(snaps, alloc)
            if len(snaps) - 1 >= most or self._confident(m):
                break
        load = hostload.other_load_cores(load_a, hostload.sample())
        full = self.pipeline.snapshot()  # the workers' memory, read once more after the window
        mem = max(m.memory_bytes, full.memory_bytes)
        return replace(m, other_load_cores=load, memory_bytes=mem), full.peak_memory_bytes

    def _confident(self, m: Measurement) -> bool:
        """The interval's half-width is within ``rel_tol`` of the throughput."""
        lo, hi = m.throughput_ci
        return (hi - lo) / 2 <= self.rel_tol * m.throughput_rows_per_s


# -- calibration ----------------------------------------------------------------------------


def calibrate(target: LiveTarget, name: str = "calibrated") -> PipelineSpec:
    """A simulator spec of the live pipeline: each stage's median measured CPU per output row
    and GIL fraction (the default where no window ran it in several threads), its worker
    memory as measured (or estimated), the measured hand-off per copying segment, the
    consumer's measured cost, how much more the stages cost in worker processes, the real
    cores, budget, buffer sizes and thread options."""
    ms = target.measurements
    if not ms:
        raise ConfigError("calibrate: the target has no measurements yet")
    p = target.pipeline
    n = len(p.stage_names)
    # the stage costs are the consumer's process's where windows ran there (a process's are
    # then those times process_cost_factor), else the windows' medians
    mine = [m for m in ms if set(m.allocation.normalized(n).segment_threads()) == {0}]
    base = mine or ms
    costs = [_median([m.cost_us_per_row[i] for m in base], 1e-3, positive=True) for i in range(n)]
    gils = [
        min(1.0, _median([m.gil_frac[i] for m in ms if m.gil_frac], DEFAULT_GIL_FRAC))
        for i in range(n)
    ]
    stages = tuple(
        StageSpec(name=n, cost_us_per_row=c, max_workers=cap, memory_mib_per_worker=mem,
                  gil_frac=g)
        for n, c, cap, mem, g in zip(
            p.stage_names, costs, target.max_workers, p.worker_memory_mib(), gils, strict=True
        )
    )  # fmt: skip
    # the measured hand-off is over all of a window's copying segments; the model charges it
    # per copying segment (consumer threads handing on in their own process copy nothing)
    per_seg = [
        m.handoff_us_per_row / k
        for m in ms
        if (k := copying_segments(m.allocation.normalized(n).segment_threads()))
    ]
    return PipelineSpec(
        name=name,
        cores=p.cores,
        memory_budget_gib=p.config.memory_budget_gib,
        stages=stages,
        transfer_us_per_row=_median(per_seg, 0.0),
        memory_mib_per_batch=item_bytes(p.config.batch_size) / MIB,
        batch_rows=p.config.batch_size,
        queue_batches=p.config.queue_batches,
        consumer_us_per_row=_median([m.consumer_us_per_row for m in ms], 0.0),
        thread_options=target.thread_options,
        process_cost_factor=process_cost_factor(ms, costs, n),
    )


def process_cost_factor(ms: list[Measurement], costs: list[float], n: int) -> float:
    """The stages' cost in worker processes over their cost in the consumer's process: the
    median chain cost of the windows that ran every segment in processes over that of the
    windows that ran every segment in consumer threads (1.0 without both; ``costs`` are the
    stage medians, for the stages a window did not measure)."""

    def chain(m: Measurement) -> float:
        return sum(c if math.isfinite(c) and c > 0 else d
                   for c, d in zip(m.cost_us_per_row, costs, strict=True))  # fmt: skip

    shapes = [(m, set(m.allocation.normalized(n).segment_threads())) for m in ms]
    procs = [chain(m) for m, t in shapes if 0 not in t]
    mine = [chain(m) for m, t in shapes if t == {0}]
    if not procs or not mine:
        return 1.0
    return min(10.0, max(0.1, statistics.median(procs) / statistics.median(mine)))


def _median(values: list[float], default: float, positive: bool = False) -> float:
    """Median of the finite values >= 0 (> 0 with ``positive``); ``default`` if none."""
    vals = [v for v in values if math.isfinite(v) and (v > 0 if positive else v >= 0)]
    return statistics.median(vals) if vals else default


def spec_toml(spec: PipelineSpec) -> str:
    """The spec as a TOML file that ``ingest simulate --spec`` reads."""
    out = [
        f"cores = {spec.cores}",
        f"memory_budget_gib = {spec.memory_budget_gib!r}",
        f"transfer_us_per_row = {spec.transfer_us_per_row!r}",
        f"memory_mib_per_batch = {spec.memory_mib_per_batch!r}",
        f"batch_rows = {spec.batch_rows}",
        f"queue_batches = {spec.queue_batches}",
        f"consumer_us_per_row = {spec.consumer_us_per_row!r}",
        f"consumer_gil_frac = {spec.consumer_gil_frac!r}",
        f"thread_options = {list(spec.thread_options)}",
        f"process_cost_factor = {spec.process_cost_factor!r}",
    ]
    if spec.memory_mib_per_thread is not None:
        out.append(f"memory_mib_per_thread = {spec.memory_mib_per_thread!r}")
    for s in spec.stages:
        out += ["", "[[stage]]", f'name = "{s.name}"', f"cost_us_per_row = {s.cost_us_per_row!r}"]
        if s.max_workers is not None:
            out.append(f"max_workers = {s.max_workers}")
        out.append(f"memory_mib_per_worker = {s.memory_mib_per_worker!r}")
        out.append(f"gil_frac = {s.gil_frac!r}")
    return "\n".join(out) + "\n"
