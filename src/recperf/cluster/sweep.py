"""Parameter sweeps of the cluster simulator: every trace x scheduler x congestion x seed, run in
parallel on local processes or on Ray, one row per run plus a summary grouped over the seeds."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from recperf.cluster.api import RunSpec, build_placement, build_scheduler, load_jobs
from recperf.cluster.limits import MAX_SWEEP_RUNS
from recperf.cluster.sweep_backends import (
    RUN_KEYS,
    OnDone,
    RunOutcome,
    SweepRun,
    _run_local,
    _run_ray,
    _run_serial,
    error_text,
    failed_outcome,
    run_one,
)
from recperf.cluster.sweep_store import RunStore
from recperf.cluster.sweep_tally import SweepTally
from recperf.cluster.topology import preset_names
from recperf.cluster.traces import BUNDLED
from recperf.core.config import check_range, check_seed
from recperf.core.errors import ConfigError
from recperf.core.progress import CountFn, ProgressFn
from recperf.core.results import exclusive_dir, write_json, write_parquet

__all__ = [
    "BACKENDS",
    "GROUP_KEYS",
    "GROUP_METRICS",
    "RUN_KEYS",
    "RunOutcome",
    "Sweep",
    "SweepInterrupted",
    "SweepResult",
    "SweepRun",
    "error_text",
    "failed_outcome",
    "run_one",
    "run_sweep",
    "split_trace",
    "summarize_groups",
    "write_sweep",
]

BACKENDS = ("local", "ray", "serial")
GROUP_KEYS = ("trace", "cluster", "scheduler", "congestion")
GROUP_METRICS = ("makespan_s", "jct_mean_s", "jct_p95_s", "comm_overhead_frac")


@dataclass(kw_only=True, frozen=True)
class Sweep:
    """A cartesian sweep; ``base`` holds what every run shares (placement, engine, jitter...)."""

    traces: tuple[str, ...]
    """Bundled names or files, each optionally ``@CLUSTER`` (a preset or TOML file)."""
    schedulers: tuple[str, ...]
    """Scheduler names or ``module:attr``."""
    congestion: tuple[float, ...] = (1.0,)
    """Values of EngineConfig.congestion (>= 1)."""
    seeds: tuple[int, ...] = (0,)
    """Seeds (>= 0) for placement, arrival jitter and synthetic traces."""
    scheduler_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Per-scheduler Config fields, merged over ``base.scheduler_options`` for that scheduler."""
    base: RunSpec = field(default_factory=RunSpec)
    """Shared settings; its trace, scheduler, seed and engine.congestion are replaced per run."""
    max_runs: int = MAX_SWEEP_RUNS
    """A larger sweep is refused (a typo like ``--seeds 0-100000`` would run for days)."""

    def __post_init__(self) -> None:
        check_range("max_runs", self.max_runs, 1, 10**9)
        for name in ("traces", "schedulers", "congestion", "seeds"):
            if not getattr(self, name):
                raise ConfigError(f"sweep: {name} is empty")
        if self.size > self.max_runs:
            raise ConfigError(
                f"sweep: {len(self.traces)} traces x {len(self.schedulers)} schedulers x "
                f"{len(self.congestion)} congestion values x {len(self.seeds)} seeds = "
                f"{self.size:,} runs, above the limit of {self.max_runs:,}; narrow it or raise "
                "the limit with --max-runs"
            )
        for name in ("traces", "schedulers", "congestion", "seeds"):
            values, seen = getattr(self, name), set()
            for v in values:
                if v in seen:
                    raise ConfigError(f"sweep: {name} lists {v!r} twice")
                seen.add(v)
        for c in self.congestion:
            dataclasses.replace(self.base.engine, congestion=c)  # EngineConfig checks the range
        for s in self.seeds:
            check_seed(s)
        stray = sorted(set(self.scheduler_options) - set(self.schedulers))
        if stray:
            raise ConfigError(
                f"options for scheduler {stray[0]!r}, which is not in the sweep; "
                f"allowed: {', '.join(self.schedulers)}"
            )

    @property
    def size(self) -> int:
        """The number of runs."""
        return len(self.traces) * len(self.schedulers) * len(self.congestion) * len(self.seeds)

    def options(self, scheduler: str) -> dict[str, Any]:
        return {**self.base.scheduler_options, **self.scheduler_options.get(scheduler, {})}

    def runs(self) -> list[SweepRun]:
        """Check every input once, then list the runs: trace x scheduler x congestion x seed.
        Bad input fails here, before any run starts: each scheduler and the placement policy
        are built once, and each trace is loaded once (a fraction of a second even for the
        15,264 Philly jobs) so that a garbled file is an error, not a failed run per seed."""
        for name in self.schedulers:
            build_scheduler(name, self.options(name))  # unknown name or bad option: fail now
        build_placement(self.base.placement)
        traces = [self._trace_spec(entry) for entry in self.traces]
        out = []
        for (entry, cluster, spec), sched, cong, seed in itertools.product(
            traces, self.schedulers, self.congestion, self.seeds
        ):
            run_spec = spec.replace(
                scheduler=sched,
                scheduler_options=self.options(sched),
                seed=seed,
                engine=dataclasses.replace(spec.engine, congestion=cong),
            )
            out.append(SweepRun(entry, cluster, sched, cong, seed, run_spec))
        return out

    def _trace_spec(self, entry: str) -> tuple[str, str, RunSpec]:
        name, cluster = split_trace(entry)
        spec = self.base.replace(
            trace=name,
            cluster=cluster or self.base.cluster,
            format=None if name in BUNDLED else self.base.format,
        )
        _, loaded_on = load_jobs(spec.replace(seed=self.seeds[0]))  # reads and checks the trace
        return entry, loaded_on.name, spec

    def definition(self) -> dict[str, Any]:
        """The sweep as plain data, for sweep.json."""
        shared = dataclasses.asdict(self.base)
        for key in ("trace", "scheduler", "seed"):
            shared.pop(key)
        shared["engine"].pop("congestion")
        return {
            "traces": list(self.traces),
            "schedulers": list(self.schedulers),
            "congestion": list(self.congestion),
            "seeds": list(self.seeds),
            "scheduler_options": {k: dict(v) for k, v in self.scheduler_options.items()},
            "shared": shared,
        }


