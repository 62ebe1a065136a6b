"""Benchmark embedding kernels for a DLRM inference configuration and an access trace: time per
batch, bytes moved and achieved bandwidth against the device's copy bandwidth, speedup over the
``torch`` reference, and the whole inference model's stage breakdown."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from recperf.core import hostload
from recperf.core.errors import ConfigError
from recperf.embed import locality, traces
from recperf.embed.autotune import Space, autotune, device_name
from recperf.embed.kernels.base import KERNELS, EmbeddingKernel, Lookup, Tables, kernel_traits
from recperf.embed.kernels.torch_hot import hot_first_order
from recperf.embed.model import EmbedConfig, inference_model, lengths_for, random_tables
from recperf.embed.timing import (
    copy_bandwidth,
    lookup_bytes,
    median_s,
    resolve_device,
    time_calls,
)

CPU_HOT_FRACTION = 0.1
"""Share of each table's rows treated as hot where no L2 limit applies (the CPU)."""
Progress = Callable[[float], None]


@dataclass(kw_only=True, slots=True)
class VariantResult:
    """One variant's figures."""

    variant: str
    params: dict[str, Any]
    ms_per_batch: float
    """The median over the timed calls."""
    ms_q1: float
    """First quartile of the timed calls (ms)."""
    ms_q3: float
    """Third quartile of the timed calls (ms)."""
    gb_per_s: float
    pct_of_copy_bw: float
    speedup_vs_torch: float
    max_abs_err: float


@dataclass(kw_only=True, slots=True)
class BenchResult:
    """Everything one benchmark measured."""

    config: str
    trace: str
    device: str
    dtype: str
    batch_size: int
    lookups_per_batch: int
    bytes_per_batch: int
    copy_gb_per_s: float
    other_load_cores: float | None = None
    """The machine's load from other processes while the variants were timed (cores)."""
    variants: list[VariantResult] = field(default_factory=list)
    stages_ms: dict[str, float] = field(default_factory=dict)
    locality: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def make_lookups(cfg: EmbedConfig, trace: traces.Trace, count: int, device: str) -> list[Lookup]:
    """``count`` consecutive batches of ``cfg``'s shape drawn from ``trace`` (each table's
    stream cycled; ids taken modulo the table's rows)."""
    b = cfg.batch_size
    lengths = lengths_for(cfg, "cpu")
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    out = []
    for k in range(count):
        parts = []
        for t, (rows, per_bag) in enumerate(zip(cfg.table_rows, cfg.pooling_factors, strict=True)):
            stream = trace.ids[t % trace.tables]
            n = b * per_bag
            pos = (torch.arange(n, dtype=torch.int64) + k * n) % stream.numel()
            parts.append(stream[pos] % rows)
        out.append(
            Lookup(indices=torch.cat(parts).to(device), offsets=offsets.to(device), batch_size=b)
        )
    return out


