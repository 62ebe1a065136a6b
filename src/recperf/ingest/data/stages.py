"""The work of each pipeline stage as pure numpy functions over column dicts, and the splits the
read stage works through (Parquet row-group slices, TSV byte ranges)."""

from __future__ import annotations

import gzip
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, cast

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from recperf.core.errors import TraceFormatError
from recperf.ingest.data.criteo import (
    CARDINALITIES,
    CAT_FEATURES,
    COLUMNS,
    INT_FEATURES,
    SCHEMA,
    _check_line,
    _files,
    open_parquet,
)

Columns = dict[str, np.ndarray]

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
        with _open(path) as fh:
            ends = list(_line_ends(fh))
        start = 0
        for i in range(0, len(ends), rows_per_split):
            chunk = ends[i : i + rows_per_split]
            splits.append(Split(name, kind, 0, start, chunk[-1], row, i + 1))
            counts.append(len(chunk))
            start = chunk[-1]
            row += len(chunk)
    return splits, counts


def _open(path: str | Path) -> IO[bytes]:
    if str(path).endswith(".gz"):
        return cast(IO[bytes], gzip.open(path, "rb"))
    return open(path, "rb")


class SplitReader:
    """Reads splits as RecordBatches with ``SCHEMA``; keeps the last Parquet row group and an
    open gzip stream so that a worker reading one group's splits in order reads each byte once."""

    def __init__(self) -> None:
        self._group: tuple[str, int] | None = None
        self._table: pa.Table | None = None
        self._gz: tuple[str, IO[bytes], int] | None = None

    def read(self, split: Split) -> pa.RecordBatch:
        if split.kind == "parquet":
            return self._parquet(split)
        if split.kind == "tsv":
            with open(split.file, "rb") as fh:
                fh.seek(split.a)
                data = fh.read(split.b - split.a)
        else:
            data = self._gz_read(split)
        return _parse_tsv(data, split)

    def _parquet(self, split: Split) -> pa.RecordBatch:
        if self._group != (split.file, split.group) or self._table is None:
            pf = pq.ParquetFile(split.file)
            table = pf.read_row_group(split.group, columns=list(COLUMNS))
            try:
                self._table = table.cast(SCHEMA).combine_chunks()
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                why = f"cannot cast to the Criteo schema: {exc}"
                raise TraceFormatError(split.file, None, None, why) from None
            self._group = (split.file, split.group)
        batches = self._table.slice(split.a, split.b - split.a).to_batches()
        if len(batches) == 1:
            return batches[0]
        return pa.Table.from_batches(batches, schema=SCHEMA).combine_chunks().to_batches()[0]

    def _gz_read(self, split: Split) -> bytes:
        if self._gz is None or self._gz[0] != split.file or self._gz[2] > split.a:
            if self._gz is not None:
                self._gz[1].close()
            self._gz = (split.file, _open(split.file), 0)
        name, fh, pos = self._gz
        while pos < split.a:  # skip forward (only when another worker read the splits between)
            pos += len(fh.read(min(split.a - pos, 16 << 20)))
        data = fh.read(split.b - split.a)
        self._gz = (name, fh, split.b)
        return data


def _parse_tsv(data: bytes, split: Split) -> pa.RecordBatch:
    read = pcsv.ReadOptions(column_names=list(COLUMNS), block_size=max(1 << 20, len(data) + 1))
    parse = pcsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False)
    convert = pcsv.ConvertOptions(
        column_types=SCHEMA, null_values=[""], strings_can_be_null=True, check_utf8=False
    )
    try:
        table = pcsv.read_csv(pa.BufferReader(data), read, parse, convert)
        label = table.column("label").to_numpy(zero_copy_only=False)
        if table.column("label").null_count or (
            label.size and (label.min() < 0 or label.max() > 1)
        ):
            raise pa.ArrowInvalid("label must be 0 or 1")
    except pa.ArrowInvalid as exc:
        for i, line in enumerate(data.splitlines()):
            bad = _check_line(line.rstrip(b"\r").split(b"\t"))
            if bad is not None:
                raise TraceFormatError(split.file, split.first_line + i, bad[0], bad[1]) from None
        raise TraceFormatError(
            split.file, split.first_line, None, str(exc).splitlines()[0]
        ) from None
    return table.combine_chunks().to_batches()[0]


# ------------------------------------------------------------------------------ stage work


class BadRow(ValueError):
    """A row with an unusable value; the coordinator maps ``row_id`` to its file and line."""

    def __init__(self, row_id: int, field: str, why: str) -> None:
        super().__init__(f"row {row_id}: {field}: {why}")
        self.row_id, self.field, self.why = row_id, field, why


