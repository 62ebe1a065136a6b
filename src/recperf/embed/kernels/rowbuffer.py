"""All tables' rows in one allocation, in their row format: what the table-batched Triton kernels
read, in table order (``triton``) or hot rows first (``hot-l2``, ``combined``).

Float and fp8 rows are one ``[Σ rows, columns]`` tensor. int8/int4 rows keep FBGEMM's codes and
float16 scale-and-bias, laid out as ``[pad][scale-bias of row N-1 ... row 0][codes of row 0 ... row
N-1]``: each row's four scale-and-bias bytes sit in a dense block just before the codes, in reverse
row order. Why not FBGEMM's own rows (the four bytes in front of each row's codes): the codes would
start 4 bytes into each row, so a row's 16-byte vector loads of codes would be misaligned, and a
128-byte int8 row would take 132 bytes and straddle cache lines. Why not a separate buffer: the
first ``h`` rows with their scale and bias would be two regions, and a stream pins one access-policy
window in L2. Reversed, the first ``h`` rows with their scale and bias are one contiguous block of
``h * row_bytes`` bytes (``window``), the codes stay aligned (rows start at a multiple of
``ALIGN`` bytes from the allocation), and eight rows' scale and bias share a 32-byte sector."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from recperf.embed.kernels.base import Tables
from recperf.embed.kernels.formats import INTEGER_FORMATS, SCALE_BIAS_BYTES

ALIGN = 128
"""Bytes the codes of int8/int4 row 0 are aligned to within the allocation (a cache line)."""


@dataclass(frozen=True, slots=True, eq=False)
class RowBuffer:
    """The rows of one or more tables in one allocation, in their row format."""

    fmt: str
    """The row format (``formats.ROW_FORMATS``)."""
    data: torch.Tensor
    """``[rows, columns]``: float rows, or fp8/int8/int4 codes (``uint8``; int4 two per byte)."""
    scale_bias: torch.Tensor
    """int8/int4: a float16 view whose first element is row 0's scale; row ``r``'s scale is at
    element ``-2 r`` and its bias at ``-2 r + 1`` (before it in memory). Other formats: ``data``
    (never read)."""
    storage: torch.Tensor
    """The whole allocation (``data`` itself for rows without scale and bias)."""
    codes_offset: int = 0
    """Elements of ``storage`` before row 0 of ``data``."""

    @property
    def rows(self) -> int:
        return int(self.data.shape[0])

    def window(self, rows: int) -> torch.Tensor:
        """The first ``rows`` rows with their scale and bias: one contiguous tensor (what an L2
        access-policy window pins), ``rows * row_bytes`` bytes. A prefix of it (a window capped
        below its size) holds all of those rows' scale and bias and the first rows' codes."""
        if self.fmt not in INTEGER_FORMATS:
            return self.data[:rows]
        start = self.codes_offset - SCALE_BIAS_BYTES * rows
        return self.storage[start : self.codes_offset + rows * int(self.data.shape[1])]


def combine(tables: Tables, order: torch.Tensor | None = None) -> RowBuffer:
    """``tables``' rows concatenated in table order, or ``order`` (int64: new position -> row of
    the concatenated tables), each row's scale and bias moved with it."""
    data = torch.cat([w.contiguous() for w in tables.weights])
    if order is not None:
        data = data[order.to(data.device)]
    data = data.contiguous()
    if tables.row_format not in INTEGER_FORMATS:
        return RowBuffer(fmt=tables.row_format, data=data, scale_bias=data, storage=data)
    assert tables.scale_bias is not None
    sb = torch.cat(list(tables.scale_bias))
    if order is not None:
        sb = sb[order.to(sb.device)]
    n, cols = int(data.shape[0]), int(data.shape[1])
    start = -(-SCALE_BIAS_BYTES * n // ALIGN) * ALIGN  # the pad, then the n scale-bias entries
    storage = torch.empty(start + n * cols, dtype=torch.uint8, device=data.device)
    storage[start - SCALE_BIAS_BYTES * n : start].view(n, SCALE_BIAS_BYTES).copy_(sb.flip(0))
    codes = storage[start:].view(n, cols)
    codes.copy_(data)
    row0 = storage[start - SCALE_BIAS_BYTES : start].view(torch.float16)
    return RowBuffer(
        fmt=tables.row_format, data=codes, scale_bias=row0, storage=storage, codes_offset=start
    )


def table_bases(tables: Tables) -> torch.Tensor:
    """Each table's first row in the tables concatenated in order (int64 [T], on the CPU)."""
    rows = torch.tensor((0, *tables.rows[:-1]), dtype=torch.int64)
    return torch.cumsum(rows, 0)
