"""``recperf embed``: the DLRM inference embedding stage: access traces and their locality,
kernel correctness on this device, and kernel benchmarks."""

from __future__ import annotations

import typer

from recperf.cli.common import err_console, one_line_errors, print_table
from recperf.core.results import dumps_json

app = typer.Typer(
    help="DLRM inference embedding stage: access traces, locality, kernels.", no_args_is_help=True
)


_TRACE_HELP = (
    "reuse-medium-500k (bundled), reuse-high|reuse-medium|reuse-low, uniform, zipf:<alpha>, or a "
    ".txt[.gz] / .pt[.gz] file."
)


@app.command("stats")
@one_line_errors
def stats_cmd(
    trace: str = typer.Option(..., help=_TRACE_HELP),
    rows: int | None = typer.Option(None, help="Rows per table (default 500,000 / from file)."),
    batch_lookups: int = typer.Option(307_200, help="Ids per batch for the unique fraction."),
    top_k: int = typer.Option(60_000, help="Hot rows per table for the coverage."),
    json_out: bool = typer.Option(False, "--json", help="Print the stats as JSON."),
) -> None:
    """Locality of an embedding access trace: top-k coverage, unique rows per batch, reuse."""
    from recperf.embed.locality import stats
    from recperf.embed.traces import resolve

    result = stats(resolve(trace, rows=rows), batch_lookups=batch_lookups, top_k=top_k)
    data = result.to_json()
    if json_out:
        typer.echo(dumps_json(data), nl=False)
    columns = ("accesses", "unique_rows", "top_k", "top_k_coverage", "unique_frac_per_batch")
    print_table(f"locality of {result.name}", [data], columns)
    total = max(result.accesses, 1)
    hist = [{**b, "share": b["count"] / total} for b in data["reuse_distance_hist"]]
    print_table("reuse distance (accesses between uses)", hist, ("bin", "count", "share"))
    err_console.print(
        f"batch of {result.batch_lookups:,} ids; {result.tables} table(s)", highlight=False
    )


def _device(device: str | None) -> str:
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


@app.command("check")
@one_line_errors
def check_cmd(
    device: str | None = typer.Option(None, help="cuda or cpu (default: cuda when present)."),
    variants: str | None = typer.Option(None, help="Comma-separated kernels (default: all)."),
    seed: int = typer.Option(0, help="Seed of the random shapes."),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Run every kernel against the torch reference on random shapes on this device (on the CPU
    the Triton kernels need TRITON_INTERPRET=1 and are skipped without it)."""
    import os

    from recperf.core.errors import RecperfError
    from recperf.embed.kernels import KERNELS, check_kernel

    dev = _device(device)
    names = variants.split(",") if variants else KERNELS.names()
    rows = []
    for name in names:
        KERNELS.factory(name)  # an unknown name is a one-line error
        if dev == "cpu" and name not in CPU_KERNELS and os.environ.get("TRITON_INTERPRET") != "1":
            rows.append({"name": name, "result": "skipped: set TRITON_INTERPRET=1 on the CPU"})
            continue
        try:
            check_kernel(name, device=dev, seed=seed)
            rows.append({"name": name, "result": "ok"})
        except RecperfError as exc:
            rows.append({"name": name, "result": f"FAILED: {exc}"})
    if json_out:
        typer.echo(dumps_json({"device": dev, "kernels": rows}), nl=False)
    print_table(f"embedding kernels vs the reference on {dev}", rows, ["name", "result"])
    if any(r["result"].startswith("FAILED") for r in rows):
        raise typer.Exit(1)


CPU_KERNELS = ("torch", "torch-hot")
"""Kernels that run on the CPU without the Triton interpreter."""


@app.command("bench")
@one_line_errors
def bench_cmd(
    config: str = typer.Option("small", help="paper, mlperf or small."),
    trace: str = typer.Option("reuse-medium-500k", help=_TRACE_HELP),
    variants: str = typer.Option("torch,torch-hot", help="Comma-separated kernels."),
    dtype: str = typer.Option("fp32", help="fp32 or fp16 weights."),
    device: str | None = typer.Option(None, help="cuda or cpu (default: cuda when present)."),
    batch_size: int | None = typer.Option(None, help="Override the configuration's batch."),
    reps: int = typer.Option(20, help="Timed calls per variant (median)."),
    tune: bool = typer.Option(False, help="Autotune each variant's parameters first (cached)."),
    seed: int = typer.Option(0, help="Seed of the tables and generated traces."),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Time embedding kernels on a DLRM inference configuration and an access trace."""
    import torch

    from recperf.core.errors import ConfigError
    from recperf.core.progress import progress_bar
    from recperf.embed.bench import bench
    from recperf.embed.model import config as make_config

    dtypes = {"fp32": torch.float32, "fp16": torch.float16}
    if dtype not in dtypes:
        raise ConfigError(f"--dtype {dtype!r}: expected fp32 or fp16")
    cfg = make_config(config, batch_size=batch_size)
    with progress_bar(f"benchmarking {config} on {trace}") as bar:
        result = bench(
            cfg,
            trace,
            variants.split(","),
            dtype=dtypes[dtype],
            device=_device(device),
            reps=reps,
            tune=tune,
            seed=seed,
            progress=bar,
        )
    data = result.to_json()
    if json_out:
        typer.echo(dumps_json(data), nl=False)
    cols = ["variant", "ms_per_batch", "gb_per_s", "pct_of_copy_bw", "speedup_vs_torch"]
    print_table(
        f"{config} / {result.trace} on {result.device} ({result.dtype}); copy "
        f"{result.copy_gb_per_s:.1f} GB/s",
        data["variants"],
        cols,
    )
    err_console.print(
        "stages (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in result.stages_ms.items())
    )
