"""``recperf ingest``: generate Criteo-format data, run and tune the live ingestion pipeline,
simulate tuners on a pipeline model."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from recperf.cli.common import err_console, one_line_errors
from recperf.core.progress import progress_bar
from recperf.core.results import dumps_json
from recperf.ingest.data.criteo import FORMATS, GenerateConfig, generate
from recperf.ingest.live.batch import PipelineConfig

app = typer.Typer(
    help="DLRM training-data ingestion: data, the live pipeline, tuners.", no_args_is_help=True
)


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
    spec: str = typer.Option(
        ..., help="Bundled spec (criteo-16, udf-64, membound-128, live-2, udfcut-4) or TOML."
    ),
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
        f"({summary['lp_bound_rows_per_s']:,.0f}); {summary['allocation']['label']}; "
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


def _pipeline_config(
    batch_size: int,
    downsample_rate: float | None,
    shuffle_window: int,
    queue_batches: int,
    memory_budget_gib: float,
    seed: int,
    read_latency_ms: float = 0.0,
) -> PipelineConfig:
    return PipelineConfig(
        batch_size=batch_size,
        downsample_rate=downsample_rate,
        shuffle_window=shuffle_window,
        queue_batches=queue_batches,
        memory_budget_gib=memory_budget_gib,
        seed=seed,
        read_latency_ms=read_latency_ms,
    )


_DATA = typer.Option(..., help="Criteo data: a Parquet / TSV(.gz) file or a directory of shards.")
_BATCH = typer.Option(4096, "--batch-size", help="Rows per batch.")
_DOWNSAMPLE = typer.Option(None, help="Keep this share of negative rows (adds the stage).")
_WINDOW = typer.Option(8, help="Batches a shuffle task mixes; 0 drops the shuffle stage.")
_QUEUE = typer.Option(4, help="Batches buffered before each stage.")
_MEMORY = typer.Option(4.0, help="Memory budget for workers plus buffers, GiB.")
_SEED = typer.Option(0, help="Seeds the read order, shuffle, downsampling and the tuner.")
_CORES = typer.Option(None, help="Cores to share among the stages (default: all).")
_LATENCY = typer.Option(0.0, help="Emulated remote-storage latency per batch read, ms.")


@app.command("run")
@one_line_errors
def run_cmd(
    data: Path = _DATA,
    alloc: str = typer.Option(
        "fused",
        help="fused (one segment, a worker per core), even (every stage its own segment, cores "
        "dealt round-robin), auto (tune a few seconds with plumber, then run) or an allocation "
        "TOML from `ingest tune`.",
    ),
    batch_size: int = _BATCH,
    seconds: float = typer.Option(10.0, help="Seconds to measure (after a 1 s warm-up)."),
    downsample_rate: float | None = _DOWNSAMPLE,
    shuffle_window: int = _WINDOW,
    queue_batches: int = _QUEUE,
    memory_budget_gib: float = _MEMORY,
    seed: int = _SEED,
    cores: int | None = _CORES,
    read_latency_ms: float = _LATENCY,
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    out_dir: Path | None = typer.Option(None, "--out", help="Directory for summary.json."),
) -> None:
    """Run the live pipeline and report throughput, per-stage metrics, hand-off and consumer
    CPU."""
    from recperf.ingest import api

    cfg = _pipeline_config(
        batch_size, downsample_rate, shuffle_window, queue_batches, memory_budget_gib, seed,
        read_latency_ms,
    )  # fmt: skip
    with progress_bar(f"running the pipeline for {seconds:g} s") as bar:
        out = api.run(data, alloc, cfg, seconds, cores=cores, progress=bar)
    if out_dir is not None:
        from recperf.core.results import write_json

        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(out_dir / "summary.json", out)
    if json_out:
        typer.echo(dumps_json(out), nl=False)
    table = Table(
        title=f"{out['throughput_rows_per_s']:,.0f} rows/s over {out['seconds']:.1f} s; "
        f"{out['allocation']['label']}"
    )
    for col in ("stage", "workers", "rows/s", "busy", "queue fill", "CPU µs/row"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for s in out["per_stage"]:
        cost = "-" if s["cost_us_per_row"] is None else f"{s['cost_us_per_row']:.2f}"
        table.add_row(s["stage"], str(s["workers"]), f"{s['rows_per_s']:,.0f}",
                      f"{s['busy_frac']:.0%}", f"{s['queue_fill']:.0%}", cost)  # fmt: skip
    err_console.print(table)
    err_console.print(
        f"peak memory {out['peak_memory_bytes'] / 2**20:,.0f} MiB of "
        f"{out['memory_budget_bytes'] / 2**20:,.0f} MiB; {out['restarts']} worker restarts; "
        f"hand-off {_us(out['handoff_us_per_row'])} and consumer {_us(out['consumer_us_per_row'])}"
        " CPU µs/row",
        highlight=False,
    )


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


@app.command("tune")
@one_line_errors
def tune_cmd(
    data: Path = _DATA,
    tuner: str = typer.Option("intune", help="static, autotune, plumber, intune, oracle, or M:A."),
    budget_s: float = typer.Option(60.0, help="Seconds of live tuning."),
    out: Path = typer.Option(..., help="Directory for allocation.toml, summary.json, ..."),
    batch_size: int = _BATCH,
    downsample_rate: float | None = _DOWNSAMPLE,
    shuffle_window: int = _WINDOW,
    queue_batches: int = _QUEUE,
    memory_budget_gib: float = _MEMORY,
    seed: int = _SEED,
    cores: int | None = _CORES,
    read_latency_ms: float = _LATENCY,
    warmup_s: float = typer.Option(2.0, help="Seconds of running before tuning starts."),
    final_s: float = typer.Option(4.0, help="Seconds measuring the chosen allocation."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Tune the live pipeline's cuts and workers; write the allocation `run --alloc` reads."""
    from recperf.ingest import api
    from recperf.ingest.base import Measurement

    cfg = _pipeline_config(
        batch_size, downsample_rate, shuffle_window, queue_batches, memory_budget_gib, seed,
        read_latency_ms,
    )  # fmt: skip

    def show(m: Measurement) -> None:
        err_console.print(
            f"  {m.allocation.label(cfg.stage_names())}: {m.throughput_rows_per_s:,.0f} rows/s",
            highlight=False,
        )

    summary = api.tune(
        data, tuner, budget_s, cfg, out, seed=seed, cores=cores, warmup_s=warmup_s,
        final_s=final_s, on_measure=show,
    )  # fmt: skip
    if json_out:
        typer.echo(dumps_json(summary), nl=False)
    err_console.print(
        f"{tuner}: {summary['allocation']['label']} -> "
        f"{summary['throughput_rows_per_s']:,.0f} rows/s = "
        f"{summary['fraction_of_bound']:.2f} of the bound {summary['bound_rows_per_s']:,.0f} "
        f"(from measured stage costs) after {summary['tuning_s']:.0f} s; wrote "
        f"{out / 'allocation.toml'}",
        highlight=False,
    )
