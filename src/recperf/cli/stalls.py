"""``recperf stalls``: profile where distributed training time goes, fit and query the
communication model, recommend a cloud setup, analyse torchrun runs, clean up namespaces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from recperf.cli.common import err_console, one_line_errors, print_table
from recperf.cli.options import Flag, Settings, command
from recperf.cli.stalls_app import app
from recperf.core.config import from_mapping, load_json_object
from recperf.core.errors import ConfigError
from recperf.core.files import check_input
from recperf.core.progress import progress_bar
from recperf.stalls.result import FIGURES

__all__ = ["app"]  # the group's app, for cli/app.py; its commands register on it below

EPOCH_SAMPLES = {"dlrm": 45_840_617, "mlp": 1_000_000, "convnet": 50_000}
"""Default samples per epoch: Criteo Kaggle's rows, a 1M-row table, CIFAR-10's training set."""
PARETO_COLUMNS = ("instance", "count", "total_h", "total_low_h", "total_high_h", "verdict",
                  "cost_usd", "compute_s", "exposed_comm_s", "data_stall_s")  # fmt: skip


def _summary_file(directory: Path, flag: str = "--profile") -> dict[str, Any]:
    check_input(directory, flag, want="any")
    path = directory / "summary.json" if directory.is_dir() else directory
    data = load_json_object(path, "a profile summary")
    return data


PROFILE_FLAGS = (
    Flag("ranks", "profile", int | None, "Data-parallel ranks (default 2)"),
    Flag("nodes", "profile", int | None,
         "Emulated machines (network namespaces; needs root) (default 1)"),
    Flag("bandwidth", "profile", str | None,
         "Per-machine link bandwidth, e.g. 200mbit (default 1gbit)"),
    Flag("iters", "profile", int | None, "Timed iterations per run (default 20)"),
    Flag("warmup", "profile", int | None, "Untimed iterations per run (default 3)"),
    Flag("batch_size", "profile", int | None, "Samples per rank per iteration (default 256)"),
    Flag("seed", "profile", int | None, "Model and data seed (default 0)"),
    Flag("threads", "profile", int | None, "torch threads per rank (default cores/ranks)"),
    Flag("device", "profile", str | None, "cpu (gloo) or cuda (NCCL) (default cpu)"),
    Flag("real_data", "profile", bool | None,
         "Also run the warm- and cold-cache real-data runs (default on)",
         ("--real-data/--no-real-data",)),
    Flag("data_dir", "profile", Path | None, "Real data directory (default OUT/data)"),
    Flag("delay_ms", "profile", float | None,
         "Inject a data stall: sleep per batch, ms (default 0)"),
    Flag("torch_trace_iters", "profile", int | None,
         "Also capture this many timed iterations per run with torch.profiler (default 0)"),
)  # fmt: skip


@command(
    app, "profile", writes="summary.json and runs/", out="required", flags=PROFILE_FLAGS,
    scopes_help="profile (ProfileConfig), or the workload's name, e.g. dlrm, mlp",
)  # fmt: skip
def profile_cmd(
    settings: Settings,
    workload: str = typer.Option("dlrm", help="dlrm, mlp, convnet or package.module:attr."),
    option: list[str] = typer.Option(
        [], help="KEY=VALUE: alias of --set WORKLOAD.KEY=VALUE (repeatable)."
    ),
) -> None:
    """Split training time into compute and stalls by differential runs.

    Cross-checked by direct instrumentation (data wait, DDP all-reduce hook)."""
    from recperf.stalls.base import WORKLOADS
    from recperf.stalls.run.profile import ProfileConfig, profile

    settings = settings.with_sets((f"{workload}.{pair}" for pair in option), "--option")
    opts = settings.resolve(["profile", workload])
    WORKLOADS.config(workload, opts[workload])  # a bad option fails before any run
    fields = opts["profile"]  # kept an Options: its TOML values are held to their types
    fields["workload"], fields["workload_options"] = workload, opts[workload]
    config = from_mapping(ProfileConfig, fields, "profile")
    out = settings.out
    assert out is not None
    with progress_bar(f"profiling {workload} on {config.ranks} rank(s)") as bar:
        summary = profile(config, out, progress=lambda f, _msg: bar(f)).to_json()
    settings.emit(summary, name=None)  # profile wrote summary.json
    _print_profile(summary)
    err_console.print(f"summary written to {out / 'summary.json'}")


def _print_profile(s: dict[str, Any]) -> None:
    rows = [
        {
            "name": k.removesuffix("_s"),
            "seconds": s[k],
            "fraction": s[k.removesuffix("_s") + "_frac"],
            "method": s["method"][k],
        }
        for k in FIGURES
    ]
    print_table(
        f"{s['workload']}: {s['iteration_s'] * 1e3:.1f} ms per iteration",
        rows,
        ["name", "seconds", "fraction", "method"],
    )
    checks = [{"name": k, **v} for k, v in s["cross_check"].items()]
    if checks:
        print_table("cross-check", checks, ["name", "differential_s", "direct_s", "rel_diff"])
    for run, why in s["skipped"].items():
        err_console.print(f"[yellow]skipped {run}:[/] {why}", highlight=False)
    for warning in s.get("warnings", []):
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False)


@command(
    app, "analyze", writes="summary.json (--traces) or analysis.json (--run)"
)  # fmt: skip
def analyze_cmd(
    settings: Settings,
    traces: list[Path] = typer.Option(
        [],
        help="torch.profiler (Kineto) trace files or directories, one file per rank "
        "(.json or .json.gz; repeatable).",
    ),
    run: Path | None = typer.Option(
        None, help="A recperf run directory (spec.json and rank*.json) instead of --traces."
    ),
    ranks_per_node: int | None = typer.Option(
        None, min=1, help="Ranks per machine (default: the traces' host names, else one node)."
    ),
    skip_steps: int = typer.Option(0, min=0, help="Warm-up iterations to drop per rank."),
    batch_size: int | None = typer.Option(
        None, min=1, help="Samples per rank per iteration (for `stalls advise`)."
    ),
    param_bytes: int | None = typer.Option(
        None, min=1, help="Model parameter bytes (for `stalls advise`'s memory check)."
    ),
) -> None:
    """Stall breakdown of any torch.profiler traces, per rank and iteration.

    Reads ProfilerStep#N iterations, DataLoader waits, and gloo or NCCL collectives; or, with
    --run, one recperf run's traces (e.g. launched with torchrun -m recperf.stalls.run.rank
    RUN/spec.json)."""
    if run is not None:
        if traces:
            raise ConfigError("--run and --traces: give one of them")
        _analyze_run(settings, run)
        return
    if not traces:
        raise ConfigError("--traces: required (trace files or directories), or --run DIR")
    from recperf.stalls.trace.facade import StallAnalysis

    analysis = StallAnalysis(traces, ranks_per_node=ranks_per_node, skip_steps=skip_steps)
    summary = analysis.summary().to_json()
    summary["batch_size"] = batch_size
    summary["param_bytes"] = param_bytes
    settings.emit(summary)
    _print_analysis(summary)
    if settings.out is not None:
        err_console.print(f"summary written to {settings.out / 'summary.json'}")


ANALYZE_MS = ("iteration", "data_wait", "compute", "exposed_comm", "overlapped_comm")


def _print_analysis(s: dict[str, Any]) -> None:
    def row(r: dict[str, Any], rank: Any, iterations: int) -> dict[str, Any]:
        ms = {f"{k}_ms": r[f"{k}_s"] * 1e3 if r.get(f"{k}_s") is not None else None
              for k in ANALYZE_MS}  # fmt: skip
        mb = r["comm_bytes"] / 1e6 if r.get("comm_bytes") is not None else None
        return {"rank": rank, **ms, "comm_mb": mb, "iterations": iterations}

    rows = [row(r, r["rank"], r["iterations"]) for r in s["per_rank"]]
    rows.append(row(s, "mean", s["iters"]))
    where = f"{s['ranks']} of {s['world_size']} rank(s), {s['nodes']} node(s), {s['device']}"
    columns = ["rank", *(f"{k}_ms" for k in ANALYZE_MS), "comm_mb", "iterations"]
    print_table(f"traces: {where}, per iteration", rows, columns)
    stall = "network" if s["nodes"] > 1 else "interconnect"
    err_console.print(
        f"exposed communication counted as {stall} stall: {s['method'][stall + '_stall_s']}",
        highlight=False,
    )
    slow = s["slowest_rank"]
    if slow is not None:
        err_console.print(
            f"slowest rank: {slow['rank']} (median {slow['iteration_median_s'] * 1e3:.2f} ms per "
            f"iteration, {slow['margin_s'] * 1e3:+.2f} ms = {slow['margin_frac']:+.1%} over "
            "the others' median)",
            highlight=False,
        )


def _analyze_run(settings: Settings, run: Path) -> None:
    from recperf.stalls.run import differential
    from recperf.stalls.run.spec import RunSpec

    spec = RunSpec.load(run / "spec.json")
    paths = [run / f"rank{r}.json" for r in range(spec.ranks)]
    present = [p for p in paths if p.is_file()]
    if len(present) != spec.ranks:
        raise ConfigError(f"{run}: {len(present)} of {spec.ranks} rank traces present")
    stats = differential.run_stats_from_files(spec, present).to_json()
    settings.emit(stats, "analysis.json")
    print_table(
        f"run {spec.name}",
        [stats],
        [
            "iteration_s",
            "data_wait_s",
            "compute_s",
            "exposed_comm_s",
            "overlapped_comm_s",
            "buckets",
        ],
    )


@command(
    app, "fit", writes="the model JSON", out="required", out_is_dir=False,
)  # fmt: skip
def fit_cmd(
    settings: Settings,
    profiles: list[Path] = typer.Option(..., help="Profile directories (repeatable)."),
    hold: list[str] = typer.Option(
        [],
        help="TERM=VALUE: hold a model term at a value instead of fitting it (repeatable), "
        "e.g. alpha_s=25e-6 when every sample has one world size.",
    ),
) -> None:
    """Fit the alpha-beta all-reduce model to the profiles' all-reduce measurements.

    Refused, naming the terms and what is missing, when the samples cannot tell two measured
    terms apart (e.g. every multi-node sample at one bandwidth); terms no sample exercises are
    left out and named."""
    from recperf.stalls.model.comm import describe, samples_from
    from recperf.stalls.model.fit import fit

    held = {}
    for pair in hold:
        term, sep, value = pair.partition("=")
        try:
            held[term.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ConfigError(f"--hold {pair}: expected TERM=VALUE, e.g. alpha_s=25e-6")
    samples = []
    for p in profiles:
        summary = _summary_file(p, "--profiles")  # checks p first (an overlong name, a FIFO)
        summary_path = p / "summary.json" if p.is_dir() else p
        samples += samples_from(summary.get("comm_samples"), str(summary_path))
    model = fit(samples, hold=held)
    out = settings.out
    assert out is not None
    model.save(out)
    if settings.json:
        typer.echo(out.read_text(), nl=False)
    err_console.print(f"{describe(model)}; model written to {out}", highlight=False)


@command(
    app, "predict", writes="prediction.json"
)  # fmt: skip
def predict_cmd(
    settings: Settings,
    model: Path = typer.Option(..., help="A model JSON from `recperf stalls fit`."),
    grad_bytes: float = typer.Option(..., help="Gradient bytes all-reduced per iteration."),
    layers: int = typer.Option(..., help="All-reduce buckets (layers) per iteration."),
    ranks: int = typer.Option(..., help="World size."),
    bandwidth: str | None = typer.Option(None, help="Inter-machine bandwidth, e.g. 500mbit."),
    nodes: int | None = typer.Option(
        None, help="Machines (default: ranks with --bandwidth, else 1)."
    ),
    backward_s: float | None = typer.Option(None, help="Backward time, for the exposed stall."),
) -> None:
    """Predict all-reduce time (and exposed stall) per iteration from the model's shape."""
    from dataclasses import replace

    from recperf.core.config import check_range
    from recperf.stalls.model.comm import CommModel, check_shape, exposed_stall_s
    from recperf.stalls.run.netem import parse_bandwidth

    m = CommModel.load(model)
    n_nodes = nodes if nodes is not None else (ranks if bandwidth is not None else 1)
    check_shape(
        grad_bytes, layers, ranks, n_nodes, ("--grad-bytes", "--layers", "--ranks", "--nodes")
    )
    if backward_s is not None:
        check_range("--backward-s", backward_s, 0.0, None)
    bw = parse_bandwidth(bandwidth) / 8 if bandwidth is not None else None
    if n_nodes > 1 and bw is None:
        raise ConfigError(f"--nodes {n_nodes}: more than one machine needs --bandwidth, e.g. 1gbit")
    pred = m.predict_interval(grad_bytes, layers, ranks, n_nodes, bw)
    if backward_s is not None:
        stalls = [exposed_stall_s(c, backward_s, layers)
                  for c in (pred.comm_s, pred.comm_low_s, pred.comm_high_s)]  # fmt: skip
        pred = replace(pred, exposed_stall_s=stalls[0], exposed_stall_low_s=stalls[1],
                       exposed_stall_high_s=stalls[2])  # fmt: skip
    result = pred.to_json()
    result["layers"] = layers  # the flag's name, as earlier versions wrote it
    settings.emit(result, "prediction.json")
    if settings.json:
        return
    shown = {k: v for k, v in result.items() if v is not None and k != "buckets"}
    err_console.print(", ".join(f"{k} = {v:.6g}" for k, v in shown.items()), highlight=False)


