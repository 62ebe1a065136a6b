"""The work of each pipeline stage as pure numpy functions over column dicts, and the splits the
read stage works through (Parquet row-group slices, TSV byte ranges)."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, cast

import numpy as np
import pyarrow.parquet as pq

from recperf.core.errors import TraceFormatError
from recperf.ingest.data import decode as dec
from recperf.ingest.data import rowgroup as rg
from recperf.ingest.data.criteo import _files, open_parquet
from recperf.ingest.data.decode import BadRow as BadRow
from recperf.ingest.data.decode import Columns as Columns

# ------------------------------------------------------------------------------------ splits

SplitKind = Literal["parquet", "tsv", "gz"]


@dataclass(slots=True, frozen=True)
class Split:
    """Rows ``first_row .. first_row + rows`` of the dataset, as stored in one file: a slice
    ``a:b`` of Parquet row group ``group``, or bytes ``a:b`` of a TSV file (uncompressed bytes of
    a gzipped one). Splits with the same (file, group) are best read by one worker in order."""

    file: str
    kind: SplitKind
    group: int
    a: int
    b: int
    first_row: int
    first_line: int
    """1-based line of the split's first row in its file (TSV), or its row index + 1 (Parquet)."""


def _line_ends(fh: IO[bytes]) -> Iterator[int]:
    """Byte offset just past every line of ``fh`` (a final line without newline included)."""
    pos = 0
    last = b"\n"
    while block := fh.read(16 << 20):
        arr = np.frombuffer(block, np.uint8)
        yield from (np.flatnonzero(arr == 10) + pos + 1).tolist()
        pos += len(block)
        last = block[-1:]
    if last != b"\n":
        yield pos


def plan_splits(data: str | Path, rows_per_split: int) -> tuple[list[Split], list[int]]:
    """Cut a file or directory of Criteo shards into splits of at most ``rows_per_split`` rows
    (splits never cross a file or a Parquet row group); also return each split's row count."""
    splits: list[Split] = []
    counts: list[int] = []
    row = 0
    for path in _files(Path(data)):
        name = str(path)
        if path.name.endswith(".parquet"):
            meta = open_parquet(path).metadata
            for g in range(meta.num_row_groups):
                n = meta.row_group(g).num_rows
                for a in range(0, n, rows_per_split):
                    b = min(n, a + rows_per_split)
                    splits.append(Split(name, "parquet", g, a, b, row, row + 1))
                    counts.append(b - a)
                    row += b - a
            continue
        kind: SplitKind = "gz" if path.name.endswith(".gz") else "tsv"
        try:
            with _open(path) as fh:
                ends = list(_line_ends(fh))
        except _READ_ERRORS as exc:
            raise TraceFormatError(path, None, None, f"cannot read: {exc}") from None
        start = 0
        for i in range(0, len(ends), rows_per_split):
            chunk = ends[i : i + rows_per_split]
            splits.append(Split(name, kind, 0, start, chunk[-1], row, i + 1))
            counts.append(len(chunk))
            start = chunk[-1]
            row += len(chunk)
    return splits, counts


_READ_ERRORS = (OSError, EOFError, zlib.error)  # EOFError, zlib.error: a truncated, corrupt .gz


def _open(path: str | Path) -> IO[bytes]:
    if str(path).endswith(".gz"):
        return cast(IO[bytes], gzip.open(path, "rb"))
    return open(path, "rb")


class SplitReader:
    """Does the whole read stage: a TSV split to row-aligned and dictionary columns (see
    ``decode.arrow_columns``), a Parquet split to row-aligned columns with ``ids`` and
    ``present`` (see ``rowgroup.RowGroup``). Keeps the last Parquet file and decoded row group,
    and an open gzip stream, so that a worker reading one group's splits in order decodes each
    byte once."""

    def __init__(self) -> None:
        self._file: tuple[str, pq.ParquetFile] | None = None
        self._group: tuple[tuple[str, int], rg.RowGroup] | None = None
        self._gz: tuple[str, IO[bytes], int] | None = None

    def read(self, split: Split) -> Columns:
        if split.kind == "parquet":
            return self._parquet(split)
        if split.kind == "tsv":
            with open(split.file, "rb") as fh:
                fh.seek(split.a)
                data = fh.read(split.b - split.a)
        else:
            data = self._gz_read(split)
        return dec.parse_tsv(data, split.file, split.first_line, split.first_row)

    def _parquet(self, split: Split) -> Columns:
        key = (split.file, split.group)
        if self._group is None or self._group[0] != key:
            self._group = None  # free the last group before the next is read
            if self._file is None or self._file[0] != split.file:
                plain = open_parquet(Path(split.file))  # names a missing column
                self._file = (split.file, rg.open_dictionary_parquet(split.file, plain.metadata))
            # the group's first row's id, so an error anywhere in the group names its row
            group_row = split.first_row - split.a
            group = rg.read_parquet_group(self._file[1], split.file, split.group, group_row)
            self._group = (key, group)
        return self._group[1].split(split.a, split.b)

    def _gz_read(self, split: Split) -> bytes:
        if self._gz is None or self._gz[0] != split.file or self._gz[2] > split.a:
            if self._gz is not None:
                self._gz[1].close()
            self._gz = (split.file, _open(split.file), 0)
        name, fh, pos = self._gz
        try:
            while pos < split.a:  # skip forward (only when another worker read splits between)
                pos += len(fh.read(min(split.a - pos, 16 << 20)))
            data = fh.read(split.b - split.a)
        except _READ_ERRORS as exc:
            fh.close()
            self._gz = None
            raise TraceFormatError(name, None, None, f"cannot read: {exc}") from None
        self._gz = (name, fh, split.b)
        return data


