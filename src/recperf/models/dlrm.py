"""The DLRM (bottom MLP, embedding bags, pairwise dot interaction, top MLP) shared by training
(``stalls``) and inference (``embed``). The embedding stage is its own module behind a small
interface, so inference can swap in other embedding-bag kernels without touching the model."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import nn

from recperf.core.config import check_range
from recperf.core.errors import ConfigError

Pooling = Literal["sum", "mean"]


@dataclass(kw_only=True, slots=True, frozen=True)
class DLRMConfig:
    """Shape of a DLRM."""

    dense_features: int = 13
    """Dense (continuous) inputs per sample (>= 1)."""
    table_rows: tuple[int, ...] = (1000,) * 8
    """Rows of each embedding table (each >= 1); ids are taken modulo the table's rows."""
    embedding_dim: int = 16
    """Width of every embedding row and of the bottom MLP's output (>= 1)."""
    bottom_mlp: tuple[int, ...] = (64,)
    """Hidden widths of the bottom MLP; a last layer of ``embedding_dim`` is added."""
    top_mlp: tuple[int, ...] = (64,)
    """Hidden widths of the top MLP; a last layer of 1 (the logit) is added."""
    pooling: Pooling = "sum"
    """How a bag's rows are combined."""

    def __post_init__(self) -> None:
        check_range("dense_features", self.dense_features, 1, None)
        check_range("embedding_dim", self.embedding_dim, 1, None)
        if not self.table_rows:
            raise ConfigError("table_rows: needs at least one table")
        for i, rows in enumerate(self.table_rows):
            if rows < 1:
                raise ConfigError(f"table_rows[{i}] = {rows}: expected >= 1")
        for name, widths in (("bottom_mlp", self.bottom_mlp), ("top_mlp", self.top_mlp)):
            if any(w < 1 for w in widths):
                raise ConfigError(f"{name} = {widths}: every width must be >= 1")
        if self.pooling not in ("sum", "mean"):
            raise ConfigError(f"pooling = {self.pooling!r}: expected 'sum' or 'mean'")

    @property
    def num_tables(self) -> int:
        return len(self.table_rows)

    @property
    def interaction_dim(self) -> int:
        """Top MLP input: the bottom output plus one dot product per pair of the T+1 vectors."""
        n = self.num_tables + 1
        return self.embedding_dim + n * (n - 1) // 2


class EmbeddingStage(Protocol):
    """Pooled embeddings of every table for a batch in KeyedJaggedTensor layout."""

    def __call__(
        self, values: torch.Tensor, lengths: torch.Tensor, per_sample_weights: torch.Tensor | None
    ) -> torch.Tensor:
        """``values``: ids of table 0's bags for all samples, then table 1's, ...; ``lengths``:
        [T * B] ids per (table, sample); returns [B, T, D]."""
        ...


class TorchEmbeddingBags(nn.Module):
    """The reference embedding stage: one ``nn.EmbeddingBag`` per table."""

    def __init__(self, table_rows: Sequence[int], dim: int, pooling: Pooling) -> None:
        super().__init__()
        self.table_rows = tuple(table_rows)
        self.bags = nn.ModuleList(nn.EmbeddingBag(r, dim, mode=pooling) for r in table_rows)

    def forward(
        self, values: torch.Tensor, lengths: torch.Tensor, per_sample_weights: torch.Tensor | None
    ) -> torch.Tensor:
        t = len(self.bags)
        if lengths.numel() % t:
            raise ConfigError(f"lengths has {lengths.numel()} entries, not a multiple of {t}")
        b = lengths.numel() // t
        per_table = lengths.view(t, b).to(torch.int64)
        counts = per_table.sum(dim=1).tolist()
        if sum(counts) != values.numel():
            raise ConfigError(f"lengths sum to {sum(counts)} but there are {values.numel()} ids")
        out = []
        start = 0
        for i, (bag, rows) in enumerate(zip(self.bags, self.table_rows, strict=True)):
            n = counts[i]
            ids = values[start : start + n].to(torch.int64) % rows
            offsets = torch.zeros(b, dtype=torch.int64, device=values.device)
            if b > 1:
                offsets[1:] = torch.cumsum(per_table[i], 0)[:-1]
            weights = None if per_sample_weights is None else per_sample_weights[start : start + n]
            out.append(bag(ids, offsets, per_sample_weights=weights))
            start += n
        return torch.stack(out, dim=1)


def mlp(widths: Sequence[int], final_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2 or final_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def dot_interaction(bottom: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
    """[B, D] and [B, T, D] -> [B, D + (T+1)T/2]: the bottom output and the dot product of
    every distinct pair of the T+1 vectors (upper triangle, no diagonal), in row-major order."""
    z = torch.cat([bottom.unsqueeze(1), pooled], dim=1)
    gram = torch.bmm(z, z.transpose(1, 2))
    n = z.shape[1]
    rows, cols = torch.triu_indices(n, n, offset=1, device=z.device)
    return torch.cat([bottom, gram[:, rows, cols]], dim=1)


class DLRM(nn.Module):
    """Logits of a click-through model: top(dot(bottom(dense), embeddings(sparse)))."""

    def __init__(self, config: DLRMConfig, embeddings: nn.Module | None = None) -> None:
        super().__init__()
        self.config = config
        c = config
        self.bottom = mlp((c.dense_features, *c.bottom_mlp, c.embedding_dim), final_relu=True)
        self.embeddings = embeddings or TorchEmbeddingBags(c.table_rows, c.embedding_dim, c.pooling)
        self.top = mlp((c.interaction_dim, *c.top_mlp, 1), final_relu=False)

    def forward(
        self,
        dense: torch.Tensor,
        values: torch.Tensor,
        lengths: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``dense`` [B, F]; ``values``/``lengths`` as in ``EmbeddingStage``; returns [B]."""
        bottom: torch.Tensor = self.bottom(dense)
        pooled: torch.Tensor = self.embeddings(values, lengths, per_sample_weights)
        logits: torch.Tensor = self.top(dot_interaction(bottom, pooled))
        return logits.squeeze(1)
