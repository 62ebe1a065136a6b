"""``bag-concat``: one ``embedding_bag`` over the float tables stacked row-wise (the fastest float
peer on a CPU in issue 18), as a kernel ``auto`` can pick. Each table's ids are shifted by its
first row on the way into one new id buffer: per-table inputs by ``shifted_ids`` (on a CPU one
numpy add a table, reading each id once and writing it once), a TBE-layout batch on a CPU by one
numpy add of a per-id shift kept while the tables' id counts repeat."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from recperf.core.errors import ConfigError
from recperf.embed.kernels.base import (
    KERNELS,
    KernelTraits,
    Lookup,
    Parts,
    Tables,
    check_tables_match,
    tbe_offsets,
)
from recperf.embed.kernels.formats import FLOAT_DTYPES
from recperf.embed.kernels.hostmem import stacked_rows

BAG_FORMATS = frozenset(FLOAT_DTYPES)


def shifted_ids(
    ids: Sequence[torch.Tensor],
    first: Sequence[int],
    offsets: Sequence[torch.Tensor] | None = None,
    batch: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The tables' ids concatenated (int64), table t's shifted by ``first[t]``; with
    ``offsets`` (each table's bag starts into its own ids, ``batch`` of them or one more) also
    the TBE offsets ``[T * batch + 1]`` into the result, the last its length. On a CPU
    ``numpy_shift``, elsewhere ``torch_shift``."""
    shift = numpy_shift if ids[0].device.type == "cpu" else torch_shift
    return shift(ids, first, offsets, batch)