def input_digests(sweep: Sweep) -> dict[str, str]:
    """The SHA-256 of each trace or cluster file the sweep reads (not the bundled ones), so a
    resumed sweep notices an input that changed since its first runs."""
    names = []
    for entry in sweep.traces:
        name, cluster = split_trace(entry)
        names += [name, cluster or sweep.base.cluster]
    digests = {}
    for name in dict.fromkeys(n for n in names if n and n not in BUNDLED):
        if name not in preset_names() and Path(name).is_file():
            digests[name] = hashlib.sha256(Path(name).read_bytes()).hexdigest()
    return digests


def split_trace(entry: str) -> tuple[str, str | None]:
    """``NAME@CLUSTER`` -> (NAME, CLUSTER); a bundled name or existing file keeps any ``@``."""
    if entry in BUNDLED or os.path.exists(entry):  # never raises (an overlong name: False)
        return entry, None
    name, sep, cluster = entry.rpartition("@")
    if not sep:
        return entry, None
    if not name or not cluster:
        raise ConfigError(f"trace entry {entry!r}: expected NAME or NAME@CLUSTER")
    return name, cluster


@dataclass(frozen=True)
class SweepResult:
    """Rows in the sweep's order with one column set, and all kept job rows as one table."""

    sweep: Sweep
    rows: list[dict[str, Any]]
    jobs: pa.Table | None

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] != "ok"]

    def groups(self) -> list[dict[str, Any]]:
        return summarize_groups(self.rows)


class SweepInterrupted(KeyboardInterrupt):
    """An interrupt (Ctrl-C, SIGTERM) during a sweep that keeps its runs in ``--out``: how many
    of them are finished there."""

    def __init__(self, kept: int, total: int) -> None:
        super().__init__(f"{kept} of {total} runs kept")
        self.kept, self.total = kept, total


