"""Library entry points behind ``recperf ingest run --engine ray`` and ``ingest tune --engine
ray``: a pipeline (a simulator spec's synthetic one, or the Criteo data's) on a Ray cluster
under an allocation that Ray Data's autoscaler, a fixed split or one of recperf's tuners
chooses, measured, with the LP bound beside it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, Measurement, even_split, fused
from recperf.ingest.raydata.runtime import ClusterSpec, RayRuntime
from recperf.ingest.raydata.target import RayTarget, RayWindow
from recperf.ingest.raydata.work import RayPipeline
from recperf.ingest.sim.model import PipelineSpec
from recperf.ingest.sim.solve import lp_bound, segments_of
from recperf.ingest.tuners.base import TUNERS, check_tuner
from recperf.ingest.tuning import allocation_summary

if TYPE_CHECKING:
    from recperf.ingest.live.batch import PipelineConfig

RAY_DEFAULT = "ray-default"
MAX_DATA_ITEMS = 20_000
"""The most source items (chunks) one dataset of the Criteo pipeline holds."""
FIXED = ("fused", "even")
TUNED = ("plumber", "autotune", "intune", "oracle", "static")
ALLOCS = (RAY_DEFAULT, "auto", *TUNED, *FIXED)
"""What ``--alloc`` takes on the Ray engine (or an allocation TOML file)."""
RAY_TUNER_OPTIONS: Mapping[str, Mapping[str, Any]] = {
    # windows long enough for blocks of about 0.1-1 s
    "plumber": {"window_s": 5.0},
    "oracle": {"window_s": 5.0},
    "autotune": {"window_s": 5.0},
    "intune": {"window_s": 5.0},
    "static": {"window_s": 5.0},
}
"""Each tuner's options on the Ray engine, under the user's own."""
BLOCKS_PER_WINDOW = 3
"""A tuning window holds at least this many of a spec's slowest blocks (udf-64's take 7 s)."""
Progress = Callable[[str], None]


def check_alloc(alloc: str) -> None:
    """One line unless ``alloc`` is one of ALLOCS or an existing file."""
    if alloc not in ALLOCS and not Path(alloc).is_file():
        raise ConfigError(f"--alloc {alloc}: expected {', '.join(ALLOCS)} or an allocation "
                          "TOML file (--engine ray)")  # fmt: skip


def tuner_options(tuner: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The tuner's Ray defaults overridden by the user's ``options``."""
    return {**RAY_TUNER_OPTIONS.get(tuner, {}), **(options or {})}


def choose(
    target: RayTarget,
    alloc: str | Allocation,
    *,
    budget_s: float,
    seed: int,
    options: Mapping[str, Any] | None = None,
) -> tuple[Allocation | None, dict[str, Any]]:
    """The allocation ``alloc`` names on ``target`` (None for ray-default), and how it was
    chosen (tuner, steps, tuning seconds)."""
    if isinstance(alloc, Allocation):
        return alloc, {"chosen_by": "file"}
    if alloc == RAY_DEFAULT:
        return None, {"chosen_by": RAY_DEFAULT}
    if alloc == "fused":
        return fused(target), {"chosen_by": "fused"}
    if alloc == "even":
        return even_split(target), {"chosen_by": "even"}
    tuner = "plumber" if alloc == "auto" else alloc
    opts = tuner_options(tuner, options)
    block_s = float(getattr(target.pipeline, "block_s", 0.0))
    if "window_s" in opts and not (options or {}).get("window_s"):
        opts["window_s"] = max(opts["window_s"], BLOCKS_PER_WINDOW * block_s)
    impl = TUNERS.build(tuner, opts)
    t0 = target.elapsed_s()
    result = check_tuner(impl, target, budget_s, seed)
    return result.allocation, {
        "chosen_by": tuner,
        "tuning_s": target.elapsed_s() - t0,
        "tuning_steps": result.steps,
        "refused": result.refused,
        "history": [
            {
                "elapsed_s": s.elapsed_s,
                "allocation": s.allocation.label(target.stage_names),
                "throughput_rows_per_s": s.throughput_rows_per_s,
            }
            for s in result.history
        ],
    }