def numpy_shift(
    ids: Sequence[torch.Tensor],
    first: Sequence[int],
    offsets: Sequence[torch.Tensor] | None,
    batch: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``shifted_ids`` on a CPU: the ids by one numpy add a table into one new buffer, so each
    is read once and written once (a ``cat`` then an in-place add of a per-id shift reads them
    three times, and torch's int64 add multiplies by its ``alpha`` element by element: 55 us
    on ``mlperf``'s 110k ids against numpy's 19 us, hot in cache; issue 27); the offsets by
    ``tbe_offsets``, a few dispatches whatever the tables (on ``mlperf``'s 26 tables, between
    pooling calls, 79 us a call, as long as one numpy add a table took)."""
    sizes = [int(x.shape[0]) for x in ids]
    out = torch.empty(sum(sizes), dtype=torch.int64)
    to, pos = out.numpy(), 0
    for x, f, m in zip(ids, first, sizes, strict=True):
        np.add(x.numpy(), f, out=to[pos : pos + m])
        pos += m
    return out, None if offsets is None else tbe_offsets(offsets, sizes, batch)


def torch_shift(
    ids: Sequence[torch.Tensor],
    first: Sequence[int],
    offsets: Sequence[torch.Tensor] | None,
    batch: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``shifted_ids`` on any device: a ``cat``, one ``_foreach_add_`` of the tables' first
    rows, and ``tbe_offsets``."""
    sizes = [int(x.shape[0]) for x in ids]
    out = torch.cat([x.long() for x in ids])
    torch._foreach_add_(list(torch.split(out, sizes))[1:], list(first[1:]))
    return out, None if offsets is None else tbe_offsets(offsets, sizes, batch)


@dataclass(kw_only=True, slots=True, frozen=True)
class BagConcatConfig:
    """Options of ``bag-concat``."""

    huge_pages: bool = True
    """Lay the stacked copy of the rows in transparent huge pages where Linux offers them
    (``hostmem.empty_rows``). On ``paper``'s bf16 rows (176 MiB, reuse trace, batch 64, 1
    thread) the concat peer over such a copy ran 6-12% faster than over torch's 4 KiB pages."""

    def __post_init__(self) -> None:
        if not isinstance(self.huge_pages, bool):
            raise ConfigError(f"huge_pages: expected true or false, got {self.huge_pages!r}")


@KERNELS.register(
    "bag-concat",
    config=BagConcatConfig,
    traits=KernelTraits(formats=BAG_FORMATS, cpu=True, layout="combined", peer="torch", parts=True),
)
class BagConcat:
    """One ``torch.nn.functional.embedding_bag`` over the float tables stacked row-wise (a copy
    of the rows, made once here), each table's ids shifted by its first row; pooled in the
    rows' dtype (fp16/bf16 rows as ``nn.EmbeddingBag`` pools them, accumulating in float32),
    returned as float32 (for float32 rows a transposed view of the table-major output, not
    contiguous). Per-sample weights are cast to the rows' dtype, as torch requires;
    a weighted ``mean`` is the weighted sum divided by the bag length (as the reference).
    ``pool_parts`` (its ``parts`` trait) pools the per-table inputs a list of
    ``nn.EmbeddingBag`` takes into their dtype, as the drop-in calls it. The copy costs the
    float tables' bytes once more (352 MiB for ``paper`` capped at 60,000 rows in fp32); on the
    host it lies in transparent huge pages (``config.huge_pages``)."""

    name: str

    def __init__(self, tables: Tables, *, config: BagConcatConfig | None = None) -> None:
        if tables.row_format not in BAG_FORMATS:
            raise ConfigError(f"bag-concat: reads float rows, not {tables.row_format}")
        self.name = "bag-concat"
        self.tables = tables
        self.layout_note = ""
        if tables.num_tables > 1:  # a subclass registered on its own gets the defaults
            huge = (config or BagConcatConfig()).huge_pages
            stacked = stacked_rows(tables.weights, huge_pages=huge)
            self._weight, self.layout_note = stacked.data, stacked.note
        else:
            self._weight = tables.weights[0]
        self._first = [0, *itertools.accumulate(tables.rows)][:-1]
        self._shift: tuple[tuple[int, ...], np.ndarray] = ((), np.empty(0, dtype=np.int64))

    def __call__(self, lookup: Lookup) -> torch.Tensor:
        # [B, T, D] as a view of the table-major bags (float32 rows: no copy; measured ~10% of
        # the call at mlperf's batch 512); fp16/bf16 rows cast to float32 in one strided pass.
        pooled = self.pool_lookup(lookup).transpose(0, 1)
        if pooled.dtype != torch.float32:
            pooled = pooled.to(torch.float32, memory_format=torch.contiguous_format)
        return pooled

    def pool_lookup(self, lookup: Lookup) -> torch.Tensor:
        """``[T, B, D]`` in the rows' dtype: the concatenated ids shifted by their tables' first
        rows (``shifted_ids``), one ``embedding_bag``."""
        check_tables_match(self.tables, lookup)
        ids = self._shifted(lookup.indices, lookup.offsets, lookup.batch_size)
        return self._pool(ids, lookup.offsets, lookup.per_sample_weights, lookup.batch_size)

    def pool_flat(self, indices: torch.Tensor, offsets: torch.Tensor, batch: int) -> torch.Tensor:
        """``pool_lookup`` of an unweighted batch the caller checked (``PartsKernel``)."""
        return self._pool(self._shifted(indices, offsets, batch), offsets, None, batch)

    def _shifted(self, ids: torch.Tensor, offsets: torch.Tensor, batch: int) -> torch.Tensor:
        """A TBE-layout batch's ids, each shifted by its table's first row."""
        if self.tables.num_tables == 1:
            return ids
        starts = offsets[::batch].tolist()  # one host copy: each table's slice of the ids
        bounds = list(itertools.pairwise(starts))
        shift = self._shift_for(tuple(e - s for s, e in bounds), ids.device)
        if shift is not None:  # one add over all the ids
            return torch.from_numpy(np.add(ids.numpy(), shift))
        return shifted_ids([ids[s:e] for s, e in bounds], self._first)[0]

    def _shift_for(self, sizes: tuple[int, ...], device: torch.device) -> np.ndarray | None:
        """On a CPU, each id's shift (its table's first row) for tables of ``sizes`` ids, made
        once and kept while the sizes repeat (fixed bag sizes, as DLRM's multi-hot inputs: one
        entry, replaced whole); None elsewhere. One numpy add of it over a TBE-layout batch
        took 1.67 ms a call against 1.70 ms for one add a table (``mlperf``'s 26 bf16 tables,
        reuse trace, interleaved medians; issue 27)."""
        if device.type != "cpu":
            return None
        kept, shift = self._shift
        if kept != sizes:
            shift = np.repeat(np.asarray(self._first, dtype=np.int64), sizes)
            self._shift = (sizes, shift)
        return shift

    def pool_parts(self, parts: Parts) -> torch.Tensor:
        """``[T, B, D]`` in the rows' dtype, pooled as ``nn.EmbeddingBag`` pools each table: its
        ids shifted by its first row and its offsets by its first id, into one buffer each
        (``shifted_ids``), one ``embedding_bag``; table t's output is a contiguous view
        ``[t]``. TBE offsets with the end (``include_last_offset``): without it
        ``embedding_bag`` ran 3% slower."""
        b, t = parts.batch_size, self.tables.num_tables
        if len(parts.indices) != t:
            raise ConfigError(f"indices: {len(parts.indices)} tables' inputs, kernel {t}")
        ids, offsets = shifted_ids(parts.indices, self._first, parts.offsets, b)
        assert offsets is not None  # given offsets, shifted_ids returns them
        psw = parts.per_sample_weights
        w = None
        if psw is not None:
            dev = self._weight.device
            w = torch.cat(
                [
                    x if x is not None else torch.ones(int(i.shape[0]), device=dev)
                    for x, i in zip(psw, parts.indices, strict=True)
                ]
            )
        return self._pool(ids, offsets, w, b)

    def _pool(
        self, ids: torch.Tensor, offsets: torch.Tensor, w: torch.Tensor | None, batch: int
    ) -> torch.Tensor:
        """``[T, B, D]``: one ``embedding_bag`` over the stacked rows (``ids`` already shifted,
        ``offsets`` TBE with the end)."""
        mean = self.tables.pooling == "mean"
        out = F.embedding_bag(
            ids,
            self._weight,
            offsets,
            mode="mean" if mean and w is None else "sum",
            per_sample_weights=None if w is None else w.to(self._weight.dtype),
            include_last_offset=True,
        )
        pooled = out.view(self.tables.num_tables, batch, self.tables.dim)
        if mean and w is not None:  # the weighted sum over the bag's length, as the reference
            lengths = (offsets[1:] - offsets[:-1]).clamp(min=1).view(*pooled.shape[:2], 1)
            pooled = pooled / lengths.to(pooled.dtype)
        return pooled
