"""``recperf ingest``: generate Criteo-format data, run and tune the live ingestion pipeline,
simulate tuners on a pipeline model."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from recperf.cli import ingest_ray as ray_cli
from recperf.cli.common import err_console, show
from recperf.cli.options import Flag, Settings, command
from recperf.core.config import from_mapping
from recperf.core.errors import ConfigError
from recperf.core.progress import progress_from_first_update
from recperf.ingest.base import MAX_INFLIGHT, MAX_THREADS
from recperf.ingest.data.limits import BUNDLED_SPECS, FORMATS, MAX_ROWS

app = typer.Typer(
    help="DLRM training-data ingestion: data, the live pipeline, tuners.", no_args_is_help=True
)


def _rows(text: str) -> int:
    """``--rows``: a whole number, also written as 2e4 or 20_000."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value != int(value):
        raise ConfigError(f"--rows {text!r}: expected a whole number of rows, 1..{MAX_ROWS:.0e}")
    return int(value)


@command(
    app, "generate", writes="part-NNNNN.* shards and manifest.json", out="required",
    json_help="Print the manifest (with the generation rate) to stdout.",
)  # fmt: skip
def generate_cmd(
    settings: Settings,
    rows: str = typer.Option(
        ..., metavar="INTEGER", help=f"Total rows over all shards (1..{MAX_ROWS:.0e}; 2e4 works)."
    ),
    fmt: str = typer.Option("parquet", "--format", help=f"Output format: {', '.join(FORMATS)}."),
    shards: int = typer.Option(1, help="Number of output files."),
    seed: int = typer.Option(0, help="Same seed, rows and shards give byte-identical files."),
    gzip: bool = typer.Option(False, "--gzip", help="TSV only: gzip each shard."),
    zipf_exponent: float = typer.Option(
        1.1, help="Skew of the categorical ids (power law; > 0, at most 10)."
    ),
) -> None:
    """Generate synthetic Criteo-format rows (label, I1..I13, C1..C26) as Parquet or TSV."""
    from recperf.ingest.data.criteo import GenerateConfig, generate

    config = GenerateConfig(
        rows=_rows(rows),
        shards=shards,
        seed=seed,
        format=fmt,
        gzip=gzip,
        zipf_exponent=zipf_exponent,
    )
    out = settings.out
    assert out is not None
    t0 = time.perf_counter()
    with progress_from_first_update(f"generating {config.rows:,} rows") as bar:
        manifest = generate(config, out, progress=bar)
    wall = time.perf_counter() - t0
    rate = config.rows / max(wall, 1e-9)
    settings.emit({**manifest, "wall_s": wall, "throughput_rows_per_s": rate}, name=None)
    err_console.print(
        f"{config.rows:,} rows in {config.shards} {config.format} shard(s) in {wall:.2f} s "
        f"({rate:,.0f} rows/s); manifest in {out / 'manifest.json'}"
    )


@command(
    app, "simulate", writes="summary.json", scopes_help="the tuner's name, e.g. intune, plumber",
)  # fmt: skip
def simulate_cmd(
    settings: Settings,
    spec: str = typer.Option(..., help=f"Bundled spec ({', '.join(BUNDLED_SPECS)}) or TOML."),
    tuner: str = typer.Option("intune", help="Tuner name or package.module:attr."),
    seed: int = typer.Option(0, help="Seed of the tuner and the simulated measurement noise."),
    budget_s: float = typer.Option(
        200.0, help="Tuning budget, simulated seconds (1 s windows; > 0, at most 100000)."
    ),
    noise: float = typer.Option(
        0.02, help="Relative noise of each simulated measurement (0..0.5)."
    ),
) -> None:
    """Tune a simulated ingestion pipeline and compare with the LP bound."""
    from recperf.ingest.tuning import simulate

    options = settings.resolve([tuner], {"tuner": tuner})[tuner]
    summary = simulate(spec, tuner, seed=seed, budget_s=budget_s, noise=noise, options=options)
    settings.emit(summary)
    if settings.json:
        return
    err_console.print(
        f"{summary['spec']} / {summary['tuner']}: {_rate(summary['throughput_rows_per_s'])} "
        f"rows/s = {_share(summary['fraction_of_bound'])} of the LP bound "
        f"({_rate(summary['lp_bound_rows_per_s'])}); {summary['allocation']['label']}; "
        f"memory {summary['peak_memory_bytes'] / 2**30:.1f} / "
        f"{summary['memory_budget_bytes'] / 2**30:.1f} GiB; {summary['tuning_steps']} steps, "
        f"{summary['refused']} refused",
        highlight=False,
    )


