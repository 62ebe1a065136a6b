"""The discrete-event engine: arrivals, finishes and checkpoints advance time event to event.

Each decision point runs the Blox loop: accept arrivals -> schedule -> place -> run. A running
job progresses at 1 / (compute + all-reduce over its placement's widest link); jobs crossing
a rack uplink share it, so their rates are recomputed whenever that set changes. The loop, the
job state arrays it mutates and the preemption it applies stay in one class (about 450 lines)
because splitting them would pass those arrays between files on every event; the event queue and
locality-wait bookkeeping live in ``bookkeeping``.
"""

from __future__ import annotations

import math

import numpy as np

from recperf.cluster.base import (
    F64,
    I64,
    Allocation,
    JobProgress,
    PlacementPolicy,
    Scheduler,
    SchedulerView,
    is_preemptive,
    scheduler_name,
)
from recperf.cluster.bookkeeping import CKPT_DONE, FINISH, WAKE, EventQueue, LocalityWaits
from recperf.cluster.jobs import JobTable
from recperf.cluster.network import JobComm
from recperf.cluster.outcome import EngineConfig, Segment, SimResult
from recperf.cluster.topology import Cluster, Level
from recperf.core.errors import RecperfError, SimulationError
from recperf.core.progress import ProgressFn

WAITING, RUNNING, CHECKPOINTING, DONE = 1, 2, 3, 4  # job states; 0: not arrived yet
_NO_JOBS: I64 = np.zeros(0, dtype=np.int64)
_NO_JOBS.setflags(write=False)


def check_fits(jobs: JobTable, cluster: Cluster) -> None:
    """Every job must fit the cluster, or it would wait forever."""
    too_big = np.flatnonzero(jobs.gpus > cluster.gpus)
    if too_big.size:
        j = int(too_big[0])
        raise RecperfError(
            f"job {jobs.name[j]!r} needs {int(jobs.gpus[j])} GPUs but cluster "
            f"{cluster.name!r} has only {cluster.gpus}"
        )