@command(
    app, "advise", writes="advice.json and pareto.html (default: the profile's)",
)  # fmt: skip
def advise_cmd(
    settings: Settings,
    profile: Path = typer.Option(..., help="A profile directory (or its summary.json)."),
    budget_h: float = typer.Option(..., help="Time budget for all epochs, hours."),
    catalog: Path | None = typer.Option(
        None, help="Instance CSV: recperf's columns or a SkyPilot vms.csv (default: bundled AWS)."
    ),
    region: str | None = typer.Option(
        None, help="SkyPilot catalog: only this region's prices (default: cheapest anywhere)."
    ),
    spot: bool = typer.Option(False, "--spot", help="SkyPilot catalog: SpotPrice, not Price."),
    links: Path | None = typer.Option(
        None, help="SkyPilot catalog: bandwidth CSV per instance type (default: bundled AWS)."
    ),
    gpus: Path | None = typer.Option(None, help="GPU datasheet CSV (default: bundled)."),
    model: Path | None = typer.Option(None, help="Fitted communication model JSON."),
    epoch_samples: int | None = typer.Option(
        None, help="Samples per epoch (default per workload)."
    ),
    epochs: float = typer.Option(1.0, help="Epochs to train."),
    max_instances: int = typer.Option(16, help="Try 1..this many instances of each type."),
    efficiency: float = typer.Option(0.4, help="Fraction of datasheet peak FLOPs achieved."),
    precision: str = typer.Option("fp32", help="fp32 or fp16 (tensor cores)."),
) -> None:
    """Recommend the cheapest cloud setup that meets the time budget.

    Predicts time and cost of every instance type and count and plots the time-cost Pareto
    frontier."""
    from recperf.report.stalls_figures import write_pareto_html
    from recperf.stalls.cost.advisor import AdvisorConfig, ProfileSummary, advise
    from recperf.stalls.cost.catalog import load_catalog, load_gpu_models
    from recperf.stalls.model.comm import CommModel

    summary = _summary_file(profile)
    samples = (
        epoch_samples
        if epoch_samples is not None
        else EPOCH_SAMPLES.get(str(summary.get("workload")))
    )
    if samples is None:
        raise ConfigError(f"--epoch-samples: required for workload {summary.get('workload')!r}")
    config = AdvisorConfig(
        budget_h=budget_h,
        epoch_samples=samples,
        epochs=epochs,
        max_instances=max_instances,
        efficiency=efficiency,
        precision=precision,
    )
    gpu_models = load_gpu_models(gpus)
    cat = load_catalog(catalog, gpu_models, region=region, spot=spot, links=links)
    advice = advise(
        ProfileSummary.from_mapping(summary),
        config,
        instances=cat.instances,
        gpu_models=gpu_models,
        notes=cat.notes,
        model=CommModel.load(model) if model else None,
    )
    out_dir = settings.out or (profile if profile.is_dir() else profile.parent)
    data = advice.to_json()
    if cat.report is not None:
        data["catalog"] = cat.report
    write_pareto_html(advice, out_dir / "pareto.html")
    settings.replace_out(out_dir).emit(data, "advice.json")
    print_table("time-cost Pareto frontier", data["pareto"], PARETO_COLUMNS)
    rec = data["recommendation"]
    if rec is None:
        err_console.print(
            f"no setup finishes within {budget_h:g} h; fastest: "
            f"{data['fastest']['instance']} x {data['fastest']['count']} "
            f"({data['fastest']['total_h']:.2f} h)",
            highlight=False,
        )
    else:
        where = f" in {cat.report['used'][rec['instance']]}" if cat.report is not None else ""
        err_console.print(
            f"recommended: {rec['instance']} x {rec['count']}{where}: {rec['total_h']:.2f} h "
            f"({rec['total_low_h']:.2f}-{rec['total_high_h']:.2f} h), ${rec['cost_usd']:,.2f}; "
            f"{rec['verdict']} the {budget_h:g} h budget",
            highlight=False,
        )
    err_console.print(f"comm model: {advice.model_source}", highlight=False, markup=False)
    err_console.print(f"data stall: {advice.data_stall_method}", highlight=False, markup=False)
    for note in cat.notes:
        err_console.print(f"note: {note}", highlight=False, markup=False)
    err_console.print(f"advice in {out_dir / 'advice.json'}, plot in {out_dir / 'pareto.html'}")


@app.command("cleanup")
@one_line_errors
def cleanup_cmd() -> None:
    """Remove network namespaces and links left by killed profiling runs."""
    from recperf.stalls.run import netem

    why = netem.available()
    if why:
        err_console.print(f"nothing to clean: {why}")
        return
    err_console.print(f"removed {netem.cleanup()} namespace(s) and link(s)")


# After the commands above, so that `stalls --help` lists them first. Each module registers its
# command on ``stalls_app.app``; neither imports this one.
from recperf.cli import stalls_export, stalls_launch  # noqa: E402, F401
