"""The output ring: fixed-size shared-memory slot files, each mapped once per process and reused
batch after batch. The last segment's workers pack each collated batch into a slot the
coordinator lent them; the consumer reads it as torch tensors that are views into the slot, so a
batch crosses from worker to trainer with one copy (into the slot) and no pickling."""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from recperf.core.errors import RecperfError
from recperf.ingest.live import items
from recperf.ingest.live.items import Layout


@dataclass(slots=True, frozen=True)
class Slot:
    """One ring slot: its file and its index in the ring."""

    index: int
    path: str


class Ring:
    """The coordinator's side: creates slot files on demand (up to what the memory budget
    allowed), lends free ones to tasks and takes them back."""

    def __init__(self, prefix: str, slot_bytes: int) -> None:
        self.prefix = prefix
        self.slot_bytes = slot_bytes
        self.slots: list[Slot] = []
        self.free: list[Slot] = []

    @property
    def nbytes(self) -> int:
        return len(self.slots) * self.slot_bytes

    def take(self, n: int, limit: int) -> list[Slot] | None:
        """``n`` slots for a task, creating files while the ring has fewer than ``limit``;
        None (nothing taken) if that many cannot be had now."""
        missing = n - len(self.free)
        if missing > 0 and len(self.slots) + missing > limit:
            return None
        for _ in range(max(0, missing)):
            self._grow()
        out = [self.free.pop() for _ in range(n)]
        return out

    def give_back(self, slots: list[Slot]) -> None:
        self.free.extend(slots)

    def _grow(self) -> None:
        slot = Slot(len(self.slots), str(items.SHM_DIR / f"{self.prefix}-ring-{len(self.slots)}"))
        try:
            fd = os.open(slot.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.slot_bytes)
            finally:
                os.close(fd)
        except OSError as exc:
            items.unlink_quietly(slot.path)
            raise items.shm_error(exc) from None
        self.slots.append(slot)
        self.free.append(slot)

    def unlink(self) -> None:
        for s in self.slots:
            items.unlink_quietly(s.path)
        self.slots.clear()
        self.free.clear()


class SlotMaps:
    """Each process's mappings of the slot files it has touched, kept for the process's life
    (mapping a 2 MB file costs about as much as copying a batch into it)."""

    def __init__(self, slot_bytes: int) -> None:
        self.slot_bytes = slot_bytes
        self._maps: dict[str, mmap.mmap] = {}

    def map(self, path: str) -> mmap.mmap:
        mm = self._maps.get(path)
        if mm is None:
            fd = os.open(path, os.O_RDWR)
            try:
                mm = mmap.mmap(fd, self.slot_bytes)
            finally:
                os.close(fd)
            self._maps[path] = mm
        return mm

    def write(self, path: str, cols: Mapping[str, np.ndarray]) -> Layout:
        """Pack ``cols`` into the slot at ``path``; its layout for the reader."""
        layout = items.plan_layout(cols)
        need = items.layout_bytes(layout)
        if need > self.slot_bytes:
            raise RecperfError(
                f"a batch needs {need:,} bytes, over the ring slot's {self.slot_bytes:,} "
                "(items.item_bytes() is too small a bound)"
            )
        items.copy_into(self.map(path), layout, cols)
        return layout

    def tensors(self, path: str, layout: Layout) -> dict[str, torch.Tensor]:
        """Torch tensors viewing the slot's columns (valid until the slot is reused)."""
        mm = self.map(path)
        out = {}
        for name, dt, shape, start in layout:
            count = int(np.prod(shape))
            if count == 0:
                out[name] = torch.from_numpy(np.empty(shape, np.dtype(dt)))
                continue
            t = torch.frombuffer(mm, dtype=_TORCH[np.dtype(dt)], count=count, offset=start)
            out[name] = t.view(shape)
        return out

    def close(self) -> None:
        """Drop this object's mappings. Never ``mmap.close()``: torch tensors made by
        ``frombuffer`` keep the mmap object, not a buffer export, so closing would unmap
        memory a caller's tensors still point at; each mapping goes when its last user does."""
        self._maps.clear()


_TORCH = {
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.bool_): torch.bool,
}
