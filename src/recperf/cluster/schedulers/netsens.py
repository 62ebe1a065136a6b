"""Network-sensitive scheduling: delay scheduling for consolidation, sensitivity-scaled timers
that tune themselves, and preemption that gives consolidated GPUs to the jobs that need them.

* **Sensitivity.** Each job's slowdown at rack level and across racks comes from the trace's
  measurement where it has one (Philly: spread vs consolidated throughput per job type) and
  from the communication model at the run's congestion otherwise (``recperf.cluster.sensitivity``).
* **Priority.** Arrival order (``order = "fifo"``, the default; a job that cannot be placed
  lets later ones start) or Tiresias' 2D-LAS queues (``order = "las"``), which also preempt
  lower queues. No job duration is assumed known either way.
* **Delay scheduling.** A waiting job may use only its tightest level (one machine if it fits
  one). After waiting ``rack timer x s`` it may take a rack-level placement, after ``network
  timer x s`` a cross-rack one, where ``s = min(1, loss / sensitivity_ref)`` and ``loss`` is the
  slowdown minus one at that level: an insensitive job spreads at once, a sensitive one waits.
  A job whose demand cannot fit a machine (a rack) starts at rack (cluster) level directly.
* **Timers.** Fixed (``timers = "RACK_S,NET_S"``) or ``auto``: per GPU-demand class (1, 2,
  3-4, 5-8, ... GPUs), the mean plus two standard deviations (``auto_stat``) of the last
  ``auto_window`` locality waits that ended in a machine-level placement (rack timer) or a
  rack-level one (network timer), bounded by ``auto_max_s``. A locality wait runs from the
  first decision at which the job could have started spread on free GPUs but was held back,
  to its start; jobs placed at once are not waits. A class with fewer than
  ``auto_min_samples`` waits uses all classes' waits, and before that ``auto_initial_s``.
* **Network-sensitive preemption.** GPUs are leases of ``lease_s``; at a preemption round:
  - *reclaim*: a job held back for locality for ``reclaim_after_s`` takes a machine (rack)
    from expired-lease jobs that would lose at most half as much as it does if spread, when
    the free GPUs can take those jobs at once;
  - *migrate*: a running job whose lease expired, placed wider than its tightest level and
    losing at least ``migrate_min_loss`` of its time to the network (at its current,
    shared-uplink rate), takes a machine (rack) back from such less sensitive jobs.
  The moved jobs checkpoint; when the GPUs are free (``checkpoint_s`` later) the sensitive
  job starts consolidated first, then the displaced ones, at any level. A move happens only
  if its expected saving exceeds its cost: the held job's GPUs x loss x time held so far, or
  the spread job's run so far (the LAS predictor of what remains) x GPUs x share of time lost,
  against ``migrate_cost_s`` (checkpoint + restore) per moved GPU plus each displaced job's
  own loss from running spread for as long again as it has run.

**No starvation.** (1) Locality waits are bounded: after its network timer (at most
``auto_max_s``, or the fixed value) a job takes any free GPUs. (2) A displaced job restarts
next, ahead of every other waiting job, at any level, on GPUs that were free when it was
displaced; a job can be displaced at most once per lease. (3) With ``order = "las"``, a
waiting job is promoted to the top queue after waiting ``promote_factor`` times its run so far
(at least ``lease_s``), as in Tiresias. (4) Every run lasts at least a lease before it can be
preempted, so a job progresses between preemptions.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from recperf.cluster.base import F64, I64, SCHEDULERS, BoolArr, Decision, SchedulerView
from recperf.cluster.jobs import JobTable
from recperf.cluster.placement import BestFit
from recperf.cluster.schedulers.tiresias import demotion_in
from recperf.cluster.sensitivity import Sensitivity
from recperf.cluster.topology import Cluster, Level
from recperf.core.config import check_range
from recperf.core.errors import ConfigError

_MACHINE, _RACK, _CLUSTER = int(Level.MACHINE), int(Level.RACK), int(Level.CLUSTER)
_MAX_PLANNED = 256  # waiting jobs examined per preemption round
_PLANNER = BestFit()  # how the planner expects the engine to place (the default policy)
_NO_RNG = np.random.default_rng(0)  # best-fit draws nothing


def parse_timers(text: str) -> tuple[float, float] | None:
    """``auto`` -> None; ``RACK_S,NET_S`` -> the two fixed timers (seconds, rack <= network)."""
    if text.strip().lower() == "auto":
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        if len(parts) != 2:
            raise ValueError
        rack, net = float(parts[0]), float(parts[1])
    except ValueError:
        raise ConfigError(
            f"timers = {text!r}: expected 'auto' or 'RACK_S,NET_S' (two numbers of seconds)"
        ) from None
    if not (0 <= rack <= net < float("inf")):
        raise ConfigError(
            f"timers = {text!r}: need 0 <= rack timer <= network timer (a cross-rack placement "
            f"waits at least as long as a rack-level one)"
        )
    return rack, net


@dataclass(kw_only=True, slots=True, frozen=True)
class NetSensConfig:
    """Options of the network-sensitive scheduler (``--opt key=value``)."""

    timers: str = "auto"
    """'auto' (learned per GPU-demand class) or 'RACK_S,NET_S' fixed delay timers."""
    sensitivity_ref: float = 0.05
    """Loss (slowdown - 1) at which a job waits its class's full timer; less waits less."""
    lease_s: float = 1_800.0
    """A started job keeps its GPUs at least this long."""
    order: Literal["fifo", "las"] = "fifo"
    """Priority among jobs: arrival order, or Tiresias' 2D-LAS queues (preempting by queue)."""
    thresholds_gpu_s: tuple[float, ...] = (3_600.0, 36_000.0)
    """order = "las": queue thresholds on attained GPU-seconds (as Tiresias)."""
    promote_factor: float = 4.0
    """order = "las": promote a waiting job to the top queue after waiting this many times its
    run so far (0: never)."""
    reclaim: bool = True
    """Let a job held back for locality take a machine (rack) from less sensitive jobs."""
    reclaim_after_s: float = 600.0
    """A held job reclaims only after being held back this long."""
    migrate: bool = True
    """Let spread, network-bound jobs take consolidated GPUs back from less sensitive jobs."""
    migrate_min_loss: float = 0.2
    """Least share of extra time lost to the network for a running job to be moved."""
    migrate_cost_s: float = 30.0
    """Seconds a move costs each moved job (checkpoint + restore) in the benefit test."""
    auto_initial_s: tuple[float, float] = (86_400.0, 86_400.0)
    """Auto: rack and network timers until ``auto_min_samples`` waits are seen (in all classes
    together). With no evidence yet a job waits long for locality, as under consolidation."""
    auto_stat: Literal["mean+2std", "p90", "max"] = "mean+2std"
    """Auto: the statistic of recent waits a timer is set to."""
    auto_window: int = 64
    """Auto: recent waits kept per class and level."""
    auto_min_samples: int = 5
    """Auto: waits a class needs before its own statistic is used (before: all classes')."""
    auto_max_s: float = 7 * 86_400.0
    """Auto: upper bound of a learned timer."""

    def __post_init__(self) -> None:
        parse_timers(self.timers)
        # Literal types are checked only when built from TOML or flags; a Config built in code
        # with another value would silently behave as the default.
        for name, allowed in (
            ("order", ("fifo", "las")),
            ("auto_stat", ("mean+2std", "p90", "max")),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"{name} = {getattr(self, name)!r}: allowed: {', '.join(allowed)}"
                )
        t = self.thresholds_gpu_s
        if not t or t[0] <= 0 or any(b <= a for a, b in itertools.pairwise(t)):
            raise ConfigError(
                f"thresholds_gpu_s = {list(t)!r}: must be one or more positive, increasing values"
            )
        check_range("sensitivity_ref", self.sensitivity_ref, 1e-6, 1e6)
        check_range("lease_s", self.lease_s, 0.0, 1e7)
        check_range("promote_factor", self.promote_factor, 0.0, 1e6)
        check_range("reclaim_after_s", self.reclaim_after_s, 0.0, 1e9)
        check_range("migrate_min_loss", self.migrate_min_loss, 0.0, 1e6)
        check_range("migrate_cost_s", self.migrate_cost_s, 0.0, 1e7)
        check_range("auto_max_s", self.auto_max_s, 0.0, 1e7)
        check_range("auto_window", self.auto_window, 1, 1_000_000)
        check_range("auto_min_samples", self.auto_min_samples, 1, 1_000_000)
        a, b = self.auto_initial_s
        if not 0 <= a <= b:
            raise ConfigError(f"auto_initial_s = {[a, b]!r}: need 0 <= rack <= network")


