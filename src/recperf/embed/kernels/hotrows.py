"""Hot rows first: ``HotRowRemap`` permutes the combined table buffer so the most looked-up rows
form one contiguous region at its front (small enough to pin in L2) and rewrites lookups to the
new row positions; ``HotRowCounter`` finds those rows from the lookups themselves. The ``hot-l2``
and ``combined`` kernels run the Triton kernel on the permuted buffer with the hot region pinned."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.embed.kernels.base import KERNELS, Lookup, Tables, check_tables_match
from recperf.embed.kernels.l2pin import L2Window
from recperf.embed.kernels.rowbuffer import combine, table_bases
from recperf.embed.kernels.torch_hot import check_hot_fraction
from recperf.embed.kernels.triton_tbe import (
    LAUNCH_SPACE,
    PREFETCH_SPACE,
    TRITON_TRAITS,
    TritonConfig,
    check_prefetch,
    launch_config,
    require_triton,
    tbe_forward,
)


@dataclass(kw_only=True, slots=True, frozen=True)
class HotL2Config(TritonConfig):
    """Options of ``hot-l2``: the launch fields and how the hot rows are counted."""

    hot_fraction: float = 0.1
    """Share of each table's rows kept hot when no ``hot_rows`` are given, in (0, 1]."""
    refresh: int = 100
    """Calls between re-choosing the counted hot rows (>= 1); unused with ``hot_rows``."""

    def __post_init__(self) -> None:
        TritonConfig.__post_init__(self)  # (zero-argument super() fails in slots dataclasses)
        check_hot_fraction(self.hot_fraction)
        check_range("refresh", self.refresh, 1, None)


@dataclass(kw_only=True, slots=True, frozen=True)
class CombinedConfig(HotL2Config):
    """Options of ``combined``: ``hot-l2``'s and the prefetch distance."""

    prefetch: int = 1
    """Chunks loaded ahead of the one being summed: 1 or 2."""

    def __post_init__(self) -> None:
        HotL2Config.__post_init__(self)
        check_prefetch(self.prefetch)


def split_rows(x: torch.Tensor, rows: Sequence[int]) -> list[torch.Tensor]:
    """``x`` (one entry per row of the concatenated tables) cut into per-table views."""
    starts = list(itertools.accumulate(rows, initial=0))
    return [x[a:b] for a, b in itertools.pairwise(starts)]


def global_ids(lookup: Lookup, bases: torch.Tensor) -> torch.Tensor:
    """``lookup``'s ids as rows of the concatenated tables (no host sync)."""
    per_table = lookup.offsets[:: lookup.batch_size]
    counts = per_table[1:] - per_table[:-1]
    n = lookup.indices.shape[0]
    return lookup.indices + torch.repeat_interleave(bases, counts, output_size=n)


class HotRowRemap:
    """The combined buffer with ``hot_rows`` (per table, most frequent first) moved to the front,
    the other rows after them in their original order, each in its row format with its scale and
    bias (``rowbuffer.combine``); exact by construction.

    The hot region interleaves the tables by rank (every table's hottest row, then every table's
    second, ...), so any prefix of it, such as the part an L2 window smaller than the region
    pins, holds each table's hottest rows rather than the first tables' whole hot sets."""

    def __init__(self, tables: Tables, hot_rows: Sequence[torch.Tensor]) -> None:
        if len(hot_rows) != tables.num_tables:
            raise ConfigError(f"hot_rows: {len(hot_rows)} tensors for {tables.num_tables} tables")
        self.tables = tables
        bases = table_bases(tables)
        total = sum(tables.rows)
        per_table = [_checked(h, t, tables.rows[t]) + bases[t] for t, h in enumerate(hot_rows)]
        t_count = tables.num_tables
        rank_keys = [torch.arange(h.numel()) * t_count + t for t, h in enumerate(per_table)]
        by_rank = torch.argsort(torch.cat(rank_keys), stable=True)
        hot = torch.cat(per_table)[by_rank]
        is_hot = torch.zeros(total, dtype=torch.bool)
        is_hot[hot] = True
        order = torch.cat([hot, (~is_hot).nonzero().squeeze(1)])  # new position -> old row
        remap = torch.empty(total, dtype=torch.int64)
        remap[order] = torch.arange(total)
        dev = tables.device
        self.rows = combine(tables, order)
        self.buffer = self.rows.data
        self.hot_count = int(hot.numel())
        self.hot_window = self.rows.window(self.hot_count)
        self.hot_bytes = self.hot_window.numel() * self.hot_window.element_size()
        self.remaps = tuple(r.to(dev) for r in split_rows(remap, tables.rows))
        self._remap = remap.to(dev)
        self._bases = bases.to(dev)
        self.zero_bases = torch.zeros(tables.num_tables, dtype=torch.int64, device=dev)

    @property
    def hot_region(self) -> torch.Tensor:
        """The hot rows as stored (floats or codes): ``buffer[:hot_count]``, one contiguous block;
        ``hot_window`` is that block with the rows' scale and bias, ``hot_bytes`` long (what is
        pinned)."""
        return self.buffer[: self.hot_count]

    def remap(self, lookup: Lookup) -> Lookup:
        """``lookup`` with ids as rows of ``buffer`` (so every table's row base is 0)."""
        return Lookup(
            indices=self._remap[global_ids(lookup, self._bases)],
            offsets=lookup.offsets,
            batch_size=lookup.batch_size,
            per_sample_weights=lookup.per_sample_weights,
        )


