"""The Ray engine as a tuner's ``Target``: an allocation becomes one actor pool per segment; a
window is measured from the workers' block records and the blocks the consumer took.

Ray Data 2.60 offers no public way to resize a running operator's pool, so a new allocation
rebuilds the dataset: the old execution is stopped, the new one started, and the wait until
every pool has its workers running (Ray's actor start, the spec's ``start_s``) and
``settle_s`` more counts as tuning time (``elapsed_s``). ``ray-default`` (workers None) leaves
every pool's size to Ray Data's autoscaler."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from recperf.core import hostload
from recperf.core.confidence import interval
from recperf.core.errors import RecperfError
from recperf.ingest.base import Allocation, AllocationRefused, Measurement
from recperf.ingest.raydata.engine import OperatorPlan, Stream, build_dataset
from recperf.ingest.raydata.meter import FLUSH_S, BlockRecord, start_meter
from recperf.ingest.raydata.runtime import RayRuntime
from recperf.ingest.raydata.work import RayPipeline

Placer = Callable[[Allocation], tuple[tuple[int, ...], ...] | None]
"""Workers per segment per node for an allocation (None: let Ray place them)."""
OVERSUBSCRIBE = 4
"""The most workers per logical CPU (more share the CPUs, each a fraction of one)."""
CPU_GRAINS = 10_000
"""Ray's resolution of fractional resources: an actor's CPU share is rounded down to it, so
that N actors of 1/N of the CPUs fit (16/17 rounded to the nearest would need 16.0004)."""


def actor_cpus(
    share: float, node_cpus: Sequence[int], place: Sequence[Sequence[int]] | None
) -> float:
    """The logical CPUs each worker asks Ray for: its ``share`` of the CPUs, and, where the
    workers are placed, no more than the most crowded node's CPUs per worker there (placed
    workers past the CPUs are dealt by node, so one node may hold more per CPU than the whole);
    rounded down to Ray's grain."""
    want = share
    if place is not None:
        per_node = [sum(row[m] for row in place) for m in range(len(node_cpus))]
        want = min([want, *(c / n for c, n in zip(node_cpus, per_node, strict=True) if n)])
    return math.floor(want * CPU_GRAINS + 1e-9) / CPU_GRAINS


SUBWINDOWS = 4
FILL_S = 30.0
"""Seconds after a rebuilt dataset's first output block by which its pools are taken as
running even if not every worker has finished a block yet."""
"""A window's throughput interval is over this many equal sub-windows."""


@dataclass(kw_only=True, slots=True, frozen=True)
class RayWindow:
    """What the Ray engine adds to a Measurement: Ray's side of the window."""

    workers_seen: tuple[int, ...]
    """Distinct workers that finished a block of each segment in the window."""
    idle_cpus: float
    """Logical CPUs no worker held, mean of the samples taken in the window."""
    gap_ms: float
    """Median wait of a worker of the busiest segment between two of its blocks, ms: Ray's
    time per task outside the stage where that segment is the bottleneck; NaN if unseen."""
    first_block_s: float
    """Seconds from building the dataset to the consumer's first block."""
    cores_used: float
    """Cores this process's tree (the driver, and Ray with its workers when recperf started
    it on this machine) kept busy in the window."""
    memory_bytes: float
    """Peak proportional memory of that tree over the window's samples, bytes."""


