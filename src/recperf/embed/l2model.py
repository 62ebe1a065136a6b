"""A trace-driven model of the embedding kernels' L2 traffic on a GPU described by a spec: for
each kernel variant, the exact stream of L2 lines it touches (rows of their row format's real
size, ``formats.row_bytes``, laid out as the kernel's traits say), its LRU hit rate at every
cache size from the stack distances (``stackdist``), the DRAM bytes per batch, and a lower bound
on the time from the DRAM and L2 bandwidths.

The layouts are ``l2layout``'s, read off each kernel's registry traits (``variant_traits``);
a variant whose traits pin L2 (``hot-l2``, ``combined``) pins its hot region in the persisting
L2: its lines always hit and the LRU holds the L2 less the carve-out. The first
``warmup`` batches fill the cache and are not counted. Will pinning pay at other carve-outs, or
with other row formats: ``l2sweep``.

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
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from recperf.core.config import check_range, check_seed
from recperf.core.errors import ConfigError
from recperf.embed import stackdist
from recperf.embed.gpus import GpuSpec
from recperf.embed.kernels.base import KernelTraits
from recperf.embed.kernels.formats import INTEGER_FORMATS, RowFormat, check_format
from recperf.embed.kernels.formats import row_bytes as format_row_bytes
from recperf.embed.l2layout import (
    ALLOC_ALIGN,
    Accesses,
    LineStream,
    accesses,
    check_reads,
    default_variants,
    hot_rows,
    read_row_bytes,
    row_stream,
    variant_traits,
)
from recperf.embed.model import EmbedConfig
from recperf.embed.traces import Trace

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
LEAVES_OUT = (
    "Left out: set associativity and the hash of addresses to L2 slices (a fully associative "
    "LRU is modelled), the L2's split into two partitions on A100/H100, sector promotion and "
    "prefetch (a miss fetches only the sectors a row covers; a sector missing from a resident "
    "line counts as a hit), the other kernels' traffic (MLPs, copies), write-backs (the output "
    "is counted once as written), and concurrency (bags replayed one after another)."
)
MODEL_NOTE = "A model, not a measurement."
CURVE_POINTS = 41
"""Points of the hit-rate curve's log grid, 1 MiB to 1 GiB."""


@dataclass(kw_only=True, slots=True, frozen=True)
class PredictConfig:
    """Options of a prediction."""

    dtype: RowFormat = "fp32"
    """Row format (``formats.ROW_FORMATS``): a row takes ``formats.row_bytes(dtype, dim)``
    bytes, int8/int4 scale and bias included (a variant whose traits say ``reads_fp32`` reads
    float32 copies whatever it is)."""
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
        check_format(self.dtype, "dtype")
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
    row_bytes: int
    """Bytes it reads per row (the row format's, or float32's for a ``reads_fp32`` kernel)."""
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


def check_variants(names: Sequence[str], fmt: str = "fp32") -> tuple[str, ...]:
    """``names`` (duplicates dropped) if each is a kernel the model knows (registered, or a
    ``module:attr`` one, by its traits) that reads ``fmt`` rows, else one ConfigError naming
    the first that is not (none given: one listing the default variants for ``fmt``)."""
    for name in names:
        check_reads(name, variant_traits(name), fmt)
    if not names:
        raise ConfigError(f"variants: none given; modelled for {fmt}: {_listed(fmt)}")
    return tuple(dict.fromkeys(names))


def _listed(fmt: str) -> str:
    return ", ".join(default_variants(fmt)) or "no registered kernel"


def check_dim(fmt: str, dim: int) -> None:
    """One ConfigError when rows of width ``dim`` cannot be held in ``fmt``."""
    if fmt == "int4" and dim % 2:
        raise ConfigError(f"dim: int4 packs two columns per byte; {dim} is odd")


def curve_sizes(spec: GpuSpec) -> tuple[int, ...]:
    """L2 sizes of the curve: a log grid from 1 MiB to 1 GiB, the spec's L2 included."""
    grid = np.geomspace(1 << 20, 1 << 30, CURVE_POINTS).round().astype(np.int64).tolist()
    return tuple(sorted({*grid, spec.l2_bytes}))


@dataclass(frozen=True, slots=True)
class Replay:
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


def _first_touches(unit: I64, size: int) -> I64:
    """Indices of the first access to each distinct ``unit`` (all in ``[0, size)``)."""
    first = np.full(size, unit.size, dtype=np.int64)
    np.minimum.at(first, unit, np.arange(unit.size, dtype=np.int64))
    found: I64 = first[first < unit.size]
    return found


