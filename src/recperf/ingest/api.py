"""Library entry points behind ``recperf ingest run`` and ``recperf ingest tune``: run the live
pipeline for a while and summarise it, or tune its allocation and write the result."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from recperf.core import hostload
from recperf.core.config import check_range
from recperf.core.errors import ConfigError, RecperfError
from recperf.core.files import check_name
from recperf.core.results import write_json
from recperf.ingest.base import (
    Allocation,
    Measurement,
    check_cores,
    check_inflight,
    check_threads,
)
from recperf.ingest.live.allocfile import read_allocation, write_allocation
from recperf.ingest.live.batch import PipelineConfig, Snapshot
from recperf.ingest.live.executor import Pipeline
from recperf.ingest.live.target import (
    LiveTarget,
    calibrate,
    check_window_options,
    repeated_measurement,
    spec_toml,
    subwindow_rates,
)
from recperf.ingest.sim.solve import lp_bound, segments_of
from recperf.ingest.tuners.base import TUNERS, check_tuner
from recperf.ingest.tuning import allocation_summary

Progress = Callable[[float], None]
MAX_SECONDS = 86_400.0
"""The longest live run, tuning budget, warm-up or final measurement taken (a day)."""
SUBWINDOW_S = 0.5
"""``run`` states its throughput over sub-windows of about this length (at least 3)."""


def confidence_json(m: Measurement) -> dict[str, Any]:
    """How sure a live measurement is: its 90% interval (None if it stated none), the
    sub-windows it was estimated from and the other load on the machine (None: unknown)."""
    ci = m.throughput_ci
    return {
        "throughput_ci_rows_per_s": list(ci) if all(map(math.isfinite, ci)) else None,
        "samples": m.samples,
        "other_load_cores": _finite(m.other_load_cores),
    }


def shaped(alloc: Allocation, threads: int | None, inflight: int | None) -> Allocation:
    """``alloc`` with ``threads`` in every segment and ``inflight`` requests, where given."""
    t = None if threads is None else (threads,) * len(alloc.workers)
    return alloc.with_shape(threads=t, inflight=inflight)


def stage_table(names: tuple[str, ...], m: Measurement) -> list[dict[str, Any]]:
    """Per-stage metrics of a measurement as JSON-ready rows."""
    return [
        {
            "stage": n,
            "workers": m.allocation.stage_workers(len(names))[i],
            "rows_per_s": m.stage_rows_per_s[i],
            "busy_frac": m.busy_frac[i],
            "queue_fill": m.queue_fill[i],
            "cpu_s": m.cpu_s[i],
            "cost_us_per_row": None if math.isnan(m.cost_us_per_row[i]) else m.cost_us_per_row[i],
        }
        for i, n in enumerate(names)
    ]


def resolve_allocation(alloc: str | Path, pipeline_stages: tuple[str, ...]) -> Allocation | str:
    """``fused``, ``even``, ``auto`` or an allocation TOML file."""
    if str(alloc) in ("fused", "even", "auto"):
        return str(alloc)
    path = check_name(alloc, "--alloc")
    if not os.path.lexists(path):
        raise ConfigError(f"--alloc {alloc}: expected fused, even, auto or an allocation TOML file")
    return read_allocation(path, pipeline_stages)


def auto_allocation(
    data: str | Path,
    config: PipelineConfig,
    tuner: str = "plumber",
    tune_s: float = 8.0,
    cores: int | None = None,
) -> Allocation:
    """A short live tuning (``tuner`` for ``tune_s`` seconds, after a 1-s warm-up) on a
    pipeline of its own; its choice."""
    check_range("tune_s", tune_s, 0.0, MAX_SECONDS, lo_open=True)
    check_cores(cores)
    impl = TUNERS.build(tuner)
    with Pipeline(data, _repeating(config), cores=cores) as p:
        target = LiveTarget(p, settle_s=0.3, warmup_s=1.0)
        return check_tuner(impl, target, tune_s, config.seed).allocation


def run(
    data: str | Path,
    alloc: str | Path,
    config: PipelineConfig,
    seconds: float,
    *,
    warmup_s: float = 1.0,
    cores: int | None = None,
    threads: int | None = None,
    inflight: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Consume the pipeline for ``warmup_s`` then ``seconds``; throughput and per-stage metrics
    over the timed part (the pipeline repeats epochs so the window is never cut short), the
    throughput's 90% interval and quartiles over sub-windows, and the machine's other load.
    ``threads`` (every segment's) and ``inflight`` reshape the fused, even or file allocation."""
    check_range("seconds", seconds, 0.0, MAX_SECONDS, lo_open=True)
    check_range("warmup_s", warmup_s, 0.0, MAX_SECONDS)
    check_cores(cores)
    cfg = _repeating(config)
    allocation = resolve_allocation(alloc, cfg.stage_names())
    _check_shape(allocation, threads, inflight)
    tuned_s = 0.0
    if allocation == "auto":
        t0 = time.monotonic()
        allocation = auto_allocation(data, config, cores=cores)
        tuned_s = time.monotonic() - t0
    p = Pipeline(data, cfg, allocation=allocation, cores=cores)
    if threads is not None or inflight is not None:
        p.resize(shaped(p.allocation, threads, inflight))  # before start: nothing runs yet
    with p:
        it = iter(p)
        t_end = time.monotonic() + warmup_s
        while time.monotonic() < t_end:
            next(it)
        snaps, load = _timed(p, it, seconds, progress)
        if snaps[-1].rows_out == snaps[0].rows_out:
            raise RecperfError(f"{data}: the pipeline delivered no rows in {seconds:g} s")
        return {"data": str(data), **_run_summary(p, snaps, load), "tuning_s": tuned_s}


