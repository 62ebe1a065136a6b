"""One simulated tuning run as the CLI and benchmarks report it: a tuner on a SimTarget,
judged by the model's noise-free throughput against the LP bound and the oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import recperf.ingest.tuners  # noqa: F401 - registers every tuner
from recperf.ingest.sim import model as sim
from recperf.ingest.sim.target import SimTarget
from recperf.ingest.tuners.base import TUNERS, check_tuner


def simulate(
    spec: str | Path | sim.PipelineSpec,
    tuner: str,
    *,
    seed: int = 0,
    budget_s: float = 200.0,
    noise: float = 0.02,
) -> dict[str, Any]:
    """Run ``tuner`` through check_tuner on a fresh SimTarget; a summary with units in keys."""
    pipeline = spec if isinstance(spec, sim.PipelineSpec) else sim.load_spec(spec)
    target = SimTarget(pipeline, seed=seed, noise=noise)
    result = check_tuner(TUNERS.create(tuner), target, budget_s, seed)
    bound = sim.lp_bound(pipeline)
    best = pipeline.throughput(sim.oracle(pipeline))
    thr = pipeline.throughput(result.allocation)
    return {
        "spec": pipeline.name,
        "tuner": tuner,
        "seed": seed,
        "cores": pipeline.cores,
        "allocation": list(result.allocation.workers),
        "throughput_rows_per_s": thr,
        "measured_throughput_rows_per_s": result.throughput_rows_per_s,
        "lp_bound_rows_per_s": bound.throughput_rows_per_s,
        "lp_binding": bound.binding,
        "oracle_rows_per_s": best,
        "fraction_of_bound": thr / bound.throughput_rows_per_s,
        "fraction_of_oracle": thr / best,
        "peak_memory_bytes": target.peak_memory_bytes,
        "memory_budget_bytes": target.memory_budget_bytes,
        "tuning_steps": result.steps,
        "refused": result.refused,
        "tuning_s": result.tuning_s,
        "budget_s": budget_s,
    }
