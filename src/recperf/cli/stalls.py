"""``recperf stalls``: profile where distributed training time goes, fit and query the
communication model, recommend a cloud setup, analyse torchrun runs, clean up namespaces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from recperf.cli.common import err_console, one_line_errors, print_table
from recperf.core.errors import ConfigError
from recperf.core.progress import progress_bar
from recperf.core.results import dumps_json, write_json

app = typer.Typer(
    help="Distributed-training stalls: profile, communication model, cloud advisor.",
    no_args_is_help=True,
)
EPOCH_SAMPLES = {"dlrm": 45_840_617, "mlp": 1_000_000, "convnet": 50_000}
"""Default samples per epoch: Criteo Kaggle's rows, a 1M-row table, CIFAR-10's training set."""
PARETO_COLUMNS = ("instance", "count", "total_h", "cost_usd", "compute_s", "exposed_comm_s",
                  "data_stall_s")  # fmt: skip
FIGURES = (
    "compute_s",
    "data_fetch_stall_s",
    "data_prep_stall_s",
    "interconnect_stall_s",
    "network_stall_s",
)


def _options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option {pair!r}: expected KEY=VALUE (VALUE as JSON or text)")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out[key] = tuple(value) if isinstance(value, list) else value
    return out


def _summary_file(directory: Path) -> dict[str, Any]:
    path = directory / "summary.json" if directory.is_dir() else directory
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a profile summary: {exc}") from None
    return data


@app.command("profile")
@one_line_errors
def profile_cmd(
    workload: str = typer.Option("dlrm", help="dlrm, mlp, convnet or package.module:attr."),
    ranks: int = typer.Option(2, help="Data-parallel ranks."),
    nodes: int = typer.Option(1, help="Emulated machines (network namespaces; needs root)."),
    bandwidth: str = typer.Option("1gbit", help="Per-machine link bandwidth, e.g. 200mbit."),
    iters: int = typer.Option(20, help="Timed iterations per run."),
    warmup: int = typer.Option(3, help="Untimed iterations per run."),
    batch_size: int = typer.Option(256, help="Samples per rank per iteration."),
    seed: int = typer.Option(0, help="Model and data seed."),
    threads: int | None = typer.Option(None, help="torch threads per rank (default cores/ranks)."),
    device: str = typer.Option("cpu", help="cpu (gloo) or cuda (NCCL)."),
    real_data: bool = typer.Option(True, help="Also run the warm- and cold-cache real-data runs."),
    data_dir: Path | None = typer.Option(None, help="Real data directory (default OUT/data)."),
    delay_ms: float = typer.Option(0.0, help="Inject a data stall: sleep per batch, ms."),
    torch_trace_iters: int = typer.Option(
        0, help="Also capture this many timed iterations per run with torch.profiler."
    ),
    option: list[str] = typer.Option([], help="Workload option KEY=VALUE (repeatable)."),
    out: Path = typer.Option(..., help="Directory for summary.json and runs/."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Split training time into compute and stalls by differential runs, cross-checked by
    direct instrumentation (data wait, DDP all-reduce hook)."""
    from recperf.stalls.profile import ProfileConfig, profile

    config = ProfileConfig(
        workload=workload,
        workload_options=_options(option),
        ranks=ranks,
        nodes=nodes,
        bandwidth=bandwidth,
        iters=iters,
        warmup=warmup,
        batch_size=batch_size,
        seed=seed,
        threads=threads,
        device=device,  # type: ignore[arg-type]
        real_data=real_data,
        data_dir=data_dir,
        delay_ms=delay_ms,
        torch_trace_iters=torch_trace_iters,
    )
    with progress_bar(f"profiling {workload} on {ranks} rank(s)") as bar:
        summary = profile(config, out, progress=lambda f, _msg: bar(f))
    if json_out:
        typer.echo(dumps_json(summary), nl=False)
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


@app.command("analyze")
@one_line_errors
def analyze_cmd(
    run: Path = typer.Option(..., help="A run directory: spec.json and rank*.json traces."),
    json_out: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
) -> None:
    """Direct breakdown of one run's traces (e.g. a run launched with torchrun:
    torchrun --nproc-per-node N -m recperf.stalls.rank RUN/spec.json)."""
    from recperf.stalls import analysis
    from recperf.stalls.spec import RunSpec

    spec = RunSpec.load(run / "spec.json")
    traces = [
        json.loads((run / f"rank{r}.json").read_text())
        for r in range(spec.ranks)
        if (run / f"rank{r}.json").is_file()
    ]
    if len(traces) != spec.ranks:
        raise ConfigError(f"{run}: {len(traces)} of {spec.ranks} rank traces present")
    stats = analysis.stats_json(analysis.run_stats(spec, traces))
    if json_out:
        typer.echo(dumps_json(stats), nl=False)
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


