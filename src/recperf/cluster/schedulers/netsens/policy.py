"""The network-sensitive scheduler itself: per-job delay timers scaled by sensitivity, the
order and level limits of each decision, and when to ask the preemption planner."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from recperf.cluster.base import F64, I64, SCHEDULERS, BoolArr, Decision, SchedulerView
from recperf.cluster.jobs import JobTable
from recperf.cluster.schedulers.netsens.config import NetSensConfig, check_timers, parse_timers
from recperf.cluster.schedulers.netsens.preemption import PreemptionPlanner
from recperf.cluster.schedulers.netsens.timers import TimerTuner, demand_class
from recperf.cluster.schedulers.tiresias import demotion_in
from recperf.cluster.sensitivity import Sensitivity
from recperf.cluster.topology import Cluster, Level

_MACHINE = int(Level.MACHINE)


@SCHEDULERS.register("netsens")
class NetSens:
    """Delay scheduling scaled by network sensitivity, with network-sensitive preemption."""

    name: ClassVar[str] = "netsens"
    preemptive: ClassVar[bool] = True
    Config = NetSensConfig

    def __init__(self, config: NetSensConfig | None = None) -> None:
        self.config = config or NetSensConfig()
        self._fixed = parse_timers(self.config.timers)
        self._thr = np.asarray(self.config.thresholds_gpu_s)
        self.tuner = TimerTuner(self.config)
        self._sens: Sensitivity | None = None
        self._planner: PreemptionPlanner | None = None

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        n = len(jobs)
        self._top = cluster.top
        self._steps = cluster.top - 1  # timers: one per level a job may be relaxed to
        check_timers(self._fixed, self._steps, cluster.level_names[2:])
        self.tuner = TimerTuner(self.config, self._steps)
        self._sens = None
        self._planner = None
        self._min_level = cluster.min_levels(jobs.gpus).astype(np.int64)
        self._class = np.asarray([demand_class(g) for g in jobs.gpus.tolist()], dtype=np.int64)
        self._n_classes = int(self._class.max(initial=0)) + 1
        self._table = np.zeros((self._n_classes, self._steps))
        self._table_version = -1
        self._base = np.zeros(n)
        self._held_since = np.full(n, np.nan)
        self._was_running = np.zeros(n, dtype=np.bool_)
        self._moving = np.zeros(n, dtype=np.bool_)
        self._displaced = np.zeros(n, dtype=np.bool_)
        self.moves = {"migrate": 0, "reclaim": 0, "las": 0}
        self._spread: set[int] = set()  # running (or checkpointing) wider than they could be

    # ------------------------------------------------------------------ timers
    def _class_timers(self, classes: I64) -> F64:
        """Class timers of each job, one row per level it may be relaxed to."""
        if self._fixed is not None:
            return np.repeat(np.asarray(self._fixed)[:, None], classes.size, axis=1)
        if self._table_version != self.tuner.version:
            self._table = np.asarray(
                [self.tuner.timers(c) for c in range(self._n_classes)], dtype=np.float64
            ).reshape(self._n_classes, self._steps)
            self._table_version = self.tuner.version
        out: F64 = self._table[classes].T
        return out

    def job_timers(self, ids: I64) -> F64:
        """Per-job timers (row ``k``: before a placement at level ``MACHINE + k + 1``; on racks x
        machines the rack and network timers): the class timers scaled by the job's loss at
        that level, each at least the one before."""
        assert self._sens is not None
        ref = self.config.sensitivity_ref
        out: F64 = self._class_timers(self._class[ids]).copy()
        for k in range(self._steps):
            scale = np.minimum(self._sens.loss(_MACHINE + k + 1)[ids] / ref, 1.0)
            out[k] = out[k] * scale if k == 0 else np.maximum(out[k] * scale, out[k - 1])
        return out

    def _observe(self, view: SchedulerView, running: BoolArr) -> None:
        """Record the locality wait of every job that started since the last decision, and
        open a wait for jobs held back from free GPUs now."""
        ids = view.active
        started = ids[running & ~self._was_running[ids]]
        if started.size:
            run_started = view.progress.run_started[started]
            held = self._held_since[started]
            waits = np.where(np.isnan(held), 0.0, np.maximum(run_started - held, 0.0))
            for j, w in zip(started.tolist(), waits.tolist(), strict=True):
                alloc = view.alloc[j]
                if alloc is not None and self._min_level[j] <= int(alloc.level):
                    self.tuner.record(int(self._class[j]), int(alloc.level), w)
                if alloc is not None and int(alloc.level) > self._min_level[j]:
                    self._spread.add(j)
            self._held_since[started] = np.nan
            self._moving[started] = False
            self._displaced[started] = False
        self._was_running[ids] = running
        waiting = ids[~running]
        if not waiting.size or view.free_gpus == 0:
            return
        d = view.jobs.gpus[waiting]
        lv = self._min_level[waiting]
        caps = view.cluster.level_caps(view.free)
        held = (d <= view.free_gpus) & (lv < self._top) & (d > caps[lv])
        fresh = waiting[held & np.isnan(self._held_since[waiting])]
        self._held_since[fresh] = view.now

    # ------------------------------------------------------------------ decision
    def schedule(self, view: SchedulerView) -> Decision:
        cfg, ids, now, running = self.config, view.active, view.now, view.running
        planner = self._planner or self._begin(view)
        self._observe(view, running)
        las = cfg.order == "las"
        if not las and not (view.may_preempt and self._may_move(view)):
            return self._fill(view)
        waiting = ~running
        wpos = np.flatnonzero(waiting)  # most decisions concern a few waiting jobs only
        wids = ids[wpos]
        waited_w, level_w, timers, moving_w, displaced_w = self._waiting_levels(view, wids)
        attained = view.attained_gpu_s
        executed = attained / view.jobs.gpus[ids]
        running_since = view.running_since
        leased = running & (now - running_since < cfg.lease_s)
        if las:
            queue, las_times = self._las_queues(view, wpos, waited_w, attained, executed, leased)
        else:
            queue, las_times = np.zeros(ids.size, dtype=np.int64), []

        level = self._min_level[ids].copy()
        level[wpos] = level_w

        key = queue.copy()
        key[leased] = -1
        key[wpos[displaced_w]] = -2
        key[wpos[moving_w]] = -3
        prio = np.lexsort((ids, key))  # positions into ids, best first

        stop = np.zeros(ids.size, dtype=np.bool_)
        moved = False
        if view.may_preempt:
            moved = planner.plan(view, prio, queue, level, leased, stop, executed)
            # A job that reclaims GPUs in this round waits for them at its tightest level: left
            # at the level its timers allow, it would start spread on the free GPUs now and the
            # jobs displaced for it would be preempted for nothing.
            claims = waiting & self._moving[ids]
            level[claims] = self._min_level[ids[claims]]
        keep_running = prio[running[prio] & ~stop[prio]]
        # While GPUs are being freed for a move, start nothing else: the jobs that move get
        # them first when the checkpoints complete (seconds later).
        start = prio[waiting[prio] & (self._moving[ids[prio]] | (not moved))]
        pos = np.concatenate([keep_running, start])
        order = ids[pos]
        max_level = level[pos].astype(np.int8)

        times = [float(np.min(running_since[leased], initial=np.inf)) + cfg.lease_s - now]
        times += las_times
        times += self._wait_timers(view, wids, waited_w, level_w, timers)
        return Decision(order=order, max_level=max_level, wake_at=_wake_at(now, times))

    def _begin(self, view: SchedulerView) -> PreemptionPlanner:
        """At a run's first decision, set up what needs the engine's communication model."""
        self._sens = Sensitivity.of(view.jobs, view.cluster, view.comm)
        self._planner = PreemptionPlanner(
            self.config,
            self._sens,
            self._min_level,
            self._held_since,
            self._moving,
            self._displaced,
            self.moves,
        )
        return self._planner

    def _las_queues(
        self,
        view: SchedulerView,
        wpos: I64,
        waited_w: F64,
        attained: F64,
        executed: F64,
        leased: BoolArr,
    ) -> tuple[I64, list[float]]:
        """Each active job's 2D-LAS queue, after promoting waiting jobs that starved to the top
        one, and the seconds until a queue changes next (a demotion or a promotion)."""
        cfg, ids, running = self.config, view.active, view.running
        waiting = ~running
        waited = np.full(ids.size, np.nan)
        waited[wpos] = waited_w
        promote_at = np.maximum(cfg.promote_factor * executed, cfg.lease_s)
        if cfg.promote_factor > 0:
            starving = waiting & (executed > 0) & (waited >= promote_at)
            self._base[ids[starving]] = attained[starving]
        service = attained - self._base[ids]
        queue = np.searchsorted(self._thr, service, side="right").astype(np.int64)
        gpus = view.jobs.gpus[ids]
        times = [demotion_in(self._thr, running & ~leased, queue, service, gpus)]
        starve = waiting & (queue > 0)
        if cfg.promote_factor > 0 and starve.any():
            times.append(float(np.min(promote_at[starve] - waited[starve])))
        return queue, times

    def _waiting_levels(
        self, view: SchedulerView, wids: I64
    ) -> tuple[F64, I64, F64, BoolArr, BoolArr]:
        """For waiting jobs ``wids``: time waited, the widest level each may use now (delay
        timers, then moves in progress), the timers, and which are moving / displaced."""
        waited: F64 = view.now - view.progress.waiting_since[wids]
        level = self._min_level[wids].copy()
        timers = self.job_timers(wids)
        level[(level == _MACHINE) & (waited >= timers[0])] = _MACHINE + 1
        for k in range(1, self._steps):
            level[(level <= _MACHINE + k) & (waited >= timers[k])] = _MACHINE + k + 1
        moving = self._moving[wids]
        level[moving] = self._min_level[wids[moving]]
        # Displaced jobs were chosen as insensitive: they restart at once wherever GPUs are.
        displaced = self._displaced[wids]
        level[displaced] = self._top
        return waited, level, timers, moving, displaced

    def _may_move(self, view: SchedulerView) -> bool:
        """Whether a reclaim or a migration could be planned now: a running job placed wider
        than its tightest level, or a job held back for locality long enough to reclaim."""
        self._spread = {j for j in self._spread if view.alloc[j] is not None}
        if self.config.migrate and self._spread:
            return True
        if not self.config.reclaim:
            return False
        wids = view.active[~view.running]
        with np.errstate(invalid="ignore"):
            due = view.now - self._held_since[wids] >= self.config.reclaim_after_s
        return bool(due.any())

    def _fill(self, view: SchedulerView) -> Decision:
        """A decision that moves no job (arrival order): the same order, levels and wake-ups
        as ``schedule`` computes, over the waiting jobs alone; running jobs lead the order so
        that a preemption round keeps them all."""
        cfg, ids, now = self.config, view.active, view.now
        wids = ids[~view.running]
        waited, level, timers, moving, displaced = self._waiting_levels(view, wids)
        key = np.zeros(wids.size, dtype=np.int64)
        key[displaced] = -2
        key[moving] = -3
        prio = np.lexsort((wids, key))
        started = view.progress.run_started[ids[view.running]]
        lease_ends = started + cfg.lease_s - now
        lease_ends = lease_ends[lease_ends > 0]
        times = [float(lease_ends.min())] if lease_ends.size else []
        times += self._wait_timers(view, wids, waited, level, timers)
        wake = _wake_at(now, times)
        order, max_level = wids[prio], level[prio].astype(np.int8)
        if view.may_preempt:
            rids = ids[view.running]
            order = np.concatenate([rids, order])
            max_level = np.concatenate([self._min_level[rids].astype(np.int8), max_level])
        return Decision(order=order, max_level=max_level, wake_at=wake)

    def _wait_timers(
        self,
        view: SchedulerView,
        wids: I64,
        waited: F64,
        level: I64,
        timers: F64,
    ) -> list[float]:
        """Seconds until a waiting job may reclaim or its next delay timer expires."""
        cfg, times = self.config, []
        if cfg.reclaim and wids.size:
            # A held job may reclaim once held for reclaim_after_s: be called then, not only at
            # the next arrival or finish (which may come after its timers let it spread).
            held_for = view.now - self._held_since[wids]
            with np.errstate(invalid="ignore"):
                due = held_for < cfg.reclaim_after_s
            if due.any():
                times.append(float(np.min(cfg.reclaim_after_s - held_for[due])))
        fits = view.jobs.gpus[wids] <= view.free_gpus
        for k in range(self._steps):
            timer, lv = timers[k], _MACHINE + k
            pending = fits & (level == lv) & (waited < timer)
            if pending.any():
                times.append(float(np.min(timer[pending] - waited[pending])))
        return times


def _wake_at(now: float, times: list[float]) -> float | None:
    """When to be called again: after the soonest of ``times`` (seconds from now), at least a
    millisecond on so that time advances; None if nothing is due."""
    soonest = min(times, default=float("inf"))
    return now + max(soonest, 1e-3) if np.isfinite(soonest) else None