def decode(batch: pa.RecordBatch, first_row: int) -> Columns:
    """Arrow rows to columns: label, dense (float64, NaN for missing), cats (8 ASCII bytes per
    feature, zeros for missing) and the global row id of every row."""
    n = batch.num_rows
    row_id = np.arange(first_row, first_row + n, dtype=np.int64)
    dense = np.empty((n, len(INT_FEATURES)), np.float64)
    for j, name in enumerate(INT_FEATURES):
        dense[:, j] = batch.column(name).to_numpy(zero_copy_only=False)
    cats = np.zeros((n, len(CAT_FEATURES), 8), np.uint8)
    for j, name in enumerate(CAT_FEATURES):
        col = batch.column(name)
        offsets = np.frombuffer(col.buffers()[1], np.int32)[col.offset : col.offset + n + 1]
        lengths = np.diff(offsets)
        bad = np.flatnonzero((lengths != 8) & (lengths != 0))
        if bad.size:
            raise BadRow(int(row_id[bad[0]]), name, "expected 8 hex digits or an empty field")
        data_buf = col.buffers()[2]
        if data_buf is None or not lengths.any():
            continue
        data = np.frombuffer(data_buf, np.uint8)
        full = np.flatnonzero(lengths == 8)
        cats[full, j, :] = data[offsets[full, None] + np.arange(8)]
    label = batch.column("label").to_numpy(zero_copy_only=False).astype(np.int8)
    return {"row_id": row_id, "label": label, "dense": dense, "cats": cats}


def dense_transform(cols: Columns) -> Columns:
    """Fill missing with 0, clip negatives to 0, log1p; float32."""
    x = np.nan_to_num(cols["dense"], nan=0.0)
    np.maximum(x, 0.0, out=x)
    dense = np.log1p(x).astype(np.float32)
    return {**cols, "dense": dense}


_NIBBLE = np.full(256, 255, np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _NIBBLE[_c] = _i
for _i, _c in enumerate(b"ABCDEF", start=10):
    _NIBBLE[_c] = _i
_CARD = np.asarray(CARDINALITIES, np.int64)


def sparse_transform(cols: Columns) -> Columns:
    """8-hex-digit strings to ints, modulo each feature's table size; ``present`` marks the
    non-missing entries (a missing feature becomes an empty bag at collate)."""
    cats = cols["cats"]
    present = cats[:, :, 0] != 0
    nib = _NIBBLE[cats]
    bad = (nib == 255) & present[:, :, None]
    if bad.any():
        i, j, _ = np.argwhere(bad)[0]
        raise BadRow(int(cols["row_id"][i]), CAT_FEATURES[j], "not a hexadecimal string")
    nib[~present] = 0
    value = np.zeros(present.shape, np.int64)
    for k in range(8):
        value = (value << 4) | nib[:, :, k]
    ids = (value % _CARD).astype(np.int32)  # every table has < 2**31 rows; half the bytes
    rest = {k: v for k, v in cols.items() if k != "cats"}
    return {**rest, "ids": ids, "present": present}


def downsample(cols: Columns, rate: float, seed: int) -> Columns:
    """Keep every positive and a deterministic ``rate`` share of negatives (a hash of the row id
    and seed decides, so a redone or resized run keeps exactly the same rows)."""
    z = cols["row_id"].astype(np.uint64) + np.uint64(seed * 0x9E3779B97F4A7C15 % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    keep = (cols["label"] == 1) | (z < np.uint64(min(rate, 1.0) * 2.0**64 - 1))
    return {k: v[keep] for k, v in cols.items()}


def shuffle(items: Sequence[Columns], seed: int, window: int) -> list[Columns]:
    """Permute the rows of a window of items among themselves (seeded by ``seed`` and the
    window index) and cut them back into items of the same sizes."""
    sizes = [len(it["row_id"]) for it in items]
    merged = {k: np.concatenate([it[k] for it in items]) for k in items[0]}
    perm = np.random.default_rng([seed, window]).permutation(sum(sizes))
    cuts = np.cumsum(sizes)[:-1]
    parts = np.split(perm, cuts)
    return [{k: v[p] for k, v in merged.items()} for p in parts]


def collate(cols: Columns) -> Columns:
    """Training layout: dense float32 [n,13], labels float32, and the 26 sparse features as
    KeyedJaggedTensor values/lengths/offsets in feature-major order (missing = empty bag)."""
    present_t = cols["present"].T
    values = cols["ids"].T[present_t].astype(np.int64)
    lengths = present_t.astype(np.int32).reshape(-1)
    offsets = np.zeros(lengths.size + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return {
        "row_id": cols["row_id"],
        "labels": cols["label"].astype(np.float32),
        "dense": np.ascontiguousarray(cols["dense"], np.float32),
        "values": values,
        "lengths": lengths,
        "offsets": offsets,
    }
