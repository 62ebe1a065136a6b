"""netsens' preemption planner: which running jobs a preemption round stops, for 2D-LAS
queues, for held jobs reclaiming consolidated GPUs, and for spread jobs migrating back."""

from __future__ import annotations

import numpy as np

from recperf.cluster.base import F64, I64, BoolArr, SchedulerView
from recperf.cluster.placement import BestFit
from recperf.cluster.schedulers.netsens.config import NetSensConfig
from recperf.cluster.sensitivity import Sensitivity
from recperf.cluster.topology import Cluster, Level

_MACHINE = int(Level.MACHINE)
_MAX_PLANNED = 256  # waiting jobs examined per preemption round
_PLANNER = BestFit()  # how the planner expects the engine to place (the default policy)
_NO_RNG = np.random.default_rng(0)  # best-fit draws nothing


class PreemptionPlanner:
    """Plans the preemptions of one netsens run, by the rules under *Network-sensitive
    preemption* in the package docstring. It shares netsens' per-job arrays and updates them in
    place: ``moving`` marks a job that GPUs are being freed for, ``displaced`` a job preempted
    for one (it restarts next, at any level)."""

    def __init__(
        self,
        config: NetSensConfig,
        sens: Sensitivity,
        min_level: I64,
        held_since: F64,
        moving: BoolArr,
        displaced: BoolArr,
        moves: dict[str, int],
    ) -> None:
        self.config = config
        self._sens = sens
        self._min_level = min_level
        self._held_since = held_since
        self._moving = moving
        self._displaced = displaced
        self.moves = moves
        """Moves planned so far, by kind (migrate, reclaim, las); counted in place."""

    def plan(
        self,
        view: SchedulerView,
        prio: I64,
        queue: I64,
        level: I64,
        leased: BoolArr,
        stop: BoolArr,
        executed: F64,
    ) -> bool:
        """Mark in ``stop`` the running jobs (positions into view.active) to preempt; True if
        a network-sensitive move (reclaim or migration) was planned."""
        expired = view.running & ~leased
        if not expired.any():
            return False
        free = view.free.copy()
        if self.config.order == "las":
            self._plan_las(view, prio, queue, level, expired, stop, free)
        moved = False
        if self.config.reclaim:
            moved |= self._plan_reclaims(view, prio, expired, stop, free, executed)
        if self.config.migrate:
            moved |= self._plan_migrations(view, expired, stop, free, executed)
        return moved

    def _plan_las(
        self,
        view: SchedulerView,
        prio: I64,
        queue: I64,
        level: I64,
        expired: BoolArr,
        stop: BoolArr,
        free: I64,
    ) -> None:
        """2D-LAS: a waiting job preempts expired-lease jobs of a strictly lower queue where
        that frees a placement at the level it may use."""
        ids, c = view.active, view.cluster
        gpus = view.jobs.gpus[ids]
        worst = int(queue[expired].max())
        planned = 0
        for p in prio[~view.running[prio]].tolist():
            if planned >= _MAX_PLANNED or not (expired & ~stop).any():
                break
            d, lv = int(gpus[p]), int(level[p])
            if _take(free, c, d, lv) or queue[p] >= worst:
                continue
            planned += 1
            victims = expired & ~stop & (queue > queue[p])
            chosen = _cheapest_victims(view, victims, d, lv, free, queue, alone=False)
            if chosen is None:
                continue
            for v in chosen:
                stop[v] = True
                _give_back(free, view, int(ids[v]))
            _take(free, c, d, lv)
            self.moves["las"] += 1

    def _victims_for(
        self, view: SchedulerView, expired: BoolArr, stop: BoolArr, loss: float
    ) -> BoolArr:
        """Expired-lease running jobs that would lose at most half of ``loss`` if spread."""
        spread_loss = self._sens.cluster_loss[view.active]
        out: BoolArr = expired & ~stop & (spread_loss <= loss / 2.0)
        return out

    def _victim_cost(self, view: SchedulerView, chosen: list[int], executed: F64) -> float:
        """Seconds x GPUs the displaced jobs lose: checkpoint/restore plus running spread for
        as long again as they have run (the LAS predictor of their remaining time)."""
        ids = view.active
        gpus = view.jobs.gpus[ids]
        loss = self._sens.cluster_loss[ids]
        return float(
            sum((self.config.migrate_cost_s + loss[v] * executed[v]) * gpus[v] for v in chosen)
        )

    def _plan_reclaims(
        self,
        view: SchedulerView,
        prio: I64,
        expired: BoolArr,
        stop: BoolArr,
        free: I64,
        executed: F64,
    ) -> bool:
        """A waiting job held back for locality (it would fit the free GPUs only spread) takes a
        machine (rack) from less sensitive jobs, which restart at once on the free GPUs."""
        cfg, ids, now = self.config, view.active, view.now
        gpus = view.jobs.gpus[ids]
        held_since = self._held_since[ids]
        with np.errstate(invalid="ignore"):
            held = ~view.running & (now - held_since >= cfg.reclaim_after_s)
        if not held.any():
            return False
        spare = view.free_gpus
        moved = False
        for w in prio[held[prio]].tolist():
            d, tight = int(gpus[w]), int(self._min_level[ids[w]])
            if d > spare or tight < _MACHINE or d <= view.cluster.level_caps(free)[tight]:
                continue
            loss = float(self._sens.loss(tight + 1)[ids[w]])
            victims = self._victims_for(view, expired, stop, loss)
            chosen = _cheapest_victims(view, victims, d, tight, free, None, alone=False)
            if not chosen:
                continue
            gain = d * loss * max(now - float(held_since[w]), 0.0)
            if gain <= self._victim_cost(view, chosen, executed):
                continue
            for v in chosen:
                stop[v] = True
                self._displaced[int(ids[v])] = True
                _give_back(free, view, int(ids[v]))
            _take(free, view.cluster, d, tight)
            self._moving[int(ids[w])] = True
            spare -= d
            moved = True
            self.moves["reclaim"] += 1
        return moved

    def _plan_migrations(
        self, view: SchedulerView, expired: BoolArr, stop: BoolArr, free: I64, executed: F64
    ) -> bool:
        """A running job placed wider than it could be and losing much to the network (at its
        current, shared-uplink rate) takes a machine (rack) back from less sensitive jobs."""
        cfg, ids = self.config, view.active
        p = view.progress
        loss_now = p.iter_s[ids] / p.ref_iter_s[ids] - 1.0
        tight = self._min_level[ids]
        cand = expired & ~stop & (loss_now >= cfg.migrate_min_loss)
        for k in np.flatnonzero(cand).tolist():
            alloc = view.alloc[int(ids[k])]
            cand[k] = alloc is not None and int(alloc.level) > int(tight[k])
        if not cand.any():
            return False
        gpus = view.jobs.gpus[ids]
        cands = np.flatnonzero(cand)
        moved = False
        for a in cands[np.argsort(-(loss_now[cands] * gpus[cands]), kind="stable")].tolist():
            if stop[a]:
                continue
            victims = self._victims_for(view, expired, stop, float(loss_now[a]))
            victims[a] = False
            # Only the victims' GPUs count: free ones may be taken before the checkpoints end.
            chosen = _cheapest_victims(
                view, victims, int(gpus[a]), int(tight[a]), free, None, alone=True
            )
            if chosen is None:
                continue
            share = loss_now[a] / (1.0 + loss_now[a])
            gain = float(executed[a] * share * gpus[a])
            cost = cfg.migrate_cost_s * gpus[a] + self._victim_cost(view, chosen, executed)
            if gain <= cost:
                continue
            for v in [a, *chosen]:
                stop[v] = True
            for v in chosen:
                self._displaced[int(ids[v])] = True
                _give_back(free, view, int(ids[v]))
            self._moving[int(ids[a])] = True
            moved = True
            self.moves["migrate"] += 1
        return moved


