"""An analytic model (a sim.PipelineSpec) of any Target, built from measured per-row costs and
the target's caps and memory predictions; used by the model-based tuners."""

from __future__ import annotations

import math
from collections.abc import Sequence

from recperf.core.errors import ConfigError
from recperf.ingest.base import Measurement, Target
from recperf.ingest.sim.model import MIB, PipelineSpec, StageSpec
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


def model_spec(target: Target, costs: Sequence[float], name: str = "model") -> PipelineSpec:
    """A PipelineSpec with ``costs`` (µs/row, transfer included), the target's caps and cores,
    and per-worker and buffer memory read off ``target.memory_bytes``."""
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
        memory_mib_per_batch=buffers / MIB / (n - 1) if n > 1 else 0.0,
        queue_batches=1,
    )
