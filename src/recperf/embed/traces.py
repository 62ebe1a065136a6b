"""Embedding access traces: per table, the row ids in access order. Loads plain-text and Meta's
``(indices, offsets, lengths)`` trace files, generates uniform and Zipf traces, and cuts any trace
into batches in the TBE (table-batched embedding) layout the kernels take."""

from __future__ import annotations

import gzip
import io
import os
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from recperf.core import exact
from recperf.core.errors import ConfigError, TraceFormatError
from recperf.core.files import TRACE_MAX_BYTES, check_input
from recperf.core.text import UTF8_BOM_OPTIONAL

DEFAULT_ROWS = 500_000
MAX_ROWS = 100_000_000
"""Largest table a trace may address (the locality statistics keep arrays of this length)."""
DEFAULT_LOOKUPS = 1_000_000
# Zipf exponents of the generated presets, calibrated on the defaults (1,000,000 look-ups over
# 500,000 rows): the 60,000 most frequent rows take 0.950 / 0.880 / 0.598 of the accesses, and a
# 307,200-id batch is 0.157 / 0.255 / 0.519 unique rows (the bundled real trace: 0.877, 0.262).
PRESETS = {"reuse-high": 1.115, "reuse-medium": 1.005, "reuse-low": 0.735}
# Bundled real traces: name -> (file under data/embedding, rows of the table).
BUNDLED = {"reuse-medium-500k": ("reuse-medium-500k.txt", 500_000)}
NAMES = ("uniform", "zipf:<alpha>", *PRESETS, *BUNDLED)
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(kw_only=True, slots=True, frozen=True, eq=False)
class Trace:
    """Per table, an int64 stream of row ids in access order, and the table's row count."""

    name: str
    """Where the trace came from: a generator name, a bundled name or a file path."""
    ids: tuple[torch.Tensor, ...]
    """One 1-D int64 tensor of row ids per table, in access order."""
    rows: tuple[int, ...]
    """Rows of each table; every id of table t lies in [0, rows[t])."""

    def __post_init__(self) -> None:
        if not self.ids or len(self.ids) != len(self.rows):
            why = f"{len(self.ids)} id streams for {len(self.rows)} row counts"
            raise ConfigError(f"trace {self.name!r}: {why} (need one per table, at least one)")
        for t, (ids, rows) in enumerate(zip(self.ids, self.rows, strict=True)):
            where = f"trace {self.name!r} table {t}"
            if ids.dtype != torch.int64 or ids.dim() != 1:
                raise ConfigError(f"{where}: ids must be a 1-D int64 tensor, got {ids.dtype}")
            if not 1 <= rows <= MAX_ROWS:
                raise ConfigError(f"{where}: rows = {rows} is outside [1, {MAX_ROWS:,}]")
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= rows):
                bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
                raise ConfigError(f"{where}: row id {bad} is outside [0, {rows})")

    @property
    def tables(self) -> int:
        """Number of tables."""
        return len(self.ids)

    @property
    def accesses(self) -> int:
        """Total ids over all tables."""
        return sum(int(ids.numel()) for ids in self.ids)

    def tiled(self, tables: int, seed: int = 0) -> Trace:
        """A single-table trace repeated over ``tables`` tables; table 0 is the original stream
        and table t > 0 maps row ids through a permutation seeded by (seed, t), so the tables
        differ but share the locality."""
        if tables < 1:
            raise ConfigError(f"tables must be >= 1, got {tables}")
        if self.tables != 1:
            raise ConfigError(f"trace {self.name!r} has {self.tables} tables; only 1 can be tiled")
        rows, ids = self.rows[0], self.ids[0]
        streams = [ids]
        for t in range(1, tables):
            perm = np.random.default_rng([seed, t]).permutation(rows)
            streams.append(torch.from_numpy(perm)[ids])
        return Trace(name=self.name, ids=tuple(streams), rows=(rows,) * tables)


