"""Shared-memory item files: a batch of numpy columns in one file under ``SHM_DIR``, written by
one process and mapped read-only by another (the hand-off at a cut of the pipeline)."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recperf.core.errors import RecperfError

Columns = dict[str, np.ndarray]
SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
ITEM_BYTES_PER_ROW = 512
"""Upper bound on one row's bytes in any stage's item (decode output is ~321, collate ~480)."""
ITEM_BYTES_FIXED = 1024
"""Upper bound on an item's bytes beyond its rows: up to 63 bytes of 64-byte alignment before
each of its columns (collate has 6) and the offsets' one extra entry; what a batch of 1 or 2
rows is mostly made of."""


def item_bytes(rows: int) -> int:
    """Upper bound on the bytes of one item (a ring slot) of ``rows`` rows."""
    return rows * ITEM_BYTES_PER_ROW + ITEM_BYTES_FIXED


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
    layout = plan_layout(cols)
    size = max(layout_bytes(layout), 1)
    try:
        if reuse is not None:
            fd = os.open(reuse, os.O_RDWR)
        else:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                # allocate the pages now: a full tmpfs fails here, not as SIGBUS on write
                os.posix_fallocate(fd, 0, size)
            with mmap.mmap(fd, size) as mm:
                copy_into(mm, layout, cols)
            if reuse is not None:
                os.rename(reuse, path)
        finally:
            os.close(fd)
    except OSError as exc:
        raise shm_error(exc) from None
    rows = int(next(iter(cols.values())).shape[0]) if cols else 0
    return ItemRef(path=path, layout=layout, nbytes=size, rows=rows)


Layout = tuple[tuple[str, str, tuple[int, ...], int], ...]


def plan_layout(cols: Mapping[str, np.ndarray]) -> Layout:
    """(name, dtype, shape, byte offset) of each column packed at 64-byte alignment."""
    layout = []
    off = 0
    for name, arr in cols.items():
        off = (off + 63) // 64 * 64
        layout.append((name, arr.dtype.str, tuple(arr.shape), off))
        off += arr.nbytes
    return tuple(layout)


def layout_bytes(layout: Layout) -> int:
    if not layout:
        return 0
    _, dt, shape, start = layout[-1]
    return start + int(np.prod(shape)) * np.dtype(dt).itemsize


def copy_into(buf: mmap.mmap, layout: Layout, cols: Mapping[str, np.ndarray]) -> None:
    for (_, dt, shape, start), arr in zip(layout, cols.values(), strict=True):
        if arr.size:
            view = np.frombuffer(buf, np.dtype(dt), int(np.prod(shape)), start)
            view[...] = arr.reshape(-1)
            del view


def shm_error(exc: OSError) -> RecperfError:
    """One line for a failed shared-memory write; a full tmpfs is named as such."""
    if exc.errno in (errno.ENOSPC, errno.ENOMEM):
        return RecperfError(
            f"{SHM_DIR} is full: the ingestion pipeline could not allocate a shared-memory "
            f"buffer ({exc.strerror}); free space there or lower queue_batches / workers"
        )
    return RecperfError(f"shared memory in {SHM_DIR}: {exc}")


def pack(items: Sequence[Mapping[str, np.ndarray]]) -> Columns:
    """Several items' columns as one flat dict (keys ``i/name``), for one buffer per hand-off."""
    return {f"{i}/{k}": v for i, it in enumerate(items) for k, v in it.items()}


def unpack(cols: Mapping[str, np.ndarray]) -> list[Columns]:
    out: list[Columns] = []
    for key, v in cols.items():
        i, name = key.split("/", 1)
        while len(out) <= int(i):
            out.append({})
        out[int(i)][name] = v
    return out


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