def _rate(rows_per_s: float) -> str:
    """Rows/s with thousands separators, or 3 significant digits below 100 (not "0")."""
    return f"{rows_per_s:,.0f}" if rows_per_s >= 100 else f"{rows_per_s:.3g}"


def _share(fraction: float | None) -> str:
    """A fraction of a bound; None (the bound was 0) is "n/a", not 1.000."""
    return "n/a" if fraction is None else f"{fraction:.3f}"


@command(
    app, "pretrain", writes="the weights (e.g. intune-dqn.npz)", out="required", out_is_dir=False,
    json_help="Print the training record (episodes, wall time, fractions) as JSON.",
)  # fmt: skip
def pretrain_cmd(
    settings: Settings,
    episodes: int = typer.Option(400, help="Episodes on random simulated pipelines."),
    seed: int = typer.Option(0, help="Seed of the pipelines, exploration and initial weights."),
) -> None:
    """Pre-train the intune DQN on random simulated pipelines and save its weights."""
    import shlex

    from recperf.core.results import atomic_path
    from recperf.ingest.tuners import dqn

    out = settings.out
    assert out is not None
    if out.is_dir():
        raise ConfigError(f"--out {out}: is a directory; expected the weights file to write")
    net, meta = dqn.pretrain(episodes, seed)
    args = ["--episodes", str(episodes), "--seed", str(seed), "--out", str(out)]
    meta["command"] = "recperf ingest pretrain " + shlex.join(args)
    with atomic_path(out) as tmp:
        dqn.save(net, meta, tmp)
    settings.emit(meta, name=None)
    err_console.print(
        f"pretrained {episodes} episodes in {meta['wall_s']:.1f} s "
        f"(last-100 mean fraction of bound {meta['final_fraction_last100']:.3f}); wrote {out}"
    )


PIPELINE_FLAGS = (
    Flag("batch_size", "pipeline", int | None, "Rows per batch (default 4096)"),
    Flag("downsample_rate", "pipeline", float | None,
         "Keep this share of negative rows (adds the stage)"),
    Flag("shuffle_window", "pipeline", int | None,
         "Batches a shuffle task mixes; 0 drops the shuffle stage (default 8)"),
    Flag("queue_batches", "pipeline", int | None,
         "Batches buffered before each stage (default 4)"),
    Flag("memory_budget_gib", "pipeline", float | None,
         "Memory budget for workers plus buffers, GiB (default 4)"),
    Flag("seed", "pipeline", int | None,
         "Seeds the read order, shuffle, downsampling and the tuner (default 0)"),
    Flag("read_latency_ms", "pipeline", float | None,
         "Emulated remote-storage latency per batch read, ms (default 0)"),
)  # fmt: skip
PIPELINE_HELP = "pipeline (PipelineConfig: batch_size, chunk_rows, read_concurrency, ...)"


_DATA = typer.Option(
    None, help="Criteo data: a Parquet / TSV(.gz) file or a directory of shards (required "
    "unless --engine ray --spec).",
)  # fmt: skip
_NO_DATA = "--data: required (Criteo data: a Parquet / TSV(.gz) file or a directory of shards)"
_CORES = typer.Option(None, help="Cores to share among the stages, >= 1 (default: all).")