def final_json(target: RayTarget, m: Measurement, w: RayWindow, default: bool) -> dict[str, Any]:
    """The measured run as the result document shows it."""
    names = target.stage_names
    alloc = m.allocation
    segs = alloc.segments(len(names))
    workers = w.workers_seen if default else alloc.workers
    place = None if default else target.placements.get(alloc)
    ops = []
    for j, (a, b) in enumerate(segs):
        op: dict[str, Any] = {"operator": "+".join(names[a:b]), "workers": workers[j],
                              "workers_seen": w.workers_seen[j]}  # fmt: skip
        if place is not None:
            op["nodes"] = {f"n{i}": k for i, k in enumerate(place[j])}
        ops.append(op)
    ci = m.throughput_ci
    return {
        "allocation": RAY_DEFAULT if default else allocation_summary(alloc, names),
        "operators": ops,
        "throughput_rows_per_s": m.throughput_rows_per_s,
        "throughput_ci_rows_per_s": list(ci) if all(map(math.isfinite, ci)) else None,
        "samples": m.samples,
        "seconds": m.window_s,
        "logical_cpus": target.cores,
        # the CPUs Ray had given to workers (a starting actor holds its CPU before its first
        # block), which for a fixed allocation is its total
        "logical_cpus_used": sum(workers)
        if math.isnan(w.idle_cpus)
        else target.cores - w.idle_cpus,
        "idle_logical_cpus": None if math.isnan(w.idle_cpus) else w.idle_cpus,
        "ray_overhead_ms_per_task": None if math.isnan(w.gap_ms) else w.gap_ms,
        "time_to_first_block_s": None if math.isnan(w.first_block_s) else w.first_block_s,
        "cores_used": None if math.isnan(w.cores_used) else w.cores_used,
        "peak_memory_bytes": None if math.isnan(w.memory_bytes) else w.memory_bytes,
        "other_load_cores": None if math.isnan(m.other_load_cores) else m.other_load_cores,
        "stage_cost_us_per_row": {
            n: (None if math.isnan(c) else c) for n, c in zip(names, m.cost_us_per_row, strict=True)
        },
    }


def measure_choice(
    target: RayTarget, chosen: Allocation | None, seconds: float, warmup_s: float
) -> tuple[Measurement, RayWindow]:
    """Measure ``chosen`` (None: Ray Data's default, after ``warmup_s`` for its autoscaler)."""
    if chosen is None:
        m = target.measure_default(seconds, warmup_s)
    else:
        m = target.measure(chosen, seconds)
    return m, target.windows[-1]


def run_pipeline(
    pipeline: RayPipeline,
    runtime: RayRuntime,
    alloc: str | Allocation,
    *,
    seconds: float,
    budget_s: float = 120.0,
    warmup_s: float = 10.0,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
    settle_s: float = 1.0,
    placer: Any = None,
) -> dict[str, Any]:
    """Choose ``alloc`` on ``pipeline`` (tuning within ``budget_s`` if a tuner), then measure
    it for ``seconds``; the result document without the bound."""
    check_range("seconds", seconds, 0.0, 86_400.0, lo_open=True)
    check_range("budget_s", budget_s, 0.0, 86_400.0, lo_open=True)
    check_range("warmup_s", warmup_s, 0.0, 86_400.0)
    with RayTarget(runtime, pipeline, settle_s=settle_s, placer=placer) as target:
        t0 = time.monotonic()
        chosen, how = choose(target, alloc, budget_s=budget_s, seed=seed, options=options)
        m, w = measure_choice(target, chosen, seconds, warmup_s)
        return {
            "stages": list(target.stage_names),
            **how,
            **final_json(target, m, w, chosen is None),
            "wall_s": time.monotonic() - t0,
        }


def bound_json(spec: PipelineSpec) -> dict[str, Any]:
    """The single-pool LP bound of ``spec`` (every worker one logical CPU)."""
    b = lp_bound(spec.with_(thread_options=(1,)))
    segs = segments_of(spec.n_stages, b.cuts)
    return {
        "lp_bound_rows_per_s": b.throughput_rows_per_s,
        "lp_binding": b.binding,
        "lp_workers": {
            "+".join(spec.stage_names[a:c]): x for (a, c), x in zip(segs, b.workers, strict=True)
        },
    }


