"""The plug-in contracts of the simulator: trace loaders, schedulers and placement policies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from recperf.cluster.jobs import JobTable
from recperf.cluster.network import JobComm
from recperf.cluster.topology import Cluster
from recperf.core.registry import Registry

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
I8 = NDArray[np.int8]
BoolArr = NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Allocation:
    """GPUs granted to one job: ``counts[i]`` GPUs on machine ``machines[i]``."""

    machines: tuple[int, ...]
    counts: tuple[int, ...]
    level: int
    """The widest level it spans (``Level`` values, up to ``Cluster.top``)."""

    @classmethod
    def of(cls, machines: list[int], counts: list[int], cluster: Cluster) -> Allocation:
        """Build an allocation and derive the widest level it spans."""
        level = cluster.tree.level_of(machines, sum(counts))
        return cls(machines=tuple(machines), counts=tuple(counts), level=level)

    @property
    def gpus(self) -> int:
        return sum(self.counts)

    def uplinks(self, cluster: Cluster) -> tuple[int, ...]:
        """The switch uplinks it crosses (``Tree.uplinks``): none within one ToR."""
        return cluster.tree.uplinks(self.machines, self.level)


@dataclass(frozen=True, slots=True)
class JobProgress:
    """The engine's live per-job arrays, indexed by job id (read them, never write them)."""

    attained_gpu_s: F64
    """GPU-seconds held, accounted up to ``settled_at``."""
    settled_at: F64
    restore_until: F64
    done_iters: F64
    """Iterations done, accounted up to ``settled_at``."""
    iter_s: F64
    """Current per-iteration time of running jobs."""
    ref_iter_s: F64
    """Per-iteration time at the job's tightest placement on an idle network."""
    waiting_since: F64
    """When the job last arrived or was stopped (NaN while running)."""
    run_started: F64
    last_run_s: F64
    """Length of the job's most recent run (0 if it never ran)."""


@dataclass(frozen=True, slots=True)
class SchedulerView:
    """What a scheduler sees at one decision point; valid only during that call.

    Arrays are aligned with ``active``; the derived ones are computed when first read, so a
    scheduler pays only for what it uses.
    """

    now: float
    cluster: Cluster
    jobs: JobTable
    active: I64
    """Ids of the jobs that have arrived and not finished, in arrival order."""
    running: BoolArr
    """Holding GPUs now (including while restoring from a checkpoint)."""
    free_gpus: int
    progress: JobProgress
    free: I64
    """Free GPUs per machine (read-only)."""
    alloc: Sequence[Allocation | None]
    """Each job's current allocation by job id (None unless it holds GPUs)."""
    comm: JobComm
    """Per-job all-reduce terms at this run's congestion."""
    may_preempt: bool
    """Whether running jobs left out of the order will be preempted at this decision (at a
    round boundary); otherwise the engine only starts waiting jobs on free GPUs."""

    @property
    def attained_gpu_s(self) -> F64:
        """GPU-seconds each job has held so far (Tiresias' attained service)."""
        p, ids = self.progress, self.active
        held = np.where(self.running, self.now - p.settled_at[ids], 0.0)
        out: F64 = p.attained_gpu_s[ids] + held * self.jobs.gpus[ids]
        return out

    @property
    def remaining_iters(self) -> F64:
        p, ids = self.progress, self.active
        busy = np.maximum(self.now - np.maximum(p.settled_at[ids], p.restore_until[ids]), 0.0)
        done = p.done_iters[ids] + np.where(self.running, busy / p.iter_s[ids], 0.0)
        out: F64 = np.maximum(self.jobs.total_iters[ids] - done, 0.0)
        return out

    @property
    def ref_iter_s(self) -> F64:
        out: F64 = self.progress.ref_iter_s[self.active]
        return out

    @property
    def remaining_s(self) -> F64:
        """Oracle remaining time at the tightest placement."""
        out: F64 = self.remaining_iters * self.ref_iter_s
        return out

    @property
    def waiting_since(self) -> F64:
        """When each job last arrived or was stopped (NaN while running)."""
        out: F64 = self.progress.waiting_since[self.active]
        return out

    @property
    def running_since(self) -> F64:
        """When each job's current run started (NaN unless running)."""
        out: F64 = np.where(self.running, self.progress.run_started[self.active], np.nan)
        return out

    @property
    def last_run_s(self) -> F64:
        out: F64 = self.progress.last_run_s[self.active]
        return out


@dataclass(frozen=True, slots=True)
class Decision:
    """A scheduler's answer: which jobs it wants running, highest priority first."""

    order: I64
    """Job ids (a subset of ``view.active``) in priority order."""
    max_level: I8 | None = None
    """Aligned with ``order``: the widest level each job may be placed at (None: any)."""
    blocking: bool = False
    """Stop at the first waiting job that cannot be placed (strict order, no backfilling)."""
    wake_at: float | None = None
    """Ask to be called again at this time even if no job arrives or finishes."""


@runtime_checkable
class Scheduler(Protocol):
    """Orders jobs. A preemptive scheduler may stop running jobs that fall out of its order.

    ``reset`` and ``schedule`` are the contract; a plug-in may leave out ``name`` (its class name
    is used) and ``preemptive`` (False): read them with ``scheduler_name`` and ``is_preemptive``.
    """

    name: ClassVar[str]
    preemptive: ClassVar[bool]

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        """Called once before a simulation; drop any state of a previous one."""
        ...

    def schedule(self, view: SchedulerView) -> Decision: ...


SCHEDULER_METHODS = ("reset", "schedule")
"""What a scheduler must have; ``name`` and ``preemptive`` have defaults."""


def scheduler_name(scheduler: object) -> str:
    """The scheduler's ``name``, or its class name when it has none."""
    name = getattr(scheduler, "name", None)
    return name if isinstance(name, str) and name else type(scheduler).__name__


def is_preemptive(scheduler: object) -> bool:
    """The scheduler's ``preemptive`` flag; False when it has none (README's protocol)."""
    return bool(getattr(scheduler, "preemptive", False))


def missing_methods(obj: object, methods: Sequence[str]) -> list[str]:
    """Which of ``methods`` ``obj`` (an instance or a class) lacks or has as a non-callable."""
    return [m for m in methods if not callable(getattr(obj, m, None))]


@runtime_checkable
class PlacementPolicy(Protocol):
    """Chooses which free GPUs a job gets."""

    name: ClassVar[str]

    def place(
        self,
        gpus: int,
        free: I64,
        cluster: Cluster,
        max_level: int,
        rng: np.random.Generator,
    ) -> Allocation | None:
        """GPUs for a ``gpus``-GPU job within ``max_level``, or None. ``free`` is read-only."""
        ...


@runtime_checkable
class TraceLoader(Protocol):
    """Turns a trace file (or a generator's settings) into a JobTable for a cluster."""

    name: ClassVar[str]
    default_cluster: ClassVar[str]

    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable: ...


@dataclass(frozen=True, slots=True)
class BundledTrace:
    """A trace shipped with recperf, reachable by name."""

    format: str
    files: tuple[str, ...] = field(default=())
    """Paths relative to ``recperf/data/cluster``."""
    description: str = ""


SCHEDULERS: Registry[Scheduler] = Registry("scheduler", "recperf.cluster.schedulers")
PLACEMENTS: Registry[PlacementPolicy] = Registry("placement policy", "recperf.cluster.placement")
TRACE_LOADERS: Registry[TraceLoader] = Registry("trace format", "recperf.cluster.traces")
