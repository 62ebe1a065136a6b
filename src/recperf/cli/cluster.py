"""``recperf cluster``: simulate GPU-cluster schedulers on real or synthetic traces."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from recperf.cli.common import console, err_console, print_table
from recperf.cli.common import fmt as fmt_value
from recperf.cli.options import Flag, Settings, command
from recperf.cluster.api import (
    RunSpec,
    build_placement,
    build_scheduler,
    bundled_dropped,
    checked_options,
    compare,
    load_jobs,
    simulate,
    trace_scopes,
    write_run,
)
from recperf.cluster.base import PLACEMENTS, SCHEDULERS, TRACE_LOADERS
from recperf.cluster.engine import check_fits
from recperf.cluster.limits import MAX_SWEEP_RUNS
from recperf.cluster.outcome import EngineConfig
from recperf.cluster.topology import load_cluster, preset_names
from recperf.cluster.traces import BUNDLED
from recperf.cluster.traces.synthetic import SyntheticConfig
from recperf.core.config import from_mapping, parse_names
from recperf.core.errors import ConfigError
from recperf.core.progress import counts_from_first_update, progress_bar

app = typer.Typer(help="GPU-cluster scheduling simulator on real traces.", no_args_is_help=True)

TABLE_COLUMNS = (
    "scheduler",
    "jobs_finished",
    "makespan_s",
    "jct_mean_s",
    "jct_p95_s",
    "queue_mean_s",
    "utilization",
    "comm_overhead_frac",
    "preemptions",
    "locality_wait_share",
)

TraceOpt = typer.Option(
    ..., "--trace", help=f"Bundled trace ({', '.join(BUNDLED)}) or a file path."
)
FormatOpt = typer.Option(
    None, "--format", help=f"Format of a trace file: {', '.join(TRACE_LOADERS)}."
)
PlacementOpt = typer.Option(
    "best-fit", help=f"Placement policy: {', '.join(PLACEMENTS)}, or module:attr."
)
ClusterOpt = typer.Option(
    None,
    help=f"Cluster preset ({', '.join(preset_names())}) or a TOML file. Default: the trace's "
    "own cluster.",
)
SeedOpt = typer.Option(0, help="Seed for synthetic traces and random placement.")
JitterOpt = typer.Option(
    None,
    "--jitter-s",
    help="Move each arrival by a seeded uniform draw in +-S seconds (seeds then differ on "
    "real traces).",
)
SCOPES_HELP = (
    "synthetic, engine, a trace format (csv, helios, philly-raw) or a scheduler's name, e.g. "
    "tiresias, netsens"
)
DropOpt = typer.Option(
    False,
    "--drop-oversized",
    help="Drop the jobs that need more GPUs than the cluster has (counted as dropped_oversized "
    "in the summary) instead of failing on the first.",
)
DropInvalidOpt = typer.Option(
    False,
    "--drop-invalid",
    help="Drop the trace rows that cannot be simulated (a run time <= 0, no GPUs, a missing or "
    "unreadable field), counted by reason as dropped_invalid in the summary, instead of failing "
    "on the first (= --set FORMAT.drop_invalid=true; synthetic jobs are never invalid).",
)

TIMERS = Flag("timers", "netsens", str | None,
    "netsens delay timers: auto (learned per GPU-demand class) or RACK_S,NET_S fixed seconds "
    "before accepting a rack-level / cross-rack placement; only with netsens in the run",
)  # fmt: skip
ENGINE_FLAGS = (
    Flag("checkpoint_s", "engine", float | None,
         "Seconds a preempted job keeps its GPUs"),
    Flag("restore_s", "engine", float | None,
         "Seconds a resumed job holds GPUs before progressing"),
    Flag("round_s", "engine", float | None,
         "Preemption round length (s); 0 = any event"),
    Flag("network", "engine", str | None,
         "on: the network model; off: every placement at the job's consolidated rate, no "
         "shared links (Gavel's assumption)"),
    Flag("rounds_s", "engine", float | None,
         "Decide only every S seconds, as round-based simulators do (Gavel: 360); 0 = at "
         "every event", names=("--rounds",)),
)  # fmt: skip
CONGESTION = Flag("congestion", "engine", float | None,
    "Factor (>= 1) on rack-uplink oversubscription: 1 = the cluster's own, 4 = a network four "
    "times as congested",
)  # fmt: skip
SYNTHETIC_FLAGS = (
    Flag("jobs", "synthetic", int | None, "Synthetic: number of jobs"),
    Flag("load", "synthetic", float | None,
         "Synthetic: offered load (arrival rate x GPU-seconds / GPUs)"),
    Flag("gpus_per_job", "synthetic", str | None,
         "Synthetic: K, or a mix like 1:0.6,4:0.3,8:0.1"),
    Flag("duration_dist", "synthetic", str | None,
         "Synthetic: exp or lognormal"),
    Flag("mean_duration_s", "synthetic", float | None,
         "Synthetic: mean job run time (s)"),
)  # fmt: skip
TRACE_FLAGS = (
    Flag("columns", "csv", str | None,
         "csv: KEY=COLUMN pairs, e.g. arrival=submit,duration=runtime,gpus=num_gpus "
         "(optional keys: model, user, id)"),
    Flag("time_format", "csv", str | None,
         "csv: strptime format of the arrival column, e.g. '%d/%m/%Y %H:%M' (default: seconds "
         "or ISO date-times)"),
    Flag("duration_unit", "csv", str | None,
         "csv: unit of the duration column: s, min or h"),
)  # fmt: skip
RUN_FLAGS = (*SYNTHETIC_FLAGS, *ENGINE_FLAGS, CONGESTION, TIMERS, *TRACE_FLAGS)


def build_spec(
    settings: Settings,
    *,
    trace: str,
    fmt: str | None,
    schedulers: Sequence[str],
    placement: str,
    cluster: str | None,
    seed: int,
    jitter_s: float | None,
    drop_oversized: bool = False,
    drop_invalid: bool = False,
) -> tuple[RunSpec, dict[str, dict[str, Any]]]:
    """The RunSpec of the first scheduler and every scheduler's validated options, from the
    --config tables, --set pairs and shortcut flags (flags win)."""
    is_synthetic = trace == "synthetic" or fmt == "synthetic"
    if not is_synthetic:
        given = [k for (scope, k) in settings.flags if scope == "synthetic"]
        given += [p.partition("=")[0] for p in settings.sets if p.startswith("synthetic.")]
        if given:
            raise ConfigError(f"--{given[0].replace('_', '-')} only applies to --trace synthetic")
    renamed = {"scheduler": schedulers[0]} if len(schedulers) == 1 else {}
    formats = trace_scopes([trace], fmt)  # their loaders' Configs are --set scopes too
    opts = settings.resolve(["synthetic", "engine", *formats, placement, *schedulers], renamed)
    trace_options = checked_options(opts, formats, placement, drop_invalid)
    build_placement(placement)
    per_scheduler = {s: opts[s] for s in schedulers}
    for name in schedulers:  # a misspelt name, a bad option or a non-scheduler fails now
        build_scheduler(name, per_scheduler[name])
    spec = RunSpec(
        trace=trace,
        format=fmt,
        scheduler=schedulers[0],
        scheduler_options=per_scheduler[schedulers[0]],
        placement=placement,
        cluster=cluster,
        seed=seed,
        synthetic=from_mapping(SyntheticConfig, opts["synthetic"], "synthetic"),
        trace_options=trace_options,
        drop_oversized=drop_oversized,
        engine=from_mapping(EngineConfig, opts["engine"], "engine"),
        jitter_s=jitter_s or 0.0,
    )
    return spec, per_scheduler


@command(
    app, "simulate", writes="summary.json, jobs.parquet, utilization.parquet", out="required",
    scopes_help=SCOPES_HELP, flags=RUN_FLAGS,
)  # fmt: skip
def simulate_cmd(
    settings: Settings,
    trace: str = TraceOpt,
    scheduler: str = typer.Option(..., help=f"Scheduler: {', '.join(SCHEDULERS)}, or module:attr."),
    fmt: str | None = FormatOpt,
    placement: str = PlacementOpt,
    cluster: str | None = ClusterOpt,
    seed: int = SeedOpt,
    jitter_s: float | None = JitterOpt,
    drop_oversized: bool = DropOpt,
    drop_invalid: bool = DropInvalidOpt,
    opt: list[str] | None = typer.Option(
        None, "--opt", help="KEY=VALUE: alias of --set SCHEDULER.KEY=VALUE (repeatable)."
    ),
) -> None:
    """Simulate one scheduler on a trace and write its results to --out."""
    settings = settings.with_sets((f"{scheduler}.{pair}" for pair in opt or []), "--opt")
    spec, _ = build_spec(
        settings, trace=trace, fmt=fmt, schedulers=[scheduler], placement=placement,
        cluster=cluster, seed=seed, jitter_s=jitter_s, drop_oversized=drop_oversized,
        drop_invalid=drop_invalid,
    )  # fmt: skip
    out = settings.out
    assert out is not None
    loaded = load_jobs(spec)
    check_fits(*loaded)  # before the progress line: a too-small cluster is one line
    t0 = time.perf_counter()
    with progress_bar(f"{spec.scheduler} on {spec.trace}") as bar:
        res = simulate(spec, progress=bar, loaded=loaded)
    wall = time.perf_counter() - t0
    summary = write_run(out, spec, res)
    settings.emit(summary, name=None)  # write_run wrote summary.json
    print_table(
        f"{spec.trace} on {summary['cluster']} ({summary['cluster_gpus']} GPUs)",
        [summary],
        TABLE_COLUMNS,
    )
    err_console.print(
        f"{res.events:,} events in {wall:.2f} s ({res.events / max(wall, 1e-9):,.0f}/s); "
        f"results in {out}",
        markup=False, highlight=False,
    )  # fmt: skip


@command(
    app, "compare", writes="compare.json and one subfolder per scheduler", out="required",
    scopes_help=SCOPES_HELP, flags=RUN_FLAGS,
)  # fmt: skip
def compare_cmd(
    settings: Settings,
    trace: str = TraceOpt,
    schedulers: str = typer.Option(
        "fifo,sjf,srtf,tiresias,consolidate,netsens", help="Comma-separated schedulers."
    ),
    fmt: str | None = FormatOpt,
    placement: str = PlacementOpt,
    cluster: str | None = ClusterOpt,
    seed: int = SeedOpt,
    jitter_s: float | None = JitterOpt,
    drop_oversized: bool = DropOpt,
    drop_invalid: bool = DropInvalidOpt,
) -> None:
    """Run several schedulers on the same trace and print one table."""
    names = parse_names(schedulers, "--schedulers")
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:  # both would write --out/NAME
        raise ConfigError(f"--schedulers lists {dup!r} twice")
    spec, per_scheduler = build_spec(
        settings, trace=trace, fmt=fmt, schedulers=names, placement=placement, cluster=cluster,
        seed=seed, jitter_s=jitter_s, drop_oversized=drop_oversized, drop_invalid=drop_invalid,
    )  # fmt: skip
    out = settings.out
    assert out is not None
    loaded = load_jobs(spec)  # a bad trace or a too-small cluster fails before any progress
    check_fits(*loaded)
    rows: list[dict[str, Any]] = []
    with progress_bar(f"{len(names)} schedulers on {trace}") as bar:

        def done(name: str, res: Any) -> None:
            run_spec = spec.replace(scheduler=name, scheduler_options=per_scheduler[name])
            rows.append(write_run(out / name, run_spec, res))
            bar(len(rows) / len(names))

        compare(spec, names, on_done=done, options=per_scheduler, loaded=loaded)
    settings.emit({"trace": trace, "runs": rows}, "compare.json")
    title = f"{trace} on {rows[0]['cluster']} ({rows[0]['cluster_gpus']} GPUs)"
    print_table(title, rows, TABLE_COLUMNS)


def sweep_table_rows(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The grouped summary as table cells: ok/total runs and ``mean ± std`` over the seeds."""
    from recperf.cluster.sweep import GROUP_METRICS, split_trace

    rows = []
    for g in groups:
        name = split_trace(g["trace"])[0]  # a TOML path would crowd out the trace name
        row = {
            "trace": f"{name if name in BUNDLED else Path(name).name}@{g['cluster']}",
            "scheduler": g["scheduler"],
            "congestion": f"{g['congestion']:g}",
        }
        row["runs_ok"] = f"{g['runs_ok']}/{g['runs_ok'] + g['runs_failed']}"
        for m in GROUP_METRICS:
            mean, std = g[f"{m}_mean"], g[f"{m}_std"]
            row[m] = fmt_value(mean) if std != std else f"{fmt_value(mean)} ± {fmt_value(std)}"
        row["preemptions"] = g["preemptions_mean"]
        rows.append(row)
    return rows


