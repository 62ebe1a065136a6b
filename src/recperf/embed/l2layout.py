"""The exact stream of L2 lines an embedding kernel touches for a trace: the ids of the
benchmark's batches in issue order (bag by bag, table-major), each row placed where the kernel
lays it out and split into lines. What the model knows of a kernel is its registry entry's
``KernelTraits`` (``variant_traits``): its ``layout`` (``tables``: one allocation per table;
``tables-hot``: the same, hottest rows first; ``combined``: the tables one after another in one
buffer; ``hot-first``: one buffer, the hot rows first, interleaved by rank as ``HotRowRemap``
places them), whether it is ``fused``, ``pins_l2`` and ``reads_fp32``, so a user's own
``module:attr`` kernel with ``traits`` is modelled as the built-ins are.

A row takes ``formats.row_bytes(fmt, dim)`` bytes, scale and bias included, where it lies:
- in one buffer (``combined``, ``hot-first``: the Triton kernels' ``RowBuffer``), int8/int4
  codes are dense from a line-aligned start and each row's four scale-and-bias bytes sit in a
  block just before them in reverse row order, so a look-up reads its codes' lines and one
  sector of the scale-and-bias block, and the first ``h`` rows with theirs are one window of
  ``h * row_bytes`` bytes (``split_stream``);
- in per-table allocations (``tables``, ``tables-hot``), as FBGEMM's IntNBit rows, the four
  bytes in front of each row's codes, rows back to back: a 132-byte int8 row need not start on
  a line or sector boundary (``line_stream``)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from recperf.core.errors import ConfigError, RecperfError
from recperf.embed import locality
from recperf.embed.gpus import GpuSpec
from recperf.embed.kernels.base import KERNELS, KernelTraits, Layout, kernel_traits
from recperf.embed.kernels.formats import INTEGER_FORMATS, ROW_FORMATS, SCALE_BIAS_BYTES
from recperf.embed.kernels.formats import row_bytes as format_row_bytes
from recperf.embed.model import EmbedConfig
from recperf.embed.traces import Trace

I64 = npt.NDArray[np.int64]
ALLOC_ALIGN = 512
"""Bytes each separately allocated table is aligned to (the CUDA caching allocator's)."""
CODES_ALIGN = 128
"""Bytes the int8/int4 codes of a one-buffer layout start at (``rowbuffer.ALIGN``)."""
ONE_BUFFER: tuple[Layout, ...] = ("combined", "hot-first")
"""The layouts that hold every table's rows in one buffer."""
LAYOUT_ORDER: tuple[Layout, ...] = ("tables", "tables-hot", "combined", "hot-first")
"""The layouts in the order the default variants are listed (unpinned ones first)."""


def variant_traits(name: str) -> KernelTraits:
    """The L2 model's view of kernel ``name`` (registered or ``package.module:attr``): its
    ``kernel_traits``; one ConfigError naming the registered kernels when there is no such
    kernel. The Triton kernels (``triton``, ``triton-prefetch``, ``hot-l2``, ``combined``)
    register only where triton is installed; without it they are unknown here too, and the
    defaults are the torch kernels alone."""
    if ":" not in name and name not in KERNELS:
        raise ConfigError(
            f"variant {name!r}: no L2 model; modelled: the registered kernels "
            f"({', '.join(KERNELS.names())}) or a 'module:attr' kernel with traits"
        )
    try:
        return kernel_traits(name)
    except RecperfError as exc:  # a module:attr that does not import
        raise ConfigError(f"variant {name!r}: {exc}") from None


def default_variants(fmt: str = "fp32") -> tuple[str, ...]:
    """The variants modelled unless named: recperf's own registered kernels (``traits.peer``
    empty) that read ``fmt`` rows, unpinned layouts first. The peers (FBGEMM's TBE, one
    concatenated ``nn.EmbeddingBag``) are modelled from their traits when named, but left out
    here: their GPU operators bring their own caching and layouts (FBGEMM's UVM cache, its
    row alignment) that their traits do not describe, so their lines would be a guess."""
    own = [n for n in KERNELS.names() if not (tr := kernel_traits(n)).peer and fmt in tr.formats]
    return tuple(sorted(own, key=lambda n: (LAYOUT_ORDER.index(kernel_traits(n).layout), n)))


def check_reads(name: str, traits: KernelTraits, fmt: str) -> None:
    """One ConfigError when variant ``name`` cannot read ``fmt`` rows."""
    if fmt not in traits.formats:
        reads = ", ".join(f for f in ROW_FORMATS if f in traits.formats)
        raise ConfigError(f"variant {name!r} does not read {fmt} rows (it reads {reads})")


def read_row_bytes(traits: KernelTraits, fmt: str, dim: int) -> int:
    """Bytes a variant reads per row: the format's (``formats.row_bytes``), or float32's for a
    kernel that reads float32 copies (the torch reference dequantizes every format once)."""
    return format_row_bytes("fp32" if traits.reads_fp32 else fmt, dim)


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
    hot = [h[:per_table] for h in _ranking(trace)]
    return [
        hot_first(rows, hot[t % len(hot)] % rows)[: min(per_table, rows)]
        for t, rows in enumerate(cfg.table_rows)
    ]


@functools.lru_cache(maxsize=2)
def _ranking(trace: Trace) -> tuple[I64, ...]:
    """Per table every row of ``trace``, most frequent first (``locality.hot_rows``, whose
    order is stable, so its ``k`` hottest are a prefix of this): kept for the next call on the
    same trace object, as a carve-out sweep asks for several ``k``."""
    return tuple(h.numpy() for h in locality.hot_rows(trace, max(trace.rows)))


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


def global_rows(acc: Accesses, rows: Sequence[int]) -> I64:
    """Each accessed row's index in the tables laid one after another."""
    bases = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
    glob: I64 = bases[acc.table] + acc.row
    return glob


def row_addresses(
    layout: Layout, acc: Accesses, rows: Sequence[int], row_bytes: int, hot: Sequence[I64]
) -> I64:
    """Byte address of each accessed row's start under ``layout``, rows of ``row_bytes``."""
    glob = global_rows(acc, rows)
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
    pin_bytes: I64
    """Per access, the smallest carve-out that pins its unit: the window over the buffer's hot
    start is that many bytes (a row-prefix window for ``split_stream``)."""


def line_stream(addr: I64, row_bytes: int, spec: GpuSpec) -> LineStream:
    """The units the rows of ``row_bytes`` at ``addr`` occupy: whole rows when rows are whole
    aligned lines, else each row split into the lines from its first byte's to its last's (any
    size, any address: a 132-byte int8 row at byte 132 touches line 1 and line 2), each access
    reading the sectors the row covers in that line (sectors 4-7 of line 1, 0 of line 2)."""
    line, sector = spec.line_bytes, spec.sector_bytes
    if row_bytes % line == 0 and not np.any(addr % line):
        unit = addr // line
        k = row_bytes // line
        return LineStream(unit, row_bytes, None, k, (unit + k) * line)
    # what a row touches depends only on where in its first line it starts: per offset and
    # per line of the row, the sectors it reads there (0: the row ends before that line)
    span = (line - 1 + row_bytes - 1) // line + 1
    nth_line = np.arange(span, dtype=np.int64)
    at = np.arange(line, dtype=np.int64)[:, None]
    lo = np.maximum(at, nth_line * line)
    hi = np.minimum(at + row_bytes, (nth_line + 1) * line)
    sectors = np.where(hi > lo, (hi - 1) // sector - lo // sector + 1, 0) * sector
    lines = (sectors > 0).sum(axis=1).astype(np.int8)
    off = addr % line
    # row-major: the rows in order, each row's lines in order
    source, nth = np.nonzero(nth_line[None, :] < lines[off][:, None])
    unit = addr[source] // line + nth
    nbytes = sectors[off[source], nth]
    return LineStream(unit, nbytes, source, 1, (unit + 1) * line)


def split_stream(pos: I64, fmt: str, dim: int, total_rows: int, spec: GpuSpec) -> LineStream:
    """The lines int8/int4 rows at buffer positions ``pos`` touch in ``RowBuffer``'s layout:
    per look-up one sector of the scale-and-bias block, then its codes' lines. A line is
    pinned once the window over the first ``h`` rows and their scale and bias reaches it."""
    line = spec.line_bytes
    cols = format_row_bytes(fmt, dim) - SCALE_BIAS_BYTES
    codes = -(-SCALE_BIAS_BYTES * total_rows // CODES_ALIGN) * CODES_ALIGN
    n, sector, rb = pos.size, spec.sector_bytes, format_row_bytes(fmt, dim)
    sb_unit = pos * -SCALE_BIAS_BYTES  # in place from here: the streams are long
    sb_unit += codes - SCALE_BIAS_BYTES
    sb_unit //= line
    aligned = codes % line == 0 and (cols % line == 0 or line % cols == 0)
    if not aligned:
        return _split_any(pos, sb_unit, cols, codes, rb, spec)
    # every row's codes take the same whole lines (or share one), never straddling: a look-up
    # is its scale-and-bias line and its codes' lines; each column's pin is one division
    per = max(cols // line, 1)
    unit = np.empty((n, 1 + per), dtype=np.int64)
    pin = np.empty_like(unit)
    unit[:, 0] = sb_unit
    # rows a window must hold to reach down to the line: ceil((codes - line start) / 4)
    np.multiply(sb_unit, -line, out=sb_unit)
    sb_unit += codes + SCALE_BIAS_BYTES - 1
    sb_unit //= SCALE_BIAS_BYTES
    np.multiply(sb_unit, rb, out=pin[:, 0])
    first = pos * cols
    first += codes
    first //= line
    for j in range(per):
        np.add(first, j, out=unit[:, 1 + j])
    # and up to the line's end: ceil((line end - codes) / cols)
    first += 1
    first *= line
    first += cols - 1 - codes
    for j in range(per):
        np.floor_divide(first, cols, out=pin[:, 1 + j])
        pin[:, 1 + j] *= rb
        first += line
    row = [sector, *[min(line, -(-cols // sector) * sector)] * per]
    nbytes = np.tile(np.asarray(row, dtype=np.int64), n)
    source = np.repeat(np.arange(n, dtype=np.int64), 1 + per)
    return LineStream(unit.ravel(), nbytes, source, 1, pin.ravel())


def _split_any(pos: I64, sb_unit: I64, cols: int, codes: int, rb: int, spec: GpuSpec) -> LineStream:
    """``split_stream`` for codes that straddle lines, or lines that hold scale-and-bias bytes
    and codes: per look-up its scale-and-bias line, then its codes' lines (``line_stream``)."""
    n, line = pos.size, spec.line_bytes
    body = line_stream(codes + pos * cols, cols, spec)
    k = body.lines_per_unit
    body_source = np.repeat(np.arange(n, dtype=np.int64), k) if body.source is None else body.source
    body_unit = (
        body.unit if body.source is not None else (body.unit[:, None] + np.arange(k)).ravel()
    )
    body_bytes = np.broadcast_to(body.nbytes if body.source is not None else line, body_unit.shape)
    per_row = np.bincount(body_source, minlength=n)
    at_sb = np.arange(n, dtype=np.int64) + (np.cumsum(per_row) - per_row)
    at_b = np.arange(body_unit.size, dtype=np.int64) + body_source + 1
    unit = np.empty(n + body_unit.size, dtype=np.int64)
    nbytes = np.empty_like(unit)
    source = np.empty_like(unit)
    unit[at_sb], nbytes[at_sb], source[at_sb] = sb_unit, spec.sector_bytes, np.arange(n)
    unit[at_b], nbytes[at_b], source[at_b] = body_unit, body_bytes, body_source
    # rows a window must hold to cover the whole line: its scale-and-bias part, its codes part
    lo, hi = unit * line, (unit + 1) * line
    rows_sb = np.where(lo < codes, -(-(codes - lo) // SCALE_BIAS_BYTES), 0)
    rows_codes = np.where(hi > codes, -(-(hi - codes) // cols), 0)
    return LineStream(unit, nbytes, source, 1, np.maximum(rows_sb, rows_codes) * rb)


def row_stream(
    layout: Layout,
    fmt: str,
    dim: int,
    acc: Accesses,
    rows: Sequence[int],
    hot: Sequence[I64],
    spec: GpuSpec,
    positions: I64 | None = None,
) -> LineStream:
    """The lines the look-ups ``acc`` touch with ``fmt`` rows of width ``dim`` laid out as
    ``layout`` (``positions``: the one-buffer positions, if already known)."""
    rb = format_row_bytes(fmt, dim)
    one_buffer = layout in ONE_BUFFER
    if positions is None and one_buffer:
        positions = row_addresses(layout, acc, rows, 1, hot)
    if one_buffer and fmt in INTEGER_FORMATS:
        assert positions is not None
        return split_stream(positions, fmt, dim, int(sum(rows)), spec)
    if positions is not None and one_buffer:
        return line_stream(positions * rb, rb, spec)
    return line_stream(row_addresses(layout, acc, rows, rb, hot), rb, spec)
