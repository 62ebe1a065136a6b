"""The decode kernels of the read and sparse stages: Criteo rows (a TSV byte range, any Arrow
table with the Criteo columns) to row-aligned columns plus per-feature dictionaries of 8-digit
hex strings, and those dictionaries to table ids; all vectorised, one call per column over a
whole chunk. Per-feature columns are feature-major ([features, rows]), the layout collate
writes. ``rowgroup`` builds the Parquet read kernel from them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from recperf.core.errors import TraceFormatError
from recperf.ingest.data import kernels
from recperf.ingest.data.criteo import (
    CARDINALITIES,
    CAT_FEATURES,
    COLUMNS,
    INT_FEATURES,
    SCHEMA,
    _check_line,
)

Columns = dict[str, np.ndarray]
HEX_WIDTH = 8
"""Bytes of one dictionary entry: Criteo categoricals are 8 hex digits."""
DICT_KEYS = ("cat_codes", "cat_dict", "cat_dict_offsets")
"""The dictionary columns the read stage adds and the sparse stage replaces by ids/present."""
_NCAT = len(CAT_FEATURES)
_CARD = np.asarray(CARDINALITIES, np.uint32)
_ODD_LENGTH = "expected 8 hex digits or an empty field"
_NOT_HEX = "not a hexadecimal string"


class BadRow(ValueError):
    """A row with an unusable value; the coordinator maps ``row_id`` to its file and line."""

    def __init__(self, row_id: int, field: str, why: str) -> None:
        super().__init__(f"row {row_id}: {field}: {why}")
        self.row_id, self.field, self.why = row_id, field, why


# --------------------------------------------------------------------------- Arrow to columns


def arrow_columns(table: pa.Table | pa.RecordBatch, first_row: int, source: str) -> Columns:
    """Criteo rows to row_id, label int8, dense float64 [13,n] (NaN for missing), cat_codes
    int32 [26,n] (-1 for missing), cat_dict uint8 [m,8] and cat_dict_offsets int64 [27]. A
    categorical column may be a string column (its values become the dictionary, in row order)
    or a dictionary column (its dictionary is used as is). ``source`` names the data in errors."""
    n = table.num_rows
    label = _label(_column(table, "label", pa.int8(), source), first_row)
    dense = np.empty((len(INT_FEATURES), n), np.float64)
    for j, name in enumerate(INT_FEATURES):
        float_values(_column(table, name, pa.int64(), source), dense[j])
    arrs = [_column(table, name, None, source) for name in CAT_FEATURES]
    block = _string_block(arrs) if n else None
    codes, entries = block if block is not None else _cat_codes(arrs, first_row, source)
    offsets = np.zeros(_NCAT + 1, np.int64)
    np.cumsum([len(e) for e in entries], out=offsets[1:])
    return {
        "row_id": np.arange(first_row, first_row + n, dtype=np.int64),
        "label": label,
        "dense": dense,
        "cat_codes": codes,
        "cat_dict": np.concatenate(entries),
        "cat_dict_offsets": offsets,
    }


def _cat_codes(
    arrs: list[pa.Array], first_row: int, source: str
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Codes [26,n] and per-feature entries, one column at a time (any column type)."""
    codes = np.empty((_NCAT, len(arrs[0])), np.int32)
    entries = []
    for j, (name, arr) in enumerate(zip(CAT_FEATURES, arrs, strict=True)):
        if pa.types.is_dictionary(arr.type):
            codes[j], e = _dictionary_codes(arr, name, first_row, source)
        else:
            codes[j], e = _string_codes(_cast(arr, pa.string(), name, source), name, first_row)
        entries.append(e)
    return codes, entries