@command(
    app, "sweep", writes="sweep.json, runs.parquet and (with --jobs) jobs.parquet",
    out="required", scopes_help="engine, a trace format (csv, helios ...) or a scheduler's name",
    flags=(*ENGINE_FLAGS, TIMERS, *TRACE_FLAGS),
)  # fmt: skip
def sweep_cmd(
    settings: Settings,
    traces: str = typer.Option(
        ...,
        help="Comma-separated traces: bundled names or files, each optionally @CLUSTER "
        "(a preset or TOML file), e.g. philly@philly-third,helios-500.",
    ),
    schedulers: str = typer.Option(
        "fifo,sjf,srtf,tiresias,consolidate,netsens",
        help=f"Comma-separated schedulers ({', '.join(SCHEDULERS)}, or module:attr).",
    ),
    congestion: str = typer.Option(
        "1", help="Comma-separated rack-uplink congestion factors (>= 1), e.g. 1,2,4."
    ),
    seeds: str = typer.Option("0", help="Seeds: a range 0-4, a list 0,3,7, or a mix 0-2,9."),
    backend: str = typer.Option(
        "local",
        help="Where runs execute: local (a process pool), ray (a Ray cluster; needs the "
        "ray extra of recperf) or serial (in this process, for debugging).",
    ),
    workers: int | None = typer.Option(
        None, help="Parallel runs (local processes or CPUs of a local Ray). Default: all CPUs."
    ),
    address: str | None = typer.Option(
        None, help="Ray cluster address (e.g. auto or ray://host:10001); default: start Ray here."
    ),
    cluster: str | None = typer.Option(
        None,
        help="Cluster for traces without @CLUSTER: a preset "
        f"({', '.join(preset_names())}) or a TOML file. Default: each trace's own cluster.",
    ),
    fmt: str | None = typer.Option(
        None,
        "--format",
        help=f"Format of trace files ({', '.join(TRACE_LOADERS)}); bundled names know their own.",
    ),
    placement: str = PlacementOpt,
    jitter_s: float = typer.Option(
        0.0,
        "--jitter-s",
        help="Move each arrival by a seeded uniform draw in +-S seconds, so seeds differ on "
        "real traces; 0 keeps arrivals as traced.",
    ),
    opt: list[str] | None = typer.Option(
        None, "--opt", help="SCHED.KEY=VALUE: alias of --set SCHED.KEY=VALUE (repeatable)."
    ),
    keep_jobs: bool = typer.Option(
        True, "--jobs/--no-jobs", help="Also write every run's per-job rows to jobs.parquet."
    ),
    max_runs: int = typer.Option(
        MAX_SWEEP_RUNS, help="Refuse a sweep of more runs than this (a guard against typos)."
    ),
    drop_invalid: bool = DropInvalidOpt,
    drop_oversized: bool = DropOpt,
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Keep the runs an interrupted sweep left in --out/runs and run only the rest (the "
        "sweep must be the same; without --resume such an --out is refused).",
    ),
) -> None:
    """Run every trace x scheduler x congestion x seed in parallel; print means over the seeds.

    Each run is written to --out/runs as it finishes, so an interrupt keeps the finished runs
    and --resume runs only the rest. Exit code 0 when all runs succeed, 1 when some failed
    (their errors are in sweep.json and on stderr; the other runs' results are still written),
    2 for bad input.
    """
    from recperf.cluster.sweep import GROUP_METRICS, SweepInterrupted, SweepSpec, write_sweep

    spec = SweepSpec.build(
        traces=traces, schedulers=schedulers, congestion=congestion, seeds=seeds,
        max_runs=max_runs, options=settings.with_sets(opt or [], "--opt").resolve, fmt=fmt,
        placement=placement, cluster=cluster, jitter_s=jitter_s, drop_invalid=drop_invalid,
        drop_oversized=drop_oversized, backend=backend, workers=workers, address=address,
        keep_jobs=keep_jobs, resume=resume,
    )  # fmt: skip
    out = settings.out
    assert out is not None
    try:
        with counts_from_first_update(f"sweep ({backend})", "runs") as bar:
            result = spec.run(out, counts=bar)
    except SweepInterrupted as stop:
        say(f"{stop.kept} of {stop.total} runs kept in {out / 'runs'}; to run the other "
            f"{stop.total - stop.kept}, repeat the command with --resume")  # fmt: skip
        raise
    summary = write_sweep(out, result)
    settings.emit(summary, name=None)  # write_sweep wrote sweep.json
    print_table(
        f"{spec.sweep.size} runs: {summary['runs_ok']} ok, {summary['runs_failed']} failed "
        "(mean and std over the ok seeds)",
        sweep_table_rows(summary["groups"]),
        ("trace", "scheduler", "congestion", "runs_ok", *GROUP_METRICS, "preemptions"),
    )
    for f in summary["failures"]:
        say(f"failed: {f['trace']}/{f['scheduler']}/congestion {f['congestion']:g}/"
            f"seed {f['seed']}: {f['error']}")  # fmt: skip
    say(f"results in {out}")
    if summary["failures"]:
        raise typer.Exit(1)


def say(line: str) -> None:
    """One line to stderr as it is: paths and error texts may hold rich markup characters."""
    err_console.print(line, markup=False, highlight=False, soft_wrap=True)


def _trace_entry(name: str) -> str:
    """A bundled trace, described, with how many rows --drop-invalid drops from it."""
    dropped = bundled_dropped(name) if BUNDLED[name].format != "synthetic" else None
    count = "" if dropped is None else f"; {sum(dropped.values())} rows dropped as invalid"
    return f"{name} ({BUNDLED[name].description}{count})"


@app.command("list")
def list_cmd() -> None:
    """List bundled traces (with the rows each drops as invalid), cluster presets, schedulers
    and placement policies."""
    console.print("[bold]traces[/]: " + ", ".join(_trace_entry(k) for k in BUNDLED))
    console.print(
        "[bold]clusters[/]: " + ", ".join(f"{k} ({load_cluster(k).shape})" for k in preset_names())
    )
    console.print("[bold]schedulers[/]: " + ", ".join(SCHEDULERS))
    console.print("[bold]placements[/]: " + ", ".join(PLACEMENTS))
    console.print("[bold]formats[/]: " + ", ".join(TRACE_LOADERS))
