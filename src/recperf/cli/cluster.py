"""``recperf cluster``: simulate GPU-cluster schedulers on real or synthetic traces."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from recperf.cli.common import console, err_console, one_line_errors, print_table
from recperf.cli.common import fmt as fmt_value
from recperf.cluster.api import RunSpec, compare, load_jobs, simulate, write_run
from recperf.cluster.base import PLACEMENTS, SCHEDULERS, TRACE_LOADERS
from recperf.cluster.outcome import EngineConfig
from recperf.cluster.sweep import (
    Sweep,
    parse_floats,
    parse_scheduler_overrides,
    parse_seeds,
    run_sweep,
    split_trace,
    write_sweep,
)
from recperf.cluster.topology import PRESETS
from recperf.cluster.traces import BUNDLED
from recperf.cluster.traces.synthetic import SyntheticConfig
from recperf.core.config import from_mapping, load_toml, parse_overrides
from recperf.core.errors import ConfigError
from recperf.core.progress import progress_bar
from recperf.core.results import dumps_json, write_json

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
    help=f"Cluster preset ({', '.join(PRESETS)}) or a TOML file. Default: the trace's own cluster.",
)
SeedOpt = typer.Option(0, help="Seed for synthetic traces and random placement.")
ConfigOpt = typer.Option(
    None,
    "--config",
    help="TOML file with [synthetic], [engine] and [scheduler] tables; flags override it.",
)
JobsOpt = typer.Option(None, help="Synthetic: number of jobs.")
LoadOpt = typer.Option(None, help="Synthetic: offered load (arrival rate x GPU-seconds / GPUs).")
GpusOpt = typer.Option(
    None, "--gpus-per-job", help="Synthetic: K, or a mix like 1:0.6,4:0.3,8:0.1."
)
DistOpt = typer.Option(None, "--duration-dist", help="Synthetic: exp or lognormal.")
MeanOpt = typer.Option(None, "--mean-duration-s", help="Synthetic: mean job run time (s).")
CkptOpt = typer.Option(None, "--checkpoint-s", help="Seconds a preempted job keeps its GPUs.")
RestoreOpt = typer.Option(
    None, "--restore-s", help="Seconds a resumed job holds GPUs before progressing."
)
RoundOpt = typer.Option(None, "--round-s", help="Preemption round length (s); 0 = any event.")
OptOpt = typer.Option(None, "--opt", help="Scheduler option key=value (repeatable).")
CongestionOpt = typer.Option(
    None,
    "--congestion",
    help="Factor (>= 1) on rack-uplink oversubscription: 1 = the cluster's own, 4 = a "
    "network four times as congested.",
)
TimersOpt = typer.Option(
    None,
    "--timers",
    help="netsens delay timers: auto (learned per GPU-demand class) or RACK_S,NET_S fixed "
    "seconds before accepting a rack-level / cross-rack placement.",
)
JitterOpt = typer.Option(
    None,
    "--jitter-s",
    help="Move each arrival by a seeded uniform draw in +-S seconds (seeds then differ on "
    "real traces).",
)


SYNTHETIC_FLAGS = ("jobs", "load", "gpus_per_job", "duration_dist", "mean_duration_s")
ENGINE_FLAGS = ("checkpoint_s", "restore_s", "round_s", "congestion")
NETSENS = "netsens"


def build_spec(
    *,
    trace: str,
    fmt: str | None,
    scheduler: str,
    placement: str,
    cluster: str | None,
    seed: int,
    config: Path | None,
    opts: list[str] | None,
    timers: str | None = None,
    jitter_s: float | None = None,
    **flags: Any,
) -> RunSpec:
    """Merge a --config TOML file and the flags into one RunSpec (flags win). ``timers`` is
    netsens' option: an error for any other scheduler."""
    file: dict[str, Any] = load_toml(config) if config else {}
    unknown = sorted(set(file) - {"synthetic", "engine", "scheduler"})
    if unknown:
        raise ConfigError(
            f"{config}: unknown table [{unknown[0]}]; allowed: synthetic, engine, scheduler"
        )
    given = {k: flags[k] for k in SYNTHETIC_FLAGS if flags[k] is not None}
    is_synthetic = trace == "synthetic" or fmt == "synthetic"
    if given and not is_synthetic:
        raise ConfigError(
            f"--{next(iter(given)).replace('_', '-')} only applies to --trace synthetic"
        )
    synthetic = from_mapping(SyntheticConfig, {**file.get("synthetic", {}), **given}, "synthetic")
    eng = {**file.get("engine", {}), **{k: flags[k] for k in ENGINE_FLAGS if flags[k] is not None}}
    sched_opts = {**file.get("scheduler", {}), **parse_overrides(opts, "--opt")}
    if timers is not None:
        if scheduler != NETSENS:
            raise ConfigError(f"--timers only applies to --scheduler {NETSENS} (got {scheduler!r})")
        sched_opts["timers"] = timers
    return RunSpec(
        trace=trace,
        format=fmt,
        scheduler=scheduler,
        scheduler_options=sched_opts,
        placement=placement,
        cluster=cluster,
        seed=seed,
        synthetic=synthetic,
        engine=from_mapping(EngineConfig, eng, "engine"),
        jitter_s=jitter_s or 0.0,
    )