def _row_counts(
    path: str | Path, tables: int, rows: int | Sequence[int] | None, maxima: Sequence[int]
) -> tuple[int, ...]:
    if rows is None:
        return tuple(max(m + 1, 1) for m in maxima)
    out = (rows,) * tables if isinstance(rows, int) else tuple(rows)
    if len(out) != tables:
        raise TraceFormatError(path, None, "rows", f"{len(out)} row counts for {tables} tables")
    for t, (r, m) in enumerate(zip(out, maxima, strict=True)):
        if m >= r:
            raise TraceFormatError(path, None, "rows", f"table {t} has row id {m} >= rows {r}")
    return out


def _read_bytes(path: str | Path) -> bytes:
    if os.path.lexists(path):  # a missing file: the read below says so, as TraceFormatError
        check_input(path, "embedding trace", max_bytes=TRACE_MAX_BYTES)
    try:
        data = Path(path).read_bytes()
        return gzip.decompress(data) if data[:2] == _GZIP_MAGIC else data
    except OSError as exc:
        raise TraceFormatError(path, None, None, f"cannot read: {exc.strerror or exc}") from None
    except (EOFError, gzip.BadGzipFile) as exc:
        raise TraceFormatError(path, None, None, f"corrupt gzip data: {exc}") from None


def load_text(path: str | Path, rows: int | None = None) -> Trace:
    """A one-table trace from plain text (optionally gzipped): one non-negative integer row id
    per line; blank lines and ``#`` comments are skipped. ``rows`` defaults to max id + 1."""
    try:
        text = _read_bytes(path).decode(UTF8_BOM_OPTIONAL)
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, None, None, f"not UTF-8 text: {exc.reason}") from None
    values: list[int] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            value = int(line)
        except ValueError:
            why = f"expected an integer row id in [0, {MAX_ROWS if rows is None else rows:,})"
            raise TraceFormatError(path, number, "row_id", f"{line!r}: {why}") from None
        limit = MAX_ROWS if rows is None else rows
        if not 0 <= value < limit:
            why = f"expected an integer row id in [0, {limit:,})"
            raise TraceFormatError(path, number, "row_id", f"row id {value}: {why}")
        values.append(value)
    if not values:
        raise TraceFormatError(path, None, "row_id", "no row ids in the file")
    ids = torch.tensor(values, dtype=torch.int64)
    return Trace(name=str(path), ids=(ids,), rows=_row_counts(path, 1, rows, [int(ids.max())]))