def _check_shape(allocation: Allocation | str, threads: int | None, inflight: int | None) -> None:
    """``--threads`` and ``--inflight`` in range, and not with ``auto`` (which chooses them)."""
    if threads is not None:
        check_threads(threads, "--threads")
    if inflight is not None:
        check_inflight(inflight, "--inflight")
    if allocation == "auto" and (threads is not None or inflight is not None):
        flag = "--threads" if threads is not None else "--inflight"
        raise ConfigError(f"{flag}: --alloc auto chooses the shape itself; give fused, even "
                          "or an allocation file with it")  # fmt: skip


def _run_summary(p: Pipeline, snaps: Sequence[Snapshot], load: float) -> dict[str, Any]:
    """What ``run`` reports of the timed snapshots ``snaps`` with ``load`` cores of other load."""
    a, b = snaps[0], snaps[-1]
    m = repeated_measurement(snaps, p.allocation, load)
    rates = subwindow_rates(snaps, p.allocation)
    return {
        "stages": list(p.stage_names),
        "allocation": allocation_summary(p.allocation, p.stage_names),
        "cores": p.cores,
        "batch_size": p.config.batch_size,
        "throughput_rows_per_s": m.throughput_rows_per_s,
        **confidence_json(m),
        "subwindow_quartiles_rows_per_s": (
            statistics.quantiles(rates, n=4) if len(rates) > 1 else None
        ),
        "batches_per_s": (b.batches_out - a.batches_out) / m.window_s,
        "rows": b.rows_out - a.rows_out,
        "seconds": m.window_s,
        "peak_memory_bytes": b.peak_memory_bytes,
        "memory_budget_bytes": p.memory_budget_bytes,
        "restarts": sum(s.restarts for s in b.stages),
        "handoff_us_per_row": _finite(m.handoff_us_per_row),
        "consumer_us_per_row": _finite(m.consumer_us_per_row),
        "per_stage": stage_table(p.stage_names, m),
    }


def _timed(
    p: Pipeline, it: Iterator[Any], seconds: float, progress: Progress | None
) -> tuple[list[Snapshot], float]:
    """Consume ``it`` for ``seconds`` with a snapshot at the start and after each of the
    sub-windows (about SUBWINDOW_S each, at least 3); the snapshots and the other load on the
    machine meanwhile, cores."""
    n = max(3, round(seconds / SUBWINDOW_S))
    load_a = hostload.sample()
    snaps = [p.snapshot()]
    t0 = time.monotonic()
    for k in range(1, n + 1):
        while (now := time.monotonic()) - t0 < seconds * k / n:
            next(it)
            if progress is not None:
                progress(min(1.0, (now - t0) / seconds))
        snaps.append(p.snapshot(memory=k == n))  # the workers' memory read at the end only
    return snaps, hostload.other_load_cores(load_a, hostload.sample())


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _mean_load(ms: Sequence[Measurement]) -> float | None:
    """Mean other load over measurements, weighted by their windows; None if none had one."""
    known = [m for m in ms if math.isfinite(m.other_load_cores) and m.window_s > 0]
    total = sum(m.window_s for m in known)
    return sum(m.other_load_cores * m.window_s for m in known) / total if known else None