def replay_carve_outs(
    spec: GpuSpec,
    acc: Accesses,
    s: LineStream,
    carves: Sequence[int],
    opts: PredictConfig,
    progress: Callable[[float], None] | None = None,
) -> list[Replay]:
    """The stream's replay with each carve-out pinned (its first ``carve`` bytes; 0: none).
    What does not depend on the carve-out is counted once: per table the counted accesses and
    bytes, and, bucketed by the carve-outs that pin them, the accesses to pinnable lines and
    their first touches (a miss: pinning keeps lines, it does not load them); per carve-out
    only the sampled lines left to the LRU are replayed through the stack distances."""
    k, line, t_count = s.lines_per_unit, spec.line_bytes, len(acc.lookups)
    per_batch = 1.0 / (opts.batches - opts.warmup)
    # the counted batches are the tail (look-ups and their accesses are in batch order)
    start = int(np.searchsorted(acc.batch, opts.warmup))
    if s.source is not None:
        start = int(np.searchsorted(s.source, start))

    def table(idx: I64 | slice) -> I64:
        """The tables of the accesses at ``idx`` (gathered for them alone: streams are long)."""
        found: I64 = acc.table[idx] if s.source is None else acc.table[s.source[idx]]
        return found

    def tally(idx: I64 | slice) -> tuple[F64, F64]:
        """Per table, the accesses at ``idx`` and their bytes, per batch."""
        t = table(idx)
        n = np.bincount(t, minlength=t_count).astype(np.float64)
        if isinstance(s.nbytes, int):
            return n * per_batch, n * (s.nbytes * per_batch)
        b = np.bincount(t, weights=s.nbytes[idx], minlength=t_count).astype(np.float64)
        return n * per_batch, b * per_batch

    counted, counted_bytes = tally(slice(start, None))
    # a unit is pinned by the carve-outs of at least its pin_bytes
    edges = np.unique(np.asarray(carves, dtype=np.int64))
    pinnable = np.flatnonzero(s.pin_bytes <= edges[-1])

    def by_edge(idx: I64) -> tuple[F64, F64]:
        """Per edge and table, the counted accesses at ``idx`` to units below it (and bytes)."""
        idx = idx[idx >= start]
        code = np.searchsorted(edges, s.pin_bytes[idx], side="left") * t_count + table(idx)
        size = (edges.size + 1) * t_count
        n = np.bincount(code, minlength=size).astype(np.float64).reshape(-1, t_count)
        w = s.nbytes if isinstance(s.nbytes, int) else s.nbytes[idx]
        weighed = np.bincount(code, weights=np.broadcast_to(w, idx.shape), minlength=size)
        b: F64 = weighed.astype(np.float64).reshape(-1, t_count)
        cum_n: F64 = np.cumsum(n, axis=0) * per_batch
        cum_b: F64 = np.cumsum(b, axis=0) * per_batch
        return cum_n, cum_b

    pinned, _ = by_edge(pinnable)
    units = s.unit[pinnable]
    first = pinnable[_first_touches(units, int(units.max()) + 1 if units.size else 0)]
    cold, cold_bytes = by_edge(first)
    sample = np.flatnonzero(stackdist.sampled(s.unit, opts.sample, opts.seed))
    sample_pin = s.pin_bytes[sample]
    sizes = np.asarray(curve_sizes(spec), dtype=np.int64)
    out = []
    for j, carve in enumerate(carves):
        e = int(np.searchsorted(edges, carve))
        pin_all, pin_cold, pin_cold_bytes = pinned[e], cold[e], cold_bytes[e]
        keep = sample[sample_pin > carve]

        def sub(f: float, j: int = j) -> None:
            if progress is not None:
                progress((j + f) / len(carves))

        dist = stackdist.stack_distances(s.unit[keep], opts.engine, sub)
        carve_lines = -(-carve // line)
        cap = max(spec.l2_lines - carve_lines, 0) // k
        hit = (dist >= 0) & (dist < opts.sample * cap)
        is_counted = keep >= start
        hits, _ = tally(keep[is_counted & hit])
        misses, miss_bytes = tally(keep[is_counted & ~hit])
        # ratio estimates: each table's sampled LRU accesses stand for all its LRU accesses
        kept = hits + misses
        lru = counted - pin_all
        overall = float(lru.sum()) / max(float(kept.sum()), 1e-300)
        scale = np.where(kept > 0, lru / np.maximum(kept, 1e-300), overall)
        lru_units = np.maximum(sizes // line - carve_lines, 0) // k
        warm = np.sort(dist[is_counted & (dist >= 0)])
        curve = np.searchsorted(warm, opts.sample * lru_units, side="left") * per_batch * overall
        pin_hits = pin_all - pin_cold
        out.append(
            Replay(
                lines=(lru + pin_all) * k,
                hits=(hits * scale + pin_hits) * k,
                l2_row_bytes=counted_bytes,
                dram_row_bytes=miss_bytes * scale + pin_cold_bytes,
                pinned_lines=float(pin_all.sum() * k),
                curve_hits=np.where(sizes >= carve, (curve + pin_hits.sum()) * k, np.nan),
            )
        )
    return out


def io_bytes(cfg: EmbedConfig, lookups: Sequence[int]) -> F64:
    """Per table and batch, the bytes besides rows: int64 ids and offsets, float32 output."""
    b = cfg.batch_size
    return np.asarray([n * 8 + b * 8 + b * cfg.dim * 4 for n in lookups], dtype=np.float64)


@dataclass(frozen=True, slots=True)
class VariantInput:
    """What ``_variant`` needs of a variant besides its replay."""

    name: str
    traits: KernelTraits
    row_bytes: int
    carve: int
    hot: int


def variant_prediction(
    v: VariantInput, spec: GpuSpec, cfg: EmbedConfig, rep: Replay, io: F64
) -> VariantPrediction:
    dram_bw, l2_bw = spec.dram_gb_per_s * 1e9, spec.l2_gb_per_s * 1e9
    l2_t, dram_t = rep.l2_row_bytes + io, rep.dram_row_bytes + io
    t_dram, t_l2 = dram_t / dram_bw, l2_t / l2_bw
    per_table = np.maximum(t_dram, t_l2)
    if v.traits.fused:
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
        variant=v.name,
        layout=v.traits.layout,
        row_bytes=v.row_bytes,
        hot_rows_per_table=v.hot if v.traits.layout in ("tables-hot", "hot-first") else 0,
        carve_out_bytes=v.carve,
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
def cached_accesses(cfg: EmbedConfig, trace: Trace, batches: int) -> Accesses:
    # kept for the next call on the same trace object (a carve-out sweep replays it again)
    return accesses(cfg, trace, batches)


def check_shape(cfg: EmbedConfig, trace: Trace, fmt: str) -> None:
    check_dim(fmt, cfg.dim)
    if trace.tables != cfg.num_tables:
        why = f"{trace.tables} tables, the configuration {cfg.num_tables}"
        raise ConfigError(f"trace {trace.name!r}: {why} (use bench.bench_trace)")


def predict(
    spec: GpuSpec,
    cfg: EmbedConfig,
    trace: Trace,
    variants: Sequence[str],
    options: PredictConfig | None = None,
    progress: Callable[[float], None] | None = None,
) -> Prediction:
    """The model's prediction for each of ``variants`` (kernel names, ``default_variants`` for
    all of recperf's own) on ``spec``, ``cfg``'s tables and batches and ``trace`` (with
    ``cfg``'s tables, e.g. from ``bench.bench_trace``), rows in ``options.dtype``."""
    t0 = time.perf_counter()
    opts = options or PredictConfig()
    names = check_variants(variants, opts.dtype)
    check_shape(cfg, trace, opts.dtype)
    row_bytes = format_row_bytes(opts.dtype, cfg.dim)
    traits = {n: variant_traits(n) for n in names}
    acc = cached_accesses(cfg, trace, opts.batches)
    hot_n = hot_count(spec, cfg, row_bytes, opts)
    needs_hot = any(t.layout in ("tables-hot", "hot-first") for t in traits.values())
    hot = hot_rows(cfg, trace, hot_n) if needs_hot else []
    hot_bytes = sum(int(h.size) for h in hot) * row_bytes
    io = io_bytes(cfg, acc.lookups)
    replays: dict[tuple[str, int, int], Replay] = {}
    out = []
    for i, name in enumerate(names):
        tr = traits[name]
        carve = spec.carve_out(hot_bytes) if tr.pins_l2 else 0
        rb = read_row_bytes(tr, opts.dtype, cfg.dim)
        fmt = "fp32" if tr.reads_fp32 else opts.dtype
        # whole-line rows (no scale and bias apart): the unpinned layouts only rename rows, so
        # their LRU hits are equal
        whole = rb % spec.line_bytes == ALLOC_ALIGN % spec.line_bytes == 0
        plain = not tr.pins_l2 and whole and fmt not in INTEGER_FORMATS
        key = ("renamed rows" if plain else tr.layout, carve, rb)
        if key not in replays:

            def sub(f: float, i: int = i) -> None:
                if progress is not None:
                    progress((i + f) / len(names))

            stream = row_stream(tr.layout, fmt, cfg.dim, acc, cfg.table_rows, hot, spec)
            replays[key] = replay_carve_outs(spec, acc, stream, [carve], opts, sub)[0]
        v = VariantInput(name=name, traits=tr, row_bytes=rb, carve=carve, hot=hot_n)
        out.append(variant_prediction(v, spec, cfg, replays[key], io))
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
