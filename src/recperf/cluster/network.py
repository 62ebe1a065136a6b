"""Alpha-beta model of ring all-reduce over a placement's widest link, and trace calibration."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from recperf.cluster.jobs import JobTable
from recperf.cluster.topology import Cluster, Level

F64 = NDArray[np.float64]


def level_bandwidth_gbps(cluster: Cluster, level: int, congestion: float = 1.0) -> float:
    """Uncontended bandwidth of the widest link at ``level`` (uplinks: one job alone, at
    ``congestion`` times their oversubscription)."""
    if level <= Level.MACHINE:
        return cluster.machine_gbps
    bw = cluster.rack_gbps
    for share in cluster.uplink_share_gbps(congestion)[: level - 2]:  # the tiers it crosses
        bw = min(bw, share)
    return bw


def level_latency_s(cluster: Cluster, level: int) -> float:
    return cluster.level_latency_us(level) * 1e-6


def allreduce_s(
    gpus: F64 | NDArray[np.int64] | int,
    grad_bytes: F64 | float,
    bandwidth_gbps: F64 | float,
    latency_s: F64 | float,
) -> F64:
    """Ring all-reduce time: 2(n-1) latency terms plus 2(n-1)/n of the bytes over the link."""
    n = np.asarray(gpus, dtype=np.float64)
    steps = 2.0 * np.maximum(n - 1.0, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        bytes_term = np.where(n > 1, steps / n * np.asarray(grad_bytes) * 8.0, 0.0)
    out: F64 = steps * latency_s + bytes_term / (np.asarray(bandwidth_gbps) * 1e9)
    return out


def comm_s(
    cluster: Cluster, level: int, gpus: F64 | NDArray[np.int64] | int, grad_bytes: F64 | float
) -> F64:
    """Uncontended per-iteration communication time of jobs placed at ``level``."""
    if level == Level.GPU:
        return np.zeros(np.shape(np.asarray(gpus)), dtype=np.float64)
    return allreduce_s(
        gpus, grad_bytes, level_bandwidth_gbps(cluster, level), level_latency_s(cluster, level)
    )


def calibrate_reference(
    cluster: Cluster,
    gpus: NDArray[np.int64],
    iter_s: F64,
    grad_bytes: F64,
    max_comm_frac: float = 0.8,
) -> tuple[F64, F64]:
    """Split a measured per-iteration time at the tightest placement into compute + comm.

    Returns ``(compute_s, grad_bytes)`` so the model reproduces ``iter_s`` at each job's
    tightest level; where the model's communication would exceed ``max_comm_frac`` of the
    measured time, the gradient bytes are scaled down to fit.
    """
    levels = cluster.min_levels(gpus)
    comm = np.zeros(len(gpus))
    for lv in cluster.levels:
        mask = levels == lv
        comm[mask] = comm_s(cluster, lv, gpus[mask], grad_bytes[mask])
    limit = max_comm_frac * iter_s
    too_big = comm > limit
    scale = np.ones_like(comm)
    scale[too_big] = limit[too_big] / comm[too_big]
    grad = grad_bytes * scale
    comm = comm * scale
    return iter_s - comm, grad


def solve_spread_bytes(
    cluster: Cluster, gpus: NDArray[np.int64], t_consolidated: F64, t_spread: F64
) -> F64:
    """Gradient bytes that make the model's RACK-level time minus its MACHINE-level time match a
    measured spread-vs-consolidated slowdown (clamped at 0 where spreading was not slower)."""
    n = gpus.astype(np.float64)
    steps = 2.0 * np.maximum(n - 1.0, 0.0)
    a_m = steps * level_latency_s(cluster, Level.MACHINE)
    a_r = steps * level_latency_s(cluster, Level.RACK)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_byte = steps / n * 8.0
        b_m = per_byte / (cluster.machine_gbps * 1e9)
        b_r = per_byte / (cluster.rack_gbps * 1e9)
        g = (t_spread - t_consolidated - (a_r - a_m)) / (b_r - b_m)
    g = np.where((n > 1) & np.isfinite(g), g, 0.0)
    out: F64 = np.maximum(g, 0.0)
    return out


@dataclass(frozen=True, slots=True)
class JobComm:
    """Per-job all-reduce terms that depend only on the placement's shape, computed once."""

    bits: F64
    """2(n-1)/n of the gradient, in bits: what crosses the slowest link per iteration."""
    by_level: F64
    """Comm seconds per iteration at every level (``top + 1`` rows x jobs), uplinks used by
    the job alone at this run's congestion."""
    latency_s: F64
    """The latency part of ``by_level``; above a ToR the bandwidth part depends on how many
    jobs share each uplink."""
    uplink_gbps: tuple[float, ...]
    """Per switch tier, an uplink's bandwidth after oversubscription and congestion."""
    host_gbps: float
    """Each machine's link to its ToR."""
    tightest_s: F64
    """Comm seconds per iteration at each job's tightest level."""

    @property
    def core_latency_s(self) -> F64:
        """The latency part at the widest level."""
        out: F64 = self.latency_s[-1]
        return out

    @classmethod
    def of(cls, cluster: Cluster, jobs: JobTable, congestion: float = 1.0) -> JobComm:
        n = jobs.gpus.astype(np.float64)
        steps = 2.0 * np.maximum(n - 1.0, 0.0)
        bits = np.where(n > 1, steps / n * jobs.grad_bytes * 8.0, 0.0)
        latency = np.stack(
            [np.zeros_like(n)] + [steps * level_latency_s(cluster, lv) for lv in cluster.levels[1:]]
        )
        by_level = np.stack(
            [np.zeros_like(n)]
            + [
                latency[lv] + bits / (level_bandwidth_gbps(cluster, lv, congestion) * 1e9)
                for lv in cluster.levels[1:]
            ]
        )
        uplink = cluster.uplink_share_gbps(congestion)
        levels = cluster.min_levels(jobs.gpus).astype(np.int64)
        tightest = by_level[levels, np.arange(n.size)]
        return cls(bits, by_level, latency, uplink, cluster.rack_gbps, tightest)