def _repeating(config: PipelineConfig) -> PipelineConfig:
    return replace(config, epochs=None)


def tune(
    data: str | Path,
    tuner: str,
    budget_s: float,
    config: PipelineConfig,
    out: Path,
    *,
    seed: int = 0,
    settle_s: float = 0.5,
    warmup_s: float = 2.0,
    final_s: float = 4.0,
    cores: int | None = None,
    options: Mapping[str, Any] | None = None,
    on_measure: Callable[[Measurement], None] | None = None,
    rel_tol: float = 0.05,
    max_extend: float = 3.0,
) -> dict[str, Any]:
    """Tune the live pipeline's allocation with ``tuner`` (its Config built from ``options``)
    within ``budget_s``, measure the choice for ``final_s``, and write ``allocation.toml``,
    ``calibrated.toml`` (a simulator spec from the measured stage costs) and ``summary.json``
    under ``out``. Each window grows (up to ``max_extend`` times) until its throughput's 90%
    interval is within ``rel_tol`` (see LiveTarget)."""
    check_range("budget_s", budget_s, 0.0, MAX_SECONDS, lo_open=True)
    check_range("warmup_s", warmup_s, 0.0, MAX_SECONDS)
    check_range("final_s", final_s, 0.0, MAX_SECONDS, lo_open=True)
    check_range("settle_s", settle_s, 0.0, MAX_SECONDS)
    check_window_options(rel_tol=rel_tol, max_extend=max_extend)
    check_cores(cores)
    impl = TUNERS.build(tuner, options)
    cfg = _repeating(config)
    with Pipeline(data, cfg, cores=cores) as p:
        target = LiveTarget(p, settle_s=settle_s, warmup_s=warmup_s, rel_tol=rel_tol,
                            max_extend=max_extend)  # fmt: skip
        target.on_measure = on_measure
        result = check_tuner(impl, target, budget_s, seed)
        tuning_s = target.elapsed_s()
        final = target.measure(result.allocation, final_s)
        if not final.throughput_rows_per_s > 0:
            raise RecperfError(
                f"{data}: the chosen allocation delivered no rows in final_s = {final_s:g} s; "
                "nothing written"
            )
        spec = calibrate(target, name=f"calibrated-{Path(data).name}")
        bound = lp_bound(spec)
        names = p.stage_names
        summary = {
            "tuner": tuner,
            "tuner_options": dict(options or {}),
            "data": str(data),
            "seed": seed,
            "cores": p.cores,
            "stages": list(names),
            "allocation": allocation_summary(result.allocation, names),
            "throughput_rows_per_s": final.throughput_rows_per_s,
            **confidence_json(final),
            "tuning_other_load_cores": _mean_load(target.measurements[:-1]),
            "rel_tol": rel_tol,
            "max_extend": max_extend,
            "bound_rows_per_s": bound.throughput_rows_per_s,
            "bound_binding": bound.binding,
            "bound_workers": {
                "+".join(names[a:b]): w
                for (a, b), w in zip(
                    segments_of(len(names), bound.cuts), bound.workers, strict=True
                )
            },
            "fraction_of_bound": final.throughput_rows_per_s / bound.throughput_rows_per_s,
            "tuning_s": tuning_s,
            "budget_s": budget_s,
            "tuning_steps": result.steps,
            "refused": result.refused,
            "peak_memory_bytes": target.peak_memory_bytes,
            "memory_budget_bytes": p.memory_budget_bytes,
            "stage_cost_us_per_row": dict(
                zip(names, (s.cost_us_per_row for s in spec.stages), strict=True)
            ),
            "handoff_us_per_row": _finite(final.handoff_us_per_row),
            "consumer_us_per_row": _finite(final.consumer_us_per_row),
            "per_stage": stage_table(names, final),
            "history": [
                {
                    "elapsed_s": s.elapsed_s,
                    "allocation": s.allocation.label(names),
                    "throughput_rows_per_s": s.throughput_rows_per_s,
                    "throughput_ci_rows_per_s": None
                    if s.throughput_ci is None
                    else list(s.throughput_ci),
                    "samples": s.samples,
                }
                for s in result.history
            ],
        }
    out.mkdir(parents=True, exist_ok=True)
    note = f"recperf ingest tune --tuner {tuner} --budget-s {budget_s:g} on {data}"
    write_allocation(out / "allocation.toml", names, result.allocation, note)
    (out / "calibrated.toml").write_text(spec_toml(spec))
    write_json(out / "summary.json", summary)
    return summary
