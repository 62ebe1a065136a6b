"""The discrete-event engine: arrivals, finishes and checkpoints advance time event to event.

Each decision point runs the Blox loop: accept arrivals -> schedule -> place -> run. A running
job progresses at 1 / (compute + all-reduce over its placement's widest link); jobs crossing
a rack uplink share it, so their rates are recomputed whenever that set changes. The loop and
the preemption it applies stay in one class; the state it mutates is one ``RunState``
(``engine_state``), and the event queue and locality-wait bookkeeping live in ``bookkeeping``.
"""

from __future__ import annotations

import math

import numpy as np

from recperf.cluster.base import (
    F64,
    I64,
    Allocation,
    PlacementPolicy,
    Scheduler,
    SchedulerView,
    is_preemptive,
    scheduler_name,
)
from recperf.cluster.bookkeeping import CKPT_DONE, FINISH, WAKE
from recperf.cluster.engine_state import RunState
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
        # Per-job communication terms depend only on placement shape: computed once.
        self.comm = JobComm.of(cluster, jobs, self.cfg.congestion)
        # With the network off a job runs at its consolidated rate: its GPUs as if on one
        # machine's links, whatever its size (Gavel's measured consolidated throughput).
        tightest = self.comm.tightest_s if self.cfg.network_on else self.comm.by_level[1]
        self.ref_iter_s: F64 = jobs.compute_s + tightest
        tiers = cluster.tree.link_tier() - 1
        self.link_gbps: list[float] = [self.comm.uplink_gbps[t] for t in tiers.tolist()]
        self.st = RunState(len(jobs), cluster, self.ref_iter_s)
        self.ran = False  # run() again starts from a fresh RunState

    # ---------------------------------------------------------------- progress
    def _settle(self, j: int, now: float) -> None:
        """Account progress and GPU time of running job ``j`` up to ``now``."""
        st = self.st
        last = float(st.settled_at[j])
        if now <= last:
            return
        start = max(last, float(st.restore_until[j]))
        if now > start:
            dt = now - start
            iter_s = float(st.iter_s[j])
            iters = dt / iter_s
            st.done[j] += iters
            st.progress_s[j] += dt
            st.comm_s[j] += dt * float(st.comm_now[j]) / iter_s
            if self.cfg.record_segments:
                st.segments.append(Segment(j, start, now, None, iters))
        self._hold(j, now)

    def _hold(self, j: int, now: float) -> None:
        """Charge job ``j`` the GPU time it held since it was last settled."""
        st = self.st
        held = now - float(st.settled_at[j])
        st.attained[j] += held * float(self.jobs.gpus[j])
        st.run_s[j] += held
        st.settled_at[j] = now

    def _comm_for(self, j: int, alloc: Allocation) -> float:
        if not self.cfg.network_on:  # every placement at the consolidated rate
            return float(self.comm.by_level[int(Level.MACHINE), j])
        lv = alloc.level
        if lv <= Level.RACK:
            return float(self.comm.by_level[lv, j])
        # Across switches: the slowest uplink crossed, each shared by the jobs crossing it.
        up, gbps = self.st.uplink_jobs, self.link_gbps
        bw = min([gbps[k] / max(len(up[k]), 1) for k in self.st.links[j]])
        bw = min(self.comm.host_gbps, bw)
        return float(self.comm.latency_s[lv, j]) + float(self.comm.bits[j]) / (bw * 1e9)

    def _set_rate(self, j: int, now: float) -> None:
        """(Re)compute job ``j``'s iteration time and reschedule its finish event."""
        st = self.st
        alloc = st.alloc[j]
        assert alloc is not None
        comm = self._comm_for(j, alloc)
        st.comm_now[j] = comm
        iter_s = float(self.jobs.compute_s[j]) + comm
        st.iter_s[j] = iter_s
        st.queue.cancel(j)
        remaining = max(float(self.jobs.total_iters[j]) - float(st.done[j]), 0.0)
        t_fin = max(now, float(st.restore_until[j])) + remaining * iter_s
        st.queue.push(t_fin, FINISH, j)

    def _uplink_change(self, j: int, now: float, join: bool) -> None:
        st = self.st
        affected: set[int] = set()
        for k in st.links[j]:
            affected |= st.uplink_jobs[k]
            if join:
                st.uplink_jobs[k].add(j)
            else:
                st.uplink_jobs[k].discard(j)
        affected.discard(j)
        for k in sorted(affected):
            alloc_k = st.alloc[k]
            assert alloc_k is not None
            if self._comm_for(k, alloc_k) != float(st.comm_now[k]):
                self._settle(k, now)
                self._set_rate(k, now)

    # ---------------------------------------------------------------- transitions
    def _activate(self, j: int, now: float) -> None:
        st = self.st
        st.state[j] = WAITING
        st.waiting_since[j] = now
        st.active_buf[st.n_active] = j
        st.n_active += 1
        st.n_waiting += 1

    def _start(self, j: int, alloc: Allocation, now: float) -> None:
        st = self.st
        st.free[list(alloc.machines)] -= np.asarray(alloc.counts, dtype=np.int64)
        st.free_total -= alloc.gpus
        st.alloc[j] = alloc
        st.state[j] = RUNNING
        st.n_waiting -= 1
        resumed = not math.isnan(float(st.first_start[j]))
        if not resumed:
            st.first_start[j] = now
        st.restore_until[j] = now + (self.cfg.restore_s if resumed else 0.0)
        st.settled_at[j] = now
        st.run_started[j] = now
        st.waiting_since[j] = np.nan
        st.widest[j] = max(int(st.widest[j]), int(alloc.level))
        if alloc.level > Level.RACK and self.cfg.network_on:
            st.links[j] = alloc.uplinks(self.cluster)
            self._uplink_change(j, now, join=True)
        self._set_rate(j, now)
        st.mark_busy(now)

    def _stop_running(self, j: int, now: float) -> Allocation:
        """Settle ``j`` and take it off the network; it still holds its GPUs."""
        st = self.st
        self._settle(j, now)
        alloc = st.alloc[j]
        assert alloc is not None
        st.queue.cancel(j)  # a stopped job must not finish
        st.last_run[j] = now - float(st.run_started[j])
        if alloc.level > Level.RACK and self.cfg.network_on:
            self._uplink_change(j, now, join=False)
        return alloc

    def _release(self, j: int, alloc: Allocation, start: float, now: float) -> None:
        st = self.st
        if len(alloc.machines) == 1:  # most jobs: a scalar update is cheaper than fancy indexing
            st.free[alloc.machines[0]] += alloc.counts[0]
        else:
            st.free[list(alloc.machines)] += np.asarray(alloc.counts, dtype=np.int64)
        st.free_total += alloc.gpus
        st.alloc[j] = None
        if self.cfg.record_segments:
            st.segments.append(Segment(j, start, now, alloc, 0.0))
        st.mark_busy(now)

    def _finish(self, j: int, now: float) -> None:
        st = self.st
        alloc = self._stop_running(j, now)
        st.done[j] = float(self.jobs.total_iters[j])
        st.state[j] = DONE
        st.finish[j] = now
        self._release(j, alloc, float(st.run_started[j]), now)
        k, buf = st.n_active, st.active_buf
        pos = int(buf[:k].searchsorted(j))
        buf[pos : k - 1] = buf[pos + 1 : k]
        st.n_active = k - 1

    def _preempt(self, j: int, now: float) -> None:
        self._stop_running(j, now)
        self.st.preemptions[j] += 1
        self.st.state[j] = CHECKPOINTING
        self.st.queue.push(now + self.cfg.checkpoint_s, CKPT_DONE, j)

    def _checkpoint_done(self, j: int, now: float) -> None:
        st = self.st
        alloc = st.alloc[j]
        assert alloc is not None
        self._hold(j, now)  # the checkpoint held the GPUs but made no progress
        self._release(j, alloc, float(st.run_started[j]), now)
        st.state[j] = WAITING
        st.waiting_since[j] = now
        st.n_waiting += 1

    # ---------------------------------------------------------------- the loop
    def run(self, progress: ProgressFn | None = None) -> SimResult:
        """Simulate until every job has finished."""
        if self.ran:
            self.st = RunState(len(self.jobs), self.cluster, self.ref_iter_s)
        self.ran = True
        st, queue = self.st, self.st.queue
        self.scheduler.reset(self.jobs, self.cluster)
        arrivals: list[float] = self.jobs.arrival_s.tolist()
        n = len(self.jobs)
        nxt = 0
        finished = 0
        report_every = max(n // 200, 1)
        while finished < n:
            t_arr = arrivals[nxt] if nxt < n else math.inf
            t_evt = queue.next_time()
            now = min(t_arr, t_evt)
            if now == math.inf:
                raise SimulationError(
                    f"simulation stalled at t={st.busy_t[-1]:.0f} s: {st.n_waiting} jobs wait, "
                    f"{st.free_total} GPUs are free, and scheduler {self.scheduler_name!r} with "
                    f"placement {self.placement.name!r} starts none of them"
                )
            changed = freed = False
            while nxt < n and arrivals[nxt] <= now:
                self._activate(nxt, now)
                nxt += 1
                st.events += 1
                changed = True
            while (event := queue.pop_due(now)) is not None:
                kind, j = event
                if kind == WAKE:
                    if now >= st.next_wake:
                        st.next_wake = math.inf
                    changed = True
                    continue
                st.events += 1
                if kind == FINISH:
                    self._finish(j, now)
                    finished += 1
                    if progress is not None and finished % report_every == 0:
                        progress(finished / n)
                else:
                    self._checkpoint_done(j, now)
                    freed = True
                changed = True
            if changed and st.n_waiting and (st.free_total or self.preemptive):
                self._maybe_decide(now, freed)
        if progress is not None:
            progress(1.0)
        return st.result(self.jobs, self.cluster, self.scheduler_name, self.placement.name)

    def _view(self, now: float, preempt: bool) -> SchedulerView:
        st = self.st
        ids = st.active_ids()
        return SchedulerView(
            now=now,
            cluster=self.cluster,
            jobs=self.jobs,
            active=ids,
            running=st.state[ids] == RUNNING,
            free_gpus=st.free_total,
            progress=st.progress,
            free=st.free_view,
            alloc=st.alloc,
            comm=self.comm,
            may_preempt=preempt,
        )

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
            if self.preemptive and self.st.n_waiting:
                self._wake(now + self.cfg.rounds_s)
            return
        if self.preemptive and self.cfg.round_s > 0:
            due = self.st.last_decision + self.cfg.round_s
            if now < due:
                self._wake(due)
                if self.st.free_total:
                    self._decide(now, preempt=False)
                return
            self.st.last_decision = now
        self._decide(now, preempt=self.preemptive)

    def _boundary(self, t: float) -> float:
        """The first round boundary at or after ``t`` (``t`` itself within rounding)."""
        r = self.cfg.rounds_s
        return math.ceil(t / r - 1e-9) * r

    def _wake(self, t: float) -> None:
        if self.cfg.rounds_s > 0:
            t = self._boundary(t)
        if t < self.st.next_wake:
            self.st.next_wake = t
            self.st.queue.push(t, WAKE)

    def _decide(self, now: float, preempt: bool) -> None:
        st = self.st
        st.decisions += 1
        decision = self.scheduler.schedule(self._view(now, preempt))
        if decision.wake_at is not None and decision.wake_at > now:
            self._wake(decision.wake_at)
        order = np.asarray(decision.order, dtype=np.int64)
        if decision.max_level is None:
            levels = st.any_level[: order.size]
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
            ids = st.active_ids()
            running_now = ids[st.state[ids] == RUNNING]
            st.mark[admitted] = True
            stopped = running_now[~st.mark[running_now]]
            for j in stopped.tolist():
                self._preempt(j, now)
            st.mark[admitted] = False
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
            return np.full(self.cluster.top + 1, self.st.free_total, dtype=np.int64)
        return self.cluster.level_caps(self.st.free)

    def _place_in_order(self, order: I64, levels: I64, blocking: bool, now: float) -> None:
        st = self.st
        waiting = st.state[order] == WAITING
        n_waiting = np.count_nonzero(waiting)  # a fraction of any()'s call cost
        if not n_waiting:
            st.locality.update(_NO_JOBS, now)
            return
        if n_waiting < order.size:  # e.g. FIFO's order holds only waiting jobs: nothing to drop
            order, levels = order[waiting], levels[waiting]
        demand = self.jobs.gpus[order]
        constrained = int(np.count_nonzero(levels < self.cluster.top)) > 0
        # Unconstrained, every level's cap is the free total: compared directly, not as an array.
        caps = self._level_caps(constrained) if constrained else None
        if caps is not None:
            held = (demand > caps[levels]) & (demand <= st.free_total)
            st.locality.update(order[held], now)
        else:
            st.locality.update(_NO_JOBS, now)
        if blocking:
            # Only a prefix can start: up to the first job whose cumulative demand overflows.
            k = int(demand.cumsum().searchsorted(st.free_total, side="right")) + 1
            order, levels, demand = order[:k], levels[:k], demand[:k]
        else:
            fits = demand <= (st.free_total if caps is None else caps[levels])
            order, levels, demand = order[fits], levels[fits], demand[fits]
        for j, lv, d in zip(order.tolist(), levels.tolist(), demand.tolist(), strict=True):
            if st.free_total == 0:
                return
            alloc = None
            if d <= (st.free_total if caps is None else caps[lv]):
                alloc = self.placement.place(d, st.free, self.cluster, lv, self.rng)
            if alloc is None:
                if blocking:
                    return
                continue
            self._start(j, alloc, now)
            if caps is not None:
                caps = self._level_caps(constrained)
