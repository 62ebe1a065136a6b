"""The library entry points behind the CLI: load a trace, simulate, write and compare results."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from recperf.cluster.base import (
    PLACEMENTS,
    SCHEDULER_METHODS,
    SCHEDULERS,
    TRACE_LOADERS,
    PlacementPolicy,
    Scheduler,
    TraceLoader,
    missing_methods,
)
from recperf.cluster.engine import Simulator
from recperf.cluster.jobs import JobTable
from recperf.cluster.metrics import job_columns, summarize, utilization_series
from recperf.cluster.outcome import EngineConfig, SimResult
from recperf.cluster.topology import Cluster, load_cluster
from recperf.cluster.traces import BUNDLED, BUNDLED_CLUSTERS, bundled_path
from recperf.cluster.traces.synthetic import SyntheticConfig, SyntheticTrace
from recperf.core import exact
from recperf.core.config import check_range, check_seed
from recperf.core.errors import ConfigError, RecperfError, RegistryError, TraceFormatError
from recperf.core.files import TRACE_MAX_BYTES, check_input, check_name
from recperf.core.progress import ProgressFn
from recperf.core.registry import Registry
from recperf.core.results import write_json, write_parquet

T = TypeVar("T")


@dataclass(kw_only=True, frozen=True)
class RunSpec:
    """Everything that determines one simulation; equal specs give byte-identical summaries."""

    trace: str = "tiresias-480"
    """A bundled trace name (``recperf cluster list``: philly, helios-500, itp-cluster01 ...) or
    a path."""
    format: str | None = None
    """Trace format for a path (philly, tiresias, helios, itp, alibaba-gpu-2023, philly-raw,
    csv); bundled names know their own."""
    scheduler: str = "fifo"
    """Scheduler name or ``module:attr``."""
    scheduler_options: Mapping[str, Any] = field(default_factory=dict)
    """Fields of the scheduler's Config."""
    placement: str = "best-fit"
    """Placement policy name or ``module:attr``."""
    cluster: str | None = None
    """Preset name or TOML file; default: the trace format's own cluster."""
    seed: int = 0
    """Seeds the synthetic generator, random placement and arrival jitter."""
    jitter_s: float = 0.0
    """Move each arrival by a seeded uniform draw in [-jitter_s, +jitter_s] (clamped at 0), so
    seeds give different interleavings of a real trace's jobs; 0 keeps the trace as it is."""
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    trace_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Fields of each trace format's Config, by format (``{"csv": {"columns": "..."}}``); a run
    uses its own format's, so one mapping serves a sweep over several formats."""
    drop_oversized: bool = False
    """Drop the jobs that need more GPUs than the cluster has (counted as ``dropped_oversized``
    in the summary) instead of failing on the first."""
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        check_seed(self.seed)
        check_range("jitter_s", self.jitter_s, 0.0, 86_400.0 * 30)

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)


def resolve_loader(spec: RunSpec) -> tuple[TraceLoader, Path | None]:
    """The loader and file for a bundled trace name or a path with a format."""
    if spec.trace in BUNDLED:
        bundled = BUNDLED[spec.trace]
        if spec.format not in (None, bundled.format):
            raise ConfigError(
                f"--format {spec.format!r} does not match bundled trace {spec.trace!r}"
            )
        fmt, path = bundled.format, bundled_path(bundled)
    else:
        path = check_name(spec.trace, "--trace")
        if not spec.trace.strip() or not os.path.exists(path):  # Path("") is the current dir
            raise ConfigError(
                f"trace {spec.trace!r} is neither a file nor a bundled name; "
                f"bundled: {', '.join(BUNDLED)}"
            )
        if spec.format is None:
            raise ConfigError(
                f"--format is required for a trace file; allowed: {', '.join(TRACE_LOADERS)}"
            )
        fmt = spec.format
        if fmt == "synthetic":
            raise ConfigError(f"--format synthetic generates jobs; it reads no file ({path})")
        check_input(path, "--trace", max_bytes=TRACE_MAX_BYTES, want="any")  # philly: a dir
    if fmt == "synthetic":
        return SyntheticTrace(spec.synthetic), None
    options = spec.trace_options.get(fmt)
    return build_plugin(TRACE_LOADERS, fmt, options, ("load",)), path


