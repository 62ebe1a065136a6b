"""Tiresias: discretised two-dimensional least-attained-service (2D-LAS), preemptive.

A job's attained service is the GPU-seconds it has held. Queues are bounded by service
thresholds: a job starts in queue 0 and is demoted as its service crosses each threshold.
Lower queues run first; within a queue, earlier arrivals first. Two guards keep it from
thrashing: a job that was just (re)started keeps its GPUs for ``min_run_s`` (a lease), and a
waiting job is promoted back to queue 0 once it has waited ``promote_factor`` times the time it
has run so far (and at least ``min_run_s``): that bounds every job's wait (no starvation).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from recperf.cluster.base import F64, I8, I64, SCHEDULERS, BoolArr, Decision, SchedulerView
from recperf.cluster.jobs import JobTable
from recperf.cluster.topology import Cluster
from recperf.core.config import check_range
from recperf.core.errors import ConfigError


@dataclass(kw_only=True, slots=True, frozen=True)
class TiresiasConfig:
    """Queue thresholds, lease and starvation promotion of the Tiresias scheduler."""

    thresholds_gpu_s: tuple[float, ...] = (3_600.0, 36_000.0)
    """Attained GPU-seconds at which a job moves to the next queue (increasing)."""
    promote_factor: float = 4.0
    """Promote a waiting job to queue 0 after waiting this many times its run time (0: never)."""
    min_run_s: float = 300.0
    """A started job is not preempted before it has run this long."""

    def __post_init__(self) -> None:
        t = self.thresholds_gpu_s
        if not t or t[0] <= 0 or any(b <= a for a, b in itertools.pairwise(t)):
            raise ConfigError(
                f"thresholds_gpu_s = {list(t)!r}: must be one or more positive, increasing values"
            )
        check_range("promote_factor", self.promote_factor, 0.0, 1e6)
        check_range("min_run_s", self.min_run_s, 0.0, 1e7)


@SCHEDULERS.register("tiresias")
class Tiresias:
    """2D-LAS over discrete queues with a lease and starvation promotion."""

    name: ClassVar[str] = "tiresias"
    preemptive: ClassVar[bool] = True
    Config = TiresiasConfig

    def __init__(self, config: TiresiasConfig | None = None) -> None:
        self.config = config or TiresiasConfig()
        self._thr = np.asarray(self.config.thresholds_gpu_s)
        # int8 holds every queue and -1 (the leased) for up to 126 thresholds; it sorts faster.
        self._int8_queues = self._thr.size < 127
        self._base = np.zeros(0)

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        self._base = np.zeros(len(jobs))

    def schedule(self, view: SchedulerView) -> Decision:
        cfg, ids, now, running = self.config, view.active, view.now, view.running
        gpus = view.jobs.gpus[ids]
        attained = view.attained_gpu_s
        service = attained - self._base[ids]
        # Promotion concerns waiting jobs only (a running job's waiting_since is NaN): computed
        # over them alone, element by element as over all jobs.
        wpos = (~running).nonzero()[0]
        wids = ids[wpos]
        executed = attained[wpos] / gpus[wpos]
        waited = now - view.progress.waiting_since[wids]
        promote_at = np.maximum(cfg.promote_factor * executed, cfg.min_run_s)
        if cfg.promote_factor > 0:
            starving = (executed > 0) & (waited >= promote_at)
            if np.count_nonzero(starving):
                promoted = wpos[starving]
                self._base[ids[promoted]] = attained[promoted]
                service[promoted] = attained[promoted] - self._base[ids[promoted]]
        pos: I64 = np.searchsorted(self._thr, service, side="right")
        queue: I8 | I64 = pos.astype(np.int8) if self._int8_queues else pos
        run_started = view.progress.run_started[ids]  # read where running only
        leased = running & (now - run_started < cfg.min_run_s)
        queue[leased] = -1
        # Ties by id: ``active`` is ascending, so a stable sort by queue is lexsort((ids, queue)).
        order = ids[queue.argsort(kind="stable")]
        times = [
            float(np.minimum.reduce(run_started[leased], initial=np.inf)) + cfg.min_run_s - now,
            demotion_in(self._thr, running & ~leased, queue, service, gpus),
        ]
        starve = queue[wpos] > 0
        if cfg.promote_factor > 0 and np.count_nonzero(starve):
            times.append(float(np.minimum.reduce(promote_at[starve] - waited[starve])))
        soonest = min(times)
        wake = now + max(soonest, 1e-3) if math.isfinite(soonest) else None
        return Decision(order=order, wake_at=wake)


def demotion_in(thresholds: F64, mask: BoolArr, queue: I64 | I8, service: F64, gpus: I64) -> float:
    """Seconds until the first running job in ``mask`` crosses its queue's threshold."""
    # Over all jobs, the others masked out of the minimum: fewer calls than selecting them.
    limit = thresholds.take(queue, mode="wrap")  # as thresholds[queue]; past the top: masked
    mask = mask & (queue < thresholds.size)
    return float(np.minimum.reduce((limit - service) / gpus, where=mask, initial=np.inf))