def _meta_tensors(path: str | Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    try:
        obj = torch.load(io.BytesIO(_read_bytes(path)), weights_only=True)
    except (RuntimeError, ValueError, EOFError, OSError, pickle.UnpicklingError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceFormatError(path, None, None, f"not a torch.save trace: {why}") from None
    if not isinstance(obj, tuple | list) or len(obj) != 3:
        why = "expected a tuple (indices, offsets, lengths) of 3 tensors"
        raise TraceFormatError(path, None, None, f"{why}, got {type(obj).__name__}")
    for field, tensor in zip(("indices", "offsets", "lengths"), obj, strict=True):
        if not isinstance(tensor, torch.Tensor):
            raise TraceFormatError(path, None, field, f"not a tensor: {type(tensor).__name__}")
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
            raise TraceFormatError(path, None, field, f"expected integers, got {tensor.dtype}")
    return obj[0].long(), obj[1].long(), obj[2].long()


def _check_meta(
    path: str | Path, indices: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor
) -> None:
    def bad(field: str, why: str) -> TraceFormatError:
        return TraceFormatError(path, None, field, why)

    if indices.dim() != 1:
        raise bad("indices", f"expected 1-D [N], got shape {list(indices.shape)}")
    if lengths.dim() != 2:
        raise bad("lengths", f"expected 2-D [tables, batch], got shape {list(lengths.shape)}")
    if int(lengths.sum()) != indices.numel() or bool((lengths < 0).any()):
        why = f"lengths sum to {int(lengths.sum())}, indices has {indices.numel()} ids"
        raise bad("lengths", why if int(lengths.sum()) != indices.numel() else "negative length")
    if offsets.dim() != 1 or offsets.numel() != lengths.numel() + 1:
        t, b = lengths.shape
        why = f"expected 1-D [tables*batch+1] = [{t * b + 1}], got shape {list(offsets.shape)}"
        raise bad("offsets", why)
    if int(offsets[0]) != 0 or not torch.equal(offsets.diff(), lengths.flatten()):
        raise bad("offsets", "must start at 0 and step by lengths (table-major)")
    if indices.numel() and int(indices.min()) < 0:
        raise bad("indices", f"negative row id {int(indices.min())}")


def load_meta(path: str | Path, rows: int | Sequence[int] | None = None) -> Trace:
    """A trace from Meta's public embedding-trace format: a torch.save file (optionally
    gzipped) of ``(indices, offsets, lengths)``: indices [N] all tables' ids concatenated,
    lengths [T, B] ids per (table, sample), offsets [T*B+1] table-major bag starts. Table t's
    stream is its bags in sample order. ``rows`` (one for all, or one per table) defaults to
    each table's max id + 1."""
    indices, offsets, lengths = _meta_tensors(path)
    _check_meta(path, indices, offsets, lengths)
    tables, batch = lengths.shape
    bounds = offsets[::batch].tolist() if batch else [0] * (tables + 1)
    streams = tuple(indices[bounds[t] : bounds[t + 1]].clone() for t in range(tables))
    if not streams:
        raise TraceFormatError(path, None, "lengths", "no tables (shape [0, B])")
    maxima = [int(s.max()) if s.numel() else 0 for s in streams]
    return Trace(name=str(path), ids=streams, rows=_row_counts(path, tables, rows, maxima))


def _table_seed(seed: int, table: int) -> int:
    return int(np.random.SeedSequence([seed, table]).generate_state(1)[0])


def _check_gen(rows: int, n: int, seed: int) -> None:
    if seed < 0:
        raise ConfigError(f"seed must be >= 0, got {seed}")
    if rows < 1:
        raise ConfigError(f"rows must be >= 1, got {rows}")
    if n < 1:
        raise ConfigError(f"lookups must be >= 1, got {n}")


def uniform(rows: int, n: int, seed: int) -> torch.Tensor:
    """``n`` row ids drawn uniformly from [0, rows), seeded."""
    _check_gen(rows, n, seed)
    return torch.from_numpy(np.random.default_rng(seed).integers(0, rows, size=n, dtype=np.int64))


def zipf(rows: int, n: int, alpha: float, seed: int) -> torch.Tensor:
    """``n`` row ids from a bounded Zipf law: rank k in 1..rows has probability proportional
    to k**-alpha; ranks map to row ids through a seeded random permutation, so hot rows are
    scattered over the table. alpha = 0 is uniform."""
    _check_gen(rows, n, seed)
    if not 0.0 <= alpha <= 10.0:
        raise ConfigError(f"zipf alpha must be in [0, 10], got {alpha}")
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(exact.power(np.arange(1, rows + 1, dtype=np.float64), -alpha))
    ranks = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
    ranks = np.minimum(ranks, rows - 1)  # guards the float edge u * cdf[-1] == cdf[-1]
    return torch.from_numpy(rng.permutation(rows)[ranks].astype(np.int64))


@lru_cache(maxsize=4)
def _bundled(name: str) -> Trace:
    file, rows = BUNDLED[name]
    path = resources.files("recperf").joinpath(f"data/embedding/{file}")
    trace = load_text(str(path), rows=rows)
    return Trace(name=name, ids=trace.ids, rows=trace.rows)


def _generated(name: str, rows: int, tables: int, lookups: int, seed: int) -> Trace | None:
    if name == "uniform":
        streams = [uniform(rows, lookups, _table_seed(seed, t)) for t in range(tables)]
    elif name in PRESETS or name.startswith("zipf:"):
        alpha = PRESETS.get(name)
        if alpha is None:
            try:
                alpha = float(name.removeprefix("zipf:"))
            except ValueError:
                why = "alpha must be a number, e.g. zipf:1.05"
                raise ConfigError(f"trace {name!r}: {why}") from None
        streams = [zipf(rows, lookups, alpha, _table_seed(seed, t)) for t in range(tables)]
    else:
        return None
    return Trace(name=name, ids=tuple(streams), rows=(rows,) * tables)


def _with_tables(trace: Trace, tables: int, seed: int) -> Trace:
    if trace.tables == tables:
        return trace
    if trace.tables == 1:
        return trace.tiled(tables, seed)
    if tables < trace.tables:
        return Trace(name=trace.name, ids=trace.ids[:tables], rows=trace.rows[:tables])
    raise ConfigError(f"trace {trace.name!r} has {trace.tables} tables, {tables} requested")


def resolve(
    name_or_path: str | Path,
    rows: int | None = None,
    tables: int = 1,
    lookups: int | None = None,
    seed: int = 0,
) -> Trace:
    """A trace with exactly ``tables`` tables, by name or path. Names: ``uniform``,
    ``zipf:<alpha>`` and the presets ``reuse-high|medium|low`` (generated: ``rows`` rows,
    default 500,000, and ``lookups`` ids per table, default 1,000,000); ``reuse-medium-500k``
    (bundled real trace). Paths: .txt/.txt.gz (text) or .pt/.pt.gz (Meta format). A one-table
    trace is tiled over ``tables`` (see ``Trace.tiled``); a file with more tables keeps the first
    ``tables``. ``lookups`` applies to generated traces only."""
    if tables < 1 or seed < 0:
        raise ConfigError(f"tables must be >= 1 and seed >= 0, got {tables} and {seed}")
    if rows is not None and not 1 <= rows <= MAX_ROWS:
        raise ConfigError(f"rows = {rows}: expected 1..{MAX_ROWS:,} (not given: the default)")
    if lookups is not None and lookups < 1:
        raise ConfigError(f"lookups = {lookups}: expected >= 1 (not given: the default)")
    name = str(name_or_path)
    rows_or_default = DEFAULT_ROWS if rows is None else rows
    made = _generated(name, rows_or_default, tables, lookups or DEFAULT_LOOKUPS, seed)
    if made is not None:
        return made
    if name in BUNDLED:
        trace = _bundled(name)
        if rows is not None:
            trace = Trace(name=name, ids=trace.ids, rows=(rows,))
        return _with_tables(trace, tables, seed)
    suffixes = "".join(Path(name).suffixes[-2:]).lower()
    if suffixes.endswith((".txt", ".txt.gz")):
        return _with_tables(load_text(name, rows), tables, seed)
    if suffixes.endswith((".pt", ".pt.gz")):
        return _with_tables(load_meta(name, rows), tables, seed)
    allowed = ", ".join(NAMES)
    raise ConfigError(
        f"unknown trace {name!r}: expected one of {allowed}, or a .txt[.gz] / .pt[.gz] file"
    )


def batches(
    trace: Trace, batch_size: int, pooling_factor: int, start: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless batches in TBE layout, cycling through each table's stream (wrapping at its
    end): ``indices`` int64 [T*B*L], table-major (table 0's B bags of L ids, then table 1's),
    and ``offsets`` int64 [T*B+1]. Batch k takes ids [k*B*L, (k+1)*B*L) of every stream;
    ``start`` is the index of the first batch yielded."""
    if batch_size < 1 or pooling_factor < 1 or start < 0:
        why = f"batch_size={batch_size}, pooling_factor={pooling_factor}, start={start}"
        raise ConfigError(f"batches need batch_size >= 1, pooling_factor >= 1, start >= 0: {why}")
    if any(ids.numel() == 0 for ids in trace.ids):
        raise ConfigError(f"trace {trace.name!r} has an empty table; cannot make batches")
    per_table = batch_size * pooling_factor
    step = torch.arange(per_table, dtype=torch.int64)
    offsets = torch.arange(trace.tables * batch_size + 1, dtype=torch.int64) * pooling_factor
    k = start
    while True:
        parts = [ids[(step + k * per_table) % ids.numel()] for ids in trace.ids]
        yield torch.cat(parts), offsets.clone()
        k += 1