@app.command("fit")
@one_line_errors
def fit_cmd(
    profiles: list[Path] = typer.Option(..., help="Profile directories (repeatable)."),
    out: Path = typer.Option(..., help="Where to write the model JSON."),
    json_out: bool = typer.Option(False, "--json", help="Print the model as JSON."),
) -> None:
    """Fit the alpha-beta all-reduce model to the profiles' all-reduce measurements."""
    from recperf.stalls.commmodel import CommSample, fit

    samples = [
        CommSample(**row) for p in profiles for row in _summary_file(p).get("comm_samples", [])
    ]
    model = fit(samples)
    out.parent.mkdir(parents=True, exist_ok=True)
    model.save(out)
    if json_out:
        typer.echo(out.read_text(), nl=False)
    err_console.print(
        f"fitted {model.samples} samples, relative RMSE {model.rel_rmse:.1%}; "
        f"model written to {out}"
    )


@app.command("predict")
@one_line_errors
def predict_cmd(
    model: Path = typer.Option(..., help="A model JSON from `recperf stalls fit`."),
    grad_bytes: float = typer.Option(..., help="Gradient bytes all-reduced per iteration."),
    layers: int = typer.Option(..., help="All-reduce buckets (layers) per iteration."),
    ranks: int = typer.Option(..., help="World size."),
    bandwidth: str | None = typer.Option(None, help="Inter-machine bandwidth, e.g. 500mbit."),
    nodes: int | None = typer.Option(
        None, help="Machines (default: ranks with --bandwidth, else 1)."
    ),
    backward_s: float | None = typer.Option(None, help="Backward time, for the exposed stall."),
    json_out: bool = typer.Option(False, "--json", help="Print the prediction as JSON."),
) -> None:
    """Predict all-reduce time (and exposed stall) per iteration from the model's shape."""
    from recperf.stalls.commmodel import CommModel, exposed_stall_s
    from recperf.stalls.netem import parse_bandwidth

    m = CommModel.load(model)
    n_nodes = nodes if nodes is not None else (ranks if bandwidth else 1)
    bw = parse_bandwidth(bandwidth) / 8 if bandwidth else None
    comm = m.predict(grad_bytes, layers, ranks, n_nodes, bw)
    result: dict[str, Any] = {
        "comm_s": comm,
        "grad_bytes": grad_bytes,
        "layers": layers,
        "ranks": ranks,
        "nodes": n_nodes,
        "bandwidth_bytes_per_s": bw,
    }
    if backward_s is not None:
        result["exposed_stall_s"] = exposed_stall_s(comm, backward_s, layers)
    if json_out:
        typer.echo(dumps_json(result), nl=False)
        return
    err_console.print(", ".join(f"{k} = {v}" for k, v in result.items()), highlight=False)


@app.command("advise")
@one_line_errors
def advise_cmd(
    profile: Path = typer.Option(..., help="A profile directory (or its summary.json)."),
    budget_h: float = typer.Option(..., help="Time budget for all epochs, hours."),
    catalog: Path | None = typer.Option(None, help="Instance CSV (default: bundled AWS)."),
    gpus: Path | None = typer.Option(None, help="GPU datasheet CSV (default: bundled)."),
    model: Path | None = typer.Option(None, help="Fitted communication model JSON."),
    epoch_samples: int | None = typer.Option(
        None, help="Samples per epoch (default per workload)."
    ),
    epochs: float = typer.Option(1.0, help="Epochs to train."),
    max_instances: int = typer.Option(16, help="Try 1..this many instances of each type."),
    efficiency: float = typer.Option(0.4, help="Fraction of datasheet peak FLOPs achieved."),
    precision: str = typer.Option("fp32", help="fp32 or fp16 (tensor cores)."),
    out: Path | None = typer.Option(
        None, help="Directory for advice.json and pareto.html (default: the profile's)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the advice as JSON."),
) -> None:
    """Predict time and cost of every instance type and count; recommend the cheapest that
    meets the budget and plot the time-cost Pareto frontier."""
    from recperf.stalls.advisor import AdvisorConfig, advise, write_pareto_html
    from recperf.stalls.catalog import load_gpu_models, load_instances
    from recperf.stalls.commmodel import CommModel

    summary = _summary_file(profile)
    samples = epoch_samples or EPOCH_SAMPLES.get(str(summary.get("workload")))
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
    advice = advise(
        summary,
        config,
        instances=load_instances(catalog),
        gpu_models=load_gpu_models(gpus),
        model=CommModel.load(model) if model else None,
    )
    out_dir = out or (profile if profile.is_dir() else profile.parent)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = advice.to_json()
    write_json(out_dir / "advice.json", data)
    write_pareto_html(advice, out_dir / "pareto.html")
    if json_out:
        typer.echo(dumps_json(data), nl=False)
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
        err_console.print(
            f"recommended: {rec['instance']} x {rec['count']}: {rec['total_h']:.2f} h, "
            f"${rec['cost_usd']:,.2f}",
            highlight=False,
        )
    err_console.print(f"advice in {out_dir / 'advice.json'}, plot in {out_dir / 'pareto.html'}")


@app.command("cleanup")
@one_line_errors
def cleanup_cmd() -> None:
    """Remove network namespaces and links left by killed profiling runs."""
    from recperf.stalls import netem

    why = netem.available()
    if why:
        err_console.print(f"nothing to clean: {why}")
        return
    err_console.print(f"removed {netem.cleanup()} namespace(s) and link(s)")
