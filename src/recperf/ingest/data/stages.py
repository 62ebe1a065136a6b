"""The work of each pipeline stage, and the splits the read stage works through (Parquet
row-group slices, TSV byte ranges). A stage takes one chunk per call (a ``Block``: a run of
consecutive splits, by default a whole 65,536-row group, as one set of columns) and works on
all of its rows in whole-chunk numpy and pyarrow calls, which release the GIL; batches are cut
only at collate, as views."""

from __future__ import annotations

import gzip
import itertools
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, cast

import numpy as np
import pyarrow.parquet as pq

from recperf.core.errors import TraceFormatError
from recperf.ingest.data import decode as dec
from recperf.ingest.data import kernels
from recperf.ingest.data import rowgroup as rg
from recperf.ingest.data.criteo import CAT_FEATURES, _files, open_parquet
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


def read_range(path: str, a: int, b: int) -> bytes:
    """Bytes ``a:b`` of the file at ``path``, in one ``pread``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, b - a, a)
    finally:
        os.close(fd)


_READ_ERRORS = (OSError, EOFError, zlib.error)  # EOFError, zlib.error: a truncated, corrupt .gz


def _open(path: str | Path) -> IO[bytes]:
    if str(path).endswith(".gz"):
        return cast(IO[bytes], gzip.open(path, "rb"))
    return open(path, "rb")


class SplitReader:
    """Does the whole read stage: TSV splits to row-aligned and dictionary columns (see
    ``decode.arrow_columns``), Parquet splits to row-aligned columns with ``ids`` and
    ``present`` (see ``rowgroup.RowGroup``). Keeps the last Parquet file and decoded row group,
    and an open gzip stream, so that a worker reading one group's chunks in order decodes each
    byte once."""

    def __init__(self) -> None:
        self._file: tuple[str, pq.ParquetFile] | None = None
        self._group: tuple[tuple[str, int], rg.RowGroup] | None = None
        self._gz: tuple[str, IO[bytes], int] | None = None

    def read(self, split: Split) -> Columns:
        """One split's columns (see ``read_chunk``)."""
        return self.read_chunk((split,)).cols

    def read_chunk(self, splits: Sequence[Split], raw: Sequence[bytes] | None = None) -> Block:
        """Consecutive splits of one file (and row group) as one block, decoded in one pass;
        ``raw``: their TSV bytes, already fetched."""
        first, last = splits[0], splits[-1]
        if first.kind == "parquet":
            cols = self._parquet(first, last.b)
            return Block(cols, tuple(s.b - s.a for s in splits))
        if raw is not None:
            data = b"".join(raw)
        elif first.kind == "tsv":
            data = read_range(first.file, first.a, last.b)
        else:
            data = b"".join([self._gz_read(s) for s in splits])
        cols = dec.parse_tsv(data, first.file, first.first_line, first.first_row)
        ends = [s.first_row - first.first_row for s in splits[1:]]
        return Block(cols, tuple(np.diff([0, *ends, len(cols["row_id"])]).tolist()))

    def _parquet(self, split: Split, b: int) -> Columns:
        """Rows ``split.a:b`` of the split's row group."""
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
        return self._group[1].rows(split.a, b)

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

_BATCH_ROWS = "batch_rows"
_NCAT = len(CAT_FEATURES)


@dataclass(slots=True, frozen=True)
class Block:
    """One chunk of consecutive batches as one set of row-aligned columns: per-row columns
    [n], per-feature columns feature-major [features, n] (and, before the sparse stage, a TSV
    chunk's dictionaries, which are not row-aligned); ``batch_rows``: each batch's rows, in
    order. No stage writes a block's arrays in place: they may view a cached row group or a
    read-only mapping."""

    cols: Columns
    batch_rows: tuple[int, ...]

    @property
    def rows(self) -> int:
        return int(self.cols["row_id"].shape[0])

    @property
    def ends(self) -> list[int]:
        """Row offsets of the batches' bounds: 0, the end of the first, ..., ``rows``."""
        return list(itertools.accumulate(self.batch_rows, initial=0))

    def pack(self) -> Columns:
        """The block as one set of columns, for a hand-off through shared memory."""
        return {**self.cols, _BATCH_ROWS: np.asarray(self.batch_rows, np.int64)}

    @staticmethod
    def unpack(cols: Columns) -> Block:
        rest = {k: v for k, v in cols.items() if k != _BATCH_ROWS}
        return Block(rest, tuple(int(r) for r in cols[_BATCH_ROWS]))


def _take_rows(cols: Columns, idx: np.ndarray) -> Columns:
    """Rows ``idx`` of every row-aligned column (the row axis is the last)."""
    if any(k in cols for k in dec.DICT_KEYS):
        raise ValueError("a block's dictionary columns are not row-aligned: run sparse first")
    return {k: np.take(v, idx, axis=v.ndim - 1) for k, v in cols.items()}  # take: ~4x a mask's


def dense_transform(block: Block) -> Block:
    """Fill missing with 0, clip negatives to 0, log1p; float32."""
    # fmax ignores NaN, so one pass does both the fill and the clip; log1p runs in float64
    # (as it always has, for the same float32 bits) into that fresh array, then rounds once
    x = np.fmax(block.cols["dense"], 0.0)
    dense = np.log1p(x, out=x).astype(np.float32)
    return Block({**block.cols, "dense": dense}, block.batch_rows)