def _cheapest_victims(
    view: SchedulerView,
    victims: BoolArr,
    d: int,
    lv: int,
    free: I64,
    queue: I64 | None,
    *,
    alone: bool,
) -> list[int] | None:
    """Victims (positions into view.active) whose GPUs, with the free ones unless ``alone``,
    give a ``d``-GPU job a placement at level ``lv``: lowest priority first (highest queue,
    latest arrival), over the best few machines or racks, the set with the fewest preempted
    GPUs. None if there is none."""
    if not victims.any():
        return None
    c = view.cluster
    ids = view.active
    vpos = np.flatnonzero(victims)
    q = queue[vpos] if queue is not None else np.zeros(vpos.size, dtype=np.int64)
    vpos = vpos[np.lexsort((-ids[vpos], -q))]
    held = np.zeros(c.machines, dtype=np.int64)
    allocs = []
    for v in vpos.tolist():
        alloc = view.alloc[int(ids[v])]
        assert alloc is not None
        allocs.append(alloc)
        held[list(alloc.machines)] += np.asarray(alloc.counts, dtype=np.int64)
    base = np.zeros_like(free) if alone else free
    room, base_room = c.group_free(base + held, lv), c.group_free(base, lv)
    group = c.tree.group_of(lv)
    candidates = np.flatnonzero(room >= d)
    if not candidates.size:
        return None
    need = d - base_room[candidates]
    best: tuple[int, list[int]] | None = None
    for g in candidates[np.argsort(need, kind="stable")][:4].tolist():
        got = int(base_room[g])
        chosen: list[int] = []
        cost = 0
        for v, alloc in zip(vpos.tolist(), allocs, strict=True):
            if got >= d:
                break
            inside = sum(
                k for m, k in zip(alloc.machines, alloc.counts, strict=True) if group[m] == g
            )
            if inside:
                chosen.append(v)
                got += inside
                cost += alloc.gpus
        if got >= d and (best is None or cost < best[0]):
            best = (cost, chosen)
    return None if best is None else best[1]


def _give_back(free: I64, view: SchedulerView, job: int) -> None:
    alloc = view.alloc[job]
    assert alloc is not None
    free[list(alloc.machines)] += np.asarray(alloc.counts, dtype=np.int64)


def _take(free: I64, c: Cluster, d: int, lv: int) -> bool:
    """Plan a ``d``-GPU job at level ``lv`` on ``free`` with the best-fit policy; False if it
    does not fit."""
    alloc = _PLANNER.place(d, free, c, lv, _NO_RNG)
    if alloc is None:
        return False
    free[list(alloc.machines)] -= np.asarray(alloc.counts, dtype=np.int64)
    return True
