"""An analytic model (a sim.PipelineSpec) of any Target, built from measured per-stage costs, the
measured hand-off cost and the target's caps and memory predictions, and the per-pattern optima
of that model; used by the model-based tuners to choose cuts and workers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, Measurement, Target, cut_patterns
from recperf.ingest.sim.model import MIB, PipelineSpec, StageSpec, pattern_oracle
from recperf.ingest.tuners.base import unit_memory


def measured_costs(ms: Sequence[Measurement], prior: Sequence[float] | None = None) -> list[float]:
    """Mean measured µs/row per stage over ``ms`` (NaN windows skipped; ``prior`` fills gaps)."""
    if not ms:
        raise ConfigError("no measurement to estimate per-row costs from")
    n = len(ms[0].cost_us_per_row)
    out = []
    for i in range(n):
        vals = [m.cost_us_per_row[i] for m in ms if math.isfinite(m.cost_us_per_row[i])]
        if vals:
            out.append(max(sum(vals) / len(vals), 1e-6))
        elif prior is not None:
            out.append(prior[i])
        else:
            out.append(1.0)
    return out


def measured_handoff(ms: Sequence[Measurement], default: float = 0.0) -> float:
    """Mean measured hand-off µs/row over ``ms``; ``default`` if no window measured it (a target
    that folds the hand-off into its stage costs reports 0 or NaN)."""
    vals = [m.handoff_us_per_row for m in ms if math.isfinite(m.handoff_us_per_row)]
    return max(sum(vals) / len(vals), 0.0) if vals else default


def model_spec(
    target: Target, costs: Sequence[float], handoff_us: float = 0.0, name: str = "model"
) -> PipelineSpec:
    """A PipelineSpec with per-stage ``costs`` (µs/row, without the hand-off), ``handoff_us``
    per segment, the target's caps and cores, and per-worker and buffer memory read off
    ``target.memory_bytes`` at one segment per stage (a fused worker is modelled as the sum of
    its stages, buffers as one per cut, as the simulator does)."""
    base, per = unit_memory(target)
    n = len(costs)
    buffers = max(base - sum(per), 0.0)
    stages = tuple(
        StageSpec(
            name=stage,
            cost_us_per_row=float(c),
            max_workers=cap,
            memory_mib_per_worker=max(p, 0.0) / MIB,
        )
        for stage, c, cap, p in zip(target.stage_names, costs, target.max_workers, per, strict=True)
    )
    return PipelineSpec(
        name=name,
        cores=target.cores,
        memory_budget_gib=target.memory_budget_bytes / 2**30,
        stages=stages,
        transfer_us_per_row=handoff_us,
        memory_mib_per_batch=buffers / MIB / (n - 1) if n > 1 else 0.0,
        queue_batches=1,
    )


def measured_spec(target: Target, ms: Sequence[Measurement], name: str = "model") -> PipelineSpec:
    """``model_spec`` from the mean costs and hand-off of ``ms``."""
    return model_spec(target, measured_costs(ms), measured_handoff(ms), name)


@dataclass(frozen=True, slots=True)
class PatternOptimum:
    """A cut pattern's best integer allocation under a model, and its modelled throughput."""

    cuts: tuple[int, ...] | None
    allocation: Allocation
    throughput_rows_per_s: float


def pattern_optima(spec: PipelineSpec, worker_limit: int | None = None) -> list[PatternOptimum]:
    """Every cut pattern's optimum (``sim.pattern_oracle``) under ``spec``, best first (ties:
    fewer workers, fewer segments, the earlier pattern); patterns where nothing fits are left
    out."""
    out = []
    for cuts in cut_patterns(spec.n_stages):
        alloc = pattern_oracle(spec, cuts, worker_limit)
        if alloc is not None:
            out.append(PatternOptimum(alloc.cuts, alloc, spec.throughput(alloc)))
    if not out:
        return out
    top = max(p.throughput_rows_per_s for p in out) * (1 - 1e-9)
    # throughputs within rounding of the best tie (equal rationals differ in the last bit)
    out.sort(key=lambda p: (-min(p.throughput_rows_per_s, top), p.allocation.total,
                            len(p.allocation.workers)))  # fmt: skip
    return out
