"""``recperf ingest``: generate and read Criteo-format DLRM training data."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from recperf.cli.common import err_console, one_line_errors
from recperf.core.progress import progress_bar
from recperf.core.results import dumps_json
from recperf.ingest.criteo import FORMATS, GenerateConfig, generate

app = typer.Typer(help="DLRM training-data ingestion: Criteo-format data.", no_args_is_help=True)


@app.command("generate")
@one_line_errors
def generate_cmd(
    rows: int = typer.Option(..., help="Total rows over all shards."),
    out: Path = typer.Option(..., help="Directory for part-NNNNN.* shards and manifest.json."),
    fmt: str = typer.Option("parquet", "--format", help=f"Output format: {', '.join(FORMATS)}."),
    shards: int = typer.Option(1, help="Number of output files."),
    seed: int = typer.Option(0, help="Same seed, rows and shards give byte-identical files."),
    gzip: bool = typer.Option(False, "--gzip", help="TSV only: gzip each shard."),
    zipf_exponent: float = typer.Option(1.1, help="Skew of the categorical ids (power law)."),
    json_out: bool = typer.Option(False, "--json", help="Print the manifest to stdout."),
) -> None:
    """Generate synthetic Criteo-format rows (label, I1..I13, C1..C26) as Parquet or TSV."""
    config = GenerateConfig(
        rows=rows, shards=shards, seed=seed, format=fmt, gzip=gzip, zipf_exponent=zipf_exponent
    )
    t0 = time.perf_counter()
    with progress_bar(f"generating {rows:,} rows") as bar:
        manifest = generate(config, out, progress=bar)
    wall = time.perf_counter() - t0
    rate = rows / max(wall, 1e-9)
    if json_out:
        typer.echo(
            dumps_json({**manifest, "wall_s": wall, "throughput_rows_per_s": rate}), nl=False
        )
    err_console.print(
        f"{rows:,} rows in {config.shards} {config.format} shard(s) in {wall:.2f} s "
        f"({rate:,.0f} rows/s); manifest in {out / 'manifest.json'}"
    )
