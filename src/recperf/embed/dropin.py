"""``EmbeddingBags``: a drop-in ``nn.Module`` for a list of ``torch.nn.EmbeddingBag`` or a TorchRec
``EmbeddingBagCollection`` that pools with a recperf embedding kernel, chosen by name or as the
autotuner's cached winner: same weights, same inputs, same outputs (inference only)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.embed.dropin_inputs import (
    Part,
    Slot,
    TableSpec,
    check_bag,
    check_values,
    describe_ebc,
    keyed_tensor,
    kjt_inputs,
    labels,
    per_slot,
    to_lookup,
    to_part,
    values_ok,
)
from recperf.embed.kernel_choice import (
    AUTO,
    AUTOTUNE_CACHE,
    KernelChoice,
    build,
    build_choice,
    cached_winner,
    check_hot_rows,
    hot_rows_from_trace,
    takes_hot_rows,
)
from recperf.embed.kernels.base import EmbeddingKernel, Lookup, Pooling, Tables, kernels_for
from recperf.embed.traces import Trace


@dataclass(kw_only=True, slots=True, frozen=True)
class DropInConfig:
    """How an ``EmbeddingBags`` picks and feeds its kernels."""

    kernel: str = "torch"
    """A registered kernel (``torch``, ``torch-hot``, ``triton`` ...), ``package.module:attr``,
    or ``auto``: the autotuner's cached winner for this device and these tables."""
    hot_fraction: float = 0.1
    """Share of each table's rows taken as hot from a ``sample`` trace, in (0, 1]."""
    cache: Path | None = AUTOTUNE_CACHE
    """The autotune cache ``auto`` reads and ``tune`` writes (None: none)."""
    batch_size: int | None = None
    """For ``auto``: prefer winners tuned at the batch size nearest this (None: the fewest ms
    per id)."""
    trace: str | None = None
    """For ``auto``: only winners tuned on this trace (None: any)."""
    check_inputs: bool = True
    """Check offsets and ids against the tables on every call (on a GPU: host syncs)."""

    def __post_init__(self) -> None:
        if not isinstance(self.kernel, str) or not self.kernel:
            raise ConfigError(f"kernel: expected a kernel name or 'auto', got {self.kernel!r}")
        check_range("hot_fraction", self.hot_fraction, 0.0, 1.0, lo_open=True)
        if self.batch_size is not None:
            check_range("batch_size", self.batch_size, 1, None)


@dataclass(slots=True)
class _Group:
    """Slots whose tables one batched ``Tables`` can hold (same width, dtype and pooling)."""

    slots: tuple[int, ...]
    tables: Tables
    hot_rows: tuple[torch.Tensor, ...] | None
    choice: KernelChoice
    kernel: EmbeddingKernel


