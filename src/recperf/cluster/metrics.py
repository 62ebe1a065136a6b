"""Summary metrics and per-job tables from a simulation result."""

from __future__ import annotations

from typing import Any

import numpy as np

from recperf.cluster.base import F64
from recperf.cluster.outcome import SimResult


def _pct(x: F64, q: float) -> float:
    return float(np.percentile(x, q)) if x.size else float("nan")


def summarize(res: SimResult) -> dict[str, Any]:
    """The summary.json keys: counts, makespan, JCT percentiles, queueing, utilisation, comm."""
    jobs = res.jobs
    finished = ~np.isnan(res.finish_s)
    jct = (res.finish_s - jobs.arrival_s)[finished]
    queue = (res.first_start_s - jobs.arrival_s)[finished]
    pending = jct - res.run_s[finished]
    t0 = float(jobs.arrival_s.min()) if len(jobs) else 0.0
    t_end = float(res.finish_s[finished].max()) if finished.any() else t0
    makespan = t_end - t0
    busy_gpu_s = float(np.sum(np.diff(res.busy_t) * res.busy_gpus[:-1]))
    denom = res.cluster.gpus * makespan
    c = res.cluster
    counts = [int(np.sum(res.widest_level == lv)) for lv in c.levels]
    tiers = c.level_names[2:-1]
    by_level = {f"jobs_within_{name}": counts[2 + i] for i, name in enumerate(tiers)}
    progress = float(res.progress_s.sum())
    waited = res.locality_wait_s[finished]
    held = waited > 0
    return {
        "cluster": res.cluster.name,
        "cluster_gpus": res.cluster.gpus,
        "scheduler": res.scheduler,
        "placement": res.placement,
        "jobs_total": len(jobs),
        "jobs_finished": int(finished.sum()),
        "makespan_s": makespan,
        "jct_mean_s": float(jct.mean()) if jct.size else float("nan"),
        "jct_p50_s": _pct(jct, 50),
        "jct_p95_s": _pct(jct, 95),
        "jct_p99_s": _pct(jct, 99),
        "queue_mean_s": float(queue.mean()) if queue.size else float("nan"),
        "pending_mean_s": float(pending.mean()) if pending.size else float("nan"),
        "utilization": busy_gpu_s / denom if denom > 0 else 0.0,
        "comm_overhead_frac": float(res.comm_s.sum()) / progress if progress > 0 else 0.0,
        "preemptions": int(res.preemptions.sum()),
        "locality_wait_share": float(held.mean()) if held.size else 0.0,
        "locality_wait_mean_s": float(waited[held].mean()) if held.any() else 0.0,
        "jobs_single_gpu": counts[0],
        "jobs_within_machine": counts[1],
        **by_level,
        f"jobs_across_{tiers[-1]}s": counts[-1],
        "events": res.events,
        "decisions": res.decisions,
    }


def job_columns(res: SimResult) -> dict[str, Any]:
    """One row per job, for jobs.parquet."""
    jobs = res.jobs
    with np.errstate(invalid="ignore", divide="ignore"):
        comm_frac = np.where(res.progress_s > 0, res.comm_s / res.progress_s, 0.0)
    level_names = res.cluster.level_names
    names = [level_names[int(v)] if v >= 0 else "never" for v in res.widest_level]
    return {
        "job_id": np.arange(len(jobs), dtype=np.int64),
        "name": list(jobs.name),
        "model": list(jobs.model),
        "gpus": jobs.gpus,
        "arrival_s": jobs.arrival_s,
        "first_start_s": res.first_start_s,
        "finish_s": res.finish_s,
        "jct_s": res.finish_s - jobs.arrival_s,
        "queue_s": res.first_start_s - jobs.arrival_s,
        "run_s": res.run_s,
        "progress_s": res.progress_s,
        "comm_s": res.comm_s,
        "comm_overhead_frac": comm_frac,
        "locality_wait_s": res.locality_wait_s,
        "preemptions": res.preemptions,
        "widest_level": names,
    }


def utilization_series(res: SimResult, points: int = 200) -> tuple[F64, F64]:
    """Mean busy fraction in ``points`` equal windows over the makespan: (window_start_s, frac)."""
    t, g = res.busy_t, res.busy_gpus.astype(np.float64)
    done = res.finish_s[~np.isnan(res.finish_s)]
    t_end = float(done.max()) if done.size else 0.0
    edges = np.linspace(
        float(res.jobs.arrival_s.min()) if len(res.jobs) else 0.0, t_end, points + 1
    )
    # Integral of the step function up to each edge, by interpolating its running integral.
    cum = np.concatenate([[0.0], np.cumsum(np.diff(t) * g[:-1])])
    idx = np.clip(np.searchsorted(t, edges, side="right") - 1, 0, len(t) - 1)
    at_edges = cum[idx] + (edges - t[idx]) * g[idx]
    width = np.diff(edges)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(width > 0, np.diff(at_edges) / (width * res.cluster.gpus), 0.0)
    return edges[:-1], frac