def trace_format(trace: str, fmt: str | None) -> str | None:
    """The format a trace is read in: a bundled name's own, else ``fmt``."""
    return BUNDLED[trace].format if trace in BUNDLED else fmt


def trace_scopes(traces: Sequence[str], fmt: str | None) -> list[str]:
    """The formats of ``traces`` (bundled names or files in ``fmt``) whose loaders take a
    Config: the ``trace_options`` keys (and --set scopes) a run of them may have."""
    formats = dict.fromkeys(trace_format(t, fmt) for t in traces)
    return [f for f in formats if f is not None and f != "synthetic" and _takes_options(f)]


def checked_options(
    opts: Mapping[str, dict[str, Any]], formats: Sequence[str], placement: str, drop_invalid: bool
) -> dict[str, dict[str, Any]]:
    """The ``trace_options`` of a run (or a sweep) of ``formats``, from options by scope: each
    format's (with ``drop_invalid`` in them) and the placement's validated now, so a bad column
    mapping fails before any trace is read."""
    for f in formats:
        if drop_invalid:
            opts[f]["drop_invalid"] = True
        TRACE_LOADERS.config(f, opts[f])
    PLACEMENTS.config(placement, opts[placement])
    return {f: opts[f] for f in formats}


def _takes_options(fmt: str) -> bool:
    try:
        return TRACE_LOADERS.entry(fmt).config is not None
    except RegistryError:  # an unknown format fails, listing the known ones, when it loads
        return False


def build_plugin(
    registry: Registry[T], name: str, options: Mapping[str, Any] | None, methods: Sequence[str]
) -> T:
    """Build plug-in ``name`` (validating ``options``). A ``module:attr`` class that lacks one
    of ``methods``, or whose constructor fails, is one RegistryError naming it; a registered
    plug-in that fails to build is a bug and keeps its traceback."""
    entry = registry.entry(name)  # unknown name, failed import, not a class: RegistryError
    if name in registry:
        return registry.build(name, options)
    what = f"{registry.kind} {name!r}"
    lacks = missing_methods(entry.factory, methods)
    if lacks:
        need = ", ".join(f"{m}()" for m in methods)
        cls = getattr(entry.factory, "__name__", repr(entry.factory))
        raise RegistryError(f"{what}: {cls} has no {lacks[0]}() method; it needs {need}")
    try:
        return registry.build(name, options)
    except RecperfError:
        raise
    except Exception as exc:  # e.g. an __init__ that needs arguments
        raise RegistryError(f"{what}: building it failed: {type(exc).__name__}: {exc}") from None


def build_scheduler(name: str, options: Mapping[str, Any] | None = None) -> Scheduler:
    """Build a scheduler, validating ``options`` against its Config and checking that a
    ``module:attr`` one has ``reset`` and ``schedule`` (``preemptive`` defaults to False)."""
    return build_plugin(SCHEDULERS, name, options, SCHEDULER_METHODS)


def build_placement(name: str) -> PlacementPolicy:
    """Build a placement policy (a ``module:attr`` one must have ``place``)."""
    return build_plugin(PLACEMENTS, name, None, ("place",))


def load_jobs(spec: RunSpec) -> tuple[JobTable, Cluster]:
    """The trace's jobs and the cluster they run on (``spec.cluster``, else the bundled trace's
    or the format's own), less the jobs too large for it with ``drop_oversized``."""
    loader, path = resolve_loader(spec)
    default = BUNDLED_CLUSTERS.get(spec.trace, loader.default_cluster)
    cluster = load_cluster(spec.cluster or default)
    jobs = loader.load(path, cluster, np.random.default_rng(spec.seed))
    if len(jobs) == 0:  # a header-only file would summarise to nulls
        dropped = sum((jobs.dropped_invalid or {}).values())
        why = f" ({dropped} rows dropped as invalid)" if dropped else ""
        raise TraceFormatError(path or spec.trace, None, None, f"holds no jobs{why}")
    if spec.drop_oversized:
        jobs = drop_oversized(jobs, cluster, path or spec.trace)
    if spec.jitter_s > 0:
        jobs = jitter_arrivals(jobs, spec.jitter_s, spec.seed)
    return jobs, cluster