def run_sweep(
    sweep: Sweep,
    *,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    keep_jobs: bool = False,
    progress: ProgressFn | None = None,
    counts: CountFn | None = None,
    out: str | Path | None = None,
    resume: bool = False,
) -> SweepResult:
    """Validate, then run every point of ``sweep`` on ``backend``; failed runs become rows.
    Bad input (a garbled trace, an unknown name, no Ray cluster) raises before any run starts,
    and before the first call of ``progress``, which is ``progress(0.0)`` as the runs begin
    (``counts`` likewise gets runs done, left and the estimated time left). With ``out``, each
    run is written to ``out/runs/`` as it finishes and the result is read back from there;
    ``resume`` keeps the runs of this sweep found there and runs the rest. An interrupt raises
    SweepInterrupted (a KeyboardInterrupt) saying how many runs ``out`` keeps."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if address is not None and backend != "ray":
        raise ConfigError("--address only applies to --backend ray")
    if workers is not None:
        check_range("workers", workers, 1, 4096)
    runs = sweep.runs()
    with ExitStack() as stack:
        store = None if out is None else _open_store(stack, Path(out), sweep, keep_jobs)
        kept = store.begin(runs, resume) if store is not None else {}
        todo = _interleaved(sweep, runs, [i for i in range(len(runs)) if i not in kept])
        width = 1 if backend == "serial" else workers or os.cpu_count() or 1
        tally = SweepTally(runs, {i: r["wall_s"] for i, r in kept.items()}, width, progress, counts)
        outcomes: list[RunOutcome | None] = [None] * len(runs)

        def on_done(j: int, outcome: RunOutcome) -> None:
            i = todo[j]
            if store is not None:
                store.save(runs[i], outcome)
            outcomes[i] = outcome
            tally.finished(i, outcome.row["wall_s"])

        try:
            sub = [runs[i] for i in todo]
            _execute(backend, sub, keep_jobs, width, address, on_done, tally.start)
        except KeyboardInterrupt:
            if store is None:
                raise
            raise SweepInterrupted(store.kept(runs), len(runs)) from None
        if store is not None:  # one road to the tables, whether the runs were kept or new
            outcomes = [store.load(run) for run in runs]
    finished = [o for o in outcomes if o is not None]
    assert len(finished) == len(runs), "a backend lost a run"
    return SweepResult(sweep, _uniform_rows([o.row for o in finished]), _jobs_table(finished))


def _open_store(stack: ExitStack, out: Path, sweep: Sweep, keep_jobs: bool) -> RunStore:
    """The run files of ``sweep`` in ``out``, which this process holds until ``stack`` closes
    (a second sweep into the same --out meanwhile is refused, not mixed in)."""
    out.mkdir(parents=True, exist_ok=True)
    stack.enter_context(exclusive_dir(out))
    spec = {**sweep.definition(), "keep_jobs": keep_jobs, "input_files": input_digests(sweep)}
    return RunStore(out, spec)  # what decides the results


def _interleaved(sweep: Sweep, runs: Sequence[SweepRun], todo: list[int]) -> list[int]:
    """``todo`` seed by seed, then congestion by congestion: the first runs to finish cover every
    trace and scheduler, so the time left is estimated from each one's own runs early on."""
    seed_at = {s: k for k, s in enumerate(sweep.seeds)}
    congestion_at = {c: k for k, c in enumerate(sweep.congestion)}
    return sorted(todo, key=lambda i: (seed_at[runs[i].seed], congestion_at[runs[i].congestion], i))


def _execute(
    backend: str,
    runs: Sequence[SweepRun],
    keep_jobs: bool,
    workers: int,
    address: str | None,
    on_done: OnDone,
    start: Callable[[], None],
) -> None:
    """Run ``runs`` on ``backend``; ``start()`` once every check passed, as the runs begin."""
    if backend == "serial" or not runs:  # nothing left: no pool, no Ray to start
        start()
        _run_serial(runs, keep_jobs, on_done)
    elif backend == "local":
        start()
        _run_local(runs, keep_jobs, min(workers, len(runs)), on_done)
    else:
        _run_ray(runs, keep_jobs, workers, address, on_done, on_start=start)


def _uniform_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every row the same columns; a failed run's metrics are None (null in Parquet)."""
    columns = [*RUN_KEYS, "status", "error", "wall_s"]
    for row in rows:
        columns += [k for k in row if k not in columns]
    return [{c: row.get(c) for c in columns} for row in rows]


def _jobs_table(outcomes: Sequence[RunOutcome]) -> pa.Table | None:
    tables = [pa.table(o.jobs) for o in outcomes if o.jobs is not None]
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="default")


def summarize_groups(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (trace, cluster, scheduler, congestion): runs ok/failed, and over the ok seeds the
    mean and sample std (ddof 1; NaN for one seed) of the main metrics and mean preemptions."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in GROUP_KEYS), []).append(row)
    out = []
    for key, members in groups.items():
        ok = [r for r in members if r["status"] == "ok"]
        group: dict[str, Any] = dict(zip(GROUP_KEYS, key, strict=True))
        group.update(runs_ok=len(ok), runs_failed=len(members) - len(ok))
        for metric in (*GROUP_METRICS, "preemptions"):
            vals = np.array([float(r[metric]) for r in ok], dtype=np.float64)
            group[f"{metric}_mean"] = float(vals.mean()) if vals.size else math.nan
            if metric != "preemptions":
                group[f"{metric}_std"] = float(vals.std(ddof=1)) if vals.size > 1 else math.nan
        out.append(group)
    return out


def write_sweep(out: str | Path, result: SweepResult) -> dict[str, Any]:
    """Write runs.parquet, jobs.parquet (if kept) and, last, sweep.json; return sweep.json."""
    out = Path(out)
    rows = result.rows
    write_parquet(out / "runs.parquet", {c: [r[c] for r in rows] for c in rows[0]})
    if result.jobs is not None:
        write_parquet(
            out / "jobs.parquet", {c: result.jobs.column(c) for c in result.jobs.schema.names}
        )
    else:
        (out / "jobs.parquet").unlink(missing_ok=True)  # a stale one would not match runs.parquet
    failed = result.failed
    summary = {
        "sweep": result.sweep.definition(),
        "runs_total": len(rows),
        "runs_ok": len(rows) - len(failed),
        "runs_failed": len(failed),
        "failures": [{**{k: r[k] for k in RUN_KEYS}, "error": r["error"]} for r in failed],
        "groups": result.groups(),
    }
    write_json(out / "sweep.json", summary)  # last: its presence marks a complete sweep
    return summary