class EmbeddingBags(nn.Module):
    """Pools like the modules it was built from (``from_torch``, ``from_torchrec``), with one
    recperf kernel per group of tables of the same width, dtype and pooling.

    Weights are shared, not copied: the module holds the originals' weight tensors (detached)
    and each kernel builds its own layout from them once, which copies them for the kernels that
    reorder or combine rows (``torch-hot``, the Triton ones) and, for float16, the reference.
    After changing the originals in place, call ``rebuild()`` (``.to()``, ``.half()`` ... rebuild
    too). Where a kernel remaps ids to hot rows, the remap is inside it: callers pass the
    original ids."""

    def __init__(
        self,
        weights: Sequence[torch.Tensor],
        tables: Sequence[TableSpec],
        slots: Sequence[Slot],
        *,
        config: DropInConfig,
        options: Mapping[str, Any] | None = None,
        hot_rows: Sequence[torch.Tensor] | None = None,
        sample: Trace | None = None,
        torchrec: bool = False,
        weighted: bool = False,
    ) -> None:
        """Built by ``from_torch`` / ``from_torchrec`` (the tables and slots they describe)."""
        super().__init__()
        if not weights:
            raise ConfigError("tables: expected at least one embedding table")
        if config.kernel == AUTO and options:
            raise ConfigError("options: 'auto' takes its options from the autotune cache")
        if hot_rows is not None and sample is not None:
            raise ConfigError("hot_rows, sample: give the hot rows or a trace to count, not both")
        given = (hot_rows is not None or sample is not None) and config.kernel != AUTO
        if given and not takes_hot_rows(config.kernel):
            raise ConfigError(
                f"hot_rows: kernel {config.kernel!r} does not remap hot rows "
                "(torch-hot, hot-l2 and combined do)"
            )
        devices = {w.device for w in weights}
        if len(devices) > 1:
            raise ConfigError(f"tables: all on one device, got {', '.join(map(str, devices))}")
        self.config = config
        self.options = dict(options or {})
        self.torchrec = torchrec
        self.weighted = weighted
        """Built from a weighted EmbeddingBagCollection: the features' weights are read."""
        self._tables = tuple(tables)
        self._slots = tuple(slots)
        for t, w in enumerate(weights):
            self.register_buffer(f"weight{t}", w.detach(), persistent=False)
        rows = [int(w.shape[0]) for w in weights]
        self._hot: tuple[torch.Tensor, ...] | None = None
        if hot_rows is not None:
            self._hot = check_hot_rows(hot_rows, rows)
        elif sample is not None:
            self._hot = hot_rows_from_trace(sample, rows, config.hot_fraction)
        self._tuned: dict[tuple[int, str], KernelChoice] = {}
        self._groups: list[_Group] = []
        self._build()

    @classmethod
    def from_torch(
        cls,
        bags: Sequence[nn.Module] | nn.ModuleList,
        kernel: str = "torch",
        *,
        options: Mapping[str, Any] | None = None,
        hot_rows: Sequence[torch.Tensor] | None = None,
        sample: Trace | None = None,
        config: DropInConfig | None = None,
    ) -> EmbeddingBags:
        """From a list (or ``nn.ModuleList``) of bags: ``forward(indices, offsets,
        per_sample_weights)`` then takes one tensor per bag in each list and returns one pooled
        tensor per bag. ``options`` are the kernel's; ``hot_rows`` (one tensor of row ids per
        bag, hottest first) or a ``sample`` trace (one id stream per bag) feed the kernels that
        remap hot rows; ``config``'s kernel is replaced by ``kernel``."""
        if not isinstance(bags, nn.ModuleList | list | tuple):
            raise ConfigError(
                f"bags: expected a list of torch.nn.EmbeddingBag, got {type(bags).__name__}"
            )
        tables = [check_bag(b, f"bags[{i}]") for i, b in enumerate(bags)]
        slots = [Slot(f"bags[{i}]", f"bags[{i}]", i) for i in range(len(tables))]
        cfg = _with_kernel(config, kernel)
        weights = [cast(nn.EmbeddingBag, b).weight for b in bags]
        return cls(
            weights, tables, slots, config=cfg, options=options, hot_rows=hot_rows, sample=sample
        )

    @classmethod
    def from_torchrec(
        cls,
        ebc: nn.Module,
        kernel: str = "torch",
        *,
        options: Mapping[str, Any] | None = None,
        hot_rows: Sequence[torch.Tensor] | Mapping[str, torch.Tensor] | None = None,
        sample: Trace | None = None,
        config: DropInConfig | None = None,
    ) -> EmbeddingBags:
        """From a TorchRec ``EmbeddingBagCollection``: ``forward(features)`` then takes a
        ``KeyedJaggedTensor`` and returns a ``KeyedTensor`` with the EBC's keys, in its order.
        ``hot_rows`` are per table (a sequence in the EBC's table order, or by table name); a
        ``sample`` trace has one id stream per table, in that order."""
        weights, tables, slots, names = describe_ebc(ebc)
        if isinstance(hot_rows, Mapping):
            unknown = sorted(set(hot_rows) - set(names))
            if unknown:
                raise ConfigError(f"hot_rows: no table {unknown[0]!r} (tables: {', '.join(names)})")
            hot_rows = [
                torch.as_tensor(hot_rows.get(n, torch.empty(0, dtype=torch.int64))) for n in names
            ]
        return cls(
            weights,
            tables,
            slots,
            config=_with_kernel(config, kernel),
            options=options,
            hot_rows=hot_rows,
            sample=sample,
            torchrec=True,
            weighted=bool(ebc.is_weighted()),  # type: ignore[operator]
        )

    # -- building ---------------------------------------------------------------------------

    def _weights(self) -> list[torch.Tensor]:
        return [getattr(self, f"weight{t}") for t in range(len(self._tables))]

    def _build(self) -> None:
        """One kernel per group of slots with the same width, dtype and pooling."""
        weights = self._weights()
        by_kind: dict[tuple[int, torch.dtype, Pooling], list[int]] = {}
        for s, slot in enumerate(self._slots):
            w = weights[slot.table]
            by_kind.setdefault(
                (int(w.shape[1]), w.dtype, self._tables[slot.table].pooling), []
            ).append(s)
        self._groups = []
        for g, ((_, _, pooling), members) in enumerate(by_kind.items()):
            table_of = [self._slots[s].table for s in members]
            tables = Tables(weights=tuple(weights[t] for t in table_of), pooling=pooling)
            hot = None if self._hot is None else tuple(self._hot[t] for t in table_of)
            # A winner tuned here holds for this device and dtype only (not after .to()).
            choice = self._tuned.get((g, _where(tables))) or self._named(tables)
            choice, kernel = build_choice(choice, tables, hot)
            self._groups.append(_Group(tuple(members), tables, hot, choice, kernel))

    def rebuild(self) -> None:
        """Re-make every kernel's layout from the weights (after they were changed in place)."""
        self._build()

    def _named(self, tables: Tables) -> KernelChoice:
        cfg = self.config
        if cfg.kernel != AUTO:
            return KernelChoice(kernel=cfg.kernel, params=self.options)
        return cached_winner(tables, cache=cfg.cache, batch_size=cfg.batch_size, trace=cfg.trace)

    def _apply(
        self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> EmbeddingBags:
        # .to(), .cuda(), .half() ... move or cast the weights: the kernels' layouts follow.
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        self._build()
        return self

    @property
    def choices(self) -> tuple[KernelChoice, ...]:
        """Per group of tables, the kernel it runs and why (see ``describe``)."""
        return tuple(g.choice for g in self._groups)

    def describe(self) -> list[dict[str, Any]]:
        """Per group: its inputs, width, dtype, pooling, kernel, options, source and note."""
        return [
            {
                "inputs": [self._slots[s].feature for s in g.slots],
                "dim": g.tables.dim,
                "dtype": str(g.tables.dtype).removeprefix("torch."),
                "pooling": g.tables.pooling,
                "kernel": g.choice.kernel,
                "params": dict(g.choice.params),
                "source": g.choice.source,
                "note": g.choice.note,
            }
            for g in self._groups
        ]

    def extra_repr(self) -> str:
        kinds = ", ".join(
            f"{len(g.slots)} x {g.tables.dim} {g.choice.kernel}" for g in self._groups
        )
        return f"tables={len(self._tables)}, groups=[{kinds}]"

    # -- running ----------------------------------------------------------------------------

    def forward(
        self,
        indices: Any,
        offsets: Sequence[torch.Tensor | None] | None = None,
        per_sample_weights: Sequence[torch.Tensor | None] | None = None,
    ) -> Any:
        """Built from bags: ``indices`` (and ``offsets``, ``per_sample_weights`` when given) hold
        one tensor per bag, as each bag takes them; returns one pooled tensor per bag. Built
        from TorchRec: ``indices`` is the ``KeyedJaggedTensor``; returns a ``KeyedTensor``."""
        with torch.no_grad():
            parts, batch = self._parts(indices, offsets, per_sample_weights)
            pooled = self._pool(self._lookups(parts, batch))
        if self.torchrec:
            return self._keyed(pooled, batch)
        return [p.contiguous() for p in self._per_slot(pooled, dtype=True)]

    def _parts(
        self,
        indices: Any,
        offsets: Sequence[torch.Tensor | None] | None,
        per_sample_weights: Sequence[torch.Tensor | None] | None,
    ) -> tuple[list[Part], int]:
        if self.torchrec:
            if offsets is not None or per_sample_weights is not None:
                raise ConfigError(
                    "offsets: built from TorchRec, forward takes one KeyedJaggedTensor"
                )
            indices, offsets, per_sample_weights = kjt_inputs(indices, self._slots, self.weighted)
        n = len(self._slots)
        ids_list = per_slot(indices, n, "indices")
        off_list = per_slot(offsets, n, "offsets")
        psw_list = per_slot(per_sample_weights, n, "per_sample_weights")
        weights = self._weights()
        parts = [
            to_part(
                labels(i, s.feature if self.torchrec else None),
                ids_list[i],
                off_list[i],
                psw_list[i],
                weights[s.table],
                self._tables[s.table],
            )
            for i, s in enumerate(self._slots)
        ]
        batches = [p.offsets.numel() - 1 for p in parts]
        if len(set(batches)) > 1:
            bad = next(i for i, b in enumerate(batches) if b != batches[0])
            raise ConfigError(
                f"offsets[{bad}]: {batches[bad]} bags, input 0 has {batches[0]} (one batch size)"
            )
        return parts, batches[0]

    def _lookups(self, parts: list[Part], batch: int) -> list[Lookup]:
        """Per group its ``Lookup``; with ``config.check_inputs`` every value checked first (one
        host sync for them all; on a failure, the input at fault named)."""
        if not batch:
            return []
        lookups = [to_lookup([parts[s] for s in g.slots], batch) for g in self._groups]
        if not self.config.check_inputs:
            return lookups
        weights = self._weights()
        rows = [int(weights[s.table].shape[0]) for s in self._slots]
        if not bool(values_ok(parts, rows)):
            for i, (slot, part) in enumerate(zip(self._slots, parts, strict=True)):
                names = labels(i, slot.feature if self.torchrec else None)
                check_values(names, part, rows[i], self._tables[slot.table])
            raise RuntimeError("inputs: values_ok refused what check_values accepts (a bug)")
        return lookups

    def _pool(self, lookups: list[Lookup]) -> list[torch.Tensor]:
        """Per group, its slots pooled: ``[B, T_group, D]`` float32 (no lookups: no bags)."""
        if not lookups:
            return [
                torch.zeros(0, len(g.slots), g.tables.dim, device=g.tables.device)
                for g in self._groups
            ]
        return [g.kernel(lk) for g, lk in zip(self._groups, lookups, strict=True)]

    def _per_slot(self, pooled: list[torch.Tensor], dtype: bool) -> list[torch.Tensor]:
        """Each slot's ``[B, D]`` (views; in the weights' dtype with ``dtype``)."""
        out: list[torch.Tensor] = [pooled[0]] * len(self._slots)
        for g, p in zip(self._groups, pooled, strict=True):
            for j, s in enumerate(g.slots):
                out[s] = p[:, j].to(g.tables.dtype) if dtype else p[:, j]
        return out

    def _keyed(self, pooled: list[torch.Tensor], batch: int) -> Any:
        """A KeyedTensor as the EmbeddingBagCollection returns it (float32, its key order)."""
        dims = [int(self._weights()[s.table].shape[1]) for s in self._slots]
        if len(self._groups) == 1 and self._groups[0].slots == tuple(range(len(self._slots))):
            values = pooled[0].reshape(batch, sum(dims))  # already in key order: no copy
        else:
            values = torch.cat(self._per_slot(pooled, dtype=False), dim=1)
        return keyed_tensor([s.name for s in self._slots], dims, values)

    def tune(
        self,
        indices: Any,
        offsets: Sequence[torch.Tensor | None] | None = None,
        per_sample_weights: Sequence[torch.Tensor | None] | None = None,
        *,
        variants: Sequence[str] | None = None,
        reps: int = 5,
        trace: str = "dropin",
    ) -> tuple[KernelChoice, ...]:
        """Time ``variants`` (default: every kernel that reads the rows and runs natively on the
        device, ``kernels_for``) on this
        example input (what ``forward`` takes), cache the winners (``config.cache``, under
        ``trace``) and run them from now on; ``kernel="auto"`` finds them later."""
        from recperf.embed.autotune import autotune

        check_range("reps", reps, 1, None)
        parts, batch = self._parts(indices, offsets, per_sample_weights)
        if batch == 0:
            raise ConfigError("tune: the example input has no bags")
        lookups = self._lookups(parts, batch)
        for g, group in enumerate(self._groups):
            names = list(variants or self._default_variants(group.tables))
            extra = {
                v: {"hot_rows": group.hot_rows}
                for v in names
                if group.hot_rows is not None and takes_hot_rows(v)
            }
            result = autotune(
                group.tables,
                [lookups[g]],
                variants=names,
                trace=trace,
                reps=reps,
                cache=self.config.cache,
                extra=extra,
            )
            when = "when tuned (cached)" if result.cached else "on the example"
            choice = KernelChoice(
                kernel=result.kernel,
                params=result.params,
                source="autotune cache" if result.cached else "tuned",
                note=f"{result.ms:.3f} ms per batch {when}",
            )
            self._tuned[(g, _where(group.tables))] = choice
            group.choice, group.kernel = choice, build(choice, group.tables, group.hot_rows)
        return self.choices

    @staticmethod
    def _default_variants(tables: Tables) -> list[str]:
        return kernels_for(tables.row_format, tables.device.type)


def _where(tables: Tables) -> str:
    return f"{tables.device}|{tables.dtype}"


def _with_kernel(config: DropInConfig | None, kernel: str) -> DropInConfig:
    from dataclasses import replace

    return DropInConfig(kernel=kernel) if config is None else replace(config, kernel=kernel)
