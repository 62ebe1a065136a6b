"""Parameter sweeps of the cluster simulator: every trace x scheduler x congestion x seed, run in
parallel on local processes or on Ray, one row per run plus a summary grouped over the seeds."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import math
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from recperf.cluster.api import RunSpec, build_scheduler, resolve_loader, run_summary, simulate
from recperf.cluster.base import PLACEMENTS
from recperf.cluster.metrics import job_columns
from recperf.cluster.topology import load_cluster
from recperf.cluster.traces import BUNDLED
from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.core.progress import ProgressFn
from recperf.core.results import write_json, write_parquet

BACKENDS = ("local", "ray", "serial")
RUN_KEYS = ("trace", "cluster", "scheduler", "congestion", "seed")
GROUP_KEYS = ("trace", "cluster", "scheduler", "congestion")
GROUP_METRICS = ("makespan_s", "jct_mean_s", "jct_p95_s", "comm_overhead_frac")
MAX_ERROR_CHARS = 300


@dataclass(frozen=True, slots=True)
class SweepRun:
    """One point of a sweep: its keys and the RunSpec that simulates it."""

    trace: str
    """The trace entry as given (``NAME`` or ``NAME@CLUSTER``)."""
    cluster: str
    """The name of the cluster it runs on."""
    scheduler: str
    congestion: float
    seed: int
    spec: RunSpec

    def keys(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in RUN_KEYS}


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What one run sends back: its row, and its per-job columns when they were asked for."""

    row: dict[str, Any]
    jobs: dict[str, Any] | None = None


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

    def __post_init__(self) -> None:
        for name in ("traces", "schedulers", "congestion", "seeds"):
            values = getattr(self, name)
            if not values:
                raise ConfigError(f"sweep: {name} is empty")
            dup = next((v for v in values if values.count(v) > 1), None)
            if dup is not None:
                raise ConfigError(f"sweep: {name} lists {dup!r} twice")
        for c in self.congestion:
            dataclasses.replace(self.base.engine, congestion=c)  # EngineConfig checks the range
        for s in self.seeds:
            check_range("seed", s, 0, 2**63 - 1)
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
        """Check every name cheaply, then list the runs: trace x scheduler x congestion x seed."""
        traces = [self._trace_spec(entry) for entry in self.traces]
        for name in self.schedulers:
            build_scheduler(name, self.options(name))  # unknown name or bad option: fail now
        PLACEMENTS.factory(self.base.placement)
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
        loader, _ = resolve_loader(spec)
        return entry, load_cluster(spec.cluster or loader.default_cluster).name, spec

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


def split_trace(entry: str) -> tuple[str, str | None]:
    """``NAME@CLUSTER`` -> (NAME, CLUSTER); a bundled name or existing file keeps any ``@``."""
    if entry in BUNDLED or Path(entry).exists():
        return entry, None
    name, sep, cluster = entry.rpartition("@")
    if not sep:
        return entry, None
    if not name or not cluster:
        raise ConfigError(f"trace entry {entry!r}: expected NAME or NAME@CLUSTER")
    return name, cluster


def run_one(run: SweepRun, keep_jobs: bool = False) -> RunOutcome:
    """Simulate one run; any exception becomes a failed row instead of propagating."""
    t0 = time.perf_counter()
    try:
        res = simulate(run.spec)
        summary = run_summary(run.spec, res)
        jobs = job_columns(res) if keep_jobs else None
    except Exception as exc:
        return failed_outcome(run, exc, time.perf_counter() - t0)
    row = {**run.keys(), "status": "ok", "error": "", "wall_s": time.perf_counter() - t0}
    row.update((k, v) for k, v in summary.items() if k not in row)
    if jobs is not None:
        n = len(res.jobs)
        tags = {k: [v] * n if isinstance(v, str) else np.full(n, v) for k, v in run.keys().items()}
        jobs = {**tags, **jobs}
    return RunOutcome(row, jobs)


def failed_outcome(run: SweepRun, exc: BaseException, wall_s: float = math.nan) -> RunOutcome:
    return RunOutcome(
        {**run.keys(), "status": "failed", "error": error_text(exc), "wall_s": wall_s}
    )