def _string_block(arrs: list[pa.Array]) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """``_cat_codes`` for the common case of 26 string columns, every value 8 bytes or missing,
    done on all features at once (one call per step for the 26 columns); None where the case
    does not hold, for the column-at-a-time path to handle."""
    if any(arr.type != pa.string() for arr in arrs):
        return None
    n = len(arrs[0])
    offs = np.empty((_NCAT, n + 1), np.int32)
    for j, arr in enumerate(arrs):
        offs[j] = np.frombuffer(arr.buffers()[1], np.int32, n + 1, arr.offset * 4)
    lengths = np.diff(offs, axis=1)
    if np.bitwise_and(lengths, ~HEX_WIDTH).any():  # a length other than 0 and 8
        return None
    present = lengths != 0
    for j, arr in enumerate(arrs):
        if arr.null_count:
            present[j] &= _validity(arr)
    counts = np.count_nonzero(present, axis=1)
    if (offs[:, -1] - offs[:, 0] != HEX_WIDTH * counts).any():  # bytes between the entries
        return None
    rank = np.cumsum(present, axis=1, dtype=np.int32)
    rank *= present
    rank -= 1  # the entry's index among the feature's values; -1 where missing
    entries = [
        _view_entries(arr, int(k), int(o[0])) for arr, k, o in zip(arrs, counts, offs, strict=True)
    ]
    return rank, entries


def float_values(arr: pa.Array, out: np.ndarray) -> None:
    """An int64 column into ``out`` as float64, NaN where null: ``to_numpy``'s values at half
    its cost."""
    if len(arr) == 0:
        return
    out[:] = np.frombuffer(arr.buffers()[1], np.int64, len(arr), arr.offset * 8)
    if arr.null_count:  # put at the indices: twice as fast as a boolean mask
        out.put(np.flatnonzero(~_validity(arr)), np.nan)


def _validity(arr: pa.Array) -> np.ndarray:
    """The validity bitmap as bools (3x faster than ``is_valid().to_numpy()``)."""
    bits = np.frombuffer(arr.buffers()[0], np.uint8)
    valid = np.unpackbits(bits, count=arr.offset + len(arr), bitorder="little")
    return valid[arr.offset :].view(bool)


def _view_entries(arr: pa.Array, k: int, start: int) -> np.ndarray:
    if k == 0:  # an all-missing column may have no data buffer at all
        return np.empty((0, HEX_WIDTH), np.uint8)
    data = np.frombuffer(arr.buffers()[2], np.uint8, HEX_WIDTH * k, start)
    return data.reshape(k, HEX_WIDTH)


def _column(
    table: pa.Table | pa.RecordBatch, name: str, to: pa.DataType | None, source: str
) -> pa.Array:
    col = table.column(name)
    if isinstance(col, pa.ChunkedArray):
        # combine_chunks unifies differing dictionaries of a dictionary column's chunks
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col if to is None else _cast(col, to, name, source)


def _cast(arr: pa.Array, to: pa.DataType, name: str, source: str) -> pa.Array:
    if arr.type == to:
        return arr
    try:
        return arr.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        why = f"cannot cast {arr.type} to {to}: {str(exc).splitlines()[0]}"
        raise TraceFormatError(source, None, name, why) from None


def _label(arr: pa.Array, first_row: int) -> np.ndarray:
    label = np.asarray(arr.fill_null(-1).to_numpy(zero_copy_only=False), np.int8)
    bad = np.flatnonzero((label != 0) & (label != 1))
    if bad.size:
        raise BadRow(first_row + int(bad[0]), "label", "label must be 0 or 1")
    return label


def _hex_entries(arr: pa.Array) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
    """For a string array: which values are 8-byte entries (None: all), which are neither that
    nor empty/null (None: none), and the 8-byte entries as uint8 [k,8] in order."""
    n = len(arr)
    if n == 0:
        return None, None, np.empty((0, HEX_WIDTH), np.uint8)
    _, off_buf, data_buf = arr.buffers()
    off = np.frombuffer(off_buf, np.int32, n + 1, arr.offset * 4)
    lengths = np.diff(off)
    valid = _validity(arr) if arr.null_count else None
    bad: np.ndarray | None = None
    if np.bitwise_and(lengths, ~HEX_WIDTH).any():  # some length is neither 0 nor 8
        bad = (lengths != HEX_WIDTH) & (lengths != 0)
        if valid is not None:
            bad &= valid
        if not bad.any():
            bad = None
    present = lengths == HEX_WIDTH
    if valid is not None:
        present &= valid
    k = int(np.count_nonzero(present))
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    start, stop = int(off[0]), int(off[-1])
    if stop - start == HEX_WIDTH * k:  # no other bytes between them: a zero-copy view
        entries = data[start:stop].reshape(k, HEX_WIDTH)
    else:
        entries = data[off[:-1][present, None] + np.arange(HEX_WIDTH)]
    return (None if k == n else present), bad, entries


