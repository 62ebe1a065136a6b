"""Parameter sweeps of the cluster simulator: every trace x scheduler x congestion x seed, run in
parallel on local processes or on Ray, one row per run plus a summary grouped over the seeds."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recperf.cluster.api import (
    RunSpec,
    build_placement,
    build_scheduler,
    checked_options,
    load_jobs,
    trace_scopes,
)
from recperf.cluster.limits import MAX_SWEEP_RUNS
from recperf.cluster.outcome import EngineConfig
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
from recperf.cluster.sweep_results import (
    GROUP_KEYS,
    GROUP_METRICS,
    SweepResult,
    jobs_table,
    summarize_groups,
    uniform_rows,
    write_sweep,
)
from recperf.cluster.sweep_store import RunStore
from recperf.cluster.sweep_tally import SweepTally
from recperf.cluster.topology import preset_names
from recperf.cluster.traces import BUNDLED
from recperf.core.config import (
    check_range,
    check_seed,
    from_mapping,
    parse_floats,
    parse_names,
    parse_seeds,
)
from recperf.core.errors import ConfigError
from recperf.core.progress import CountFn, ProgressFn
from recperf.core.results import exclusive_dir

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
    "SweepSpec",
    "error_text",
    "failed_outcome",
    "run_one",
    "run_sweep",
    "split_trace",
    "summarize_groups",
    "write_sweep",
]

BACKENDS = ("local", "ray", "serial")


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


Resolve = Callable[[Sequence[str]], dict[str, dict[str, Any]]]
"""Options by scope for the scopes named (``Settings.resolve``: --config, --set and flags)."""


def _no_options(scopes: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {s: {} for s in scopes}


@dataclass(kw_only=True, frozen=True, slots=True)
class SweepSpec:
    """A sweep as a command states it: its runs and where they execute. ``build`` makes one from
    the command line's text; each bad value is one ConfigError naming its flag or field."""

    sweep: Sweep
    """The runs."""
    backend: str = "local"
    """Where runs execute: local (a process pool), ray, or serial (in this process)."""
    workers: int | None = None
    """Parallel runs (local processes or CPUs of a local Ray); None: every CPU."""
    address: str | None = None
    """The Ray cluster's address, only with backend ray; None: start Ray here."""
    keep_jobs: bool = False
    """Also keep every run's per-job rows (jobs.parquet)."""
    resume: bool = False
    """Keep the runs an interrupted sweep left in ``out/runs`` and run only the rest."""

    def __post_init__(self) -> None:
        check_backend(self.backend, self.workers, self.address)

    @classmethod
    def build(
        cls,
        *,
        traces: str,
        schedulers: str,
        congestion: str = "1",
        seeds: str = "0",
        max_runs: int = MAX_SWEEP_RUNS,
        options: Resolve = _no_options,
        fmt: str | None = None,
        placement: str = "best-fit",
        cluster: str | None = None,
        jitter_s: float = 0.0,
        drop_invalid: bool = False,
        drop_oversized: bool = False,
        backend: str = "local",
        workers: int | None = None,
        address: str | None = None,
        keep_jobs: bool = False,
        resume: bool = False,
    ) -> SweepSpec:
        """From the flags' text (``--traces a,b@c --seeds 0-4``) and ``options``, which gives
        the engine's, the trace formats', the placement's and each scheduler's options."""
        names = parse_names(schedulers, "--schedulers")
        check_range("--max-runs", max_runs, 1, 10**9)
        n_seeds = seed_count(seeds)
        if n_seeds > max_runs:  # before listing them: 0-10000000000 would exhaust memory
            raise ConfigError(f"--seeds {seeds}: {n_seeds:,} seeds, above --max-runs {max_runs:,}")
        entries = parse_names(traces, "--traces")
        formats = trace_scopes([split_trace(t)[0] for t in entries], fmt)
        opts = options(["engine", *formats, placement, *names])
        if "congestion" in opts["engine"]:
            raise ConfigError("engine.congestion: a sweep takes its congestion from --congestion")
        base = RunSpec(
            format=fmt,
            placement=placement,
            cluster=cluster,
            jitter_s=jitter_s,
            trace_options=checked_options(opts, formats, placement, drop_invalid),
            drop_oversized=drop_oversized,
            engine=from_mapping(EngineConfig, opts["engine"], "engine"),
        )
        sweep = Sweep(
            traces=entries,
            schedulers=names,
            congestion=parse_floats(congestion, "--congestion"),
            seeds=parse_seeds(seeds, "--seeds"),
            scheduler_options={n: opts[n] for n in names if opts[n]},
            base=base,
            max_runs=max_runs,
        )
        return cls(
            sweep=sweep, backend=backend, workers=workers, address=address,
            keep_jobs=keep_jobs, resume=resume,
        )  # fmt: skip

    def run(self, out: str | Path | None = None, counts: CountFn | None = None) -> SweepResult:
        """``run_sweep`` of this spec, writing each run to ``out/runs`` as it finishes."""
        return run_sweep(
            self.sweep, backend=self.backend, workers=self.workers, address=self.address,
            keep_jobs=self.keep_jobs, counts=counts, out=out, resume=self.resume,
        )  # fmt: skip


def seed_count(text: str) -> int:
    """How many seeds ``--seeds`` lists, counted without listing them (0 for what
    ``parse_seeds`` will reject)."""
    total = 0
    for item in text.split(","):
        lo, dash, hi = item.strip().partition("-")
        if lo.strip().isdigit() and (not dash or hi.strip().isdigit()):
            total += max(int(hi) - int(lo) + 1, 0) if dash else 1
    return total


def check_backend(backend: str, workers: int | None, address: str | None) -> None:
    """A known backend, ``address`` only for Ray, and a sane number of workers."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if address is not None and backend != "ray":
        raise ConfigError("--address only applies to --backend ray")
    if workers is not None:
        check_range("workers", workers, 1, 4096)


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
    check_backend(backend, workers, address)
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
    return SweepResult(sweep, uniform_rows([o.row for o in finished]), jobs_table(finished))


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
