"""``recperf embed quantize``: float embedding tables (a model configuration's, seeded, or your own
saved with torch.save) converted to a row format, all or nothing, with the error it costs: per
table the relative error of pooled outputs against the float rows on an access trace, and the
bytes per row before and after."""

from __future__ import annotations

from pathlib import Path

import typer

from recperf.cli.common import err_console, print_table
from recperf.cli.embed import _TRACE_HELP, app
from recperf.cli.options import Settings, command


@command(
    app, "quantize", writes="quantize.json (and quantized.pt with --save)"
)  # fmt: skip
def quantize_cmd(
    settings: Settings,
    dtype: str = typer.Option("int8", help="Row format: fp16, bf16, fp8, int8 or int4."),
    config: str | None = typer.Option(
        None, help="paper, mlperf or small: seeded tables of that shape (default small)."
    ),
    tables: Path | None = typer.Option(
        None, help="A torch.save file: a list (or dict by name) of 2-D float tensors."
    ),
    trace: str = typer.Option("reuse-medium-500k", help=f"Ids of the bags. {_TRACE_HELP}"),
    bags: int = typer.Option(2048, help="Bags pooled per table for the error."),
    pooling_factor: int | None = typer.Option(
        None, help="Ids per bag (default: the configuration's, 20 with --tables)."
    ),
    rows_cap: int = typer.Option(1_000_000, help="mlperf: rows of a table at most."),
    seed: int = typer.Option(0, help="Seed of the configuration's tables and generated traces."),
    save: bool = typer.Option(False, help="Also write the quantized tables to --out."),
) -> None:
    """Quantize float embedding tables and report the pooled-output error per table.

    A bag's error: ||pooled - pooled_float|| / ||pooled_float||, ids from the trace."""
    import torch

    from recperf.core.config import check_range
    from recperf.core.errors import ConfigError
    from recperf.embed import quantize as q
    from recperf.embed.kernels.formats import check_format
    from recperf.embed.model import config as make_config
    from recperf.embed.model import random_tables

    fmt = check_format(dtype, "--dtype")
    check_range("seed", seed, 0, None)
    if save and settings.out is None:
        raise ConfigError("--save: needs --out DIR to write the quantized tables into")
    if tables is not None and config is not None:
        raise ConfigError("--tables, --config: give one (your tables, or a configuration's)")
    if tables is not None:
        weights, labels = q.load_tables(tables)
        rows = [int(w.shape[0]) for w in weights]
        per_bag = q.DEFAULT_POOLING_FACTOR if pooling_factor is None else pooling_factor
        factors = q.check_sampling(len(weights), bags, per_bag)
        loaded = q.load_trace(trace, rows, seed)
        source = str(tables)
    else:  # the checks and the trace before the tables are drawn (paper: 3 GB)
        cfg = make_config(config or "small", rows_cap=rows_cap)
        per_table = cfg.pooling_factors if pooling_factor is None else pooling_factor
        factors = q.check_sampling(cfg.num_tables, bags, per_table)
        loaded = q.load_trace(trace, cfg.table_rows, seed)
        weights = list(random_tables(cfg, torch.float32, "cpu", seed).weights)
        labels = [f"tables[{i}]" for i in range(len(weights))]
        source = f"config {cfg.name}"
    quantized, report = q.quantize_with_report(
        weights, fmt, labels, trace=loaded, bags=bags, pooling_factor=factors
    )
    data = {"tables_from": source, **report.to_json()}
    settings.emit(data, "quantize.json")
    if save and settings.out is not None:
        q.save_quantized(settings.out / "quantized.pt", quantized, labels)
    cols = ["table", "rows", "dim", "bytes_per_row_before", "bytes_per_row_after",
            "max_rel_err", "mean_rel_err"]  # fmt: skip
    print_table(
        f"{source} in {fmt}: pooled-output error on {report.trace} ({bags} bags per table)",
        data["tables"],
        cols,
    )
    before = sum(t.bytes_per_row_before * t.rows for t in report.tables)
    after = sum(t.bytes_per_row_after * t.rows for t in report.tables)
    err_console.print(
        f"{before / 1e6:,.1f} MB -> {after / 1e6:,.1f} MB ({before / after:.2f}x fewer bytes)",
        highlight=False,
    )
