"""``recperf embed``: the DLRM inference embedding stage: access traces and their locality,
kernel correctness on this device, and kernel benchmarks."""

from __future__ import annotations

import typer

from recperf.cli.common import err_console, print_table
from recperf.cli.options import Settings, command
from recperf.core.config import parse_ints, parse_names

app = typer.Typer(
    help="DLRM inference embedding stage: access traces, locality, kernels.", no_args_is_help=True
)


_TRACE_HELP = (
    "reuse-medium-500k (bundled), reuse-high|reuse-medium|reuse-low, uniform, zipf:<alpha>, or a "
    ".txt[.gz] / .pt[.gz] file."
)


KERNEL_SCOPES = "a kernel's name, e.g. torch-hot, triton"


@command(
    app, "stats", writes="stats.json"
)  # fmt: skip
def stats_cmd(
    settings: Settings,
    trace: str = typer.Option(..., help=_TRACE_HELP),
    rows: int | None = typer.Option(None, help="Rows per table (default 500,000 / from file)."),
    batch_lookups: int = typer.Option(307_200, help="Ids per batch for the unique fraction."),
    top_k: int = typer.Option(60_000, help="Hot rows per table for the coverage."),
) -> None:
    """Locality of an embedding access trace: top-k coverage, unique rows per batch, reuse."""
    from recperf.embed.locality import stats
    from recperf.embed.traces import resolve

    result = stats(resolve(trace, rows=rows), batch_lookups=batch_lookups, top_k=top_k)
    data = result.to_json()
    settings.emit(data, "stats.json")
    columns = ("accesses", "unique_rows", "top_k", "top_k_coverage", "unique_frac_per_batch")
    print_table(f"locality of {result.name}", [data], columns)
    total = max(result.accesses, 1)
    hist = [{**b, "share": b["count"] / total} for b in data["reuse_distance_hist"]]
    print_table("reuse distance (accesses between uses)", hist, ("bin", "count", "share"))
    err_console.print(
        f"batch of {result.batch_lookups:,} ids; {result.tables} table(s)", highlight=False
    )


def _device(device: str | None) -> str:
    from recperf.embed.timing import resolve_device

    return resolve_device(device)


@command(
    app, "check", writes="check.json", scopes_help=KERNEL_SCOPES,
)  # fmt: skip
def check_cmd(
    settings: Settings,
    device: str | None = typer.Option(None, help="cuda or cpu (default: cuda when present)."),
    variants: str | None = typer.Option(None, help="Comma-separated kernels (default: all)."),
    seed: int = typer.Option(0, help="Seed of the random shapes."),
) -> None:
    """Run every kernel against the torch reference on random shapes on this device.

    On the CPU the Triton kernels need TRITON_INTERPRET=1 and are skipped without it."""
    import os

    from recperf.core.errors import RecperfError
    from recperf.embed.kernels import KERNELS, check_kernel
    from recperf.embed.kernels.base import kernel_traits

    dev = _device(device)
    names = parse_names(variants, "--variants") if variants else tuple(KERNELS.names())
    options = settings.resolve(names)
    for name in names:
        KERNELS.config(name, options[name])  # an unknown name or a bad option: one line
    rows = []
    for name in names:
        native = kernel_traits(name).cpu
        if dev == "cpu" and not native and os.environ.get("TRITON_INTERPRET") != "1":
            rows.append({"name": name, "result": "skipped: set TRITON_INTERPRET=1 on the CPU"})
            continue
        try:
            check_kernel(name, device=dev, seed=seed, options=options[name])
            rows.append({"name": name, "result": "ok"})
        except RecperfError as exc:
            rows.append({"name": name, "result": f"FAILED: {exc}"})
    settings.emit({"device": dev, "kernels": rows}, "check.json")
    print_table(f"embedding kernels vs the reference on {dev}", rows, ["name", "result"])
    if any(r["result"].startswith("FAILED") for r in rows):
        raise typer.Exit(1)