def dropping_invalid(spec: RunSpec) -> RunSpec:
    """``spec`` with its trace format's ``drop_invalid`` on (``--drop-invalid``); a synthetic
    trace, whose jobs are never invalid, is unchanged."""
    fmt = trace_format(spec.trace, spec.format)
    if fmt is None or fmt == "synthetic":
        return spec
    options = {**spec.trace_options.get(fmt, {}), "drop_invalid": True}
    return spec.replace(trace_options={**spec.trace_options, fmt: options})


def bundled_dropped(trace: str) -> dict[str, int] | None:
    """The rows of bundled ``trace`` that cannot be simulated, by reason, as ``--drop-invalid``
    drops them; None for a generated trace."""
    jobs, _ = load_jobs(dropping_invalid(RunSpec(trace=trace)))
    return None if jobs.dropped_invalid is None else dict(jobs.dropped_invalid)


def drop_oversized(jobs: JobTable, cluster: Cluster, source: Path | str) -> JobTable:
    """The jobs that fit ``cluster``, with the count of the others as ``dropped_oversized``."""
    fits = np.flatnonzero(jobs.gpus <= cluster.gpus)
    if fits.size == 0:
        raise TraceFormatError(
            source,
            None,
            None,
            f"every job needs more than the {cluster.gpus} GPUs of {cluster.name!r}",
        )
    dropped = len(jobs) - int(fits.size)
    kept = jobs.subset(fits) if dropped else jobs
    return kept.with_notes(dropped_oversized=dropped)


def jitter_arrivals(jobs: JobTable, jitter_s: float, seed: int) -> JobTable:
    """The same jobs with each arrival moved by a uniform draw in +-jitter_s (seeded)."""
    rng = np.random.default_rng([seed, 0x6A17])
    shift = exact.uniform(rng, -jitter_s, jitter_s, len(jobs))
    return jobs.with_arrivals(np.maximum(jobs.arrival_s + shift, 0.0))


def simulate(
    spec: RunSpec,
    progress: ProgressFn | None = None,
    loaded: tuple[JobTable, Cluster] | None = None,
) -> SimResult:
    """Run one simulation (``loaded`` skips re-reading the trace)."""
    jobs, cluster = loaded or load_jobs(spec)
    sim = Simulator(
        jobs,
        cluster,
        build_scheduler(spec.scheduler, spec.scheduler_options),
        build_placement(spec.placement),
        spec.engine,
        seed=spec.seed,
    )
    return sim.run(progress)


def run_summary(spec: RunSpec, res: SimResult) -> dict[str, Any]:
    summary = summarize(res)
    summary.update(trace=spec.trace, seed=spec.seed, congestion=spec.engine.congestion)
    summary.update(res.jobs.trace_notes)  # what loading skipped, rounded or dropped
    if res.jobs.dropped_invalid is not None:
        summary["dropped_invalid"] = sum(res.jobs.dropped_invalid.values())
        summary["dropped_invalid_by_reason"] = dict(res.jobs.dropped_invalid)
    return summary


def write_run(out: Path, spec: RunSpec, res: SimResult) -> dict[str, Any]:
    """Write summary.json, jobs.parquet and utilization.parquet to ``out``; return the summary."""
    summary = run_summary(spec, res)
    write_parquet(out / "jobs.parquet", job_columns(res))
    t, frac = utilization_series(res)
    write_parquet(out / "utilization.parquet", {"t_s": t, "busy_frac": frac})
    write_json(out / "summary.json", summary)  # last: its presence marks a complete run
    return summary


def compare(
    spec: RunSpec,
    schedulers: Sequence[str],
    on_done: Callable[[str, SimResult], None] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    loaded: tuple[JobTable, Cluster] | None = None,
) -> dict[str, SimResult]:
    """Run several schedulers over the same loaded trace (``loaded``, or read from ``spec``);
    ``options`` gives per-scheduler options (others run with ``spec.scheduler_options``)."""
    loaded = loaded or load_jobs(spec)
    results: dict[str, SimResult] = {}
    for name in schedulers:
        opts = (options or {}).get(name, spec.scheduler_options)
        res = simulate(spec.replace(scheduler=name, scheduler_options=opts), loaded=loaded)
        results[name] = res
        if on_done is not None:
            on_done(name, res)
    return results