class Simulator:
    """Runs one scheduler and placement policy over a job table on a cluster."""

    def __init__(
        self,
        jobs: JobTable,
        cluster: Cluster,
        scheduler: Scheduler,
        placement: PlacementPolicy,
        config: EngineConfig | None = None,
        seed: int = 0,
    ) -> None:
        self.jobs, self.cluster = jobs, cluster
        self.scheduler, self.placement = scheduler, placement
        self.preemptive = is_preemptive(scheduler)  # a plug-in may leave it out: False
        self.scheduler_name = scheduler_name(scheduler)
        self.cfg = config or EngineConfig()
        self.rng = np.random.default_rng(seed)
        check_fits(jobs, cluster)
        self._init_comm()

    def _init_comm(self) -> None:
        """Per-job communication terms depend only on placement shape: computed once."""
        self.comm = JobComm.of(self.cluster, self.jobs, self.cfg.congestion)
        # With the network off a job runs at its consolidated rate: its GPUs as if on one
        # machine's links, whatever its size (Gavel's measured consolidated throughput).
        tightest = self.comm.tightest_s if self.cfg.network_on else self.comm.by_level[1]
        self.ref_iter_s: F64 = self.jobs.compute_s + tightest
        tiers = self.cluster.tree.link_tier() - 1
        self.link_gbps: list[float] = [self.comm.uplink_gbps[t] for t in tiers.tolist()]

    # ---------------------------------------------------------------- state
    def _reset(self) -> None:
        n, c = len(self.jobs), self.cluster
        self.state = np.zeros(n, dtype=np.int8)
        self.done = np.zeros(n)
        self.settled_at = np.zeros(n)
        self.restore_until = np.zeros(n)
        self.iter_s = np.ones(n)
        self.comm_now = np.zeros(n)
        self.attained = np.zeros(n)
        self.first_start = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.run_s = np.zeros(n)
        self.progress_s = np.zeros(n)
        self.comm_s = np.zeros(n)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.widest = np.full(n, -1, dtype=np.int64)
        self.waiting_since = np.full(n, np.nan)
        self.last_run = np.zeros(n)
        self.run_started = np.zeros(n)
        self.locality = LocalityWaits(n)
        self.progress = JobProgress(
            attained_gpu_s=self.attained, settled_at=self.settled_at,
            restore_until=self.restore_until, done_iters=self.done, iter_s=self.iter_s,
            ref_iter_s=self.ref_iter_s, waiting_since=self.waiting_since,
            run_started=self.run_started, last_run_s=self.last_run,
        )  # fmt: skip
        self.alloc: list[Allocation | None] = [None] * n
        self.links: list[tuple[int, ...]] = [()] * n
        self.free = np.full(c.machines, c.gpus_per_machine, dtype=np.int64)
        self.free_view = self.free.view()  # what schedulers see: always current, read-only
        self.free_view.setflags(write=False)
        self.free_total = self.gpus_total = c.gpus  # gpus: a property, read at every start
        # Ids of arrived, unfinished jobs, ascending (arrivals come in id order): the first
        # n_active entries; kept so that a decision need not scan every job since the oldest.
        self.active_buf = np.zeros(n, dtype=np.int64)
        self.n_active = 0
        self.mark = np.zeros(n, dtype=np.bool_)
        self.any_level = np.full(n, c.top, dtype=np.int64)  # levels of a decision
        self.any_level.setflags(write=False)  # without max_level, sliced (not built) per decision
        self.n_waiting = 0
        self.uplink_jobs: list[set[int]] = [set() for _ in range(c.tree.links)]
        self.queue = EventQueue(n)
        self.next_wake = math.inf
        self.last_decision = -math.inf
        self.busy_t: list[float] = [0.0]
        self.busy_g: list[int] = [0]
        self.segments: list[Segment] = []
        self.events = 0
        self.decisions = 0

    def _mark_busy(self, now: float) -> None:
        busy = self.gpus_total - self.free_total
        if self.busy_t[-1] == now:
            self.busy_g[-1] = busy
        else:
            self.busy_t.append(now)
            self.busy_g.append(busy)

    # ---------------------------------------------------------------- progress
    def _settle(self, j: int, now: float) -> None:
        """Account progress and GPU time of running job ``j`` up to ``now``."""
        last = float(self.settled_at[j])
        if now <= last:
            return
        start = max(last, float(self.restore_until[j]))
        if now > start:
            dt = now - start
            iter_s = float(self.iter_s[j])
            iters = dt / iter_s
            self.done[j] += iters
            self.progress_s[j] += dt
            self.comm_s[j] += dt * float(self.comm_now[j]) / iter_s
            if self.cfg.record_segments:
                self.segments.append(Segment(j, start, now, None, iters))
        self._hold(j, now)

    def _hold(self, j: int, now: float) -> None:
        """Charge job ``j`` the GPU time it held since it was last settled."""
        held = now - float(self.settled_at[j])
        self.attained[j] += held * float(self.jobs.gpus[j])
        self.run_s[j] += held
        self.settled_at[j] = now

    def _comm_for(self, j: int, alloc: Allocation) -> float:
        if not self.cfg.network_on:  # every placement at the consolidated rate
            return float(self.comm.by_level[int(Level.MACHINE), j])
        lv = alloc.level
        if lv <= Level.RACK:
            return float(self.comm.by_level[lv, j])
        # Across switches: the slowest uplink crossed, each shared by the jobs crossing it.
        up, gbps = self.uplink_jobs, self.link_gbps
        bw = min([gbps[k] / max(len(up[k]), 1) for k in self.links[j]])
        bw = min(self.comm.host_gbps, bw)
        return float(self.comm.latency_s[lv, j]) + float(self.comm.bits[j]) / (bw * 1e9)

    def _set_rate(self, j: int, now: float) -> None:
        """(Re)compute job ``j``'s iteration time and reschedule its finish event."""
        alloc = self.alloc[j]
        assert alloc is not None
        comm = self._comm_for(j, alloc)
        self.comm_now[j] = comm
        iter_s = float(self.jobs.compute_s[j]) + comm
        self.iter_s[j] = iter_s
        self.queue.cancel(j)
        remaining = max(float(self.jobs.total_iters[j]) - float(self.done[j]), 0.0)
        t_fin = max(now, float(self.restore_until[j])) + remaining * iter_s
        self.queue.push(t_fin, FINISH, j)

    def _uplink_change(self, j: int, now: float, join: bool) -> None:
        affected: set[int] = set()
        for k in self.links[j]:
            affected |= self.uplink_jobs[k]
            if join:
                self.uplink_jobs[k].add(j)
            else:
                self.uplink_jobs[k].discard(j)
        affected.discard(j)
        for k in sorted(affected):
            alloc_k = self.alloc[k]
            assert alloc_k is not None
            if self._comm_for(k, alloc_k) != float(self.comm_now[k]):
                self._settle(k, now)
                self._set_rate(k, now)

    # ---------------------------------------------------------------- transitions
    def _activate(self, j: int, now: float) -> None:
        self.state[j] = WAITING
        self.waiting_since[j] = now
        self.active_buf[self.n_active] = j
        self.n_active += 1
        self.n_waiting += 1

    def _start(self, j: int, alloc: Allocation, now: float) -> None:
        self.free[list(alloc.machines)] -= np.asarray(alloc.counts, dtype=np.int64)
        self.free_total -= alloc.gpus
        self.alloc[j] = alloc
        self.state[j] = RUNNING
        self.n_waiting -= 1
        resumed = not math.isnan(float(self.first_start[j]))
        if not resumed:
            self.first_start[j] = now
        self.restore_until[j] = now + (self.cfg.restore_s if resumed else 0.0)
        self.settled_at[j] = now
        self.run_started[j] = now
        self.waiting_since[j] = np.nan
        self.widest[j] = max(int(self.widest[j]), int(alloc.level))
        if alloc.level > Level.RACK and self.cfg.network_on:
            self.links[j] = alloc.uplinks(self.cluster)
            self._uplink_change(j, now, join=True)
        self._set_rate(j, now)
        self._mark_busy(now)

    def _stop_running(self, j: int, now: float) -> Allocation:
        """Settle ``j`` and take it off the network; it still holds its GPUs."""
        self._settle(j, now)
        alloc = self.alloc[j]
        assert alloc is not None
        self.queue.cancel(j)  # a stopped job must not finish
        self.last_run[j] = now - float(self.run_started[j])
        if alloc.level > Level.RACK and self.cfg.network_on:
            self._uplink_change(j, now, join=False)
        return alloc

    def _release(self, j: int, alloc: Allocation, start: float, now: float) -> None:
        if len(alloc.machines) == 1:  # most jobs: a scalar update is cheaper than fancy indexing
            self.free[alloc.machines[0]] += alloc.counts[0]
        else:
            self.free[list(alloc.machines)] += np.asarray(alloc.counts, dtype=np.int64)
        self.free_total += alloc.gpus
        self.alloc[j] = None
        if self.cfg.record_segments:
            self.segments.append(Segment(j, start, now, alloc, 0.0))
        self._mark_busy(now)

    def _finish(self, j: int, now: float) -> None:
        alloc = self._stop_running(j, now)
        self.done[j] = float(self.jobs.total_iters[j])
        self.state[j] = DONE
        self.finish[j] = now
        self._release(j, alloc, float(self.run_started[j]), now)
        k, buf = self.n_active, self.active_buf
        pos = int(buf[:k].searchsorted(j))
        buf[pos : k - 1] = buf[pos + 1 : k]
        self.n_active = k - 1

    def _preempt(self, j: int, now: float) -> None:
        self._stop_running(j, now)
        self.preemptions[j] += 1
        self.state[j] = CHECKPOINTING
        self.queue.push(now + self.cfg.checkpoint_s, CKPT_DONE, j)

    def _checkpoint_done(self, j: int, now: float) -> None:
        alloc = self.alloc[j]
        assert alloc is not None
        self._hold(j, now)  # the checkpoint held the GPUs but made no progress
        self._release(j, alloc, float(self.run_started[j]), now)
        self.state[j] = WAITING
        self.waiting_since[j] = now
        self.n_waiting += 1

    # ---------------------------------------------------------------- the loop
    def run(self, progress: ProgressFn | None = None) -> SimResult:
        """Simulate until every job has finished."""
        self._reset()
        self.scheduler.reset(self.jobs, self.cluster)
        arrivals: list[float] = self.jobs.arrival_s.tolist()
        n = len(self.jobs)
        nxt = 0
        finished = 0
        report_every = max(n // 200, 1)
        while finished < n:
            t_arr = arrivals[nxt] if nxt < n else math.inf
            t_evt = self.queue.next_time()
            now = min(t_arr, t_evt)
            if now == math.inf:
                raise SimulationError(
                    f"simulation stalled at t={self.busy_t[-1]:.0f} s: {self.n_waiting} jobs wait, "
                    f"{self.free_total} GPUs are free, and scheduler {self.scheduler_name!r} with "
                    f"placement {self.placement.name!r} starts none of them"
                )
            changed = freed = False
            while nxt < n and arrivals[nxt] <= now:
                self._activate(nxt, now)
                nxt += 1
                self.events += 1
                changed = True
            while (event := self.queue.pop_due(now)) is not None:
                kind, j = event
                if kind == WAKE:
                    if now >= self.next_wake:
                        self.next_wake = math.inf
                    changed = True
                    continue
                self.events += 1
                if kind == FINISH:
                    self._finish(j, now)
                    finished += 1
                    if progress is not None and finished % report_every == 0:
                        progress(finished / n)
                else:
                    self._checkpoint_done(j, now)
                    freed = True
                changed = True
            if changed and self.n_waiting and (self.free_total or self.preemptive):
                self._maybe_decide(now, freed)
        if progress is not None:
            progress(1.0)
        return self._result()

    def _view(self, now: float, preempt: bool) -> SchedulerView:
        ids = self._active_ids()
        return SchedulerView(
            now=now,
            cluster=self.cluster,
            jobs=self.jobs,
            active=ids,
            running=self.state[ids] == RUNNING,
            free_gpus=self.free_total,
            progress=self.progress,
            free=self.free_view,
            alloc=self.alloc,
            comm=self.comm,
            may_preempt=preempt,
        )

    def _active_ids(self) -> I64:
        """Ids of arrived, unfinished jobs in arrival order."""
        out: I64 = self.active_buf[: self.n_active].copy()
        return out

    def _maybe_decide(self, now: float, freed: bool = False) -> None:
        """Decide now; within a round, a preemptive scheduler only fills free GPUs and is asked
        again at the round's end. With ``rounds_s``, decide only on a round boundary (else wake
        at the next one), and ask a preemptive scheduler again each round while jobs wait;
        GPUs ``freed`` by a checkpoint go at once to the jobs the boundary's preemption was
        for (the scheduler's order, filling free GPUs only), not a round later."""
        if self.cfg.rounds_s > 0:
            boundary = self._boundary(now)
            if freed and boundary > now:
                self._decide(now, preempt=False)
                self._wake(boundary)
                return
            if boundary > now:
                self._wake(boundary)
                return
            self._decide(now, preempt=self.preemptive)
            if self.preemptive and self.n_waiting:
                self._wake(now + self.cfg.rounds_s)
            return
        if self.preemptive and self.cfg.round_s > 0:
            due = self.last_decision + self.cfg.round_s
            if now < due:
                self._wake(due)
                if self.free_total:
                    self._decide(now, preempt=False)
                return
            self.last_decision = now
        self._decide(now, preempt=self.preemptive)

    def _boundary(self, t: float) -> float:
        """The first round boundary at or after ``t`` (``t`` itself within rounding)."""
        r = self.cfg.rounds_s
        return math.ceil(t / r - 1e-9) * r

    def _wake(self, t: float) -> None:
        if self.cfg.rounds_s > 0:
            t = self._boundary(t)
        if t < self.next_wake:
            self.next_wake = t
            self.queue.push(t, WAKE)

    def _decide(self, now: float, preempt: bool) -> None:
        self.decisions += 1
        decision = self.scheduler.schedule(self._view(now, preempt))
        if decision.wake_at is not None and decision.wake_at > now:
            self._wake(decision.wake_at)
        order = np.asarray(decision.order, dtype=np.int64)
        if decision.max_level is None:
            levels = self.any_level[: order.size]
        else:
            levels = np.asarray(decision.max_level, dtype=np.int64)
        if preempt:
            # Admission decides which running jobs lose their GPUs; every waiting job in the
            # order may still start on GPUs that are free now (admitted ones first) unless
            # this round preempts: then the GPUs being freed are for the admitted jobs, and a
            # job not admitted that took free GPUs now could leave them short when the
            # checkpoints end, to be preempted in turn (with checkpoint_s = 0, forever at one
            # instant: two jobs alternating on a GPU an admitted job waits for).
            keep = self._admit(order)
            admitted = order[keep]
            ids = self._active_ids()
            running_now = ids[self.state[ids] == RUNNING]
            self.mark[admitted] = True
            stopped = running_now[~self.mark[running_now]]
            for j in stopped.tolist():
                self._preempt(j, now)
            self.mark[admitted] = False
            first = np.flatnonzero(keep)
            if not stopped.size:
                first = np.concatenate([first, np.flatnonzero(~keep)])
            order, levels = order[first], levels[first]
        self._place_in_order(order, levels, decision.blocking, now)

    def _admit(self, order: I64) -> np.ndarray:
        """Greedy by priority: the jobs whose GPU demands fit the whole cluster together."""
        demand = self.jobs.gpus[order]
        room = self.cluster.gpus
        keep = np.cumsum(demand) <= room
        k = int(np.argmin(keep)) if not keep.all() else order.size
        room -= int(demand[:k].sum())
        i = k
        while room > 0:
            rest = np.flatnonzero(demand[i:] <= room)
            if not rest.size:
                break
            i += int(rest[0])
            keep[i] = True
            room -= int(demand[i])
            i += 1
        return keep

    def _level_caps(self, constrained: bool) -> I64:
        """Largest job placeable now at each Level; without level constraints only the total
        matters, so the per-machine scans are skipped."""
        if not constrained:
            return np.full(self.cluster.top + 1, self.free_total, dtype=np.int64)
        return self.cluster.level_caps(self.free)

    def _place_in_order(self, order: I64, levels: I64, blocking: bool, now: float) -> None:
        waiting = self.state[order] == WAITING
        n_waiting = np.count_nonzero(waiting)  # a fraction of any()'s call cost
        if not n_waiting:
            self.locality.update(_NO_JOBS, now)
            return
        if n_waiting < order.size:  # e.g. FIFO's order holds only waiting jobs: nothing to drop
            order, levels = order[waiting], levels[waiting]
        demand = self.jobs.gpus[order]
        constrained = int(np.count_nonzero(levels < self.cluster.top)) > 0
        # Unconstrained, every level's cap is the free total: compared directly, not as an array.
        caps = self._level_caps(constrained) if constrained else None
        if caps is not None:
            held = (demand > caps[levels]) & (demand <= self.free_total)
            self.locality.update(order[held], now)
        else:
            self.locality.update(_NO_JOBS, now)
        if blocking:
            # Only a prefix can start: up to the first job whose cumulative demand overflows.
            k = int(demand.cumsum().searchsorted(self.free_total, side="right")) + 1
            order, levels, demand = order[:k], levels[:k], demand[:k]
        else:
            fits = demand <= (self.free_total if caps is None else caps[levels])
            order, levels, demand = order[fits], levels[fits], demand[fits]
        for j, lv, d in zip(order.tolist(), levels.tolist(), demand.tolist(), strict=True):
            if self.free_total == 0:
                return
            alloc = None
            if d <= (self.free_total if caps is None else caps[lv]):
                alloc = self.placement.place(d, self.free, self.cluster, lv, self.rng)
            if alloc is None:
                if blocking:
                    return
                continue
            self._start(j, alloc, now)
            if caps is not None:
                caps = self._level_caps(constrained)

    def _result(self) -> SimResult:
        return SimResult(
            jobs=self.jobs,
            cluster=self.cluster,
            scheduler=self.scheduler_name,
            placement=self.placement.name,
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