def _string_codes(arr: pa.Array, name: str, first_row: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes into a dictionary made of the column's own non-missing values, in row order."""
    present, bad, entries = _hex_entries(arr)
    if bad is not None:
        raise BadRow(first_row + int(np.argmax(bad)), name, _ODD_LENGTH)
    if present is None:
        return np.arange(len(arr), dtype=np.int32), entries
    rank = np.cumsum(present, dtype=np.int32)
    return np.where(present, rank, 0) - 1, entries


def _indices(indices: pa.Array) -> np.ndarray:
    """A dictionary column's indices as a new int32 array, -1 where null."""
    if indices.type != pa.int32() or len(indices) == 0:
        if indices.null_count:
            indices = pc.fill_null(indices, -1)
        return np.asarray(indices.to_numpy(zero_copy_only=False), np.int32)
    idx = np.frombuffer(indices.buffers()[1], np.int32, len(indices), indices.offset * 4).copy()
    if indices.null_count:  # ~5x faster than fill_null and to_numpy
        idx.put(np.flatnonzero(~_validity(indices)), -1)
    return idx


def _dictionary_codes(
    arr: pa.DictionaryArray, name: str, first_row: int, source: str
) -> tuple[np.ndarray, np.ndarray]:
    """Codes into the column's own dictionary, minus its empty and null entries."""
    values = _cast(arr.dictionary, pa.string(), name, source)
    idx = _indices(arr.indices)
    keep, bad, entries = _hex_entries(values)
    if keep is None:  # every entry is 8 bytes (so none is bad): the indices are the codes
        return idx, entries
    # remap[-1] is the extra last slot, so a null row (index -1) maps to -1 as well
    remap = np.full(len(values) + 1, -1, np.int32)
    remap[:-1][keep] = np.arange(len(entries), dtype=np.int32)
    if bad is not None:
        remap[:-1][bad] = -2
    codes = remap[idx]
    if bad is not None and (hit := np.flatnonzero(codes == -2)).size:
        raise BadRow(first_row + int(hit[0]), name, _ODD_LENGTH)
    return codes, entries


# -------------------------------------------------------------------------------- read kernels

_TSV_PARSE = pcsv.ParseOptions(
    delimiter="\t", quote_char=False, escape_char=False, ignore_empty_lines=False
)
_TSV_CONVERT = pcsv.ConvertOptions(
    column_types=SCHEMA, null_values=[""], strings_can_be_null=True, check_utf8=False
)


def parse_tsv(data: bytes, file: str, first_line: int, first_row: int) -> Columns:
    """Whole Criteo TSV lines (``first_line`` the 1-based line of the first) to columns: where
    every line is in the plain layout, by the compiled parser, with the sparse stage's ``ids``
    and ``present`` already decoded; else by pyarrow's CSV reader, with dictionary columns. A bad
    row raises TraceFormatError with its file, line and field."""
    if not data:
        return arrow_columns(SCHEMA.empty_table(), first_row, file)
    parsed = kernels.parse_tsv(data, _CARD)
    if parsed is not None:  # every line in the plain layout: decoded straight from the bytes
        label, dense, ids, present = parsed
        row_id = np.arange(first_row, first_row + len(label), dtype=np.int64)
        return {"row_id": row_id, "label": label, "dense": dense, "ids": ids, "present": present}
    # one block and one thread: a worker is one core, and one block keeps one chunk per column
    read = pcsv.ReadOptions(column_names=list(COLUMNS), block_size=len(data) + 1, use_threads=False)
    try:
        table = pcsv.read_csv(pa.BufferReader(data), read, _TSV_PARSE, _TSV_CONVERT)
        return arrow_columns(table, first_row, file)
    except pa.ArrowInvalid as exc:
        fallback = TraceFormatError(file, first_line, None, str(exc).splitlines()[0])
    except BadRow as exc:
        fallback = TraceFormatError(file, first_line + exc.row_id - first_row, exc.field, exc.why)
    raise _locate_tsv(data, file, first_line) or fallback


def _locate_tsv(data: bytes, file: str, first_line: int) -> TraceFormatError | None:
    """The first malformed line's error (a Python loop, but it only runs once a split failed)."""
    for i, line in enumerate(data.splitlines()):
        parts = line.split(b"\t")
        bad = _check_line(parts)
        if bad is None:
            odd = [name for name, raw in zip(CAT_FEATURES, parts[14:], strict=True)
                   if len(raw) not in (0, HEX_WIDTH)]  # fmt: skip
            bad = (odd[0], _ODD_LENGTH) if odd else None
        if bad is not None:
            return TraceFormatError(file, first_line + i, bad[0], bad[1])
    return None


# ------------------------------------------------------------------------------ sparse kernels

_M = np.uint64
_LOW_NIBBLES = _M(0x0F0F0F0F0F0F0F0F)
_ONES = _M(0x0101010101010101)


def hex_values(entries: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """uint8 [m,8] ASCII hex digits (either case) to uint32 [m], and a mask of the entries that
    are not hex (None: all are). Eight digits are one uint64, worked on a byte per lane."""
    x = np.ascontiguousarray(entries).view("<u8").reshape(-1)
    # worked in place over scratch arrays: a fresh temporary per operation costs a fifth more
    # a digit's value: its low nibble, plus 9 for a letter (bit 6 set: A-F and a-f)
    nib = np.bitwise_and(x, _LOW_NIBBLES)
    t = np.right_shift(x, _M(6))
    t &= _ONES
    t *= _M(9)
    nib += t
    # pack the 8 nibbles; the first digit sits in the lowest byte and is the most significant
    y = np.left_shift(nib, _M(4))
    np.right_shift(nib, _M(8), out=t)
    y |= t
    y &= _M(0x00FF00FF00FF00FF)
    np.right_shift(y, _M(16), out=t)
    y <<= _M(8)
    y |= t
    y &= _M(0x0000FFFF0000FFFF)
    np.right_shift(y, _M(32), out=t)
    y <<= _M(16)
    y |= t
    value = y.astype(np.uint32)  # the low 32 bits
    # valid iff the nibbles re-encode to the entry lowercased, no nibble exceeds 15, and each
    # byte has bit 5 or 6 (this rules out the control bytes that lowercase into digits)
    err = np.add(nib, _M(0x0606060606060606), out=y)
    err >>= _M(4)
    err &= _ONES  # 1 where the nibble is >= 10
    err *= _M(ord("a") - ord("0") - 10)
    err += nib
    err += _M(0x3030303030303030)  # the entry re-encoded, lowercase
    err ^= np.bitwise_or(x, _M(0x2020202020202020), out=t)
    err |= np.bitwise_and(nib, _M(0xF0F0F0F0F0F0F0F0), out=t)
    np.right_shift(x, _M(5), out=t)
    t |= np.right_shift(x, _M(6), out=nib)
    np.invert(t, out=t)
    t &= _ONES
    err |= t
    bad = err != 0
    return value, (bad if bad.any() else None)


def lookup_ids(cols: Columns) -> tuple[np.ndarray, np.ndarray]:
    """ids int32 [26,n] (hex value modulo the feature's table size, 0 where missing) and
    present bool [26,n], decoding each dictionary entry once and gathering by code."""
    codes, offsets = cols["cat_codes"], cols["cat_dict_offsets"]
    counts = np.diff(offsets)
    value, bad = hex_values(cols["cat_dict"])
    ids = value % np.repeat(_CARD, counts)  # every table has < 2**31 rows: fits int32
    # table layout: per feature a 0 (what code -1 gathers) then its entries' ids
    table = np.insert(ids.view(np.int32), offsets[:-1], 0)
    base = (offsets[:-1] + np.arange(1, _NCAT + 1)).astype(np.int32)
    where = codes + base[:, None]
    if bad is not None:
        hit = np.take(np.insert(bad, offsets[:-1], False), where)
        if hit.any():
            i, j = first_hit(hit)
            raise BadRow(int(cols["row_id"][i]), CAT_FEATURES[j], _NOT_HEX)
    return np.take(table, where), codes >= 0


def first_hit(hit: np.ndarray) -> tuple[int, int]:
    """(row, feature) of the first true entry of a feature-major mask [features, rows], rows
    first: the error a row-by-row reader would meet first."""
    rows = np.flatnonzero(hit.any(axis=0))
    i = int(rows[0])
    return i, int(np.argmax(hit[:, i]))