@app.command("simulate")
@one_line_errors
def simulate_cmd(
    trace: str = TraceOpt,
    scheduler: str = typer.Option(..., help=f"Scheduler: {', '.join(SCHEDULERS)}, or module:attr."),
    out: Path = typer.Option(
        ..., help="Directory for summary.json, jobs.parquet, utilization.parquet."
    ),
    fmt: str | None = FormatOpt,
    placement: str = PlacementOpt,
    cluster: str | None = ClusterOpt,
    seed: int = SeedOpt,
    config: Path | None = ConfigOpt,
    jobs: int | None = JobsOpt,
    load: float | None = LoadOpt,
    gpus_per_job: str | None = GpusOpt,
    duration_dist: str | None = DistOpt,
    mean_duration_s: float | None = MeanOpt,
    checkpoint_s: float | None = CkptOpt,
    restore_s: float | None = RestoreOpt,
    round_s: float | None = RoundOpt,
    congestion: float | None = CongestionOpt,
    timers: str | None = TimersOpt,
    jitter_s: float | None = JitterOpt,
    opt: list[str] | None = OptOpt,
    json_out: bool = typer.Option(False, "--json", help="Print summary.json to stdout."),
) -> None:
    """Simulate one scheduler on a trace and write its results to --out."""
    spec = build_spec(
        trace=trace, fmt=fmt, scheduler=scheduler, placement=placement, cluster=cluster,
        seed=seed, config=config, opts=opt, timers=timers, jitter_s=jitter_s, jobs=jobs,
        load=load, gpus_per_job=gpus_per_job, duration_dist=duration_dist,
        mean_duration_s=mean_duration_s, checkpoint_s=checkpoint_s, restore_s=restore_s,
        round_s=round_s, congestion=congestion,
    )  # fmt: skip
    loaded = load_jobs(spec)
    t0 = time.perf_counter()
    with progress_bar(f"{spec.scheduler} on {spec.trace}") as bar:
        res = simulate(spec, progress=bar, loaded=loaded)
    wall = time.perf_counter() - t0
    summary = write_run(out, spec, res)
    if json_out:
        typer.echo(dumps_json(summary), nl=False)
    print_table(
        f"{spec.trace} on {summary['cluster']} ({summary['cluster_gpus']} GPUs)",
        [summary],
        TABLE_COLUMNS,
    )
    err_console.print(
        f"{res.events:,} events in {wall:.2f} s ({res.events / max(wall, 1e-9):,.0f}/s); "
        f"results in {out}"
    )


