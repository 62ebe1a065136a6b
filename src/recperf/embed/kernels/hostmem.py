"""Host memory for the rows a CPU kernel copies: laid in Linux's transparent huge pages (2 MiB),
where the kernel offers them, so that gathering rows at random across hundreds of MiB misses the
TLB far less often than over 4 KiB pages. PyTorch's own allocator does this only when the process
was started with ``THP_MEM_ALLOC_ENABLE=1``; a kernel's copy does it by itself (issue 27)."""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

HUGE_PAGE = 1 << 21
"""Bytes in one x86-64 (and arm64 4K-granule) transparent huge page."""
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True, slots=True)
class CopiedRows:
    """A tensor of rows in host memory, and how it was laid out."""

    data: torch.Tensor
    huge_pages: bool
    """Whether its memory was advised into transparent huge pages (``madvise``); the kernel
    backs it with them as far as it finds free 2 MiB frames."""

    @property
    def note(self) -> str:
        """What ``describe()`` says of the layout, or "" for ordinary pages."""
        if not self.huge_pages:
            return ""
        mib = self.data.numel() * self.data.element_size() / 2**20
        return f"rows copied into transparent huge pages ({mib:.0f} MiB)"


def thp_mode(setting: Path = THP_SETTING) -> str:
    """The system's transparent-huge-page mode (``always``, ``madvise`` or ``never``; "" where
    the kernel has none, as off Linux)."""
    try:
        text = setting.read_text()
    except OSError:
        return ""
    chosen = [w for w in text.split() if w.startswith("[") and w.endswith("]")]
    return chosen[0][1:-1] if chosen else ""


def empty_rows(shape: Sequence[int], dtype: torch.dtype, *, huge_pages: bool = True) -> CopiedRows:
    """An uninitialised host tensor of ``shape``: with ``huge_pages``, and where the system's
    mode is not ``never`` and the tensor spans at least one huge page, in an anonymous private
    mapping aligned to 2 MiB and advised ``MADV_HUGEPAGE``; else from torch's allocator. The
    mapping is unmapped when the last tensor viewing it goes."""
    nbytes = math.prod(int(n) for n in shape) * dtype.itemsize
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if not huge_pages or nbytes < HUGE_PAGE or advise is None or thp_mode() in ("", "never"):
        return CopiedRows(torch.empty(tuple(shape), dtype=dtype), huge_pages=False)
    area = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        area.madvise(advise)
    except OSError:  # a kernel built without THP: ordinary pages, the same layout
        area.close()
        return CopiedRows(torch.empty(tuple(shape), dtype=dtype), huge_pages=False)
    raw = torch.frombuffer(area, dtype=torch.uint8)  # keeps ``area`` mapped while viewed
    start = -raw.data_ptr() % HUGE_PAGE
    rows = raw[start : start + nbytes].view(dtype).view(tuple(shape))
    return CopiedRows(rows, huge_pages=True)


def stacked_rows(weights: Sequence[torch.Tensor], *, huge_pages: bool = True) -> CopiedRows:
    """``weights`` (2-D, one width and dtype) stacked row-wise into one new tensor
    (``torch.cat``'s result): on the host laid out by ``empty_rows``, on a device by torch."""
    first = weights[0]
    if first.device.type != "cpu":
        return CopiedRows(torch.cat(list(weights)), huge_pages=False)
    rows = sum(int(w.shape[0]) for w in weights)
    out = empty_rows((rows, int(first.shape[1])), first.dtype, huge_pages=huge_pages)
    torch.cat(list(weights), out=out.data)
    return out