def error_text(exc: BaseException) -> str:
    """``ExcType: message`` on one line (a Ray task error is reported as its cause)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    message = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


OnDone = Callable[[int, RunOutcome], None]


def _run_serial(runs: Sequence[SweepRun], keep_jobs: bool, on_done: OnDone) -> None:
    for i, run in enumerate(runs):
        on_done(i, run_one(run, keep_jobs))


Task = Callable[[SweepRun, bool], RunOutcome]


def _run_local(
    runs: Sequence[SweepRun], keep_jobs: bool, workers: int, on_done: OnDone, task: Task = run_one
) -> None:
    """Run on a process pool. A worker that dies (segfault, OOM kill) breaks the whole pool and
    fails every unfinished run with it: those are retried on a fresh pool, and when a pool makes
    no progress, one at a time, so that only the run that kills its worker is reported failed."""
    todo, width = list(range(len(runs))), workers
    while todo:
        broken = _pool_pass(runs, todo, keep_jobs, width, on_done, task)
        if broken and width == 1:  # one worker runs tasks in order: the first broken one crashed
            i, exc = broken[0]
            on_done(i, failed_outcome(runs[i], exc))
            broken = broken[1:]
        stalled = len(broken) == len(todo)
        todo, width = [i for i, _ in broken], 1 if stalled else workers


def _pool_pass(
    runs: Sequence[SweepRun],
    todo: Sequence[int],
    keep_jobs: bool,
    workers: int,
    on_done: OnDone,
    task: Task,
) -> list[tuple[int, BaseException]]:
    """One pool over ``todo``; returns the runs lost to a broken pool, in submission order."""
    # fork is unsafe in a process with threads (rich, pyarrow); forkserver/spawn start clean.
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context(method))
    broken: list[tuple[int, BaseException]] = []
    try:
        futures = {pool.submit(task, runs[i], keep_jobs): i for i in todo}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                outcome = fut.result()
            except BrokenProcessPool as exc:
                broken.append((i, exc))
                continue
            except Exception as exc:  # e.g. a result that cannot be pickled back
                outcome = failed_outcome(runs[i], exc)
            on_done(i, outcome)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return sorted(broken, key=lambda b: b[0])  # todo is ascending: submission order


def _import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ConfigError(
            "--backend ray needs Ray, which is not installed: pip install 'recperf[ray]'"
        ) from None


def _run_ray(
    runs: Sequence[SweepRun],
    keep_jobs: bool,
    workers: int,
    address: str | None,
    on_done: OnDone,
    task: Task = run_one,
) -> None:
    ray = _import_ray()
    started = not ray.is_initialized()
    if started and address:
        ray.init(address=address)
    elif started:
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    pending: dict[Any, int] = {}
    try:
        remote = ray.remote(num_cpus=1)(task)
        pending = {remote.remote(run, keep_jobs): i for i, run in enumerate(runs)}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as exc:  # RayTaskError, WorkerCrashedError, ...
                    outcome = failed_outcome(runs[i], exc)
                on_done(i, outcome)
    finally:
        for ref in pending:  # interrupted: do not leave tasks running on a shared cluster
            ray.cancel(ref)
        if started:
            ray.shutdown()


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


def run_sweep(
    sweep: Sweep,
    *,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    keep_jobs: bool = False,
    progress: ProgressFn | None = None,
) -> SweepResult:
    """Validate, then run every point of ``sweep`` on ``backend``; failed runs become rows."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if address is not None and backend != "ray":
        raise ConfigError("--address only applies to --backend ray")
    if workers is not None:
        check_range("workers", workers, 1, 4096)
    runs = sweep.runs()
    n_workers = min(workers or os.cpu_count() or 1, len(runs))
    outcomes: list[RunOutcome | None] = [None] * len(runs)
    done = 0

    def on_done(i: int, outcome: RunOutcome) -> None:
        nonlocal done
        outcomes[i] = outcome
        done += 1
        if progress is not None:
            progress(done / len(runs))

    if backend == "serial":
        _run_serial(runs, keep_jobs, on_done)
    elif backend == "local":
        _run_local(runs, keep_jobs, n_workers, on_done)
    else:
        _run_ray(runs, keep_jobs, workers or os.cpu_count() or 1, address, on_done)
    finished = [o for o in outcomes if o is not None]
    assert len(finished) == len(runs), "a backend lost a run"
    return SweepResult(sweep, _uniform_rows([o.row for o in finished]), _jobs_table(finished))


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


def parse_seeds(text: str, flag: str = "--seeds") -> tuple[int, ...]:
    """``0-4``, ``0,3,7`` or a mix like ``0-2,9`` -> the seeds in the order given."""
    seeds: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        where = repr(item) if item == text.strip() else f"{item!r} in {text!r}"
        lo, dash, hi = item.partition("-")
        try:
            first, last = int(lo), int(hi if dash else lo)
        except ValueError:
            raise ConfigError(
                f"{flag}: cannot read {where}; expected e.g. 0-4, 0,3,7 or 0-2,9"
            ) from None
        if first < 0 or last < first:
            raise ConfigError(f"{flag}: {where} is not a range of seeds >= 0 (low-high)")
        seeds.extend(range(first, last + 1))
    return tuple(seeds)


def parse_floats(text: str, flag: str = "--congestion") -> tuple[float, ...]:
    """A comma list of numbers, e.g. ``1,2,4``."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(map(math.isfinite, values)):
        raise ConfigError(f"{flag}: expected comma-separated numbers, got {text!r}")
    return values


def parse_scheduler_overrides(
    pairs: Sequence[str] | None, schedulers: Sequence[str], flag: str = "--opt"
) -> dict[str, dict[str, str]]:
    """``SCHED.key=value`` flags -> {scheduler: {key: value}}; SCHED must be in ``schedulers``
    (matched as the longest listed name, so ``pkg.mod:Cls.key=v`` works too)."""
    out: dict[str, dict[str, str]] = {}
    for pair in pairs or []:
        target, sep, value = pair.partition("=")
        matches = [s for s in schedulers if target.startswith(f"{s}.") and len(target) > len(s) + 1]
        if not sep or not matches:
            raise ConfigError(
                f"{flag}: expected SCHEDULER.key=value with SCHEDULER one of "
                f"{', '.join(schedulers)}; got {pair!r}"
            )
        sched = max(matches, key=len)
        out.setdefault(sched, {})[target[len(sched) + 1 :].strip()] = value.strip()
    return out
