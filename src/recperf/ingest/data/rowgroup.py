"""A Parquet row group decoded once for all of the splits cut from it: the read stage's
Parquet kernel. The group's dictionaries are hex-decoded once (not once per split), so a
Parquet split leaves the read stage with ``ids`` and ``present``, as the sparse stage gives a
TSV split's."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recperf.core.errors import TraceFormatError
from recperf.ingest.data.criteo import CAT_FEATURES, COLUMNS, INT_FEATURES
from recperf.ingest.data.decode import (
    _CARD,
    _NCAT,
    _NOT_HEX,
    BadRow,
    Columns,
    _cast,
    _column,
    _dictionary_codes,
    _label,
    _string_codes,
    _validity,
    hex_values,
)


def open_dictionary_parquet(path: str, metadata: pq.FileMetaData) -> pq.ParquetFile:
    """``path`` (already opened once for ``metadata``) to read its categoricals as dictionaries,
    which decodes each distinct string once rather than once per row."""
    return pq.ParquetFile(path, metadata=metadata, read_dictionary=list(CAT_FEATURES))


def read_parquet_group(pf: pq.ParquetFile, file: str, group: int, first_row: int) -> RowGroup:
    """One row group, decoded (``first_row``: the global row id of the group's first row)."""
    try:
        table = pf.read_row_group(group, columns=list(COLUMNS), use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        why = f"unreadable row group {group}: {str(exc).splitlines()[0]}"
        raise TraceFormatError(file, None, None, why) from None
    return RowGroup(table, first_row, file)


class RowGroup:
    """One Parquet row group decoded once for cutting splits from: its row columns, and the
    sparse stage's ids for every row, each dictionary entry hex-decoded once per group (the
    group's dictionaries are shared by all of its splits). A non-hex entry raises only when a
    split that uses it is cut, naming that split's first row to use it. Per-feature columns are
    kept feature-major and transposed a split at a time (a whole group's transpose misses the
    cache: it costs twice as much)."""

    def __init__(self, table: pa.Table, first_row: int, source: str) -> None:
        n = table.num_rows
        self.first_row = first_row
        self._label = _label(_column(table, "label", pa.int8(), source), first_row)
        self._dense = np.empty((len(INT_FEATURES), n), np.float64)
        for j, name in enumerate(INT_FEATURES):
            _float_values(_column(table, name, pa.int64(), source), self._dense[j])
        self._ids = np.empty((_NCAT, n), np.int32)  # -1 where missing
        hits: list[np.ndarray | None] = []
        for j, name in enumerate(CAT_FEATURES):
            arr = _column(table, name, None, source)
            codes, table_j, bad = _feature_ids(arr, j, first_row, source)
            np.take(table_j, codes, out=self._ids[j], mode="wrap")  # wrap: no buffered copy
            hits.append(None if bad is None else np.append(bad, False)[codes])
        self._bad = None
        if any(h is not None for h in hits):
            self._bad = np.stack([np.zeros(n, bool) if h is None else h for h in hits])

    def split(self, a: int, b: int) -> Columns:
        """Rows ``a:b`` with their ``ids`` (0 where missing) and ``present``; every array is
        new, so a stage that writes in place cannot change the cached group."""
        row_id = np.arange(self.first_row + a, self.first_row + b, dtype=np.int64)
        if self._bad is not None and (hit := self._bad[:, a:b].T).any():
            i, j = np.argwhere(hit)[0]
            raise BadRow(int(row_id[i]), CAT_FEATURES[j], _NOT_HEX)
        ids = _transpose(self._ids[:, a:b])
        present = ids >= 0
        np.maximum(ids, 0, out=ids)
        dense = _transpose(self._dense[:, a:b])
        return {"row_id": row_id, "label": self._label[a:b].copy(), "dense": dense,
                "ids": ids, "present": present}  # fmt: skip


def _transpose(x: np.ndarray) -> np.ndarray:
    """A new C-ordered ``x.T``, written a column at a time (for a few thousand rows, twice as
    fast as ``np.ascontiguousarray(x.T)``)."""
    out = np.empty(x.shape[::-1], x.dtype)
    for j, row in enumerate(x):
        out[:, j] = row
    return out


def _float_values(arr: pa.Array, out: np.ndarray) -> None:
    """An int64 column into ``out`` as float64, NaN where null: ``to_numpy``'s values at half
    its cost."""
    if len(arr) == 0:
        return
    out[:] = np.frombuffer(arr.buffers()[1], np.int64, len(arr), arr.offset * 8)
    if arr.null_count:  # put at the indices: twice as fast as a boolean mask
        out.put(np.flatnonzero(~_validity(arr)), np.nan)


def _feature_ids(
    arr: pa.Array, j: int, first_row: int, source: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Categorical column ``j`` to codes, the ids its codes gather (the entries' hex values
    modulo the table size, and a last -1 that code -1, missing, gathers) and which entries are
    not hex (None: none)."""
    name = CAT_FEATURES[j]
    if pa.types.is_dictionary(arr.type):
        codes, entries = _dictionary_codes(arr, name, first_row, source)
    else:
        codes, entries = _string_codes(_cast(arr, pa.string(), name, source), name, first_row)
    value, bad = hex_values(entries)
    table = np.full(len(entries) + 1, -1, np.int32)
    np.remainder(value, _CARD[j], out=table[:-1].view(np.uint32))  # every table < 2**31 rows
    return codes, table, bad
