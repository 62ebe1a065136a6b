"""DLRM inference configurations (``paper``, ``mlperf``, ``small``) and the adapter that puts any
embedding kernel behind the shared DLRM's embedding stage (``recperf.models.dlrm``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.embed.kernels.base import EmbeddingKernel, Lookup, Pooling, Tables
from recperf.models.dlrm import DLRM, DLRMConfig

MLPERF_MULTI_HOT = (
    3,
    2,
    1,
    2,
    6,
    1,
    1,
    1,
    1,
    7,
    3,
    8,
    1,
    6,
    9,
    5,
    1,
    1,
    1,
    12,
    100,
    27,
    10,
    3,
    1,
    1,
)
"""Ids per bag of each of DLRMv2's 26 tables (MLPerf's multi-hot Criteo 1TB)."""
MLPERF_ROWS = (
    40_000_000,
    39_060,
    17_295,
    7_424,
    20_265,
    3,
    7_122,
    1_543,
    63,
    40_000_000,
    3_067_956,
    405_282,
    10,
    2_209,
    11_938,
    155,
    4,
    976,
    14,
    40_000_000,
    40_000_000,
    40_000_000,
    590_152,
    12_973,
    108,
    36,
)
"""Rows of DLRMv2's 26 tables (before capping)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class EmbedConfig:
    """Shape of a DLRM inference workload."""

    name: str
    """Configuration name."""
    table_rows: tuple[int, ...]
    """Rows of each table."""
    dim: int
    """Embedding width."""
    pooling_factors: tuple[int, ...]
    """Ids per bag of each table."""
    batch_size: int
    """Samples per batch."""
    bottom_mlp: tuple[int, ...] = (512, 256)
    """Hidden widths of the bottom MLP."""
    top_mlp: tuple[int, ...] = (1024, 1024, 512, 256)
    """Hidden widths of the top MLP."""
    pooling: Pooling = "sum"
    """sum or mean."""

    def __post_init__(self) -> None:
        if len(self.pooling_factors) != len(self.table_rows):
            raise ConfigError(
                f"pooling_factors: {len(self.pooling_factors)} values for "
                f"{len(self.table_rows)} tables"
            )
        check_range("dim", self.dim, 1, None)
        check_range("batch_size", self.batch_size, 1, None)
        if min(self.table_rows) < 1 or min(self.pooling_factors) < 0:
            raise ConfigError("table_rows must be >= 1 and pooling_factors >= 0")

    @property
    def num_tables(self) -> int:
        return len(self.table_rows)

    @property
    def lookups_per_batch(self) -> int:
        return self.batch_size * sum(self.pooling_factors)

    def dlrm(self) -> DLRMConfig:
        return DLRMConfig(
            dense_features=13,
            table_rows=self.table_rows,
            embedding_dim=self.dim,
            bottom_mlp=self.bottom_mlp,
            top_mlp=self.top_mlp,
            pooling=self.pooling,
        )


def config(name: str, *, rows_cap: int = 1_000_000, batch_size: int | None = None) -> EmbedConfig:
    """``paper`` (12 x 500k x 128, 150 ids per bag, batch 2048), ``mlperf`` (DLRMv2's 26 tables,
    dim 128, its multi-hot sizes, rows capped at ``rows_cap``, batch 2048), ``small`` (CPU)."""
    if name == "paper":
        cfg = EmbedConfig(
            name="paper",
            table_rows=(500_000,) * 12,
            dim=128,
            pooling_factors=(150,) * 12,
            batch_size=2048,
        )
    elif name == "mlperf":
        rows = tuple(min(r, rows_cap) for r in MLPERF_ROWS)
        cfg = EmbedConfig(
            name="mlperf",
            table_rows=rows,
            dim=128,
            pooling_factors=MLPERF_MULTI_HOT,
            batch_size=2048,
        )
    elif name == "small":
        cfg = EmbedConfig(
            name="small",
            table_rows=(20_000,) * 4,
            dim=32,
            pooling_factors=(20,) * 4,
            batch_size=256,
            bottom_mlp=(64,),
            top_mlp=(128, 64),
        )
    else:
        raise ConfigError(f"config {name!r}: expected one of paper, mlperf, small")
    if batch_size is not None:
        check_range("batch_size", batch_size, 1, None)
        return replace(cfg, batch_size=batch_size)
    return cfg


class KernelStage(nn.Module):
    """An ``EmbeddingKernel`` as the DLRM's embedding stage (KJT values/lengths in, [B, T, D]
    out)."""

    def __init__(self, kernel: EmbeddingKernel, num_tables: int) -> None:
        super().__init__()
        self.kernel = kernel
        self.num_tables = num_tables

    def forward(
        self, values: torch.Tensor, lengths: torch.Tensor, per_sample_weights: torch.Tensor | None
    ) -> torch.Tensor:
        if lengths.numel() % self.num_tables:
            raise ConfigError(f"lengths has {lengths.numel()} entries for {self.num_tables} tables")
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
        offsets[1:] = torch.cumsum(lengths.to(torch.int64), 0)
        lookup = Lookup(
            indices=values.to(torch.int64),
            offsets=offsets,
            batch_size=lengths.numel() // self.num_tables,
            per_sample_weights=per_sample_weights,
        )
        return self.kernel(lookup)


def inference_model(cfg: EmbedConfig, kernel: EmbeddingKernel | None = None) -> DLRM:
    """The shared DLRM for ``cfg``; with ``kernel``, its embedding stage is that kernel."""
    stage = None if kernel is None else KernelStage(kernel, cfg.num_tables)
    return DLRM(cfg.dlrm(), embeddings=stage).eval()


def random_tables(cfg: EmbedConfig, dtype: torch.dtype, device: str, seed: int) -> Tables:
    """Seeded tables of ``cfg``'s shape (uniform in +-1/sqrt(dim), as nn.EmbeddingBag's init
    scale)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    bound = cfg.dim**-0.5
    weights = tuple(
        ((torch.rand(rows, cfg.dim, generator=g) * 2 - 1) * bound).to(dtype=dtype, device=device)
        for rows in cfg.table_rows
    )
    return Tables(weights=weights, pooling=cfg.pooling)


def lengths_for(cfg: EmbedConfig, device: str) -> torch.Tensor:
    """Ids per (table, sample), table-major, from the configured pooling factors."""
    return torch.tensor(cfg.pooling_factors, device=device).repeat_interleave(cfg.batch_size)
