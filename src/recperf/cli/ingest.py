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


@app.command("simulate")
@one_line_errors
def simulate_cmd(
    spec: str = typer.Option(..., help="Bundled spec (criteo-16, udf-64, membound-128) or TOML."),
    tuner: str = typer.Option("intune", help="Tuner name or package.module:attr."),
    seed: int = typer.Option(0, help="Seed of the tuner and the simulated measurement noise."),
    budget_s: float = typer.Option(200.0, help="Tuning budget, simulated seconds (1 s windows)."),
    noise: float = typer.Option(0.02, help="Relative noise of each simulated measurement."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Tune a simulated ingestion pipeline and compare with the LP bound."""
    from recperf.ingest.tuning import simulate

    summary = simulate(spec, tuner, seed=seed, budget_s=budget_s, noise=noise)
    if json_out:
        typer.echo(dumps_json(summary), nl=False)
        return
    err_console.print(
        f"{summary['spec']} / {summary['tuner']}: {summary['throughput_rows_per_s']:,.0f} rows/s "
        f"= {summary['fraction_of_bound']:.3f} of the LP bound "
        f"({summary['lp_bound_rows_per_s']:,.0f}); workers {summary['allocation']}; "
        f"memory {summary['peak_memory_bytes'] / 2**30:.1f} / "
        f"{summary['memory_budget_bytes'] / 2**30:.1f} GiB; {summary['tuning_steps']} steps, "
        f"{summary['refused']} refused",
        highlight=False,
    )


@app.command("pretrain")
@one_line_errors
def pretrain_cmd(
    episodes: int = typer.Option(400, help="Episodes on random simulated pipelines."),
    seed: int = typer.Option(0, help="Seed of the pipelines, exploration and initial weights."),
    out: Path = typer.Option(..., help="Weights file to write (e.g. intune-dqn.pt)."),
) -> None:
    """Pre-train the intune DQN on random simulated pipelines and save its weights."""
    import shlex

    from recperf.core.results import atomic_path
    from recperf.ingest.tuners import dqn

    net, meta = dqn.pretrain(episodes, seed)
    args = ["--episodes", str(episodes), "--seed", str(seed), "--out", str(out)]
    meta["command"] = "recperf ingest pretrain " + shlex.join(args)
    with atomic_path(out) as tmp:
        dqn.save(net, meta, tmp)
    err_console.print(
        f"pretrained {episodes} episodes in {meta['wall_s']:.1f} s "
        f"(last-100 mean fraction of bound {meta['final_fraction_last100']:.3f}); wrote {out}"
    )
