"""The running state of one simulation: every array, counter and list the event engine mutates,
typed and held in one object, so that a fresh run is one constructor call and nothing the loop
touches is created anywhere else."""

from __future__ import annotations

import math
from dataclasses import InitVar, dataclass, field

import numpy as np

from recperf.cluster.base import F64, I8, I64, Allocation, BoolArr, JobProgress
from recperf.cluster.bookkeeping import EventQueue, LocalityWaits
from recperf.cluster.jobs import JobTable
from recperf.cluster.outcome import Segment, SimResult
from recperf.cluster.topology import Cluster


@dataclass(slots=True, eq=False, repr=False)
class RunState:
    """Per-job arrays indexed by job id, the free-GPU map and the loop's counters, all zero or
    empty before the first event; built from the job count, the cluster and the jobs'
    reference iteration times (which the schedulers read through ``progress``)."""

    n: InitVar[int]
    cluster: InitVar[Cluster]
    ref_iter_s: InitVar[F64]

    # ------------------------------------------------ per job, indexed by job id
    state: I8 = field(init=False)  # 0: not arrived yet, then the engine's WAITING ... DONE
    done: F64 = field(init=False)  # iterations, accounted up to settled_at
    settled_at: F64 = field(init=False)
    restore_until: F64 = field(init=False)
    iter_s: F64 = field(init=False)
    comm_now: F64 = field(init=False)  # the all-reduce part of iter_s
    attained: F64 = field(init=False)  # GPU-seconds held
    first_start: F64 = field(init=False)
    finish: F64 = field(init=False)
    run_s: F64 = field(init=False)
    progress_s: F64 = field(init=False)
    comm_s: F64 = field(init=False)
    preemptions: I64 = field(init=False)
    widest: I64 = field(init=False)
    waiting_since: F64 = field(init=False)
    last_run: F64 = field(init=False)
    run_started: F64 = field(init=False)
    locality: LocalityWaits = field(init=False)
    progress: JobProgress = field(init=False)  # the arrays above that schedulers may read
    alloc: list[Allocation | None] = field(init=False)
    links: list[tuple[int, ...]] = field(init=False)  # rack uplinks a cross-rack job crosses
    mark: BoolArr = field(init=False)  # scratch flags of one decision, all False between
    # ------------------------------------------------ the cluster
    free: I64 = field(init=False)  # free GPUs per machine
    free_view: I64 = field(init=False)  # what schedulers see: always current, read-only
    free_total: int = field(init=False)
    gpus_total: int = field(init=False)  # Cluster.gpus is a property, read at every start
    uplink_jobs: list[set[int]] = field(init=False)  # per rack uplink, the jobs crossing it
    # ------------------------------------------------ the loop
    # Ids of arrived, unfinished jobs, ascending (arrivals come in id order): the first
    # n_active entries; kept so that a decision need not scan every job since the oldest.
    active_buf: I64 = field(init=False)
    n_active: int = field(init=False)
    n_waiting: int = field(init=False)
    any_level: I64 = field(init=False)  # levels of a decision without max_level, sliced
    queue: EventQueue = field(init=False)
    next_wake: float = field(init=False)
    last_decision: float = field(init=False)
    busy_t: list[float] = field(init=False)
    busy_g: list[int] = field(init=False)
    segments: list[Segment] = field(init=False)
    events: int = field(init=False)
    decisions: int = field(init=False)

    def __post_init__(self, n: int, cluster: Cluster, ref_iter_s: F64) -> None:
        self.state = np.zeros(n, dtype=np.int8)
        self.done, self.settled_at, self.restore_until = np.zeros(n), np.zeros(n), np.zeros(n)
        self.iter_s, self.comm_now, self.attained = np.ones(n), np.zeros(n), np.zeros(n)
        self.first_start, self.finish = np.full(n, np.nan), np.full(n, np.nan)
        self.run_s, self.progress_s, self.comm_s = np.zeros(n), np.zeros(n), np.zeros(n)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.widest = np.full(n, -1, dtype=np.int64)
        self.waiting_since = np.full(n, np.nan)
        self.last_run, self.run_started = np.zeros(n), np.zeros(n)
        self.locality = LocalityWaits(n)
        self.progress = JobProgress(
            attained_gpu_s=self.attained, settled_at=self.settled_at,
            restore_until=self.restore_until, done_iters=self.done, iter_s=self.iter_s,
            ref_iter_s=ref_iter_s, waiting_since=self.waiting_since,
            run_started=self.run_started, last_run_s=self.last_run,
        )  # fmt: skip
        self.alloc = [None] * n
        self.links = [()] * n
        self.mark = np.zeros(n, dtype=np.bool_)
        self.free = np.full(cluster.machines, cluster.gpus_per_machine, dtype=np.int64)
        self.free_view = self.free.view()
        self.free_view.setflags(write=False)
        self.free_total = self.gpus_total = cluster.gpus
        self.uplink_jobs = [set() for _ in range(cluster.tree.links)]
        self.active_buf = np.zeros(n, dtype=np.int64)
        self.n_active = self.n_waiting = 0
        self.any_level = np.full(n, cluster.top, dtype=np.int64)
        self.any_level.setflags(write=False)
        self.queue = EventQueue(n)
        self.next_wake, self.last_decision = math.inf, -math.inf
        self.busy_t, self.busy_g = [0.0], [0]
        self.segments = []
        self.events = self.decisions = 0

    def mark_busy(self, now: float) -> None:
        """Extend the busy-GPU step function: one step per instant, its last value winning."""
        busy = self.gpus_total - self.free_total
        if self.busy_t[-1] == now:
            self.busy_g[-1] = busy
        else:
            self.busy_t.append(now)
            self.busy_g.append(busy)

    def active_ids(self) -> I64:
        """Ids of arrived, unfinished jobs in arrival order (a copy)."""
        out: I64 = self.active_buf[: self.n_active].copy()
        return out

    def result(self, jobs: JobTable, cluster: Cluster, scheduler: str, placement: str) -> SimResult:
        """The outcome of the run this state went through."""
        return SimResult(
            jobs=jobs,
            cluster=cluster,
            scheduler=scheduler,
            placement=placement,
            first_start_s=self.first_start,
            finish_s=self.finish,
            run_s=self.run_s,
            progress_s=self.progress_s,
            comm_s=self.comm_s,
            locality_wait_s=self.locality.total_s,
            preemptions=self.preemptions,
            widest_level=self.widest,
            busy_t=np.asarray(self.busy_t),
            busy_gpus=np.asarray(self.busy_g, dtype=np.int64),
            events=self.events,
            decisions=self.decisions,
            segments=tuple(self.segments),
        )