def sparse_transform(block: Block) -> Block:
    """The dictionary columns to ``ids`` (8-hex-digit value modulo each feature's table size)
    and ``present`` (the non-missing entries; a missing feature becomes an empty bag at
    collate). Each dictionary entry is decoded once; rows gather by code. Parquet chunks come
    from the read stage decoded already (their row group's dictionaries are decoded once for all
    of its chunks there), and pass through."""
    cols = block.cols
    if "ids" in cols:
        return block
    ids, present = dec.lookup_ids(cols)
    rest = {k: v for k, v in cols.items() if k not in dec.DICT_KEYS}
    return Block({**rest, "ids": ids, "present": present}, block.batch_rows)


def kept_rows(row_id: np.ndarray, label: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """Positions of the rows downsampling keeps: every positive and a deterministic ``rate``
    share of negatives (a hash of the row id and seed decides, so a redone or resized run keeps
    exactly the same rows)."""
    z = row_id.astype(np.uint64) + np.uint64(seed * 0x9E3779B97F4A7C15 % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return np.flatnonzero((label == 1) | (z < np.uint64(min(rate, 1.0) * 2.0**64 - 1)))


def downsample(block: Block, rate: float, seed: int) -> Block:
    """The rows ``kept_rows`` keeps; each batch keeps its own survivors."""
    keep = kept_rows(block.cols["row_id"], block.cols["label"], rate, seed)
    sizes = np.diff(np.searchsorted(keep, block.ends))
    return Block(_take_rows(block.cols, keep), tuple(sizes.tolist()))


def shuffle(block: Block, seqs: Sequence[int], seed: int, window: int) -> Block:
    """Permute the rows of each window of ``window`` batches among themselves (seeded by
    ``seed`` and the seq of the window's first batch; ``seqs``: the block's batch seqs) and cut
    them back into batches of the same sizes; one gather for the whole block."""
    ends = block.ends
    parts = []
    for a in range(0, len(block.batch_rows), window):
        lo, hi = ends[a], ends[min(a + window, len(block.batch_rows))]
        perm = np.random.default_rng([seed, seqs[a]]).permutation(hi - lo)
        parts.append(perm + lo if lo else perm)
    idx = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return Block(_take_rows(block.cols, idx), block.batch_rows)


def apply_stage(
    name: str,
    block: Block,
    seqs: Sequence[int],
    seed: int,
    downsample_rate: float,
    shuffle_window: int,
) -> Block:
    """Run stage ``name`` (any but read and collate) on a block whose batches' sequence numbers
    are ``seqs``: shuffle windows are seeded by their first seq, so the rows of every batch
    depend on the seed and the data only, whichever engine or worker runs it."""
    if name == "dense":
        return dense_transform(block)
    if name == "sparse":
        return sparse_transform(block)
    if name == "downsample":
        return downsample(block, downsample_rate, seed)
    if name == "shuffle":
        return shuffle(block, seqs, seed, shuffle_window)
    raise ValueError(f"unknown stage {name!r}")


def collate(block: Block) -> list[Columns]:
    """Training layout, a dict per batch: dense float32 [n,13], labels float32, and the 26
    sparse features as KeyedJaggedTensor values/lengths/offsets in feature-major order (missing
    = empty bag). The whole chunk is laid out in one compiled pass (``kernels``) and its
    batches are views of it; without numba, each run of equal-sized batches in one numpy call
    per column, the same bytes."""
    cols = block.cols
    sizes = np.asarray(block.batch_rows, np.int64)
    laid = kernels.collate_arrays(cols["ids"], cols["present"], cols["dense"], sizes)
    if laid is not None:
        values, lengths, offsets, dense, starts = laid
        labels = cols["label"].astype(np.float32)
        ends = block.ends
        return [
            {
                "row_id": cols["row_id"][a:b],
                "labels": labels[a:b],
                "dense": dense[a:b],
                "values": values[starts[i] : starts[i + 1]],
                "lengths": lengths[_NCAT * a : _NCAT * b],
                "offsets": offsets[_NCAT * a + i : _NCAT * b + i + 1],
            }
            for i, (a, b) in enumerate(itertools.pairwise(ends))
        ]
    return collate_numpy(block)


def collate_numpy(block: Block) -> list[Columns]:
    """``collate`` in numpy calls (the path without numba)."""
    out: list[Columns] = []
    sizes = block.batch_rows
    row = i = 0
    while i < len(sizes):
        k = 1
        while i + k < len(sizes) and sizes[i + k] == sizes[i]:
            k += 1
        out += _collate_run(block.cols, row, sizes[i], k)
        row += sizes[i] * k
        i += k
    return out


def _collate_run(cols: Columns, a: int, b: int, k: int) -> list[Columns]:
    """``k`` batches of ``b`` rows from row ``a`` on."""
    rows = slice(a, a + k * b)
    # [features, k*b] -> [k, features, b]: each batch's feature-major block, side by side
    present = cols["present"][:, rows].reshape(_NCAT, k, b).transpose(1, 0, 2)
    lengths = present.astype(np.int32)
    ids = cols["ids"][:, rows].reshape(_NCAT, k, b).transpose(1, 0, 2)
    values = ids[present].astype(np.int64)
    offsets = np.zeros((k, _NCAT * b + 1), np.int32)
    np.cumsum(lengths.reshape(k, -1), axis=1, out=offsets[:, 1:])
    starts = np.zeros(k + 1, np.int64)
    np.cumsum(offsets[:, -1], out=starts[1:])
    dense = np.ascontiguousarray(cols["dense"][:, rows].T, np.float32)
    labels = cols["label"][rows].astype(np.float32)
    row_id = cols["row_id"][rows]
    return [
        {
            "row_id": row_id[j * b : (j + 1) * b],
            "labels": labels[j * b : (j + 1) * b],
            "dense": dense[j * b : (j + 1) * b],
            "values": values[starts[j] : starts[j + 1]],
            "lengths": lengths[j].reshape(-1),
            "offsets": offsets[j],
        }
        for j in range(k)
    ]
