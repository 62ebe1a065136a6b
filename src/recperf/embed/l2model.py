"""A trace-driven model of the embedding kernels' L2 traffic on a GPU described by a spec: for
each kernel variant, the exact stream of L2 lines it touches (rows laid out as the kernel lays
them out), its LRU hit rate at every cache size from the stack distances (``stackdist``), the
DRAM bytes per batch, and a lower bound on the time from the DRAM and L2 bandwidths.

The layouts are ``l2layout``'s; ``hot-l2`` and ``combined`` pin their hot region in the
persisting L2: its lines always hit and the LRU holds the L2 less the carve-out. The first
``warmup`` batches fill the cache and are not counted.

It is a model, not a measurement. It leaves out (``LEAVES_OUT``): set associativity and the
hash of addresses to L2 slices (a fully associative LRU is modelled, over the whole L2 as one
pool, though A100/H100 split it in two partitions); sector promotion and prefetch (a miss fetches
the sectors a row covers, and a sector absent from a resident line counts as a hit); the other
kernels' traffic (MLPs, copies) and write-backs (the output counts once as written); and
concurrency (bags are replayed one after another, not as the SMs interleave them). Pinned lines
hit from their second access on (the window is set on every call, so they stay resident); the
first is a miss, as for the LRU's lines."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from recperf.core.config import check_range, check_seed
from recperf.core.errors import ConfigError
from recperf.embed import stackdist
from recperf.embed.gpus import GpuSpec
from recperf.embed.l2layout import (
    ALLOC_ALIGN,
    Accesses,
    accesses,
    hot_rows,
    line_stream,
    row_addresses,
)
from recperf.embed.l2layout import VARIANTS as VARIANTS  # re-exported: the modelled names
from recperf.embed.model import EmbedConfig
from recperf.embed.traces import Trace

F64 = npt.NDArray[np.float64]
LEAVES_OUT = (
    "Left out: set associativity and the hash of addresses to L2 slices (a fully associative "
    "LRU is modelled), the L2's split into two partitions on A100/H100, sector promotion and "
    "prefetch (a miss fetches only the sectors a row covers; a sector missing from a resident "
    "line counts as a hit), the other kernels' traffic (MLPs, copies), write-backs (the output "
    "is counted once as written), and concurrency (bags replayed one after another)."
)
MODEL_NOTE = "A model, not a measurement."
ELEMENT_BYTES = {"fp32": 4, "fp16": 2}
CURVE_POINTS = 41
"""Points of the hit-rate curve's log grid, 1 MiB to 1 GiB."""


@dataclass(kw_only=True, slots=True, frozen=True)
class PredictConfig:
    """Options of a prediction."""

    dtype: Literal["fp32", "fp16"] = "fp32"
    """Weight element type: fp32 or fp16."""
    batches: int = 2
    """Consecutive batches replayed (>= 2), the first ``warmup`` only to fill the cache."""
    warmup: int = 1
    """Batches that fill the cache before counting, 0 .. batches - 1."""
    sample: float = 1.0
    """Share of the lines replayed, in (0, 1]: 1 is exact, less samples lines by hash."""
    seed: int = 0
    """Seed of the line sample and of generated traces."""
    engine: stackdist.Engine = "auto"
    """Stack-distance engine: auto, numpy or numba."""
    hot_rows_per_table: int | None = None
    """Hot rows per table (hot variants); None: as many as fit the persisting-L2 maximum, split
    evenly over the tables (as the GPU benchmark chooses them)."""

    def __post_init__(self) -> None:
        if self.dtype not in ELEMENT_BYTES:
            raise ConfigError(f"dtype = {self.dtype!r}: expected fp32 or fp16")
        check_range("batches", self.batches, 2, 64)
        check_range("warmup", self.warmup, 0, self.batches - 1)
        check_range("sample", self.sample, 0.0, 1.0, lo_open=True)
        check_seed(self.seed)
        if self.engine not in ("auto", "numpy", "numba"):
            raise ConfigError(f"engine = {self.engine!r}: expected auto, numpy or numba")
        if self.hot_rows_per_table is not None:
            check_range("hot_rows_per_table", self.hot_rows_per_table, 1, None)