@command(
    app, "bench", writes="bench.json", scopes_help=KERNEL_SCOPES, toml=False,
)  # fmt: skip
def bench_cmd(
    settings: Settings,
    config: str = typer.Option("small", help="paper, mlperf or small."),
    trace: str = typer.Option("reuse-medium-500k", help=_TRACE_HELP),
    variants: str = typer.Option("torch,torch-hot", help="Comma-separated kernels."),
    dtype: str = typer.Option("fp32", help="fp32 or fp16 weights."),
    device: str | None = typer.Option(None, help="cuda or cpu (default: cuda when present)."),
    batch_size: int | None = typer.Option(None, help="Override the configuration's batch."),
    reps: int = typer.Option(20, help="Timed calls per variant (median)."),
    tune: bool = typer.Option(False, help="Autotune each variant's parameters first (cached)."),
    seed: int = typer.Option(0, help="Seed of the tables and generated traces."),
) -> None:
    """Time embedding kernels on a DLRM inference configuration and an access trace."""
    import torch

    from recperf.core.errors import ConfigError
    from recperf.core.progress import progress_bar
    from recperf.embed.bench import bench, bench_trace, check_args
    from recperf.embed.model import config as make_config

    dtypes = {"fp32": torch.float32, "fp16": torch.float16}
    if dtype not in dtypes:
        raise ConfigError(f"--dtype {dtype!r}: expected fp32 or fp16")
    cfg = make_config(config, batch_size=batch_size)
    names = parse_names(variants, "--variants")
    options = settings.resolve(names)
    dev = check_args(names, device=device, reps=reps, options=options)  # before any work
    loaded = bench_trace(cfg, trace, seed)
    with progress_bar(f"benchmarking {config} on {trace}") as bar:
        result = bench(
            cfg,
            loaded,
            names,
            dtype=dtypes[dtype],
            device=dev,
            reps=reps,
            tune=tune,
            seed=seed,
            options=options,
            progress=bar,
        )
    data = result.to_json()
    settings.emit(data, "bench.json")
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


@command(
    app, "compile", writes="compile.json"
)  # fmt: skip
def compile_cmd(
    settings: Settings,
    arch: int = typer.Option(90, help="Compute capability: 80, 86, 89 or 90 (H100/H200)."),
    dtype: str = typer.Option("fp32", help="Row format: fp32, fp16, bf16, fp8, int8 or int4."),
    pooling: str = typer.Option("sum", help="sum or mean."),
    weighted: bool = typer.Option(False, help="With per-sample weights."),
    dim: int = typer.Option(128, help="Embedding dimension D."),
    batch: int = typer.Option(2048, help="Batch size (specialised like the launch's)."),
    tables: int = typer.Option(12, help="Number of tables."),
    block_d: str | None = typer.Option(None, help="Comma-separated (default: covers D, <= 128)."),
    block_n: str = typer.Option("16,32,64", help="Comma-separated ids per chunk."),
    num_warps: str = typer.Option("4,8", help="Comma-separated warps per program."),
    bags: str = typer.Option("1,2", help="Comma-separated bags per program."),
    prefetch: str = typer.Option("0,1,2", help="Comma-separated prefetch distances (0: none)."),
) -> None:
    """Compile the table-batched Triton kernel for a GPU architecture, without a GPU.

    Shows each launch shape's registers, spills, shared memory and theoretical occupancy."""
    import os

    from recperf.core.errors import ConfigError
    from recperf.core.progress import progress_bar

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise ConfigError("TRITON_INTERPRET=1: compiling for a GPU needs the interpreter off")
    from recperf.embed.kernels.compiled import arch as arch_limits
    from recperf.embed.kernels.compiled import compile_shapes, configs
    from recperf.embed.kernels.formats import check_format
    from recperf.embed.kernels.triton_tbe import default_block_d

    check_format(dtype, "--dtype")
    if pooling not in ("sum", "mean"):
        raise ConfigError(f"--pooling {pooling!r}: expected sum or mean")
    limits = arch_limits(arch)
    shapes = configs(
        parse_ints(block_d, "--block-d") if block_d else (default_block_d(dim),),
        parse_ints(block_n, "--block-n"),
        parse_ints(num_warps, "--num-warps"),
        parse_ints(bags, "--bags"),
        parse_ints(prefetch, "--prefetch"),
    )
    with progress_bar(f"compiling {len(shapes)} launch shapes for sm_{arch}") as bar:
        rows = compile_shapes(
            shapes, cc=arch, fmt=dtype, weighted=weighted, pooling=pooling,  # type: ignore[arg-type]
            dim=dim, batch=batch, tables=tables, progress=bar,
        )  # fmt: skip
    settings.emit({"arch": arch, "gpus": limits.gpus, "shapes": rows}, "compile.json")
    cols = ["block_d", "block_n", "num_warps", "bags_per_program", "prefetch", "registers",
            "spill_bytes", "shared_bytes", "vector_loads", "loop_barriers", "occupancy",
            "limiter"]  # fmt: skip
    print_table(f"table-batched kernel on sm_{arch} ({limits.gpus}), {dtype}", rows, cols)
    failed = [r for r in rows if "error" in r]
    for r in failed:
        err_console.print(str(r["error"]), highlight=False, markup=False)
    if failed:
        raise typer.Exit(1)


from recperf.cli import embed_predict, embed_quantize  # noqa: E402, F401  (register the commands)
