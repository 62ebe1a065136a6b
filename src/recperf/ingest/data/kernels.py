"""Compiled whole-chunk kernels of the read and collate stages (numba, ``nogil``): a Criteo TSV
parser that knows the fixed 40-field layout and decodes the hex fields straight from the bytes,
and the collate layout of a chunk's batches. Each runs a whole chunk in one call with the GIL
released and one pass over its bytes. Where numba is not installed (or ``RECPERF_NO_NUMBA`` is
set) the callers use the vectorised numpy / pyarrow path, which gives the same bytes (tested)."""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

_NDENSE, _NCAT = 13, 26

AVAILABLE = not os.environ.get("RECPERF_NO_NUMBA") and importlib.util.find_spec("numba") is not None
"""Whether the compiled kernels run (numba is installed and ``RECPERF_NO_NUMBA`` is not set)."""
_KERNELS: list[str] = []
"""The kernels' names, helpers first (a kernel is compiled after the helpers it calls)."""
_compiled = False
_lock = threading.Lock()


def _jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` a kernel; ``_ready`` swaps it for its numba form when first needed, so
    importing this module does not import numba (about 0.3 s)."""
    _KERNELS.append(fn.__name__)
    return fn


def _ready() -> bool:
    """Whether the kernels run; the first time, every kernel becomes a numba ``nogil``
    function (compiled on its first call, or loaded from numba's cache: once per machine, not
    once per worker process)."""
    global _compiled
    if not AVAILABLE:
        return False
    with _lock:
        if not _compiled:
            from numba import njit

            for name in _KERNELS:  # helpers first: a caller sees them compiled
                globals()[name] = njit(nogil=True, cache=True)(globals()[name])
            _compiled = True
    return True


CLEAN = 0
"""``parse_tsv``'s status when every line is in the plain layout it parses."""


@_jit
def _hex8(buf: np.ndarray, pos: int) -> tuple[int, bool]:
    """The value of the 8 ASCII hex digits (either case) at ``buf[pos:pos + 8]``, and whether
    all 8 are hex digits."""
    v = 0
    ok = True
    for k in range(8):  # branch-free: a digit's low nibble, plus 9 for a letter
        c = int(buf[pos + k])
        low = c | 0x20
        ok &= ((c >= 48) & (c <= 57)) | ((low >= 97) & (low <= 102))
        v = (v << 4) | ((c & 0xF) + 9 * ((c >> 6) & 1))
    return v, ok


@_jit
def _parse_tsv(
    buf: np.ndarray,
    card: np.ndarray,
    label: np.ndarray,
    dense: np.ndarray,
    ids: np.ndarray,
    present: np.ndarray,
) -> tuple[int, int]:  # pragma: no cover - compiled (its twin is tested against pyarrow)
    """Lines of ``buf`` into the output arrays; (rows, status): status CLEAN, or 1 + the row of
    the first line outside the plain layout (label 0 or 1; 13 integer fields of at most 18
    digits, or empty; 26 fields of 8 hex digits, or empty; tabs between, a newline or the end
    after), which the caller hands to the general parser to accept or name the error."""
    n_cap = label.shape[0]
    size = buf.shape[0]
    pos = 0
    row = 0
    while pos < size:
        if row >= n_cap:
            return row, 1 + row
        c = buf[pos]
        if (c != 48 and c != 49) or pos + 1 >= size or buf[pos + 1] != 9:
            return row, 1 + row
        label[row] = c - 48
        pos += 2
        for j in range(_NDENSE):
            neg = False
            if pos < size and buf[pos] == 45:
                neg = True
                pos += 1
            v = 0
            digits = 0
            while pos < size:
                c = buf[pos]
                if c < 48 or c > 57:
                    break
                v = v * 10 + (c - 48)
                digits += 1
                pos += 1
            if pos >= size or buf[pos] != 9 or digits > 18 or (neg and digits == 0):
                return row, 1 + row
            if digits == 0:
                dense[j, row] = np.nan
            else:
                dense[j, row] = float(-v if neg else v)
            pos += 1
        for j in range(_NCAT):
            last = j == _NCAT - 1
            if pos >= size or buf[pos] == 9 or buf[pos] == 10:  # empty: a missing feature
                if (pos >= size or buf[pos] == 10) != last:
                    return row, 1 + row
                ids[j, row] = 0
                present[j, row] = False
                pos += 1
                continue
            if pos + 8 > size:
                return row, 1 + row
            v, ok = _hex8(buf, pos)
            if not ok:
                return row, 1 + row
            pos += 8
            end = pos >= size or buf[pos] == 10
            if end != last or (not end and buf[pos] != 9):
                return row, 1 + row
            ids[j, row] = v % card[j]
            present[j, row] = True
            pos += 1
        row += 1
    return row, CLEAN


def parse_tsv(
    data: bytes, card: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Whole Criteo TSV lines to label int8 [n], dense float64 [13,n] (NaN where missing), ids
    int32 [26,n] (hex value modulo ``card``, 0 where missing) and present bool [26,n]; None
    where a line is outside the plain layout (the general parser then decides) or numba is not
    installed."""
    if not data or not _ready():
        return None
    buf = np.frombuffer(data, np.uint8)
    n = int(np.count_nonzero(buf == 10)) + (buf[-1] != 10)
    label = np.empty(n, np.int8)
    dense = np.empty((_NDENSE, n), np.float64)
    ids = np.empty((_NCAT, n), np.int32)
    present = np.empty((_NCAT, n), np.bool_)
    rows, status = _parse_tsv(buf, card.astype(np.int64), label, dense, ids, present)
    if status != CLEAN or rows != n:
        return None
    return label, dense, ids, present


@_jit
def _collate(
    ids: np.ndarray,
    present: np.ndarray,
    dense: np.ndarray,
    sizes: np.ndarray,
    values: np.ndarray,
    lengths: np.ndarray,
    offsets: np.ndarray,
    dense_out: np.ndarray,
    starts: np.ndarray,
) -> None:  # pragma: no cover - compiled (its twin is tested against the numpy path)
    """Every batch's feature-major lengths, offsets and values, and its dense rows, in one pass:
    batch ``i`` of ``sizes[i]`` rows has lengths ``[26*a, 26*(a+b))``, offsets
    ``[26*a + i, 26*(a+b) + i + 1)`` and values ``[starts[i], starts[i+1])`` (a: its first row)."""
    a = 0
    k = 0
    for i in range(sizes.shape[0]):
        b = sizes[i]
        o = _NCAT * a + i
        offsets[o] = 0
        starts[i] = k
        k0 = k
        for f in range(_NCAT):
            base = _NCAT * a + f * b
            for r in range(b):  # branch-free: a missing entry's value is overwritten next
                p = 1 if present[f, a + r] else 0
                lengths[base + r] = p
                values[k] = ids[f, a + r]
                k += p
                offsets[o + 1 + f * b + r] = k - k0
        for r in range(b):
            for j in range(_NDENSE):
                dense_out[a + r, j] = dense[j, a + r]
        a += b
    starts[sizes.shape[0]] = k


def collate_arrays(
    ids: np.ndarray, present: np.ndarray, dense: np.ndarray, sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``_collate``'s outputs (values int64, lengths int32, offsets int32, dense float32 [n,13],
    starts int64) for a chunk; None where numba is not installed."""
    if not _ready():
        return None
    n = int(sizes.sum())
    values = np.empty(int(np.count_nonzero(present)) + 1, np.int64)  # +1: the last write
    lengths = np.empty(_NCAT * n, np.int32)
    offsets = np.empty(_NCAT * n + len(sizes), np.int32)
    dense_out = np.empty((n, _NDENSE), np.float32)
    starts = np.empty(len(sizes) + 1, np.int64)
    _collate(ids, present, dense, sizes, values, lengths, offsets, dense_out, starts)
    return values, lengths, offsets, dense_out, starts


@_jit
def _dictionary_ids(
    offsets: np.ndarray,
    data: np.ndarray,
    indices: np.ndarray,
    valid: np.ndarray,
    card: int,
    ids: np.ndarray,
    present: np.ndarray,
) -> bool:  # pragma: no cover - compiled (its twin is tested against the numpy path)
    """A dictionary column's ids (entry's hex value modulo ``card``, 0 where missing) and
    present flags; False (outputs undefined) where an entry is neither empty nor 8 hex digits,
    for the general path to name. ``valid``: the rows' validity (empty: no nulls)."""
    m = offsets.shape[0] - 1
    table = np.empty(m + 1, np.int32)  # the last: what a null row gathers
    table[m] = -1
    for e in range(m):
        a = offsets[e]
        size = offsets[e + 1] - a
        if size == 0:
            table[e] = -1
            continue
        if size != 8:
            return False
        v, ok = _hex8(data, a)
        if not ok:
            return False
        table[e] = v % card
    if valid.shape[0] > 0:
        for r in range(indices.shape[0]):  # branch-free: a null row gathers the last entry
            t = table[m + (indices[r] - m) * valid[r]]
            present[r] = t >= 0
            ids[r] = max(t, 0)
    else:
        for r in range(indices.shape[0]):
            t = table[indices[r]]
            present[r] = t >= 0
            ids[r] = max(t, 0)
    return True


def dictionary_ids(arr: Any, card: int, ids: np.ndarray, present: np.ndarray) -> bool:
    """``_dictionary_ids`` for a pyarrow dictionary<string> column with int32 indices, into
    ``ids`` and ``present``; False where it does not apply (numba missing, another column type,
    a null dictionary entry, an odd entry), for the numpy path to do (or to name the error)."""
    import pyarrow as pa

    if not pa.types.is_dictionary(arr.type) or len(arr) == 0 or not _ready():
        return False
    d, idx = arr.dictionary, arr.indices
    if d.type != pa.string() or idx.type != pa.int32() or d.null_count or len(d) == 0:
        return False
    offsets = np.frombuffer(d.buffers()[1], np.int32, len(d) + 1, d.offset * 4)
    data = np.frombuffer(d.buffers()[2], np.uint8)
    indices = np.frombuffer(idx.buffers()[1], np.int32, len(idx), idx.offset * 4)
    if idx.null_count:
        bits = np.frombuffer(idx.buffers()[0], np.uint8)
        valid = np.unpackbits(bits, count=idx.offset + len(idx), bitorder="little")
        valid = valid[idx.offset :].view(np.bool_)
    else:
        valid = np.empty(0, np.bool_)
    return bool(_dictionary_ids(offsets, data, indices, valid, int(card), ids, present))