@dataclass(kw_only=True, slots=True, frozen=True)
class TablePrediction:
    """One table's share of a batch."""

    table: int
    lookups: int
    """Ids per batch."""
    hit_rate: float
    """Share of its L2 line accesses that hit."""
    l2_bytes: float
    """Bytes through the L2 per batch: its rows (sector granular), ids, offsets and output."""
    dram_bytes: float
    """Bytes from DRAM per batch: the rows' missed sectors, ids, offsets and output."""
    time_lower_bound_ms: float
    """max(dram_bytes / DRAM bandwidth, l2_bytes / L2 bandwidth)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class VariantPrediction:
    """One variant's predicted L2 behaviour per batch."""

    variant: str
    layout: str
    hot_rows_per_table: int
    carve_out_bytes: int
    """Persisting L2 set aside for the pinned region (0 without pinning)."""
    hit_rate: float
    """Share of the row line accesses that hit (pinned hits included)."""
    pinned_share: float
    """Share of the row line accesses to the pinned region."""
    l2_bytes_per_batch: float
    dram_bytes_per_batch: float
    time_lower_bound_ms: float
    """Per batch: the sum over tables (one launch each) or, fused, over the tables' sums."""
    bound: str
    """Which bandwidth sets the bound: dram or l2."""
    tables: tuple[TablePrediction, ...]
    curve_l2_bytes: tuple[int, ...]
    """L2 sizes of the hit-rate curve (the carve-out kept, the LRU taking the rest)."""
    curve_hit_rate: tuple[float, ...]


@dataclass(kw_only=True, slots=True, frozen=True)
class Prediction:
    """The model's answer for one GPU, configuration and trace."""

    gpu: GpuSpec
    config: str
    trace: str
    options: PredictConfig
    batch_size: int
    lookups_per_batch: int
    variants: tuple[VariantPrediction, ...]
    seconds: float
    """Time the model took."""

    def to_json(self) -> dict[str, Any]:
        o = self.options
        head = {"model": MODEL_NOTE, "leaves_out": LEAVES_OUT, "gpu": self.gpu.to_json()}
        keys = ("config", "trace", "batch_size", "lookups_per_batch")
        shape = {k: getattr(self, k) for k in keys}
        run = {"dtype": o.dtype, "batches": o.batches, "warmup_batches": o.warmup,
               "sample": o.sample, "seed": o.seed, "model_s": self.seconds}  # fmt: skip
        return head | shape | run | {"variants": [variant_json(v) for v in self.variants]}


def variant_json(v: VariantPrediction) -> dict[str, Any]:
    """One variant's prediction with snake_case keys, its tables as a list."""
    out = {k: getattr(v, k) for k in VariantPrediction.__slots__ if k not in ("tables",)}
    out["tables"] = [{k: getattr(t, k) for k in TablePrediction.__slots__} for t in v.tables]
    out["curve_l2_bytes"], out["curve_hit_rate"] = list(v.curve_l2_bytes), list(v.curve_hit_rate)
    return out


# -- predicting -------------------------------------------------------------------------------