# ------------------------------------------------------------------------------ stage work


def dense_transform(cols: Columns) -> Columns:
    """Fill missing with 0, clip negatives to 0, log1p; float32."""
    # fmax ignores NaN, so one pass does both the fill and the clip; log1p runs in float64
    # (as it always has, for the same float32 bits) into that fresh array, then rounds once
    x = np.fmax(cols["dense"], 0.0)
    dense = np.log1p(x, out=x).astype(np.float32)
    return {**cols, "dense": dense}


def sparse_transform(cols: Columns) -> Columns:
    """The dictionary columns to ``ids`` (8-hex-digit value modulo each feature's table size)
    and ``present`` (the non-missing entries; a missing feature becomes an empty bag at
    collate). Each dictionary entry is decoded once; rows gather by code. Parquet splits come
    from the read stage decoded already (their row group's dictionaries are decoded once for all
    of its splits there), and pass through."""
    if "ids" in cols:
        return cols
    ids, present = dec.lookup_ids(cols)
    rest = {k: v for k, v in cols.items() if k not in dec.DICT_KEYS}
    return {**rest, "ids": ids, "present": present}


def downsample(cols: Columns, rate: float, seed: int) -> Columns:
    """Keep every positive and a deterministic ``rate`` share of negatives (a hash of the row id
    and seed decides, so a redone or resized run keeps exactly the same rows)."""
    z = cols["row_id"].astype(np.uint64) + np.uint64(seed * 0x9E3779B97F4A7C15 % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    keep = np.flatnonzero((cols["label"] == 1) | (z < np.uint64(min(rate, 1.0) * 2.0**64 - 1)))
    return {k: np.take(v, keep, axis=0) for k, v in cols.items()}  # take: ~4x a mask's speed


def shuffle(items: Sequence[Columns], seed: int, window: int) -> list[Columns]:
    """Permute the rows of a window of items among themselves (seeded by ``seed`` and the
    window index) and cut them back into items of the same sizes."""
    sizes = [len(it["row_id"]) for it in items]
    if len(items) == 1:
        merged = dict(items[0])
    else:
        merged = {k: np.concatenate([it[k] for it in items]) for k in items[0]}
    perm = np.random.default_rng([seed, window]).permutation(sum(sizes))
    parts = np.split(perm, np.cumsum(sizes)[:-1])
    return [{k: np.take(v, p, axis=0) for k, v in merged.items()} for p in parts]


def apply_stage(
    name: str,
    cols: list[Columns],
    seqs: Sequence[int],
    seed: int,
    downsample_rate: float,
    shuffle_window: int,
) -> list[Columns]:
    """Run stage ``name`` (any but read) on a chunk of consecutive batches whose item sequence
    numbers are ``seqs``: per batch, or for shuffle per window of ``shuffle_window`` batches
    seeded by the window's first seq (so the rows of every batch depend on the seed and the
    data only, whichever engine or worker runs it)."""
    if name == "dense":
        return [dense_transform(c) for c in cols]
    if name == "sparse":
        return [sparse_transform(c) for c in cols]
    if name == "downsample":
        return [downsample(c, downsample_rate, seed) for c in cols]
    if name == "collate":
        return [collate(c) for c in cols]
    if name == "shuffle":
        k = shuffle_window
        out: list[Columns] = []
        for a in range(0, len(cols), k):  # windows of k batches, seeded by their first seq
            out += shuffle(cols[a : a + k], seed, seqs[a])
        return out
    raise ValueError(f"unknown stage {name!r}")


def collate(cols: Columns) -> Columns:
    """Training layout: dense float32 [n,13], labels float32, and the 26 sparse features as
    KeyedJaggedTensor values/lengths/offsets in feature-major order (missing = empty bag)."""
    # transpose into contiguous copies first: masking a transposed view is ~3x slower
    present = np.ascontiguousarray(cols["present"].T).reshape(-1)
    ids = cols["ids"].T.astype(np.int64, order="C").reshape(-1)
    offsets = np.zeros(present.size + 1, np.int32)
    np.cumsum(present, out=offsets[1:])
    return {
        "row_id": cols["row_id"],
        "labels": cols["label"].astype(np.float32),
        "dense": np.ascontiguousarray(cols["dense"], np.float32),
        "values": ids[present],
        "lengths": present.astype(np.int32),
        "offsets": offsets,
    }