class RayTarget:
    """``pipeline`` on the Ray instance of ``runtime``; allocations within its logical CPUs."""

    def __init__(
        self,
        runtime: RayRuntime,
        pipeline: RayPipeline,
        *,
        settle_s: float = 1.0,
        ready_timeout_s: float = 600.0,
        placer: Placer | None = None,
    ) -> None:
        self.runtime = runtime
        self.pipeline = pipeline
        self.settle_s = settle_s
        self.ready_timeout_s = ready_timeout_s
        self.placer = placer
        self._t0 = time.monotonic()
        self._meter = start_meter(runtime.ray)
        self._current: Allocation | None = None
        self._default = False
        self._stream: Stream | None = None
        self._records: list[BlockRecord] = []
        self._idle: list[tuple[float, float]] = []
        self.measurements: list[Measurement] = []
        self.windows: list[RayWindow] = []
        self.placements: dict[Allocation, tuple[tuple[int, ...], ...] | None] = {}

    # -- the Target protocol ---------------------------------------------------------------

    @property
    def stage_names(self) -> tuple[str, ...]:
        return self.pipeline.stage_names

    @property
    def cores(self) -> int:
        return self.runtime.cpus

    @property
    def max_workers(self) -> tuple[int | None, ...]:
        return tuple(min(c, self.cores) if c is not None else self.cores
                     for c in self.pipeline.max_workers)  # fmt: skip

    @property
    def thread_options(self) -> tuple[int, ...]:
        return (1,)

    @property
    def inflight_options(self) -> tuple[int, ...]:
        return (0,)

    @property
    def memory_budget_bytes(self) -> float:
        return self.pipeline.memory_budget_bytes

    def memory_bytes(self, alloc: Allocation) -> float:
        n = len(self.stage_names)
        return self.pipeline.memory_bytes(alloc.workers, alloc.segments(n))

    def elapsed_s(self) -> float:
        return time.monotonic() - self._t0

    def measure(self, alloc: Allocation, window_s: float) -> Measurement:
        alloc = alloc.normalized(len(self.stage_names))
        self._check(alloc)
        if alloc != self._current or self._default or self._stream is None or self._stream.closed:
            self._start(alloc, default=False)
        return self._window(alloc, window_s)

    def measure_default(self, window_s: float, warmup_s: float) -> Measurement:
        """Ray Data's own choice: every segment's pool autoscaled (1..its cap), measured for
        ``window_s`` after ``warmup_s`` (the autoscaler needs time to grow the pools)."""
        n = len(self.stage_names)
        alloc = Allocation(workers=(1,) * n)  # the segments; sizes are Ray's
        self._start(alloc, default=True, warmup_s=warmup_s)
        return self._window(alloc, window_s)

    # -- internals ---------------------------------------------------------------------------

    def _check(self, alloc: Allocation) -> None:
        if any(t != 1 for t in alloc.segment_threads()) or alloc.inflight:
            raise AllocationRefused(f"{alloc.label(self.stage_names)}: the Ray engine runs "
                                    "single-threaded workers only")  # fmt: skip
        if alloc.total > self.cores * OVERSUBSCRIBE:
            raise AllocationRefused(f"{alloc.label(self.stage_names)}: {alloc.total} workers "
                                    f"on {self.cores} logical CPUs")  # fmt: skip
        caps = self._segment_caps(alloc)
        for w, cap in zip(alloc.workers, caps, strict=True):
            if w > cap:
                raise AllocationRefused(f"{alloc.label(self.stage_names)}: a segment capped "
                                        f"at {cap} workers")  # fmt: skip
        if self.memory_bytes(alloc) > self.memory_budget_bytes:
            raise AllocationRefused(f"{alloc.label(self.stage_names)}: over the memory budget")

    def _segment_caps(self, alloc: Allocation) -> list[int]:
        caps = self.max_workers
        return [min(c for c in caps[a:b] if c is not None)
                for a, b in alloc.segments(len(caps))]  # fmt: skip

    def _plans(self, alloc: Allocation, default: bool) -> list[OperatorPlan]:
        """Each segment's pool; may refuse (a placement that does not fit) before Ray runs."""
        segs = alloc.segments(len(self.stage_names))
        # more workers than logical CPUs share them: each holds a share of a CPU and runs that
        # much slower (a spec's sleeps are stretched to match, as the model assumes)
        share = min(1.0, self.cores / (len(segs) if default else alloc.total))
        works = self.pipeline.works(segs, 1.0 if default else 1.0 / share)
        place = None if default or self.placer is None else self.placer(alloc)
        self.placements[alloc] = place
        caps = self._segment_caps(alloc)
        cpus = actor_cpus(share, self.runtime.node_cpus, place)
        if default:
            caps = [max(1, math.floor(c / cpus)) for c in caps]
        return [
            OperatorPlan(work=wk, workers=None if default else w, cap=cap,
                         nodes=None if place is None else place[j], cpus=cpus)
            for j, (wk, w, cap) in enumerate(zip(works, alloc.workers, caps, strict=True))
        ]  # fmt: skip

    def _start(self, alloc: Allocation, *, default: bool, warmup_s: float = 0.0) -> None:
        """Stop the running dataset, build ``alloc``'s and wait until it is ready."""
        plans = self._plans(alloc, default)  # a refusal leaves the running dataset as it is
        if self._stream is not None:
            self._stream.close()
        ray = self.runtime.ray
        ds = build_dataset(ray, self.pipeline.items(), plans, self._meter,
                           self.runtime.node_ids)  # fmt: skip
        self._stream = Stream(ds, self.pipeline.consume)
        self._current, self._default = alloc, default
        self._drain()
        self._records.clear()
        deadline = time.time() + self.ready_timeout_s
        want = None if default else alloc.workers
        while True:
            self._stream.pull(time.time() + 0.5)
            self._drain()
            if self._stream.exhausted:
                raise RecperfError("the Ray dataset ended before its pools were ready")
            seen = _workers_seen(self._records, len(alloc.workers), 0.0, math.inf)
            if want is None and self._stream.first_s is not None:
                break
            if want is not None and all(s >= w for s, w in zip(seen, want, strict=True)):
                break
            # Ray Data may keep handing a lightly loaded pool's blocks to the same actors: once
            # every pool has run a block, FILL_S after the first output is enough for the rest
            # (a fixed pool starts its actors together)
            first = self._stream.first_s
            if (want is not None and min(seen) >= 1 and first is not None
                    and time.time() - self._stream.started > first + FILL_S):  # fmt: skip
                break
            if time.time() > deadline:
                raise RecperfError(f"the Ray pools of {alloc.label(self.stage_names)} were not "
                                   f"all running after {self.ready_timeout_s:g} s")  # fmt: skip
        self._stream.pull(time.time() + self.settle_s + warmup_s)

    def _drain(self) -> None:
        self._records.extend(self.runtime.ray.get(self._meter.drain.remote()))

    def _window(self, alloc: Allocation, window_s: float) -> Measurement:
        stream = self._stream
        assert stream is not None
        a = time.time()
        idle: list[float] = []
        mem: list[float] = []
        k = 1
        load_a = hostload.sample()
        while (now := time.time()) < a + window_s and not stream.exhausted:
            stream.pull(min(a + window_s, now + 0.5))
            if time.time() >= a + window_s * k / SUBWINDOWS:
                idle.append(float(self.runtime.ray.available_resources().get("CPU", 0.0)))
                mem.append(hostload.tree_memory_bytes())
                k += 1
        b = time.time()
        load_b = hostload.sample()
        load = hostload.other_load_cores(load_a, load_b)
        cores = (load_b.own_s - load_a.own_s) / (load_b.t - load_a.t)
        time.sleep(FLUSH_S + 0.1)  # the workers' last records of the window reach the meter
        self._drain()
        if stream.exhausted:
            raise RecperfError("the Ray dataset ended inside a measurement window")
        m, w = self._measurement(alloc, a, b, idle, load)
        w = replace(w, cores_used=cores, memory_bytes=max(mem, default=math.nan))
        self.measurements.append(m)
        self.windows.append(w)
        return m

    def _measurement(
        self, alloc: Allocation, a: float, b: float, idle: Sequence[float], load: float
    ) -> tuple[Measurement, RayWindow]:
        stream = self._stream
        assert stream is not None
        n = len(self.stage_names)
        segs = alloc.segments(n)
        dt = b - a
        recs = [r for r in self._records if a <= r.t1 < b]
        seen = _workers_seen(recs, len(segs), a, b)
        workers = seen if self._default else alloc.workers
        rows, cpu, wall = [0] * n, [0.0] * n, [0.0] * n
        busy_s = [0.0] * len(segs)
        handoff = 0.0
        for r in recs:
            first = segs[r.op][0]
            for k in range(len(r.times.rows)):
                rows[first + k] += r.times.rows[k]
                cpu[first + k] += r.times.cpu_s[k]
                wall[first + k] += r.times.wall_s[k]
            busy_s[r.op] += min(r.t1, b) - max(r.t0, a)
            handoff += r.times.handoff_s
        seg_busy = [min(1.0, s / (w * dt)) if w else 0.0 for s, w in zip(busy_s, workers,
                                                                          strict=True)]  # fmt: skip
        busy = [seg_busy[j] for j, (x, y) in enumerate(segs) for _ in range(x, y)]
        out_rows = stream.rows_between(a, b)
        cuts = [a + dt * i / SUBWINDOWS for i in range(SUBWINDOWS + 1)]
        rates = [stream.rows_between(x, y) / (y - x) for x, y in itertools.pairwise(cuts)]
        thr = out_rows / dt
        m = Measurement(
            allocation=alloc,
            throughput_rows_per_s=thr,
            stage_rows_per_s=tuple(r / dt for r in rows),
            busy_frac=tuple(busy),
            # Ray Data shows no queue depths: a segment whose workers are all busy is the
            # closest sign that blocks wait at its input
            queue_fill=tuple(busy),
            cpu_s=tuple(cpu),
            cost_us_per_row=tuple(c / r * 1e6 if r else math.nan for c, r in zip(cpu, rows,
                                                                                  strict=True)),
            memory_bytes=self.memory_bytes(
                Allocation(workers=tuple(max(1, w) for w in workers), cuts=alloc.cuts)
            ),
            window_s=dt,
            handoff_us_per_row=handoff / out_rows * 1e6 if out_rows else math.nan,
            stage_wall_s=tuple(wall),
            throughput_ci=interval(thr, rates),
            samples=len(rates),
            other_load_cores=load,
        )  # fmt: skip
        busiest = max(range(len(segs)), key=lambda j: seg_busy[j])
        w = RayWindow(
            workers_seen=seen,
            idle_cpus=statistics.fmean(idle) if idle else math.nan,
            gap_ms=_median_gap_ms(recs, busiest),
            first_block_s=math.nan if stream.first_s is None else stream.first_s,
            cores_used=math.nan,
            memory_bytes=math.nan,
        )
        return m, w

    def close(self) -> None:
        """Stop the running dataset (its actors exit); the runtime stays up."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._current = None

    def __enter__(self) -> RayTarget:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _workers_seen(recs: Sequence[BlockRecord], k: int, a: float, b: float) -> tuple[int, ...]:
    sets: list[set[str]] = [set() for _ in range(k)]
    for r in recs:
        if a <= r.t1 < b:
            sets[r.op].add(r.worker)
    return tuple(len(s) for s in sets)


def _median_gap_ms(recs: Sequence[BlockRecord], op: int) -> float:
    """Median time a worker of segment ``op`` waited between consecutive blocks, ms."""
    by: dict[str, list[BlockRecord]] = {}
    for r in recs:
        if r.op == op:
            by.setdefault(r.worker, []).append(r)
    gaps = []
    for rs in by.values():
        rs.sort(key=lambda r: r.t0)
        gaps += [(y.t0 - x.t1) * 1e3 for x, y in itertools.pairwise(rs)]
    return statistics.median(gaps) if gaps else math.nan