def check_variants(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` if every one is modelled, else one ConfigError naming the first that is not."""
    for name in names:
        if name not in VARIANTS:
            raise ConfigError(f"variant {name!r}: no L2 model; modelled: {', '.join(VARIANTS)}")
    if not names:
        raise ConfigError(f"variants: none given; modelled: {', '.join(VARIANTS)}")
    return tuple(dict.fromkeys(names))


def curve_sizes(spec: GpuSpec) -> tuple[int, ...]:
    """L2 sizes of the curve: a log grid from 1 MiB to 1 GiB, the spec's L2 included."""
    grid = np.geomspace(1 << 20, 1 << 30, CURVE_POINTS).round().astype(np.int64).tolist()
    return tuple(sorted({*grid, spec.l2_bytes}))


@dataclass(frozen=True, slots=True)
class _Replay:
    """One layout's replay: per look-up (measured batches only) its line accesses and hits at
    the spec's L2, and the hits at each size of the curve."""

    lines: F64
    """Per table, line accesses per batch."""
    hits: F64
    """Per table, line hits per batch."""
    l2_row_bytes: F64
    dram_row_bytes: F64
    pinned_lines: float
    curve_hits: F64
    """Per curve size, line hits per batch (NaN where the L2 is smaller than the carve-out)."""


PINNED, KEPT_HIT, KEPT_MISS, UNSAMPLED, PINNED_COLD = range(5)
"""What happened to a line access: a pinned hit, a sampled LRU hit or miss, not sampled, or the
first access to a pinned line (a miss: pinning keeps lines, it does not load them)."""


def _replay(
    spec: GpuSpec,
    acc: Accesses,
    addr: npt.NDArray[np.int64],
    row_bytes: int,
    carve: int,
    opts: PredictConfig,
    progress: Callable[[float], None] | None,
) -> _Replay:
    s = line_stream(addr, row_bytes, spec)
    k, line = s.lines_per_unit, spec.line_bytes
    carve_lines = -(-carve // line)
    kind = np.full(s.unit.size, UNSAMPLED, dtype=np.int8)
    if carve:
        pinned = np.flatnonzero(s.unit * line + k * line <= carve)
        kind[pinned] = PINNED
        kind[pinned[np.unique(s.unit[pinned], return_index=True)[1]]] = PINNED_COLD
    lru_access = (kind != PINNED) & (kind != PINNED_COLD)
    keep = np.flatnonzero(lru_access & stackdist.sampled(s.unit, opts.sample, opts.seed))
    dist = stackdist.stack_distances(s.unit[keep], opts.engine, progress)
    cap = max(spec.l2_lines - carve_lines, 0) // k
    kind[keep] = np.where((dist >= 0) & (dist < opts.sample * cap), KEPT_HIT, KEPT_MISS)
    # the batches follow one another: the counted accesses are the stream's tail
    batch = acc.batch if s.source is None else acc.batch[s.source]
    start = int(np.searchsorted(batch, opts.warmup))
    table = acc.table[start:] if s.source is None else acc.table[s.source[start:]]
    t_count = len(acc.lookups)
    per_batch = 1.0 / (opts.batches - opts.warmup)
    code = table * 5 + kind[start:]
    n: F64 = np.bincount(code, minlength=5 * t_count).astype(np.float64).reshape(t_count, 5)
    n *= per_batch
    if isinstance(s.nbytes, int):  # every access reads the same bytes
        nbytes = n * s.nbytes
    else:
        weighed = np.bincount(code, weights=s.nbytes[start:], minlength=5 * t_count)
        nbytes = weighed.astype(np.float64).reshape(t_count, 5) * per_batch
    # ratio estimates: each table's sampled LRU accesses stand for all its LRU accesses
    kept = n[:, KEPT_HIT] + n[:, KEPT_MISS]
    lru = kept + n[:, UNSAMPLED]
    overall = float(lru.sum()) / max(float(kept.sum()), 1e-300)
    scale = np.where(kept > 0, lru / np.maximum(kept, 1e-300), overall)
    sizes = np.asarray(curve_sizes(spec), dtype=np.int64)
    lru_units = np.maximum(sizes // line - carve_lines, 0) // k
    warm = np.sort(dist[(keep >= start) & (dist >= 0)])
    curve = np.searchsorted(warm, opts.sample * lru_units, side="left") * per_batch * overall
    pin_hits, pin_all = n[:, PINNED], n[:, PINNED] + n[:, PINNED_COLD]
    return _Replay(
        lines=(lru + pin_all) * k,
        hits=(n[:, KEPT_HIT] * scale + pin_hits) * k,
        l2_row_bytes=nbytes.sum(axis=1),
        dram_row_bytes=nbytes[:, KEPT_MISS] * scale + nbytes[:, PINNED_COLD],
        pinned_lines=float(pin_all.sum() * k),
        curve_hits=np.where(sizes >= carve, (curve + pin_hits.sum()) * k, np.nan),
    )


def _io_bytes(cfg: EmbedConfig, lookups: Sequence[int]) -> F64:
    """Per table and batch, the bytes besides rows: int64 ids and offsets, float32 output."""
    b = cfg.batch_size
    return np.asarray([n * 8 + b * 8 + b * cfg.dim * 4 for n in lookups], dtype=np.float64)


def _variant(
    name: str, spec: GpuSpec, cfg: EmbedConfig, rep: _Replay, io: F64, carve: int, hot: int
) -> VariantPrediction:
    model = VARIANTS[name]
    dram_bw, l2_bw = spec.dram_gb_per_s * 1e9, spec.l2_gb_per_s * 1e9
    l2_t, dram_t = rep.l2_row_bytes + io, rep.dram_row_bytes + io
    t_dram, t_l2 = dram_t / dram_bw, l2_t / l2_bw
    per_table = np.maximum(t_dram, t_l2)
    if model.fused:
        total = max(float(t_dram.sum()), float(t_l2.sum()))
        bound = "dram" if t_dram.sum() >= t_l2.sum() else "l2"
    else:
        total = float(per_table.sum())
        bound = "dram" if float(per_table[t_dram >= t_l2].sum()) >= total / 2 else "l2"
    lines = float(rep.lines.sum())
    tables = tuple(
        TablePrediction(
            table=t,
            lookups=int(n),
            hit_rate=float(rep.hits[t] / rep.lines[t]) if rep.lines[t] else float("nan"),
            l2_bytes=float(l2_t[t]),
            dram_bytes=float(dram_t[t]),
            time_lower_bound_ms=float(per_table[t] * 1e3),
        )
        for t, n in enumerate(cfg.batch_size * p for p in cfg.pooling_factors)
    )
    return VariantPrediction(
        variant=name,
        layout=model.layout,
        hot_rows_per_table=hot if model.layout in ("tables-hot", "hot-first") else 0,
        carve_out_bytes=carve,
        hit_rate=float(rep.hits.sum()) / lines if lines else float("nan"),
        pinned_share=rep.pinned_lines / lines if lines else 0.0,
        l2_bytes_per_batch=float(l2_t.sum()),
        dram_bytes_per_batch=float(dram_t.sum()),
        time_lower_bound_ms=total * 1e3,
        bound=bound,
        tables=tables,
        curve_l2_bytes=curve_sizes(spec),
        curve_hit_rate=tuple(float(h) / lines if lines else float("nan") for h in rep.curve_hits),
    )


def hot_count(spec: GpuSpec, cfg: EmbedConfig, row_bytes: int, opts: PredictConfig) -> int:
    """Hot rows per table: the option, else the persisting-L2 maximum split over the tables."""
    if opts.hot_rows_per_table is not None:
        return opts.hot_rows_per_table
    return max(1, spec.persisting_l2_max_bytes // row_bytes // cfg.num_tables)


@functools.lru_cache(maxsize=1)
def _accesses(cfg: EmbedConfig, trace: Trace, batches: int) -> Accesses:
    # kept for the next call on the same trace object (a carve-out sweep replays it again)
    return accesses(cfg, trace, batches)


def predict(
    spec: GpuSpec,
    cfg: EmbedConfig,
    trace: Trace,
    variants: Sequence[str],
    options: PredictConfig | None = None,
    progress: Callable[[float], None] | None = None,
) -> Prediction:
    """The model's prediction for each of ``variants`` on ``spec``, ``cfg``'s tables and
    batches and ``trace`` (with ``cfg``'s tables, e.g. from ``bench.bench_trace``)."""
    t0 = time.perf_counter()
    opts = options or PredictConfig()
    names = check_variants(variants)
    if trace.tables != cfg.num_tables:
        why = f"{trace.tables} tables, the configuration {cfg.num_tables}"
        raise ConfigError(f"trace {trace.name!r}: {why} (use bench.bench_trace)")
    row_bytes = cfg.dim * ELEMENT_BYTES[opts.dtype]
    acc = _accesses(cfg, trace, opts.batches)
    hot_n = hot_count(spec, cfg, row_bytes, opts)
    needs_hot = any(VARIANTS[n].layout in ("tables-hot", "hot-first") for n in names)
    hot = hot_rows(cfg, trace, hot_n) if needs_hot else []
    hot_bytes = sum(int(h.size) for h in hot) * row_bytes
    io = _io_bytes(cfg, acc.lookups)
    replays: dict[tuple[str, int, int], _Replay] = {}
    out = []
    for i, name in enumerate(names):
        model = VARIANTS[name]
        carve = spec.carve_out(hot_bytes) if model.pins else 0
        rb = cfg.dim * 4 if model.reads_fp32 else row_bytes
        # whole-line rows: the unpinned layouts only rename rows, so their LRU hits are equal
        plain = not model.pins and rb % spec.line_bytes == ALLOC_ALIGN % spec.line_bytes == 0
        key = ("renamed rows" if plain else model.layout, carve, rb)
        if key not in replays:
            addr = row_addresses(model.layout, acc, cfg.table_rows, rb, hot)

            def sub(f: float, i: int = i) -> None:
                if progress is not None:
                    progress((i + f) / len(names))

            replays[key] = _replay(spec, acc, addr, rb, carve, opts, sub)
        out.append(_variant(name, spec, cfg, replays[key], io, carve, hot_n))
        if progress is not None:
            progress((i + 1) / len(names))
    return Prediction(
        gpu=spec,
        config=cfg.name,
        trace=trace.name,
        options=opts,
        batch_size=cfg.batch_size,
        lookups_per_batch=cfg.lookups_per_batch,
        variants=tuple(out),
        seconds=time.perf_counter() - t0,
    )


SWEEP = (0.0625, 0.125, 0.25, 0.5, 1.0)
"""Carve-outs of ``sweep_carve_out``, as shares of the persisting-L2 maximum."""


def sweep_carve_out(
    spec: GpuSpec,
    cfg: EmbedConfig,
    trace: Trace,
    shares: Sequence[float] = SWEEP,
    options: PredictConfig | None = None,
    progress: Callable[[float], None] | None = None,
) -> tuple[VariantPrediction, ...]:
    """Will pinning pay? ``hot-l2`` with its hot region (and so its carve-out) sized to each
    share of the persisting-L2 maximum, the hot rows split evenly over the tables."""
    opts = options or PredictConfig()
    row_bytes = cfg.dim * ELEMENT_BYTES[opts.dtype]
    out: list[VariantPrediction] = []
    for i, share in enumerate(shares):
        check_range("carve-out share", share, 0.0, 1.0, lo_open=True)
        per_table = int(share * spec.persisting_l2_max_bytes) // row_bytes // cfg.num_tables
        sized = replace(opts, hot_rows_per_table=max(1, per_table))
        out += predict(spec, cfg, trace, ["hot-l2"], sized).variants
        if progress is not None:
            progress((i + 1) / len(shares))
    return tuple(out)
