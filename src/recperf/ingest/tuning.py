"""One simulated tuning run as the CLI, the benchmarks and the report show it: a tuner on a
SimTarget, judged by the model's noise-free throughput against the LP bound and the oracle (both
over every cut pattern)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recperf.core.config import check_range, check_seed
from recperf.ingest.base import Allocation
from recperf.ingest.sim import model as sim
from recperf.ingest.sim import solve
from recperf.ingest.sim.target import SimTarget
from recperf.ingest.tuners.base import TUNERS, TuneResult, check_tuner

MAX_SIM_BUDGET_S = 100_000.0
"""The longest simulated tuning budget ``simulate`` takes (one window per simulated second)."""


def allocation_summary(alloc: Allocation, stage_names: Sequence[str]) -> dict[str, Any]:
    """An allocation as JSON: its segments (stages and workers), cut points, per-segment worker
    and thread lists, the in-flight storage requests (0: the configured default) and a one-line
    label such as ``read+dense x2 | collate x1``."""
    n = len(stage_names)
    segs = alloc.segments(n)
    return {
        "segments": [
            {"stages": list(stage_names[a:b]), "workers": w}
            for (a, b), w in zip(segs, alloc.workers, strict=True)
        ],
        "cuts": list(alloc.cut_points(n)),
        "workers": list(alloc.workers),
        "threads": list(alloc.segment_threads()),
        "inflight": alloc.inflight,
        "label": alloc.label(stage_names),
    }


def history_summary(result: TuneResult, stage_names: Sequence[str]) -> list[dict[str, Any]]:
    """Every measurement of a tuning run as JSON: when it ended, the allocation's label and the
    throughput measured."""
    return [
        {
            "elapsed_s": s.elapsed_s,
            "allocation": s.allocation.label(stage_names),
            "throughput_rows_per_s": s.throughput_rows_per_s,
        }
        for s in result.history
    ]


def fraction(value: float, bound: float) -> float | None:
    """``value`` as a fraction of ``bound``; None when the bound is 0 (nothing to compare with:
    0 / 0 is not "at the bound")."""
    return value / bound if bound > 0 else None


def found_at_s(result: TuneResult) -> float:
    """Tuning time at the end of the first measurement of the allocation finally chosen."""
    return next(s.elapsed_s for s in result.history if s.allocation == result.allocation)


def simulate(
    spec: str | Path | sim.PipelineSpec,
    tuner: str,
    *,
    seed: int = 0,
    budget_s: float = 200.0,
    noise: float = 0.02,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``tuner`` (its Config built from ``options``) through check_tuner on a fresh
    SimTarget; a summary with units in keys.

    ``allocation`` is the chosen allocation as ``allocation_summary`` writes it;
    ``stage_workers`` lists each stage's workers (its segment's) and ``workers`` / ``cuts``
    the list form that ``Allocation(workers=..., cuts=...)`` takes back; ``history`` is every
    measurement (``history_summary``) and ``found_at_s`` when the chosen one was first made."""
    check_range("budget_s", budget_s, 0.0, MAX_SIM_BUDGET_S, lo_open=True)
    check_seed(seed)
    pipeline = spec if isinstance(spec, sim.PipelineSpec) else sim.load_spec(spec)
    target = SimTarget(pipeline, seed=seed, noise=noise)
    result = check_tuner(TUNERS.build(tuner, options), target, budget_s, seed)
    bound = solve.lp_bound(pipeline)
    best = solve.oracle(pipeline)
    best_thr = pipeline.throughput(best)
    chosen = result.allocation
    thr = pipeline.throughput(chosen)
    names = pipeline.stage_names
    n = pipeline.n_stages
    return {
        "spec": pipeline.name,
        "tuner": tuner,
        "tuner_options": dict(options or {}),
        "seed": seed,
        "cores": pipeline.cores,
        "allocation": allocation_summary(chosen, names),
        "workers": list(chosen.workers),
        "cuts": list(chosen.cut_points(n)),
        "stage_workers": list(chosen.stage_workers(n)),
        "bottleneck": pipeline.bottleneck(chosen),
        "throughput_rows_per_s": thr,
        "measured_throughput_rows_per_s": result.throughput_rows_per_s,
        "lp_bound_rows_per_s": bound.throughput_rows_per_s,
        "lp_binding": bound.binding,
        "lp_cuts": list(range(1, n)) if bound.cuts is None else list(bound.cuts),
        "oracle_rows_per_s": best_thr,
        "oracle_allocation": allocation_summary(best, names),
        "fraction_of_bound": fraction(thr, bound.throughput_rows_per_s),
        "fraction_of_oracle": thr / best_thr,
        "peak_memory_bytes": target.peak_memory_bytes,
        "memory_budget_bytes": target.memory_budget_bytes,
        "tuning_steps": result.steps,
        "refused": result.refused,
        "tuning_s": result.tuning_s,
        "found_at_s": found_at_s(result),
        "budget_s": budget_s,
        "history": history_summary(result, names),
    }
