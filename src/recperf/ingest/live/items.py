"""Shared-memory item files: a batch of numpy columns in one file under ``SHM_DIR``, written by
one process and mapped read-only by another (the hand-off at a cut of the pipeline)."""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Columns = dict[str, np.ndarray]
SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
ITEM_BYTES_PER_ROW = 512
"""Upper bound on one row's bytes in any stage's item (decode output is ~321, collate ~480)."""


@dataclass(slots=True, frozen=True)
class ItemRef:
    """A batch of columns in one file under SHM_DIR: name, dtype, shape and offset per column."""

    path: str
    layout: tuple[tuple[str, str, tuple[int, ...], int], ...]
    nbytes: int
    rows: int


def write_item(path: str, cols: Mapping[str, np.ndarray], reuse: str | None = None) -> ItemRef:
    """Write ``cols`` as item file ``path`` (which must not exist) and describe it. With
    ``reuse``, the columns go into that spent item file (its pages are already allocated, which
    saves about half the cost of a new file), which is then renamed to ``path``."""
    layout = []
    off = 0
    for name, arr in cols.items():
        off = (off + 63) // 64 * 64
        layout.append((name, arr.dtype.str, tuple(arr.shape), off))
        off += arr.nbytes
    size = max(off, 1)
    if reuse is not None:
        fd = os.open(reuse, os.O_RDWR)
    else:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as mm:
            for (_, dt, shape, start), arr in zip(layout, cols.values(), strict=True):
                if arr.nbytes:
                    view = np.frombuffer(mm, np.dtype(dt), int(np.prod(shape)), start)
                    view[...] = np.ascontiguousarray(arr).reshape(-1)
                    del view
        if reuse is not None:
            os.rename(reuse, path)
    finally:
        os.close(fd)
    rows = int(next(iter(cols.values())).shape[0]) if cols else 0
    return ItemRef(path=path, layout=tuple(layout), nbytes=size, rows=rows)


def read_item(ref: ItemRef) -> Columns:
    """Zero-copy numpy views of an item's columns (the mapping lives as long as the arrays)."""
    with open(ref.path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), ref.nbytes, access=mmap.ACCESS_READ)
    out: Columns = {}
    for name, dt, shape, start in ref.layout:
        count = int(np.prod(shape))
        out[name] = np.frombuffer(mm, np.dtype(dt), count, start).reshape(shape)
    return out


def unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