def hot_rows_for(cfg: EmbedConfig, trace: traces.Trace, tables: Tables) -> tuple[torch.Tensor, ...]:
    """The hottest rows per table, as many as fit the device's persisting L2 (GPU) or
    ``CPU_HOT_FRACTION`` of each table (CPU), split evenly over the tables."""
    if tables.device.type == "cuda":
        limit = torch.cuda.get_device_properties(tables.device).L2_cache_size * 3 // 4
        row_bytes = tables.dim * tables.weights[0].element_size()
        per_table = max(1, limit // row_bytes // cfg.num_tables)
    else:
        per_table = max(1, int(min(cfg.table_rows) * CPU_HOT_FRACTION))
    hot = locality.hot_rows(trace, per_table)
    return tuple(
        hot_first_order(rows, hot[t % len(hot)] % rows)[: min(per_table, rows)].to(tables.device)
        for t, rows in enumerate(cfg.table_rows)
    )


def _kernel(
    name: str, tables: Tables, params: Mapping[str, Any], hot: tuple[torch.Tensor, ...]
) -> EmbeddingKernel:
    extra: dict[str, Any] = {"hot_rows": hot} if kernel_traits(name).hot_rows else {}
    return KERNELS.build(name, params, tables, **extra)


def check_args(
    variants: Sequence[str],
    *,
    device: str | None,
    reps: int,
    inputs: int | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """Check ``bench``'s arguments before any work (unknown variants, bad options, a device
    this machine lacks, ``reps`` or ``inputs`` < 1): one ConfigError; return the device."""
    unknown = [v for v in variants if v not in KERNELS]
    if unknown:
        raise ConfigError(f"variant {unknown[0]!r}: expected one of {', '.join(KERNELS.names())}")
    for name in variants:
        KERNELS.config(name, (options or {}).get(name))
    if reps < 1:
        raise ConfigError(f"reps = {reps}: expected an integer >= 1")
    if inputs is not None and inputs < 1:
        raise ConfigError(f"inputs = {inputs}: expected an integer >= 1 (None: default)")
    return resolve_device(device)


def bench_trace(cfg: EmbedConfig, trace_name: str, seed: int = 0) -> traces.Trace:
    """The trace ``bench`` runs: a generated one sized to ``cfg``'s largest table, or a recorded
    one with its own rows; either with ``cfg``'s tables."""
    generated = (
        trace_name == "uniform" or trace_name.startswith("zipf:") or trace_name in traces.PRESETS
    )
    rows = max(cfg.table_rows) if generated else None  # a recorded trace keeps its own rows
    return traces.resolve(trace_name, rows=rows, tables=cfg.num_tables, seed=seed)


def bench(
    cfg: EmbedConfig,
    trace_name: str | traces.Trace,
    variants: Sequence[str],
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    reps: int = 20,
    inputs: int | None = None,
    tune: bool = False,
    seed: int = 0,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    spaces: Mapping[str, Space] | None = None,
    progress: Progress | None = None,
) -> BenchResult:
    """Time each variant against ``torch``, built with its ``options`` (Config fields, e.g. CLI
    strings) and, with ``tune``, its autotuned fields over its registered space or ``spaces``.
    ``trace_name`` may be a trace ``bench_trace`` made (the CLI loads it before the work)."""
    device = check_args(variants, device=device, reps=reps, inputs=inputs, options=options)
    fixed = options or {}
    dev = torch.device(device)
    trace = (
        trace_name if isinstance(trace_name, traces.Trace) else bench_trace(cfg, trace_name, seed)
    )
    tables = random_tables(cfg, dtype, device, seed)
    lookups = make_lookups(cfg, trace, inputs or _rotation(cfg, tables), device)
    hot = hot_rows_for(cfg, trace, tables)
    nbytes = lookup_bytes(lookups[0], cfg.dim, tables.weights[0].element_size(), cfg.num_tables)
    result = BenchResult(
        config=cfg.name,
        trace=trace.name,
        device=device_name(dev),
        dtype=str(dtype).removeprefix("torch."),
        batch_size=cfg.batch_size,
        lookups_per_batch=int(lookups[0].indices.numel()),
        bytes_per_batch=nbytes,
        copy_gb_per_s=copy_bandwidth(dev, nbytes=_copy_bytes(dev)) / 1e9,
        locality=locality.stats(trace).to_json(),
    )
    ref = KERNELS.build("torch", None, tables)
    want = ref(lookups[0])
    load_before = hostload.sample()
    base = _quartiles_ms(ref, lookups, reps, dev)
    names = ["torch", *[v for v in variants if v != "torch"]]
    for i, name in enumerate(names):
        params: dict[str, Any] = dict(fixed.get(name, {}))
        if tune and name != "torch":
            params = autotune(
                tables,
                lookups,
                variants=[name],
                trace=trace.name,
                reps=reps,
                extra={name: {"hot_rows": hot}} if kernel_traits(name).hot_rows else None,
                options=fixed,
                spaces=spaces,
            ).params
        kernel = ref if name == "torch" else _kernel(name, tables, params, hot)
        err = float((kernel(lookups[0]) - want).abs().max())
        q1, ms, q3 = base if name == "torch" else _quartiles_ms(kernel, lookups, reps, dev)
        gbps = nbytes / (ms / 1e3) / 1e9
        result.variants.append(
            VariantResult(
                variant=name,
                params=params,
                ms_per_batch=ms,
                ms_q1=q1,
                ms_q3=q3,
                gb_per_s=gbps,
                pct_of_copy_bw=100.0 * gbps / result.copy_gb_per_s,
                speedup_vs_torch=base[1] / ms,
                max_abs_err=err,
            )
        )
        if progress is not None:
            progress((i + 1) / (len(names) + 1))
    result.other_load_cores = hostload.other_load_cores(load_before, hostload.sample())
    best = min(result.variants, key=lambda v: v.ms_per_batch)
    result.stages_ms = stage_breakdown(
        cfg,
        _kernel(best.variant, tables, best.params, hot) if best.variant != "torch" else ref,
        lookups,
        tables,
        reps,
    )
    return result


def _quartiles_ms(
    fn: EmbeddingKernel, lookups: Sequence[Lookup], reps: int, dev: torch.device
) -> tuple[float, float, float]:
    """First quartile, median and third quartile of ``reps`` timed calls, in ms."""
    times = sorted(1e3 * t for t in time_calls(fn, lookups, reps, dev))
    if len(times) < 2:
        return times[0], times[0], times[0]
    q1, q2, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return q1, q2, q3


def _rotation(cfg: EmbedConfig, tables: Tables) -> int:
    """Distinct input batches to rotate through: on a GPU enough that their rows exceed twice
    the L2 (so repeats do not hit in cache), at most 16; 4 on the CPU."""
    if tables.device.type != "cuda":
        return 4
    l2 = torch.cuda.get_device_properties(tables.device).L2_cache_size
    per_batch = cfg.lookups_per_batch * cfg.dim * tables.weights[0].element_size()
    return int(min(16, max(2, -(-2 * l2 // max(per_batch, 1)))))


def _copy_bytes(dev: torch.device) -> int:
    return 1 << 30 if dev.type == "cuda" else 1 << 27


def stage_breakdown(
    cfg: EmbedConfig, kernel: EmbeddingKernel, lookups: Sequence[Lookup], tables: Tables, reps: int
) -> dict[str, float]:
    """Median ms of each stage of the whole inference model (bottom MLP, embeddings, dot
    interaction and top MLP) with ``kernel`` as its embedding stage."""
    from recperf.models.dlrm import dot_interaction

    dev = tables.device
    model = inference_model(cfg, kernel).to(dev)
    if tables.dtype == torch.float16:
        model.bottom.half()
        model.top.half()
    dense = torch.rand(cfg.batch_size, 13, device=dev, dtype=tables.dtype)
    with torch.no_grad():
        pooled = model.embeddings(lookups[0].indices, lengths_for(cfg, str(dev)), None)
        bottom = model.bottom(dense)
        inter = dot_interaction(bottom.float(), pooled).to(tables.dtype)
        stages = {
            "bottom_mlp": median_s(lambda _: model.bottom(dense), [None], reps, dev),
            "embedding": median_s(kernel, lookups, reps, dev),
            "interaction": median_s(
                lambda _: dot_interaction(bottom.float(), pooled), [None], reps, dev
            ),
            "top_mlp": median_s(lambda _: model.top(inter), [None], reps, dev),
        }
    return {k: v * 1e3 for k, v in stages.items()}
