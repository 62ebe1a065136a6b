"""``bag-list``: what a list of ``nn.EmbeddingBag`` runs, as a kernel ``auto`` can pick where it
measures faster: one ``embedding_bag`` per table over the table's own rows, where they lie (no
copy, unlike ``bag-concat``'s stacked tables)."""

from __future__ import annotations

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
    parts_of,
)
from recperf.embed.kernels.formats import FLOAT_DTYPES

TRAITS = KernelTraits(
    formats=frozenset(FLOAT_DTYPES),
    cpu=True,
    gpu=False,  # measured on a CPU only: not a GPU candidate until a device times it
    layout="tables",
    fused=False,
    peer="torch",
    parts=True,
)


@KERNELS.register("bag-list", traits=TRAITS)
class BagList:
    """One ``torch.nn.functional.embedding_bag`` per table over its float rows in place, pooled
    in the rows' dtype (fp16/bf16 as ``nn.EmbeddingBag`` pools them), stacked table-major;
    ``__call__`` returns float32 ``[B, T, D]``. Per-sample weights are cast to the rows' dtype;
    a weighted ``mean`` is the weighted sum over the bag length (as the reference)."""

    name: str

    def __init__(self, tables: Tables) -> None:
        if tables.row_format not in FLOAT_DTYPES:
            raise ConfigError(f"bag-list: reads float rows, not {tables.row_format}")
        self.name = "bag-list"
        self.tables = tables

    def __call__(self, lookup: Lookup) -> torch.Tensor:
        pooled = self.pool_lookup(lookup).transpose(0, 1)
        return pooled.to(torch.float32, memory_format=torch.contiguous_format)

    def pool_lookup(self, lookup: Lookup) -> torch.Tensor:
        """``pool_parts`` of a TBE-layout batch, cut into per-table views."""
        check_tables_match(self.tables, lookup)
        return self.pool_parts(parts_of(lookup))

    def pool_flat(self, indices: torch.Tensor, offsets: torch.Tensor, batch: int) -> torch.Tensor:
        """``pool_lookup`` of an unweighted batch the caller checked (``PartsKernel``)."""
        return self.pool_parts(parts_of(Lookup(indices=indices, offsets=offsets, batch_size=batch)))

    def pool_parts(self, parts: Parts) -> torch.Tensor:
        """``[T, B, D]`` in the rows' dtype, each table pooled as its ``nn.EmbeddingBag``."""
        t = self.tables.num_tables
        if len(parts.indices) != t:
            raise ConfigError(f"indices: {len(parts.indices)} tables' inputs, kernel {t}")
        psw = parts.per_sample_weights or (None,) * t
        return torch.stack(
            [
                self._pool(w, ids, off, p, parts.batch_size)
                for w, ids, off, p in zip(
                    self.tables.weights, parts.indices, parts.offsets, psw, strict=True
                )
            ]
        )

    def _pool(
        self,
        weight: torch.Tensor,
        ids: torch.Tensor,
        offsets: torch.Tensor,
        psw: torch.Tensor | None,
        batch: int,
    ) -> torch.Tensor:
        mean = self.tables.pooling == "mean"
        out = F.embedding_bag(
            ids,
            weight,
            offsets,
            mode="mean" if mean and psw is None else "sum",
            per_sample_weights=None if psw is None else psw.to(weight.dtype),
            include_last_offset=int(offsets.shape[0]) == batch + 1,
        )
        if mean and psw is not None:  # the weighted sum over the bag's length
            ends = torch.cat([offsets[1 : batch + 1], offsets.new_tensor([ids.shape[0]])])
            lengths = (ends[:batch] - offsets[:batch]).clamp(min=1)
            out = out / lengths.to(out.dtype)[:, None]
        return out