@app.command("compare")
@one_line_errors
def compare_cmd(
    trace: str = TraceOpt,
    schedulers: str = typer.Option(
        "fifo,sjf,srtf,tiresias,consolidate,netsens", help="Comma-separated schedulers."
    ),
    out: Path = typer.Option(..., help="Directory: one subfolder per scheduler plus compare.json."),
    fmt: str | None = FormatOpt,
    placement: str = PlacementOpt,
    cluster: str | None = ClusterOpt,
    seed: int = SeedOpt,
    config: Path | None = ConfigOpt,
    jobs: int | None = JobsOpt,
    load: float | None = LoadOpt,
    gpus_per_job: str | None = GpusOpt,
    duration_dist: str | None = DistOpt,
    mean_duration_s: float | None = MeanOpt,
    checkpoint_s: float | None = CkptOpt,
    restore_s: float | None = RestoreOpt,
    round_s: float | None = RoundOpt,
    congestion: float | None = CongestionOpt,
    timers: str | None = TimersOpt,
    jitter_s: float | None = JitterOpt,
    json_out: bool = typer.Option(False, "--json", help="Print compare.json to stdout."),
) -> None:
    """Run several schedulers on the same trace and print one table."""
    names = [s.strip() for s in schedulers.split(",") if s.strip()]
    if not names:
        raise ConfigError("--schedulers is empty")
    for name in names:
        SCHEDULERS.factory(name)  # fail before any long run on a misspelt name
    spec = build_spec(
        trace=trace, fmt=fmt, scheduler=names[0], placement=placement, cluster=cluster,
        seed=seed, config=config, opts=None, jitter_s=jitter_s, jobs=jobs, load=load,
        gpus_per_job=gpus_per_job, duration_dist=duration_dist,
        mean_duration_s=mean_duration_s, checkpoint_s=checkpoint_s, restore_s=restore_s,
        round_s=round_s, congestion=congestion,
    )  # fmt: skip
    if timers is not None and NETSENS not in names:
        raise ConfigError(f"--timers only applies to {NETSENS}, which is not in --schedulers")
    per_scheduler = {NETSENS: {"timers": timers}} if timers is not None else {}
    rows: list[dict[str, Any]] = []
    with progress_bar(f"{len(names)} schedulers on {trace}") as bar:

        def done(name: str, res: Any) -> None:
            run_spec = spec.replace(scheduler=name, scheduler_options=per_scheduler.get(name, {}))
            rows.append(write_run(out / name, run_spec, res))
            bar(len(rows) / len(names))

        compare(spec, names, on_done=done, options=per_scheduler)
    write_json(out / "compare.json", {"trace": trace, "runs": rows})
    if json_out:
        typer.echo(dumps_json({"trace": trace, "runs": rows}), nl=False)
    print_table(
        f"{trace} on {rows[0]['cluster']} ({rows[0]['cluster_gpus']} GPUs)", rows, TABLE_COLUMNS
    )


SWEEP_METRICS = ("makespan_s", "jct_mean_s", "jct_p95_s", "comm_overhead_frac")


