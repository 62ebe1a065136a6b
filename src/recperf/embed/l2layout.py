"""The exact stream of L2 lines an embedding kernel variant touches for a trace: the ids of the
benchmark's batches in issue order (bag by bag, table-major), each row placed where the variant
lays it out (``torch``/``torch-hot``: one allocation per table, ``torch-hot`` hottest rows
first; ``triton``: the tables one after another in one buffer; ``hot-l2``/``combined``: the hot
rows first, interleaved by rank as ``HotRowRemap`` places them) and split into lines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from recperf.core.errors import ConfigError
from recperf.embed import locality
from recperf.embed.gpus import GpuSpec
from recperf.embed.model import EmbedConfig
from recperf.embed.traces import Trace

I64 = npt.NDArray[np.int64]
Layout = Literal["tables", "tables-hot", "combined", "hot-first"]
ALLOC_ALIGN = 512
"""Bytes each separately allocated table is aligned to (the CUDA caching allocator's)."""


@dataclass(frozen=True, slots=True)
class VariantModel:
    """How a kernel variant lays out and reads the rows."""

    layout: Layout
    fused: bool
    """One launch for all tables (the time bound is over their sum) or one per table."""
    pins: bool
    """Whether the hot region is pinned in the persisting L2."""
    reads_fp32: bool = False
    """Whether it reads float32 copies of the weights whatever their dtype (the reference)."""


VARIANTS = {
    "torch": VariantModel(layout="tables", fused=False, pins=False, reads_fp32=True),
    "torch-hot": VariantModel(layout="tables-hot", fused=False, pins=False, reads_fp32=True),
    "triton": VariantModel(layout="combined", fused=True, pins=False),
    "triton-prefetch": VariantModel(layout="combined", fused=True, pins=False),
    "hot-l2": VariantModel(layout="hot-first", fused=True, pins=True),
    "combined": VariantModel(layout="hot-first", fused=True, pins=True),
}
"""The variants modelled, by kernel name."""


@dataclass(frozen=True, slots=True)
class Accesses:
    """Every id the batches look up, in issue order."""

    table: I64
    row: I64
    batch: I64
    lookups: tuple[int, ...]
    """Ids per batch of each table."""


def accesses(cfg: EmbedConfig, trace: Trace, batches: int) -> Accesses:
    """The ``batches`` consecutive batches the benchmark draws from ``trace``, flattened: per id
    its table, row and batch. The ids are ``bench.make_lookups``'s (batch k of table t takes ids
    [k*n, (k+1)*n) of its stream, cycled, modulo its rows), without building the tensors."""
    lookups = tuple(cfg.batch_size * p for p in cfg.pooling_factors)
    streams = [trace.ids[t % trace.tables].numpy() for t in range(cfg.num_tables)]
    rows = [
        np.take(stream, np.arange(k * n, (k + 1) * n) % stream.size) % r
        for k in range(batches)
        for stream, n, r in zip(streams, lookups, cfg.table_rows, strict=True)
    ]
    per_batch = np.repeat(np.arange(cfg.num_tables, dtype=np.int64), lookups)
    return Accesses(
        table=np.tile(per_batch, batches),
        row=np.concatenate(rows).astype(np.int64),
        batch=np.repeat(np.arange(batches, dtype=np.int64), per_batch.size),
        lookups=lookups,
    )


def hot_first(rows: int, hot: I64) -> I64:
    """``torch_hot.hot_first_order`` vectorised: the distinct ``hot`` ids in their order, then
    the other rows in id order (a permutation of ``range(rows)``)."""
    if hot.size and (int(hot.min()) < 0 or int(hot.max()) >= rows):
        raise ConfigError(f"hot_rows: ids must lie in [0, {rows})")
    _, first = np.unique(hot, return_index=True)
    keep = hot[np.sort(first)].astype(np.int64)
    is_hot = np.zeros(rows, dtype=bool)
    is_hot[keep] = True
    return np.concatenate([keep, np.flatnonzero(~is_hot)])


def hot_rows(cfg: EmbedConfig, trace: Trace, per_table: int) -> list[I64]:
    """Per table the trace's ``per_table`` hottest rows, hottest first, as the benchmark picks
    them (``bench.hot_rows_for``)."""
    hot = [h.numpy() for h in locality.hot_rows(trace, per_table)]
    return [
        hot_first(rows, hot[t % len(hot)] % rows)[: min(per_table, rows)]
        for t, rows in enumerate(cfg.table_rows)
    ]


def hot_first_positions(rows: Sequence[int], hot: Sequence[I64]) -> I64:
    """``HotRowRemap``'s map from a row of the concatenated tables to its position: the hot rows
    first, interleaved by rank (each table's hottest, then each table's second ...), the rest
    after them in order."""
    bases = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
    t_count = len(rows)
    keys = np.concatenate([np.arange(h.size) * t_count + t for t, h in enumerate(hot)])
    glob = np.concatenate([h + bases[t] for t, h in enumerate(hot)]).astype(np.int64)
    first = glob[np.argsort(keys, kind="stable")]
    is_hot = np.zeros(int(sum(rows)), dtype=bool)
    is_hot[first] = True
    order = np.concatenate([first, np.flatnonzero(~is_hot)])
    pos = np.empty(order.size, dtype=np.int64)
    pos[order] = np.arange(order.size)
    return pos


def row_addresses(
    layout: Layout, acc: Accesses, rows: Sequence[int], row_bytes: int, hot: Sequence[I64]
) -> I64:
    """Byte address of each accessed row's start under ``layout``."""
    bases = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
    glob: I64 = bases[acc.table] + acc.row
    if layout == "combined":
        return glob * row_bytes
    if layout == "hot-first":
        pos: I64 = hot_first_positions(rows, hot)[glob]
        return pos * row_bytes
    sizes = -(-np.asarray(rows, dtype=np.int64) * row_bytes // ALLOC_ALIGN) * ALLOC_ALIGN
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    table_start: I64 = starts[acc.table]
    if layout == "tables":
        return table_start + acc.row * row_bytes
    inverse = []
    for r, h in zip(rows, hot, strict=True):
        order = hot_first(r, h)
        inv = np.empty(r, dtype=np.int64)
        inv[order] = np.arange(r)
        inverse.append(inv)
    moved: I64 = np.concatenate(inverse)[glob]
    return table_start + moved * row_bytes


@dataclass(frozen=True, slots=True)
class LineStream:
    """The L2 units a variant touches: whole rows when rows are whole aligned lines (a row's
    lines are always touched together, so an LRU of C lines hits as one of C // k rows), else
    single lines."""

    unit: I64
    """Per access, the unit's first line."""
    nbytes: I64 | int
    """Per access, the bytes of the sectors it reads (an int: the same for every access)."""
    source: I64 | None
    """Per access, the index of the look-up it belongs to (None: one access per look-up)."""
    lines_per_unit: int


def line_stream(addr: I64, row_bytes: int, spec: GpuSpec) -> LineStream:
    """The units the rows at ``addr`` occupy, split into lines unless whole and aligned."""
    line, sector = spec.line_bytes, spec.sector_bytes
    if row_bytes % line == 0 and not np.any(addr % line):
        return LineStream(addr // line, row_bytes, None, row_bytes // line)
    first, last = addr // line, (addr + row_bytes - 1) // line
    count = last - first + 1
    source = np.repeat(np.arange(addr.size, dtype=np.int64), count)
    offset = np.arange(source.size) - np.repeat(np.cumsum(count) - count, count)
    unit = first[source] + offset
    lo = np.maximum(addr[source], unit * line)
    hi = np.minimum(addr[source] + row_bytes, (unit + 1) * line)
    nbytes = ((hi - 1) // sector - lo // sector + 1) * sector
    return LineStream(unit, nbytes, source, 1)