@command(
    app, "run", writes="summary.json", scopes_help=PIPELINE_HELP, flags=PIPELINE_FLAGS,
)  # fmt: skip
def run_cmd(
    settings: Settings,
    data: Path | None = _DATA,
    alloc: str = typer.Option(
        "fused",
        help="fused (one segment, a worker per core), even (every stage its own segment, cores "
        "dealt round-robin), auto (tune a few seconds with plumber, then run) or an allocation "
        "TOML from `ingest tune`. --engine ray also takes ray-default (Ray Data's autoscalers) "
        "and a tuner's name: plumber, autotune, intune, oracle, static.",
    ),
    seconds: float = typer.Option(
        10.0, help="Seconds to measure (after a 1 s warm-up; > 0, at most a day)."
    ),
    cores: int | None = _CORES,
    threads: int | None = typer.Option(
        None,
        help=f"Threads per worker in every segment of the fused, even or file allocation "
        f"(0..{MAX_THREADS}; 0: the workers are threads of this process, no worker processes; "
        "default: the allocation's own, else 1).",
    ),
    inflight: int | None = typer.Option(
        None,
        help=f"Storage requests each reading worker keeps in flight (1..{MAX_INFLIGHT}; "
        "default: the allocation file's, else the pipeline's read_concurrency).",
    ),
    engine: str = ray_cli.ENGINE,
    address: str | None = ray_cli.ADDRESS,
    spec: str | None = ray_cli.SPEC,
    nodes: int | None = ray_cli.NODES,
    cpus_per_node: int | None = ray_cli.CPUS_PER_NODE,
    link_gbps: float | None = ray_cli.LINK_GBPS,
    budget_s: float | None = typer.Option(
        None, help="--engine ray: tuning budget, seconds, when --alloc names a tuner (default 120)."
    ),
) -> None:
    """Run the live pipeline and report throughput (with its 90% interval over 0.5-s
    sub-windows and the machine's other load), per-stage metrics, hand-off and consumer CPU."""
    flags = ray_cli.RayFlags(engine=engine, address=address, spec=spec, nodes=nodes,
                             cpus_per_node=cpus_per_node, link_gbps=link_gbps)  # fmt: skip
    if flags.check(native_only=("cores", "threads", "inflight"), ray_only=("budget_s",)):
        job = ray_cli.prepare(settings, flags, data)
        ray_cli.run(settings, job, ray_cli.allocation(job, alloc), seconds, budget_s)
        return
    if data is None:
        raise ConfigError(_NO_DATA)
    from recperf.ingest import api
    from recperf.ingest.live.batch import PipelineConfig

    cfg = from_mapping(PipelineConfig, settings.resolve(["pipeline"])["pipeline"], "pipeline")
    with progress_from_first_update(f"running the pipeline for {seconds:g} s") as bar:
        out = api.run(data, alloc, cfg, seconds, cores=cores, threads=threads,
                      inflight=inflight, progress=bar)  # fmt: skip
    settings.emit(out)
    table = Table(
        title=Text(
            f"{out['throughput_rows_per_s']:,.0f} rows/s{_ci(out)} over {out['seconds']:.1f} s; "
            f"{out['allocation']['label']}"
        )
    )
    for col in ("stage", "workers", "rows/s", "busy", "queue fill", "CPU µs/row"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for s in out["per_stage"]:
        cost = "-" if s["cost_us_per_row"] is None else f"{s['cost_us_per_row']:.2f}"
        table.add_row(s["stage"], str(s["workers"]), f"{s['rows_per_s']:,.0f}",
                      f"{s['busy_frac']:.0%}", f"{s['queue_fill']:.0%}", cost)  # fmt: skip
    show(table)
    err_console.print(
        f"peak memory {out['peak_memory_bytes'] / 2**20:,.0f} MiB of "
        f"{out['memory_budget_bytes'] / 2**20:,.0f} MiB; {out['restarts']} worker restarts; "
        f"hand-off {_us(out['handoff_us_per_row'])} and consumer {_us(out['consumer_us_per_row'])}"
        f" CPU µs/row; sub-window quartiles {_quartiles(out['subwindow_quartiles_rows_per_s'])} "
        f"rows/s; other load {_load(out['other_load_cores'])}",
        highlight=False,
    )


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _ci(summary: Mapping[str, Any]) -> str:
    """`` ± h (90%, n windows)`` from a summary's interval, or nothing without one."""
    ci = summary.get("throughput_ci_rows_per_s")
    if not ci:
        return ""
    return f" ± {(ci[1] - ci[0]) / 2:,.0f} (90%, {summary['samples']} windows)"


def _quartiles(q: list[float] | None) -> str:
    return "-" if not q else " / ".join(f"{x:,.0f}" for x in q)


def _load(cores: float | None) -> str:
    return "not measured" if cores is None else f"{cores:.2f} cores"


@command(
    app, "tune", writes="allocation.toml, calibrated.toml, summary.json", out="required",
    flags=PIPELINE_FLAGS,
    scopes_help=f"{PIPELINE_HELP}, or the tuner's name, e.g. intune",
)  # fmt: skip
def tune_cmd(
    settings: Settings,
    data: Path | None = _DATA,
    tuner: str = typer.Option("intune", help="static, autotune, plumber, intune, oracle, or M:A."),
    budget_s: float = typer.Option(
        60.0, help="Seconds of live tuning (> 0, at most a day; --engine ray: default 120)."
    ),
    cores: int | None = _CORES,
    warmup_s: float = typer.Option(2.0, help="Seconds of running before tuning starts (>= 0)."),
    final_s: float = typer.Option(4.0, help="Seconds measuring the chosen allocation (> 0)."),
    rel_tol: float = typer.Option(
        0.05,
        help="A window grows until its throughput's 90% interval is within this share of it "
        "(>= 0; 0: always grow to --max-extend).",
    ),
    max_extend: float = typer.Option(
        3.0, help="The most a window grows, times its tuner's window (1..100; 1: never)."
    ),
    engine: str = ray_cli.ENGINE,
    address: str | None = ray_cli.ADDRESS,
    spec: str | None = ray_cli.SPEC,
    nodes: int | None = ray_cli.NODES,
    cpus_per_node: int | None = ray_cli.CPUS_PER_NODE,
    link_gbps: float | None = ray_cli.LINK_GBPS,
) -> None:
    """Tune the live pipeline's cuts and workers; write the allocation `run --alloc` reads."""
    flags = ray_cli.RayFlags(engine=engine, address=address, spec=spec, nodes=nodes,
                             cpus_per_node=cpus_per_node, link_gbps=link_gbps)  # fmt: skip
    if flags.check(native_only=("cores", "warmup_s", "rel_tol", "max_extend")):
        budget = budget_s if ray_cli.given("budget_s") else ray_cli.TUNE_BUDGET_S
        ray_cli.tune(settings, ray_cli.prepare(settings, flags, data), tuner, budget, final_s)
        return
    if data is None:
        raise ConfigError(_NO_DATA)
    from recperf.ingest import api
    from recperf.ingest.base import Measurement
    from recperf.ingest.live.batch import PipelineConfig

    opts = settings.resolve(["pipeline", tuner], {"tuner": tuner})
    cfg = from_mapping(PipelineConfig, opts["pipeline"], "pipeline")
    out = settings.out
    assert out is not None

    def show(m: Measurement) -> None:
        err_console.print(
            f"  {m.allocation.label(cfg.stage_names())}: {m.throughput_rows_per_s:,.0f} rows/s"
            f"{_ci(api.confidence_json(m))}; other load {_load(_finite(m.other_load_cores))}",
            highlight=False,
        )

    summary = api.tune(
        data, tuner, budget_s, cfg, out, seed=cfg.seed, cores=cores, warmup_s=warmup_s,
        final_s=final_s, options=opts[tuner], on_measure=show, rel_tol=rel_tol,
        max_extend=max_extend,
    )  # fmt: skip
    settings.emit(summary, name=None)  # api.tune wrote summary.json
    err_console.print(
        f"{tuner}: {summary['allocation']['label']} -> "
        f"{summary['throughput_rows_per_s']:,.0f} rows/s{_ci(summary)} = "
        f"{summary['fraction_of_bound']:.2f} of the bound {summary['bound_rows_per_s']:,.0f} "
        f"(from measured stage costs) after {summary['tuning_s']:.0f} s; other load "
        f"{_load(summary['other_load_cores'])} (while tuning "
        f"{_load(summary['tuning_other_load_cores'])}); wrote {out / 'allocation.toml'}",
        highlight=False,
    )