def _checked(ids: torch.Tensor, t: int, rows: int) -> torch.Tensor:
    ids = ids.detach().to("cpu", torch.int64).reshape(-1)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        raise ConfigError(f"hot_rows[{t}]: row ids must lie in 0..{rows - 1}")
    ordered = ids.sort().values
    if bool((ordered[1:] == ordered[:-1]).any()):
        raise ConfigError(f"hot_rows[{t}]: row ids must be distinct")
    return ids


class HotRowCounter:
    """Counts how often each row is looked up; ``hottest`` halves the counts after reading them,
    so the hot set follows a drifting workload."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self._bases = table_bases(tables).to(tables.device)
        self.counts = torch.zeros(sum(tables.rows), dtype=torch.int64, device=tables.device)

    def observe(self, lookup: Lookup) -> None:
        ids = global_ids(lookup, self._bases)
        self.counts.index_add_(0, ids, torch.ones_like(ids))

    def hottest(self, fraction: float) -> tuple[torch.Tensor, ...]:
        """Per table the ``fraction`` of its rows looked up most (if seen at all), most first."""
        out = []
        for counts in split_rows(self.counts, self.tables.rows):
            k = int(fraction * counts.numel())
            order = torch.sort(counts, descending=True, stable=True).indices[:k]
            out.append(order[counts[order] > 0].cpu())
        self.counts //= 2
        return tuple(out)


class HotRowKernel:
    """``hot-l2`` / ``combined``: remap, then the Triton kernel on the permuted buffer with the
    hot region pinned in L2 (on a CUDA device). The hot rows are ``hot_rows`` when given, else
    the ``config.hot_fraction`` of each table counted most often, re-chosen every
    ``config.refresh`` calls (none are hot before the first)."""

    name: str

    def __init__(
        self,
        tables: Tables,
        name: str,
        config: HotL2Config,
        hot_rows: Sequence[torch.Tensor] | None = None,
    ) -> None:
        require_triton(tables.device)
        self.name, self.tables, self.options = name, tables, config
        self.config = launch_config(config, tables.dim)
        self.hot_fraction, self.refresh = config.hot_fraction, config.refresh
        self.counter = None if hot_rows is not None else HotRowCounter(tables)
        empty = tuple(torch.empty(0, dtype=torch.int64) for _ in tables.rows)
        self.remapper = HotRowRemap(tables, empty if hot_rows is None else hot_rows)
        self.calls = 0
        self.last_window: L2Window | None = None

    def __call__(self, lookup: Lookup) -> torch.Tensor:
        check_tables_match(self.tables, lookup)
        if self.counter is not None:
            self.counter.observe(lookup)
            self.calls += 1
            if self.calls % self.refresh == 0:
                self.remapper = HotRowRemap(self.tables, self.counter.hottest(self.hot_fraction))
        r = self.remapper
        with L2Window(r.hot_window) as window:
            out = tbe_forward(
                r.rows, r.zero_bases, r.remap(lookup), self.tables.pooling, self.config
            )
        self.last_window = window
        return out


HOT_TRAITS = replace(TRITON_TRAITS, hot_rows=True, layout="hot-first", pins_l2=True)
"""Hot rows first in one buffer, that region pinned in the persisting L2."""


@KERNELS.register("hot-l2", config=HotL2Config, space=LAUNCH_SPACE, traits=HOT_TRAITS)
def make_hot_l2(
    tables: Tables, *, config: HotL2Config, hot_rows: Sequence[torch.Tensor] | None = None
) -> HotRowKernel:
    """Hot rows first and pinned in L2, pooled by the plain table-batched kernel."""
    return HotRowKernel(tables, "hot-l2", config, hot_rows)


@KERNELS.register("combined", config=CombinedConfig, space=PREFETCH_SPACE, traits=HOT_TRAITS)
def make_combined(
    tables: Tables, *, config: CombinedConfig, hot_rows: Sequence[torch.Tensor] | None = None
) -> HotRowKernel:
    """``hot-l2`` with the software-prefetching kernel (``config.prefetch`` = 1 or 2)."""
    return HotRowKernel(tables, "combined", config, hot_rows)
