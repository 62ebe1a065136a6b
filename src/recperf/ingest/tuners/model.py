"""An analytic model (a sim.PipelineSpec) of any Target, built from measured per-stage costs, the
measured hand-off cost, GIL fractions and consumer cost (on a target that runs threads) and the
target's caps and memory predictions, and the per-pattern optima of that model; used by the
model-based tuners to choose cuts, thread shapes and workers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, Measurement, Target, cut_patterns
from recperf.ingest.sim.model import DEFAULT_GIL_FRAC, MIB, PipelineSpec, StageSpec
from recperf.ingest.sim.solve import pattern_oracle
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


def measured_gil(ms: Sequence[Measurement], n: int) -> list[float]:
    """Median measured GIL fraction per stage over ``ms`` (windows that did not measure it, NaN,
    skipped; ``DEFAULT_GIL_FRAC`` where none did)."""
    out = []
    for i in range(n):
        vals = sorted(m.gil_frac[i] for m in ms if m.gil_frac and math.isfinite(m.gil_frac[i]))
        mid = len(vals) // 2
        med = (vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2) if vals else None
        out.append(DEFAULT_GIL_FRAC if med is None else min(1.0, max(0.0, med)))
    return out


def measured_consumer(ms: Sequence[Measurement]) -> float:
    """Mean measured consumer µs/row over ``ms``; 0 where no window measured it."""
    vals = [m.consumer_us_per_row for m in ms if math.isfinite(m.consumer_us_per_row)]
    return max(sum(vals) / len(vals), 0.0) if vals else 0.0


def thread_options(target: Target) -> tuple[int, ...]:
    """``target.thread_options``; (1,) for a target written before it was part of the
    protocol (a user's plug-in, a test's stand-in)."""
    return tuple(getattr(target, "thread_options", (1,)))


def inflight_options(target: Target) -> tuple[int, ...]:
    """``target.inflight_options``; (0,) for a target written before it was in the protocol."""
    return tuple(getattr(target, "inflight_options", (0,)))


def threaded(target: Target) -> bool:
    """The target runs other shapes than single-threaded worker processes."""
    return thread_options(target) != (1,)


def model_spec(
    target: Target,
    costs: Sequence[float],
    handoff_us: float = 0.0,
    name: str = "model",
    gil: Sequence[float] | None = None,
    consumer_us: float = 0.0,
) -> PipelineSpec:
    """A PipelineSpec with per-stage ``costs`` (µs/row, without the hand-off), ``handoff_us``
    per segment, the target's caps and cores, and per-worker and buffer memory read off
    ``target.memory_bytes`` at one segment per stage (a fused worker is modelled as the sum of
    its stages, buffers as one per cut, as the simulator does). On a target that runs threads,
    also its thread options, the stages' ``gil`` fractions, the consumer's cost and a
    thread's memory (read off ``target.memory_bytes`` of a two-thread worker)."""
    base, per = unit_memory(target)
    n = len(costs)
    buffers = max(base - sum(per), 0.0)
    fracs = [DEFAULT_GIL_FRAC] * n if gil is None else list(gil)
    stages = tuple(
        StageSpec(
            name=stage,
            cost_us_per_row=float(c),
            max_workers=cap,
            memory_mib_per_worker=max(p, 0.0) / MIB,
            gil_frac=g,
        )
        for stage, c, cap, p, g in zip(
            target.stage_names, costs, target.max_workers, per, fracs, strict=True
        )
    )
    spec = PipelineSpec(
        name=name,
        cores=target.cores,
        memory_budget_gib=target.memory_budget_bytes / 2**30,
        stages=stages,
        transfer_us_per_row=handoff_us,
        memory_mib_per_batch=buffers / MIB / (n - 1) if n > 1 else 0.0,
        queue_batches=1,
    )
    if not threaded(target):
        return spec
    two = Allocation(workers=(1,) * n, threads=(2,) + (1,) * (n - 1))
    thread_mib = max(target.memory_bytes(two) - base, 0.0) / MIB
    return spec.with_(
        thread_options=thread_options(target),
        consumer_us_per_row=consumer_us,
        memory_mib_per_thread=thread_mib,
    )


def measured_spec(target: Target, ms: Sequence[Measurement], name: str = "model") -> PipelineSpec:
    """``model_spec`` from the mean costs and hand-off of ``ms`` (and, on a target that runs
    threads, their GIL fractions and consumer cost)."""
    costs, handoff = measured_costs(ms), measured_handoff(ms)
    if not threaded(target):
        return model_spec(target, costs, handoff, name)
    gil = measured_gil(ms, len(costs))
    return model_spec(target, costs, handoff, name, gil, measured_consumer(ms))


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
