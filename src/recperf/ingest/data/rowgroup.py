"""A Parquet row group decoded once for all of the chunks cut from it: the read stage's
Parquet kernel. The group's dictionaries are hex-decoded once, so a Parquet chunk leaves the
read stage with ``ids`` and ``present``, as the sparse stage gives a TSV chunk's."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recperf.core.errors import TraceFormatError
from recperf.ingest.data import kernels
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
    first_hit,
    float_values,
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
    """One Parquet row group decoded once for cutting chunks from: its row columns, and the
    sparse stage's ids for every row, each dictionary entry hex-decoded once per group (the
    group's dictionaries are shared by all of its chunks). Per-feature columns are kept
    feature-major, the layout collate writes. A non-hex entry raises only when a chunk that uses
    it is cut, naming that chunk's first row to use it."""

    def __init__(self, table: pa.Table, first_row: int, source: str) -> None:
        n = table.num_rows
        self.first_row = first_row
        self._label = _label(_column(table, "label", pa.int8(), source), first_row)
        self._dense = np.empty((len(INT_FEATURES), n), np.float64)
        for j, name in enumerate(INT_FEATURES):
            float_values(_column(table, name, pa.int64(), source), self._dense[j])
        self._ids = np.empty((_NCAT, n), np.int32)  # 0 where missing
        self._present = np.empty((_NCAT, n), bool)
        hits: list[np.ndarray | None] = []
        for j, name in enumerate(CAT_FEATURES):
            arr = _column(table, name, None, source)
            ids, present = self._ids[j], self._present[j]
            if kernels.dictionary_ids(arr, int(_CARD[j]), ids, present):  # one compiled pass
                hits.append(None)
                continue
            codes, table_j, bad = _feature_ids(arr, j, first_row, source)
            np.take(table_j, codes, out=ids, mode="wrap")  # wrap: no buffered copy
            np.greater_equal(ids, 0, out=present)
            np.maximum(ids, 0, out=ids)
            hits.append(None if bad is None else np.append(bad, False)[codes])
        self._bad = None
        if any(h is not None for h in hits):
            self._bad = np.stack([np.zeros(n, bool) if h is None else h for h in hits])

    def rows(self, a: int, b: int) -> Columns:
        """Rows ``a:b`` with their ``ids`` [26, n] (0 where missing) and ``present``: read-only
        views of the cached group (no stage writes its input in place), row ids new."""
        row_id = np.arange(self.first_row + a, self.first_row + b, dtype=np.int64)
        if self._bad is not None and (hit := self._bad[:, a:b]).any():
            i, j = first_hit(hit)
            raise BadRow(int(row_id[i]), CAT_FEATURES[j], _NOT_HEX)
        cols = {
            "row_id": row_id,
            "label": self._label[a:b],
            "dense": self._dense[:, a:b],
            "ids": self._ids[:, a:b],
            "present": self._present[:, a:b],
        }
        for k in ("label", "dense", "ids", "present"):
            cols[k].flags.writeable = False
        return cols


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