def spec_run(
    spec: PipelineSpec,
    cluster: ClusterSpec | RayRuntime,
    alloc: str | Allocation,
    *,
    seconds: float = 20.0,
    budget_s: float = 120.0,
    warmup_s: float = 10.0,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
    link_bytes_per_s: float = math.inf,
) -> dict[str, Any]:
    """A spec's synthetic pipeline on ``cluster`` (see ``raydata.spec``; an open RayRuntime is
    used as it is), the result document: throughput against the LP bound (on more than one
    node, the placement bound with a CPU row per node and a network row per link), the final
    allocation per operator (and per node), idle logical CPUs and Ray's overhead."""
    if isinstance(cluster, RayRuntime):
        return _spec_run(spec, cluster, alloc, seconds=seconds, budget_s=budget_s,
                         warmup_s=warmup_s, seed=seed, options=options,
                         link_bytes_per_s=link_bytes_per_s)  # fmt: skip
    with RayRuntime(cluster) as rt:
        return _spec_run(spec, rt, alloc, seconds=seconds, budget_s=budget_s,
                         warmup_s=warmup_s, seed=seed, options=options,
                         link_bytes_per_s=link_bytes_per_s)  # fmt: skip


def _spec_run(
    spec: PipelineSpec,
    rt: RayRuntime,
    alloc: str | Allocation,
    *,
    link_bytes_per_s: float,
    **kw: Any,
) -> dict[str, Any]:
    from recperf.ingest.raydata.spec import SpecPipeline
    from recperf.ingest.sim.placement import Network, place, placement_lp_bound, worker_slots

    network = Network(link_bytes_per_s=link_bytes_per_s)
    pipeline = SpecPipeline(spec, rt.cpus)
    cpus = rt.node_cpus
    placer = None
    if len(cpus) > 1:

        def placer(a: Allocation) -> tuple[tuple[int, ...], ...]:
            return place(pipeline.spec, a, worker_slots(cpus, a.total), network)

    out = run_pipeline(pipeline, rt, alloc, placer=placer, **kw)
    bound = bound_json(pipeline.spec)
    if len(cpus) > 1:
        pb = placement_lp_bound(pipeline.spec, cpus, network)
        bound["lp_bound_rows_per_s"] = pb.throughput_rows_per_s
        bound["lp_binding"] = pb.binding
    return {
        "spec": spec.name,
        "nodes": len(cpus),
        "cpus_per_node": list(cpus),
        "block_rows": pipeline.rows,
        **out,
        **bound,
        "fraction_of_bound": out["throughput_rows_per_s"] / bound["lp_bound_rows_per_s"],
    }


ROWS_PER_S_CEILING = 3e6
"""Rows/s one machine's Ray pipeline is sized for when ``data_run`` repeats the data (the
dataset must outlast tuning windows and the run: each build is that many rows/s times them)."""


def data_run(
    data: str | Path,
    config: PipelineConfig,
    cluster: ClusterSpec,
    alloc: str | Allocation,
    *,
    seconds: float = 10.0,
    budget_s: float = 60.0,
    warmup_s: float = 3.0,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Criteo data's pipeline (``raydata.criteo``) on ``cluster``, repeating epochs so that
    each dataset outlasts its window; the result document as ``spec_run``'s, without a bound."""
    from recperf.ingest.raydata.criteo import CriteoPipeline

    with RayRuntime(cluster) as rt:
        probe = CriteoPipeline(data, replace(config, epochs=1))
        rows = max(1, sum(probe.plan.counts))
        horizon = seconds + warmup_s + 30.0
        epochs = max(2, math.ceil(ROWS_PER_S_CEILING * horizon / rows))
        epochs = min(epochs, max(2, MAX_DATA_ITEMS // max(1, probe.tasks_per_epoch)))
        pipeline = CriteoPipeline(data, replace(config, epochs=None), repeat_epochs=epochs)
        out = run_pipeline(pipeline, rt, alloc, seconds=seconds, budget_s=budget_s,
                           warmup_s=warmup_s, seed=seed, options=options)  # fmt: skip
        return {"data": str(data), "nodes": len(rt.node_cpus),
                "cpus_per_node": list(rt.node_cpus), **out}  # fmt: skip