def demand_class(gpus: int) -> int:
    """GPU-demand class: 0 for 1 GPU, then one class per power of two (2, 3-4, 5-8, ...)."""
    return max(int(gpus) - 1, 0).bit_length()


class TimerTuner:
    """Learns delay timers per GPU-demand class from recent locality waits."""

    def __init__(self, cfg: NetSensConfig) -> None:
        self.cfg = cfg
        self._waits: dict[tuple[int, int], deque[float]] = {}
        self._cache: dict[int, tuple[float, float]] = {}
        self.version = 0
        """Bumped by every recorded wait (timers may have changed)."""

    def record(self, cls: int, level: int, wait_s: float) -> None:
        """A job of class ``cls`` started at ``level`` after a locality wait of ``wait_s``.

        Only jobs that were held back count: one placed at once says nothing about how long
        locality takes to come once a job has to wait for it."""
        if level not in (_MACHINE, _RACK) or wait_s <= 0:
            return
        key = (cls, level)
        if key not in self._waits:
            self._waits[key] = deque(maxlen=self.cfg.auto_window)
        self._waits[key].append(wait_s)
        self.version += 1
        self._cache.clear()  # classes without enough waits of their own use the pooled ones

    def _stat(self, cls: int, level: int, initial: float) -> float:
        """Mean + 2 std of the class's recent waits; of all classes' while the class has too
        few; ``initial`` while all classes together have too few."""
        waits = self._waits.get((cls, level))
        if waits is None or len(waits) < self.cfg.auto_min_samples:
            pooled = [w for (_, lv), ws in self._waits.items() if lv == level for w in ws]
            if len(pooled) < self.cfg.auto_min_samples:
                return initial
            arr = np.asarray(pooled, dtype=np.float64)
        else:
            arr = np.fromiter(waits, dtype=np.float64)
        if self.cfg.auto_stat == "max":
            stat = float(arr.max())
        elif self.cfg.auto_stat == "p90":
            stat = float(np.percentile(arr, 90))
        else:
            stat = float(arr.mean() + 2.0 * arr.std())
        return min(stat, self.cfg.auto_max_s)

    def timers(self, cls: int) -> tuple[float, float]:
        """(rack timer, network timer) for a class; the network one is never the shorter."""
        hit = self._cache.get(cls)
        if hit is None:
            r0, n0 = self.cfg.auto_initial_s
            rack = self._stat(cls, _MACHINE, r0)
            hit = (rack, max(self._stat(cls, _RACK, n0), rack))
            self._cache[cls] = hit
        return hit

    def snapshot(self) -> dict[int, tuple[float, float]]:
        """Current timers of every class seen so far."""
        return {c: self.timers(c) for c in sorted({c for c, _ in self._waits})}


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

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        n = len(jobs)
        self.tuner = TimerTuner(self.config)
        self._sens = None
        self._min_level = cluster.min_levels(jobs.gpus).astype(np.int64)
        self._class = np.asarray([demand_class(g) for g in jobs.gpus.tolist()], dtype=np.int64)
        self._n_classes = int(self._class.max(initial=0)) + 1
        self._table = np.zeros((self._n_classes, 2))
        self._table_version = -1
        self._base = np.zeros(n)
        self._held_since = np.full(n, np.nan)
        self._was_running = np.zeros(n, dtype=np.bool_)
        self._moving = np.zeros(n, dtype=np.bool_)
        self._displaced = np.zeros(n, dtype=np.bool_)
        self.moves = {"migrate": 0, "reclaim": 0, "las": 0}
        self._spread: set[int] = set()  # running (or checkpointing) wider than they could be

    # ------------------------------------------------------------------ timers
    def _class_timers(self, classes: I64) -> tuple[F64, F64]:
        if self._fixed is not None:
            r, n = self._fixed
            return np.full(classes.size, r), np.full(classes.size, n)
        if self._table_version != self.tuner.version:
            self._table = np.asarray(
                [self.tuner.timers(c) for c in range(self._n_classes)], dtype=np.float64
            ).reshape(self._n_classes, 2)
            self._table_version = self.tuner.version
        return self._table[classes, 0], self._table[classes, 1]

    def job_timers(self, ids: I64) -> tuple[F64, F64]:
        """Per-job (rack, network) timers: the class timers scaled by sensitivity."""
        assert self._sens is not None
        ref = self.config.sensitivity_ref
        rack, net = self._class_timers(self._class[ids])
        s_rack = np.minimum(self._sens.rack_loss[ids] / ref, 1.0)
        s_net = np.minimum(self._sens.cluster_loss[ids] / ref, 1.0)
        t_rack = rack * s_rack
        out_net: F64 = np.maximum(net * s_net, t_rack)
        return t_rack, out_net

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
        held = (d <= view.free_gpus) & (lv < _CLUSTER) & (d > _caps(view)[lv])
        fresh = waiting[held & np.isnan(self._held_since[waiting])]
        self._held_since[fresh] = view.now

    # ------------------------------------------------------------------ decision
    def schedule(self, view: SchedulerView) -> Decision:
        cfg, ids, now, running = self.config, view.active, view.now, view.running
        if self._sens is None:
            self._sens = Sensitivity.of(view.jobs, view.cluster, view.comm)
        self._observe(view, running)
        las = cfg.order == "las"
        if not las and not (view.may_preempt and self._may_move(view)):
            return self._fill(view)
        waiting = ~running
        wpos = np.flatnonzero(waiting)  # most decisions concern a few waiting jobs only
        wids = ids[wpos]
        waited_w, level_w, t_rack, t_net, moving_w, displaced_w = self._waiting_levels(view, wids)
        needs_service = las or view.may_preempt
        if needs_service:
            attained = view.attained_gpu_s
            executed = attained / view.jobs.gpus[ids]
        if las:
            waited = np.full(ids.size, np.nan)
            waited[wpos] = waited_w
            promote_at = np.maximum(cfg.promote_factor * executed, cfg.lease_s)
            if cfg.promote_factor > 0:
                starving = waiting & (executed > 0) & (waited >= promote_at)
                self._base[ids[starving]] = attained[starving]
            service = attained - self._base[ids]
            queue = np.searchsorted(self._thr, service, side="right").astype(np.int64)
        else:
            queue = np.zeros(ids.size, dtype=np.int64)
        running_since = view.running_since
        leased = running & (now - running_since < cfg.lease_s)

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
            moved = self._plan(view, prio, queue, level, leased, stop, executed)
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
        if las:
            gpus = view.jobs.gpus[ids]
            times.append(demotion_in(self._thr, running & ~leased, queue, service, gpus))
            starve = waiting & (queue > 0)
            if cfg.promote_factor > 0 and starve.any():
                times.append(float(np.min(promote_at[starve] - waited[starve])))
        times += self._wait_timers(view, wids, waited_w, level_w, t_rack, t_net)
        soonest = min(times)
        wake = now + max(soonest, 1e-3) if np.isfinite(soonest) else None
        return Decision(order=order, max_level=max_level, wake_at=wake)

    def _waiting_levels(
        self, view: SchedulerView, wids: I64
    ) -> tuple[F64, I64, F64, F64, BoolArr, BoolArr]:
        """For waiting jobs ``wids``: time waited, the widest level each may use now (delay
        timers, then moves in progress), the timers, and which are moving / displaced."""
        waited: F64 = view.now - view.progress.waiting_since[wids]
        level = self._min_level[wids].copy()
        t_rack, t_net = self.job_timers(wids)
        level[(level == _MACHINE) & (waited >= t_rack)] = _RACK
        level[(level <= _RACK) & (waited >= t_net)] = _CLUSTER
        moving = self._moving[wids]
        level[moving] = self._min_level[wids[moving]]
        # Displaced jobs were chosen as insensitive: they restart at once wherever GPUs are.
        displaced = self._displaced[wids]
        level[displaced] = _CLUSTER
        return waited, level, t_rack, t_net, moving, displaced

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
        waited, level, t_rack, t_net, moving, displaced = self._waiting_levels(view, wids)
        key = np.zeros(wids.size, dtype=np.int64)
        key[displaced] = -2
        key[moving] = -3
        prio = np.lexsort((wids, key))
        started = view.progress.run_started[ids[view.running]]
        lease_ends = started + cfg.lease_s - now
        lease_ends = lease_ends[lease_ends > 0]
        times = [float(lease_ends.min())] if lease_ends.size else []
        times += self._wait_timers(view, wids, waited, level, t_rack, t_net)
        soonest = min(times, default=float("inf"))
        wake = now + max(soonest, 1e-3) if np.isfinite(soonest) else None
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
        t_rack: F64,
        t_net: F64,
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
        for timer, lv in ((t_rack, _MACHINE), (t_net, _RACK)):
            pending = fits & (level == lv) & (waited < timer)
            if pending.any():
                times.append(float(np.min(timer[pending] - waited[pending])))
        return times

    # ------------------------------------------------------------------ preemption
    def _plan(
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
        assert self._sens is not None
        spread_loss = self._sens.cluster_loss[view.active]
        out: BoolArr = expired & ~stop & (spread_loss <= loss / 2.0)
        return out

    def _victim_cost(self, view: SchedulerView, chosen: list[int], executed: F64) -> float:
        """Seconds x GPUs the displaced jobs lose: checkpoint/restore plus running spread for
        as long again as they have run (the LAS predictor of their remaining time)."""
        assert self._sens is not None
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
        assert self._sens is not None
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
            if d > spare or tight < _MACHINE or _fits(free, view.cluster, d, tight):
                continue
            loss = float(
                self._sens.rack_loss[ids[w]]
                if tight == _MACHINE
                else self._sens.cluster_loss[ids[w]]
            )
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


def _caps(view: SchedulerView) -> I64:
    """Largest demand placeable on the free GPUs at GPU, MACHINE, RACK level (CLUSTER: 0)."""
    free = view.free
    return np.asarray(
        [view.free_gpus, int(free.max()), int(view.cluster.rack_free(free).max()), 0],
        dtype=np.int64,
    )


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
    if lv <= _MACHINE:
        room, base_room, width = base + held, base, 1
    elif lv == _RACK:
        room, base_room, width = c.rack_free(base + held), c.rack_free(base), c.machines_per_rack
    else:
        room = np.asarray([int((base + held).sum())])
        base_room, width = np.asarray([int(base.sum())]), c.machines
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
                k for m, k in zip(alloc.machines, alloc.counts, strict=True) if m // width == g
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


def _fits(free: I64, c: Cluster, d: int, lv: int) -> bool:
    """Whether a ``d``-GPU job fits ``free`` at level ``lv``."""
    if lv <= _MACHINE:
        return bool(int(free.max()) >= d)
    if lv == _RACK:
        return bool(int(c.rack_free(free).max()) >= d)
    return bool(int(free.sum()) >= d)


def _take(free: I64, c: Cluster, d: int, lv: int) -> bool:
    """Plan a ``d``-GPU job at level ``lv`` on ``free`` with the best-fit policy; False if it
    does not fit."""
    alloc = _PLANNER.place(d, free, c, Level(lv), _NO_RNG)
    if alloc is None:
        return False
    free[list(alloc.machines)] -= np.asarray(alloc.counts, dtype=np.int64)
    return True
