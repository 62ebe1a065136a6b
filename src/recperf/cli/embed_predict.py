"""``recperf embed predict``: the trace-driven L2 model of the embedding kernels on a GPU spec (a
model, not a measurement): per variant the L2 hit rate, DRAM bytes per batch and a time bound,
rows in any row format at their real size, as a table, ``--json`` and a plotly figure of the hit
rate against the L2 size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from recperf.cli.common import err_console, print_table
from recperf.cli.embed import _TRACE_HELP, app
from recperf.cli.options import Settings, command
from recperf.core.config import parse_floats, parse_names

_GPU_HELP = "a100-40gb, a100-80gb, h100, h200, l4 (bundled specs) or a FILE.toml of your own."
_VARIANTS_HELP = (
    "Comma-separated kernels: registered names or a package.module:attr kernel with traits "
    "(default: recperf's own registered kernels that read --dtype; the Triton ones need triton)."
)
MIB = 1 << 20


@command(
    app, "predict", writes="predict.json and predict.html"
)  # fmt: skip
def predict_cmd(
    settings: Settings,
    gpu: str = typer.Option(..., help=_GPU_HELP),
    config: str = typer.Option("paper", help="paper or mlperf (or small)."),
    trace: str = typer.Option("reuse-medium-500k", help=_TRACE_HELP),
    batch_size: int | None = typer.Option(None, help="Override the configuration's batch."),
    variants: str | None = typer.Option(None, help=_VARIANTS_HELP),
    dtype: str = typer.Option(
        "fp32",
        help="Row format: fp32, fp16, bf16, fp8, int8 or int4 (int8/int4 rows carry 4 "
        "bytes of scale and bias).",
    ),
    rows_cap: int = typer.Option(1_000_000, help="mlperf: rows of a table at most."),
    batches: int = typer.Option(2, help="Batches replayed, the first --warmup not counted."),
    warmup: int = typer.Option(1, help="Batches that fill the cache before counting."),
    sample: float = typer.Option(1.0, help="Share of lines replayed (hash sample); 1 = exact."),
    hot_rows: int | None = typer.Option(
        None, help="Hot rows per table (default: the persisting-L2 maximum split over tables)."
    ),
    seed: int = typer.Option(0, help="Seed of generated traces and of the line sample."),
    figure: Path | None = typer.Option(None, help="Write the hit-rate figure (HTML) here."),
    carve_outs: str | None = typer.Option(
        None,
        help="Will pinning pay? Also model the pinning kernel (hot-l2) with its carve-out at these "
        "comma-separated shares of the persisting-L2 maximum, e.g. 0.125,0.25,0.5,1.",
    ),
) -> None:
    """Predict each kernel's L2 hit rate with a trace-driven model (not a measurement).

    For each kernel variant: the L2 hit rate, DRAM bytes per batch and a lower bound on its time
    on a GPU described by a spec."""
    from recperf.core.progress import progress_from_first_update
    from recperf.embed import gpus, l2model, l2sweep
    from recperf.embed.bench import bench_trace
    from recperf.embed.kernels.formats import check_format
    from recperf.embed.l2layout import default_variants
    from recperf.embed.model import config as make_config

    shares = parse_floats(carve_outs, "--carve-outs") if carve_outs else ()
    check_format(dtype, "--dtype")
    spec = gpus.load(gpu)
    cfg = make_config(config, rows_cap=rows_cap, batch_size=batch_size)
    options = l2model.PredictConfig(
        dtype=dtype,  # type: ignore[arg-type]  # checked above
        batches=batches,
        warmup=warmup,
        sample=sample,
        seed=seed,
        hot_rows_per_table=hot_rows,
    )
    given = parse_names(variants, "--variants") if variants is not None else None
    names = l2model.check_variants(default_variants(dtype) if given is None else given, dtype)
    l2model.check_dim(dtype, cfg.dim)
    pinning = l2sweep.pinning_variant(dtype) if shares else None
    loaded = bench_trace(cfg, trace, seed)
    with progress_from_first_update(f"L2 model: {config} / {trace} on {spec.name}") as bar:
        result = l2model.predict(spec, cfg, loaded, names, options, progress=bar)
        sweep = (
            l2sweep.sweep_carve_out(spec, cfg, loaded, shares, options, variant=pinning)
            if shares
            else ()
        )
    data = result.to_json()
    if shares:
        data["carve_out_sweep"] = [l2model.variant_json(v) for v in sweep]
    settings.emit(data, "predict.json")
    _write_figure(data, figure, settings.out)
    rows = [_row(v) for v in data["variants"]]
    cols = ["variant", "row_bytes", "hit_rate", "pinned_share", "carve_out_mib",
            "dram_mb_per_batch", "l2_mb_per_batch", "time_lower_bound_ms", "bound"]  # fmt: skip
    print_table(
        f"MODEL (not measured): {config} / {result.trace} on {spec.name} ({options.dtype}, "
        f"batch {cfg.batch_size:,}, {100 * options.sample:g}% of lines)",
        rows,
        cols,
    )
    if shares:
        print_table(
            f"MODEL (not measured): {sweep[0].variant} by carve-out on {spec.name} ({dtype}, "
            f"persisting maximum "
            f"{spec.persisting_l2_max_bytes / MIB:.1f} MiB of {spec.l2_bytes / MIB:.1f} MiB L2)",
            [_row(v) for v in data["carve_out_sweep"]],
            cols,
        )
    err_console.print(f"{l2model.MODEL_NOTE} {l2model.LEAVES_OUT}", highlight=False)


def _row(v: dict[str, Any]) -> dict[str, Any]:
    """A variant's JSON with the table's MiB / MB columns added."""
    return v | {
        "carve_out_mib": v["carve_out_bytes"] / MIB,
        "dram_mb_per_batch": v["dram_bytes_per_batch"] / 1e6,
        "l2_mb_per_batch": v["l2_bytes_per_batch"] / 1e6,
    }


def _write_figure(data: dict[str, Any], figure: Path | None, out: Path | None) -> None:
    """The hit-rate figure as a standalone HTML file at ``figure`` and in ``out``."""
    from recperf.core.errors import ConfigError
    from recperf.report.embed_l2 import hit_rate_figure

    paths = [p for p in (figure, None if out is None else out / "predict.html") if p is not None]
    if not paths:
        return
    fig = hit_rate_figure(data)
    for path in paths:
        tmp = path.with_name(path.name + ".tmp")
        try:
            fig.write_html(str(tmp), include_plotlyjs=True, full_html=True)  # works offline
            tmp.replace(path)
        except OSError as exc:
            raise ConfigError(f"--figure {path}: cannot write: {exc.strerror or exc}") from None
