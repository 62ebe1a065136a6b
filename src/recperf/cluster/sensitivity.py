"""How much a job slows down when its GPUs span machines or switches (its network sensitivity)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recperf.cluster.base import F64
from recperf.cluster.jobs import JobTable
from recperf.cluster.network import JobComm
from recperf.cluster.topology import Cluster, Level


@dataclass(frozen=True, slots=True)
class Sensitivity:
    """Per-job slowdown (iteration time / iteration time at the tightest placement, >= 1) at
    every level (``top + 1`` rows x jobs): 1 up to the job's tightest level; beyond it, the job
    alone on the links it would cross, at the run's congestion. Never lower at a wider level."""

    by_level: F64
    measured: np.ndarray
    """Where the rack figure comes from the trace's measurement rather than the model."""

    @property
    def rack(self) -> F64:
        """Slowdown under one ToR (several machines)."""
        return self.at(int(Level.RACK))

    @property
    def cluster(self) -> F64:
        """Slowdown across the top switch tier."""
        return self.at(self.by_level.shape[0] - 1)

    @property
    def rack_loss(self) -> F64:
        """Fraction of extra time spent at rack level (slowdown - 1)."""
        return self.loss(int(Level.RACK))

    @property
    def cluster_loss(self) -> F64:
        return self.loss(self.by_level.shape[0] - 1)

    def loss(self, level: int) -> F64:
        """Fraction of extra time at ``level`` (slowdown - 1)."""
        out: F64 = self.at(level) - 1.0
        return out

    @classmethod
    def of(cls, jobs: JobTable, cluster: Cluster, comm: JobComm) -> Sensitivity:
        """Measured where the trace has it (Philly: unconsolidated vs consolidated rate per job
        type; Helios: cross-machine and cross-rack slowdowns), otherwise the communication
        model's. Each level is raised to at least the one below it (spreading wider is never
        faster)."""
        ref = jobs.compute_s + comm.tightest_s
        levels = cluster.min_levels(jobs.gpus)
        out = np.ones((cluster.top + 1, len(jobs)))
        measured = np.isfinite(jobs.slowdown_measured) & (levels == int(Level.MACHINE))
        cross = _cross_rack(jobs)
        measured_cross = np.isfinite(cross) & (levels <= int(Level.RACK))
        for lv in cluster.levels[int(Level.RACK) :]:
            model = np.where(levels < lv, (jobs.compute_s + comm.by_level[lv]) / ref, 1.0)
            if lv == Level.RACK:
                model = np.where(measured, jobs.slowdown_measured, model)
            else:
                model = np.where(measured_cross, cross, model)
            out[lv] = np.maximum(np.maximum(model, out[lv - 1]), 1.0)
        return cls(by_level=out, measured=measured)

    def at(self, level: int) -> F64:
        """Slowdown of every job if placed at ``level`` (1 at machine level or tighter)."""
        out: F64 = self.by_level[min(level, self.by_level.shape[0] - 1)]
        return out


def _cross_rack(jobs: JobTable) -> F64:
    """The trace's measured slowdown across ToRs, NaN where unknown."""
    cross = getattr(jobs, "measured_cross_rack", None)
    out: F64 = np.full(len(jobs), np.nan) if cross is None else np.asarray(cross, np.float64)
    return out
