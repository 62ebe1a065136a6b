"""Conformance checks: run any scheduler, placement policy or trace loader through its contract."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from recperf.cluster.base import (
    I64,
    SCHEDULER_METHODS,
    Decision,
    PlacementPolicy,
    Scheduler,
    SchedulerView,
    TraceLoader,
    is_preemptive,
    missing_methods,
    scheduler_name,
)
from recperf.cluster.engine import Simulator
from recperf.cluster.jobs import JobTable
from recperf.cluster.outcome import EngineConfig, SimResult
from recperf.cluster.topology import Cluster, Level
from recperf.cluster.traces.synthetic import SyntheticConfig, SyntheticTrace
from recperf.core.errors import ContractError, SimulationError

SMALL = Cluster(name="check", racks=2, machines_per_rack=2, gpus_per_machine=4)


class _Checked:
    """Wraps a scheduler and validates every Decision it returns against the view it saw."""

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.name = scheduler_name(inner)
        self.preemptive = is_preemptive(inner)
        self.calls = 0

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        self.inner.reset(jobs, cluster)

    def schedule(self, view: SchedulerView) -> Decision:
        d = self.inner.schedule(view)
        self.calls += 1
        who = f"scheduler {self.name!r}"
        if not isinstance(d, Decision):
            raise ContractError(f"{who}: schedule() returned {type(d).__name__}, not Decision")
        order = np.asarray(d.order)
        if order.ndim != 1 or (order.size and not np.issubdtype(order.dtype, np.integer)):
            raise ContractError(f"{who}: Decision.order must be a 1-D integer array")
        if np.unique(order).size != order.size:
            raise ContractError(f"{who}: Decision.order lists a job twice")
        if not np.isin(order, view.active).all():
            raise ContractError(f"{who}: Decision.order names a job that is not active")
        if d.max_level is not None:
            levels = np.asarray(d.max_level)
            if (
                levels.shape != order.shape
                or levels.min(initial=0) < 0
                or levels.max(initial=0) > 3
            ):
                raise ContractError(f"{who}: Decision.max_level must align with order, values 0-3")
        if d.wake_at is not None and not d.wake_at > view.now:
            raise ContractError(f"{who}: wake_at {d.wake_at} is not after now {view.now}")
        return d


def check_result(res: SimResult) -> None:
    """Invariants every simulation must keep (needs ``record_segments=True``)."""
    jobs = res.jobs
    if np.isnan(res.finish_s).any():
        raise ContractError("a job never finished")
    if (res.first_start_s < jobs.arrival_s).any():
        raise ContractError("a job started before it arrived")
    done = np.zeros(len(jobs))
    usage: list[tuple[float, int, int, int]] = []  # (time, order, machine, +/-gpus)
    for seg in res.segments:
        if seg.start_s < jobs.arrival_s[seg.job] - 1e-9 or seg.end_s > res.finish_s[seg.job] + 1e-6:
            raise ContractError(f"job {seg.job} holds or progresses outside its lifetime")
        if seg.alloc is None:
            done[seg.job] += seg.iters
            continue
        for m, c in zip(seg.alloc.machines, seg.alloc.counts, strict=True):
            usage.append((seg.start_s, 1, m, c))
            usage.append((seg.end_s, 0, m, -c))
    if not np.allclose(done, jobs.total_iters, rtol=1e-6):
        bad = int(np.argmax(np.abs(done - jobs.total_iters)))
        raise ContractError(
            f"job {bad}: progressed {done[bad]} of {jobs.total_iters[bad]} iterations"
        )
    held = np.zeros(res.cluster.machines, dtype=np.int64)
    for _t, _o, m, c in sorted(usage):  # releases sort before grants at the same instant
        held[m] += c
        if held[m] > res.cluster.gpus_per_machine:
            raise ContractError(f"machine {m} has more GPUs held than it owns")


def check_scheduler(factory: Callable[[], Scheduler], seeds: tuple[int, ...] = (0, 1)) -> None:
    """Run a scheduler over small synthetic traces and check its decisions and the outcome."""
    from recperf.cluster.placement import BestFit

    for seed in seeds:
        sched = factory()
        missing = missing_methods(sched, SCHEDULER_METHODS)
        if missing:
            raise ContractError(
                f"{type(sched).__name__} is no Scheduler: it has no {missing[0]}() method "
                f"(a scheduler needs {', '.join(SCHEDULER_METHODS)})"
            )
        cfg = SyntheticConfig(
            jobs=60, load=1.2, gpus_per_job="1:0.5,2:0.2,4:0.2,8:0.1", mean_duration_s=600.0
        )
        jobs = SyntheticTrace(cfg).load(None, SMALL, np.random.default_rng(seed))
        checked = _Checked(sched)
        engine = EngineConfig(record_segments=True, checkpoint_s=5.0, restore_s=5.0)
        sim = Simulator(jobs, SMALL, checked, BestFit(), engine, seed=seed)  # type: ignore[arg-type]
        try:
            res = sim.run()
        except SimulationError as exc:
            raise ContractError(f"scheduler {checked.name!r}: {exc}") from None
        if checked.calls == 0:
            raise ContractError(f"scheduler {checked.name!r} was never consulted")
        check_result(res)


def check_placement(policy: PlacementPolicy, trials: int = 200, seed: int = 0) -> None:
    """Random free-GPU maps: an allocation must fit, sum to the demand and respect max_level."""
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        free = rng.integers(0, SMALL.gpus_per_machine + 1, size=SMALL.machines).astype(np.int64)
        before = free.copy()
        gpus = int(rng.integers(1, SMALL.gpus + 1))
        level = int(rng.integers(0, SMALL.top + 1))
        alloc = policy.place(gpus, free, SMALL, level, rng)
        if not np.array_equal(free, before):
            raise ContractError(f"placement {policy.name!r} modified the free-GPU array")
        if alloc is None:
            if _fits(gpus, free, level):
                raise ContractError(f"placement {policy.name!r} refused a job that fits")
            continue
        if alloc.gpus != gpus or len(set(alloc.machines)) != len(alloc.machines):
            raise ContractError(f"placement {policy.name!r} granted a wrong allocation {alloc}")
        if any(c < 1 or c > free[m] for m, c in zip(alloc.machines, alloc.counts, strict=True)):
            raise ContractError(f"placement {policy.name!r} granted GPUs that are not free")
        if alloc.level > level:
            name = SMALL.level_names[level]
            raise ContractError(f"placement {policy.name!r} exceeded max_level {name}")


def _fits(gpus: int, free: I64, level: int) -> bool:
    """Whether some placement of ``gpus`` GPUs within ``level`` exists on ``free``."""
    if level >= SMALL.top:
        return int(free.sum()) >= gpus
    if level <= Level.MACHINE:
        return bool((free >= gpus).any()) and (level == Level.MACHINE or gpus == 1)
    return bool((SMALL.group_free(free, level) >= gpus).any())


def check_loader(loader: TraceLoader, source: Path | None, cluster: Cluster, **_: Any) -> JobTable:
    """Load a trace twice with the same seed: valid, sorted and identical both times."""
    a = loader.load(source, cluster, np.random.default_rng(7))
    b = loader.load(source, cluster, np.random.default_rng(7))
    if len(a) == 0:
        raise ContractError(f"loader {loader.name!r} returned no jobs")
    for col in ("arrival_s", "gpus", "total_iters", "compute_s", "grad_bytes"):
        if not np.array_equal(getattr(a, col), getattr(b, col)):
            raise ContractError(f"loader {loader.name!r}: column {col} differs between loads")
    if a.name != b.name:
        raise ContractError(f"loader {loader.name!r}: job names differ between loads")
    return replace(a)
