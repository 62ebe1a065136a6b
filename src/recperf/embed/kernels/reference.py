"""The reference kernel ``torch``: ``torch.nn.functional.embedding_bag`` table by table, in float32.

Pooling definitions every kernel follows: ``sum`` = Σ w_i·row_i and ``mean`` = Σ w_i·row_i / len
(w_i = 1 without per-sample weights; torch's own ``mean`` takes no weights, so a weighted mean is
the weighted sum divided by the bag length here); an empty bag pools to zeros."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from recperf.embed.kernels.base import KERNELS, KernelTraits, Lookup, Tables, check_tables_match
from recperf.embed.kernels.formats import ROW_FORMATS

TRAITS = KernelTraits(
    formats=frozenset(ROW_FORMATS), cpu=True, layout="tables", fused=False, reads_fp32=True
)


@KERNELS.register("torch", traits=TRAITS)
class TorchReference:
    """One ``embedding_bag`` per table over the float32 weights (float32 rows read in place;
    every other row format dequantized into a copy, made once); it takes no options."""

    name: str

    def __init__(self, tables: Tables) -> None:
        self.name = "torch"
        self.tables = tables
        self._weights = tuple(tables.dequantized(t) for t in range(tables.num_tables))

    def __call__(self, lookup: Lookup) -> torch.Tensor:
        check_tables_match(self.tables, lookup)
        b = lookup.batch_size
        # One host copy of the bag boundaries to slice each table's ids (a reference, not fast).
        starts = lookup.offsets[::b].tolist()
        pooled = [
            self._table(t, lookup, starts[t], starts[t + 1]) for t in range(self.tables.num_tables)
        ]
        return torch.stack(pooled, dim=1)

    def _table(self, t: int, lookup: Lookup, start: int, end: int) -> torch.Tensor:
        b = lookup.batch_size
        ids = lookup.indices[start:end]
        offsets = lookup.offsets[t * b : (t + 1) * b + 1] - start
        psw = lookup.per_sample_weights
        w = None if psw is None else psw[start:end]
        # torch pools a weighted bag only with mode="sum": divide by the length ourselves.
        mode = "mean" if self.tables.pooling == "mean" and w is None else "sum"
        out = F.embedding_bag(
            ids,
            self._weights[t],
            offsets,
            mode=mode,
            per_sample_weights=w,
            include_last_offset=True,
        )
        if self.tables.pooling == "mean" and w is not None:
            lengths = (offsets[1:] - offsets[:-1]).clamp(min=1).to(out.dtype)
            out = out / lengths[:, None]
        return out