def sweep_table_rows(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The grouped summary as table cells: ok/total runs and ``mean ± std`` over the seeds."""
    rows = []
    for g in groups:
        name = split_trace(g["trace"])[0]  # a TOML path would crowd out the trace name
        row = {
            "trace": f"{name if name in BUNDLED else Path(name).name}@{g['cluster']}",
            "scheduler": g["scheduler"],
            "congestion": f"{g['congestion']:g}",
        }
        row["runs_ok"] = f"{g['runs_ok']}/{g['runs_ok'] + g['runs_failed']}"
        for m in SWEEP_METRICS:
            mean, std = g[f"{m}_mean"], g[f"{m}_std"]
            row[m] = fmt_value(mean) if std != std else f"{fmt_value(mean)} ± {fmt_value(std)}"
        row["preemptions"] = g["preemptions_mean"]
        rows.append(row)
    return rows


def split_list(text: str, flag: str) -> tuple[str, ...]:
    """A comma-separated flag value as a tuple; empty is an error naming the flag."""
    items = tuple(s.strip() for s in text.split(",") if s.strip())
    if not items:
        raise ConfigError(f"{flag} is empty")
    return items


@app.command("sweep")
@one_line_errors
def sweep_cmd(
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
    out: Path = typer.Option(
        ..., help="Directory for runs.parquet, jobs.parquet (with --jobs) and sweep.json."
    ),
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
        help=f"Cluster for traces without @CLUSTER: a preset ({', '.join(PRESETS)}) or a TOML "
        "file. Default: each trace's own cluster.",
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
    checkpoint_s: float | None = CkptOpt,
    restore_s: float | None = RestoreOpt,
    round_s: float | None = RoundOpt,
    opt: list[str] | None = typer.Option(
        None,
        "--opt",
        help="Option for one scheduler, SCHED.key=value, e.g. tiresias.min_run_s=60 (repeatable).",
    ),
    timers: str | None = TimersOpt,
    keep_jobs: bool = typer.Option(
        True, "--jobs/--no-jobs", help="Also write every run's per-job rows to jobs.parquet."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print sweep.json to stdout."),
) -> None:
    """Run every trace x scheduler x congestion x seed in parallel; print means over the seeds.

    Exit code 0 when all runs succeed, 1 when some failed (their errors are in sweep.json and
    on stderr; the other runs' results are still written), 2 for bad input.
    """
    names = split_list(schedulers, "--schedulers")
    if timers is not None:
        if NETSENS not in names:
            raise ConfigError(f"--timers only applies to {NETSENS}, which is not in --schedulers")
        opt = [*(opt or []), f"{NETSENS}.timers={timers}"]
    eng = {"checkpoint_s": checkpoint_s, "restore_s": restore_s, "round_s": round_s}
    base = RunSpec(
        format=fmt,
        placement=placement,
        cluster=cluster,
        jitter_s=jitter_s,
        engine=from_mapping(
            EngineConfig, {k: v for k, v in eng.items() if v is not None}, "engine"
        ),
    )
    sweep = Sweep(
        traces=split_list(traces, "--traces"),
        schedulers=names,
        congestion=parse_floats(congestion, "--congestion"),
        seeds=parse_seeds(seeds, "--seeds"),
        scheduler_options=parse_scheduler_overrides(opt, names, "--opt"),
        base=base,
    )
    n = sweep.size
    with progress_bar(f"{n} runs ({backend})") as bar:
        result = run_sweep(
            sweep, backend=backend, workers=workers, address=address, keep_jobs=keep_jobs,
            progress=bar,
        )  # fmt: skip
    summary = write_sweep(out, result)
    if json_out:
        typer.echo(dumps_json(summary), nl=False)
    print_table(
        f"{n} runs: {summary['runs_ok']} ok, {summary['runs_failed']} failed "
        "(mean and std over the ok seeds)",
        sweep_table_rows(summary["groups"]),
        ("trace", "scheduler", "congestion", "runs_ok", *SWEEP_METRICS, "preemptions"),
    )
    for f in summary["failures"]:
        err_console.print(
            f"failed: {f['trace']}/{f['scheduler']}/congestion {f['congestion']:g}/"
            f"seed {f['seed']}: {f['error']}",
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip
    err_console.print(f"results in {out}", markup=False, highlight=False)
    if summary["failures"]:
        raise typer.Exit(1)


@app.command("list")
def list_cmd() -> None:
    """List bundled traces, cluster presets, schedulers and placement policies."""
    console.print(
        "[bold]traces[/]: " + ", ".join(f"{k} ({v.description})" for k, v in BUNDLED.items())
    )
    console.print(
        "[bold]clusters[/]: "
        + ", ".join(
            f"{k} ({c.racks}x{c.machines_per_rack}x{c.gpus_per_machine}={c.gpus} GPUs)"
            for k, c in PRESETS.items()
        )
    )
    console.print("[bold]schedulers[/]: " + ", ".join(SCHEDULERS))
    console.print("[bold]placements[/]: " + ", ".join(PLACEMENTS))
    console.print("[bold]formats[/]: " + ", ".join(TRACE_LOADERS))
