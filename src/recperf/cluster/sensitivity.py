"""How much a job slows down when its GPUs span machines or racks (its network sensitivity)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recperf.cluster.base import F64
from recperf.cluster.jobs import JobTable
from recperf.cluster.network import JobComm
from recperf.cluster.topology import Cluster, Level


@dataclass(frozen=True, slots=True)
class Sensitivity:
    """Per-job slowdown (iteration time / iteration time at the tightest placement, >= 1) when
    placed at rack level (several machines, one rack) and across racks (one job on the uplinks,
    at the run's congestion)."""

    rack: F64
    cluster: F64
    measured: np.ndarray
    """Where the rack figure comes from the trace's measurement rather than the model."""

    @property
    def rack_loss(self) -> F64:
        """Fraction of extra time spent at rack level (slowdown - 1)."""
        out: F64 = self.rack - 1.0
        return out

    @property
    def cluster_loss(self) -> F64:
        out: F64 = self.cluster - 1.0
        return out

    @classmethod
    def of(cls, jobs: JobTable, cluster: Cluster, comm: JobComm) -> Sensitivity:
        """Measured where the trace has it (Philly: unconsolidated vs consolidated rate per job
        type), otherwise the communication model's. Across racks the model's figure is used,
        raised to at least the rack figure (crossing racks is never faster than one rack)."""
        ref = jobs.compute_s + comm.tightest_s
        levels = cluster.min_levels(jobs.gpus)
        t_rack = jobs.compute_s + comm.by_level[int(Level.RACK)]
        uplink = min(cluster.rack_gbps, comm.uplink_gbps)
        t_cross = jobs.compute_s + comm.core_latency_s + comm.bits / (uplink * 1e9)
        model_rack = np.where(levels <= int(Level.MACHINE), t_rack / ref, 1.0)
        model_cross = np.where(levels <= int(Level.RACK), t_cross / ref, 1.0)
        measured = np.isfinite(jobs.slowdown_measured) & (levels == int(Level.MACHINE))
        rack = np.maximum(np.where(measured, jobs.slowdown_measured, model_rack), 1.0)
        cross = np.maximum(np.maximum(model_cross, rack), 1.0)
        return cls(rack=rack, cluster=cross, measured=measured)

    def at(self, level: int) -> F64:
        """Slowdown of every job if placed at ``level`` (1 at machine level or tighter)."""
        if level <= int(Level.MACHINE):
            return np.ones_like(self.rack)
        return self.rack if level == int(Level.RACK) else self.cluster
