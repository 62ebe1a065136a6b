"""``EmbeddingBags``: a drop-in ``nn.Module`` for a list of ``torch.nn.EmbeddingBag`` or a TorchRec
``EmbeddingBagCollection`` (float or quantized) that pools with a recperf embedding kernel, chosen
by name or as the autotuner's cached winner: same weights, same inputs, same outputs (inference
only); ``quantize`` makes one over the tables in another row format, with the error it costs."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.embed.dropin_choice import Group, make_group, measure
from recperf.embed.dropin_choice import tune as tune_group
from recperf.embed.dropin_config import (
    TRAIN_REFUSED,
    DropInConfig,
    check_devices,
    check_kernel_inputs,
    hot_from_sample,
)
from recperf.embed.dropin_inputs import (
    Part,
    Slot,
    Source,
    check_bag,
    check_rows,
    check_values,
    labels,
    per_slot,
    plain_parts,
    tbe_batch,
    to_lookup,
    to_part,
    to_parts,
    values_ok,
)
from recperf.embed.dropin_trial import TRIAL_LOCK, Trial
from recperf.embed.kernel_choice import KernelChoice, check_hot_rows
from recperf.embed.kernels.base import Lookup, PartsKernel, Pooling, Tables
from recperf.embed.kernels.formats import FLOAT_DTYPES, INTEGER_FORMATS, dim_of, format_of
from recperf.embed.traces import Trace

if TYPE_CHECKING:
    from recperf.embed.quantize import QuantizationReport

__all__ = ["DropInConfig", "EmbeddingBags"]


class EmbeddingBags(nn.Module):
    """Pools like the modules it was built from (``from_torch``, ``from_torchrec``), with one
    recperf kernel per group of tables of the same width, row format and pooling.

    Weights are shared, not copied: the module holds the originals' weight tensors (detached;
    a quantized TorchRec collection's rows, scales and biases as views into its FBGEMM buffers)
    and each kernel builds its own layout from them once, which copies them for the kernels that
    reorder or combine rows or read float32 (``torch``, ``torch-hot``, ``bag-concat``: one
    concatenated copy, the float tables' bytes once more, the Triton ones). A kernel that pools
    per-table inputs (``bag-concat``) is handed them as given and its table-major output is
    returned as views, in the rows' dtype: no TBE layout and no float32 round trip. After
    changing the originals in place, call ``rebuild()`` (``.to()``, ``.half()`` ... rebuild
    too). Where a kernel remaps ids to hot rows, the remap is inside it: callers pass the
    original ids. The module starts in eval mode; a forward in train mode with gradients on is
    refused (its outputs carry no gradient)."""

    def __init__(
        self,
        source: Source,
        *,
        config: DropInConfig,
        options: Mapping[str, Any] | None = None,
        hot_rows: Sequence[torch.Tensor] | None = None,
        sample: Trace | None = None,
    ) -> None:
        """Built by ``from_torch`` / ``from_torchrec`` (the tables and slots they describe)."""
        super().__init__()
        if not source.weights:
            raise ConfigError("tables: expected at least one embedding table")
        check_kernel_inputs(config, options, hot_rows, sample)
        check_devices(source)
        for t, spec in enumerate(source.tables):
            check_rows(spec.label, source.weights[t], spec.fmt, source.scale_bias_of(t))
        self.config = config
        self.options = dict(options or {})
        self.torchrec = source.torchrec
        self.weighted = source.weighted
        """Built from a weighted EmbeddingBagCollection: the features' weights are read."""
        self.quantization: QuantizationReport | None = None
        """What ``quantize`` measured, on the module it made (None on others)."""
        self._source = source
        self._tables = source.tables
        self._slots = source.slots
        self._slot_specs = [source.tables[s.table] for s in source.slots]
        self._by_slot: list[torch.Tensor] = []
        self._input_names = [
            labels(i, s.feature if source.torchrec else None) for i, s in enumerate(self._slots)
        ]
        """Per input, how errors name its ids, offsets and weights (made once, not per call)."""
        for t, w in enumerate(source.weights):
            self.register_buffer(f"weight{t}", w.detach(), persistent=False)
            self.register_buffer(f"scale_bias{t}", source.scale_bias_of(t), persistent=False)
        rows = [int(w.shape[0]) for w in source.weights]
        self._hot: tuple[torch.Tensor, ...] | None = None
        if hot_rows is not None:
            self._hot = check_hot_rows(hot_rows, rows)
        elif sample is not None:
            names = [spec.label for spec in source.tables]
            self._hot = hot_from_sample(sample, rows, names, config.hot_fraction)
        self._tuned: dict[tuple[int, str], KernelChoice] = {}
        self._groups: list[Group] = []
        self._trials: list[Trial] = []
        """``auto``'s first picks on trial, one group at a time (``dropin_trial``)."""
        self._dtypes: list[tuple[torch.dtype, ...]] = []
        self._in_order = False
        self._plain = False
        self._kjt_whole = False
        self._features: list[str] = []
        self._key_dims: list[int] = []
        self._key_dtype = torch.float32
        self._build()
        self.eval()

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
        """From a list (or ``nn.ModuleList``) of bags (float32, float16 or bfloat16):
        ``forward(indices, offsets, per_sample_weights)`` then takes one tensor per bag in each
        list and returns one pooled tensor per bag. ``options`` are the kernel's; ``hot_rows``
        (one tensor of row ids per bag, hottest first) or a ``sample`` trace (one id stream per
        bag, each with its bag's row count) feed the kernels that remap hot rows; ``config``'s
        kernel is replaced by ``kernel``."""
        if not isinstance(bags, nn.ModuleList | list | tuple):
            raise ConfigError(
                f"bags: expected a list of torch.nn.EmbeddingBag, got {type(bags).__name__}"
            )
        tables = tuple(check_bag(b, f"bags[{i}]") for i, b in enumerate(bags))
        source = Source(
            weights=tuple(cast(nn.EmbeddingBag, b).weight for b in bags),
            tables=tables,
            slots=tuple(Slot(f"bags[{i}]", f"bags[{i}]", i) for i in range(len(tables))),
        )
        cfg = _with_kernel(config, kernel)
        return cls(source, config=cfg, options=options, hot_rows=hot_rows, sample=sample)

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
        """From a TorchRec ``EmbeddingBagCollection`` or a quantized one
        (``torchrec.quant.EmbeddingBagCollection``: fp32, fp16, int8 and int4 tables, read in
        place): ``forward(features)`` then takes a ``KeyedJaggedTensor`` and returns a
        ``KeyedTensor`` with the collection's keys, in its order and output dtype. ``hot_rows``
        are per table (a sequence in the collection's output order, or by table name); a
        ``sample`` trace has one id stream per table, in that order."""
        from recperf.embed.dropin_torchrec import describe_ebc

        source = describe_ebc(ebc)
        if isinstance(hot_rows, Mapping):
            unknown = sorted(set(hot_rows) - set(source.names))
            if unknown:
                have = ", ".join(source.names)
                raise ConfigError(f"hot_rows: no table {unknown[0]!r} (tables: {have})")
            hot_rows = [
                torch.as_tensor(hot_rows.get(n, torch.empty(0, dtype=torch.int64)))
                for n in source.names
            ]
        cfg = _with_kernel(config, kernel)
        return cls(source, config=cfg, options=options, hot_rows=hot_rows, sample=sample)

    # -- building ---------------------------------------------------------------------------

    def _weights(self) -> list[torch.Tensor]:
        return [getattr(self, f"weight{t}") for t in range(len(self._tables))]

    def _scale_bias(self) -> list[torch.Tensor | None]:
        return [getattr(self, f"scale_bias{t}") for t in range(len(self._tables))]

    def _fmt(self, t: int, weight: torch.Tensor) -> str:
        fmt = self._tables[t].fmt or format_of(weight.dtype)
        if fmt is None:
            raise ConfigError(f"{self._tables[t].label} weight: {weight.dtype} is not a row format")
        return fmt

    def _build(self) -> None:
        """One kernel per group of slots with the same width, row format and pooling."""
        weights, sbs = self._weights(), self._scale_bias()
        self._by_slot = [weights[slot.table] for slot in self._slots]
        """Per slot its table's weights, as last built (a buffer looked up by name costs ~5 us
        a call)."""
        by_kind: dict[tuple[int, str, Pooling], list[int]] = {}
        for s, slot in enumerate(self._slots):
            w, fmt = weights[slot.table], self._fmt(slot.table, weights[slot.table])
            key = (dim_of(fmt, int(w.shape[1])), fmt, self._tables[slot.table].pooling)
            by_kind.setdefault(key, []).append(s)
        self._groups = []
        self._trials = []  # a trial's kernels were built over the tables as they were
        for g, ((_, fmt, pooling), members) in enumerate(by_kind.items()):
            table_of = [self._slots[s].table for s in members]
            tables = Tables(
                weights=tuple(weights[t] for t in table_of),
                pooling=pooling,
                fmt=fmt,
                scale_bias=tuple(cast(torch.Tensor, sbs[t]) for t in table_of)
                if fmt in INTEGER_FORMATS
                else None,
            )
            hot = None if self._hot is None else tuple(self._hot[t] for t in table_of)
            # A winner tuned here holds for this device and row format only (not after .to()).
            tuned = self._tuned.get((g, _where(tables)))
            labels = self._labels(members)
            group = make_group(
                tuple(members), tables, labels, hot, self.config, self.options, tuned
            )
            self._groups.append(group)
        self._dtypes = [tuple(self._out_dtype(s, g) for s in g.slots) for g in self._groups]
        """Per group its slots' output dtypes (one, where they share it)."""
        self._dtypes = [d[:1] if len(set(d)) == 1 else d for d in self._dtypes]
        self._in_order = len(self._groups) == 1 and len(self._dtypes[0]) == 1
        """One group holds every slot, in order, in one output dtype."""
        self._dev = self._groups[0].tables.device
        self._ends = [spec.include_last_offset for spec in self._slot_specs]
        self._plain = (
            self._in_order
            and not self.torchrec
            and self._dtypes[0][0] == self._groups[0].tables.out_dtype
        )
        """``forward`` may take the short road (``plain_parts``) when its one group's kernel
        pools per-table inputs: they come out in the slots' dtype."""
        self._kjt_whole = self.torchrec and self._in_order and not self.weighted
        """``forward`` may hand a KeyedJaggedTensor whose keys are the features in order to the
        one group's kernel as it is (``kjt_lookup``)."""
        self._features = [slot.feature for slot in self._slots]
        dims = [0] * len(self._slots)
        for grp in self._groups:
            for s in grp.slots:
                dims[s] = grp.tables.dim
        self._key_dims = dims
        """Each slot's width, in slot order (the ``KeyedTensor``'s ``length_per_key``)."""
        self._key_dtype = self._out_dtype(0, next(x for x in self._groups if 0 in x.slots))
        """The dtype the collection returns (its ``output_dtype``)."""

    def _labels(self, slots: Sequence[int]) -> str:
        return ", ".join(dict.fromkeys(self._tables[self._slots[s].table].label for s in slots))

    def rebuild(self) -> None:
        """Re-make every kernel's layout from the weights (after they were changed in place)."""
        self._build()

    def _apply(
        self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> EmbeddingBags:
        # .to(), .cuda(), .half() ... move or cast the weights: the kernels' layouts follow.
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        self._build()
        return self

    @property
    def on_trial(self) -> bool:
        """Whether ``auto``'s first pick is still being confirmed on the next forwards
        (``DropInConfig.confirm``)."""
        return bool(self._trials)

    @property
    def choices(self) -> tuple[KernelChoice, ...]:
        """Per group of tables, the kernel it runs and why (see ``describe``)."""
        return tuple(g.choice for g in self._groups)

    def describe(self) -> list[dict[str, Any]]:
        """Per group: its inputs, width, dtype, row format, pooling, kernel, options, source and
        note (a kernel on trial says so first)."""
        trials = {t.group: t.status() for t in self._trials}
        return [
            {
                "inputs": [self._slots[s].feature for s in g.slots],
                "dim": g.tables.dim,
                "dtype": str(g.tables.dtype).removeprefix("torch."),
                "row_format": g.tables.row_format,
                "pooling": g.tables.pooling,
                "kernel": g.choice.kernel,
                "params": dict(g.choice.params),
                "source": g.choice.source,
                "note": "; ".join(
                    n for n in (trials.get(i, ""), g.choice.note, layout_note(g.kernel)) if n
                ),
            }
            for i, g in enumerate(self._groups)
        ]

    def extra_repr(self) -> str:
        kinds = ", ".join(
            f"{len(g.slots)} x {g.tables.dim} {g.tables.row_format} {g.choice.kernel}"
            for g in self._groups
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
        one tensor per bag, as each bag takes them, or one tensor each in the TBE layout (see
        ``_forward_flat``); returns one pooled tensor per bag. Built from TorchRec: ``indices``
        is the ``KeyedJaggedTensor``, or one tensor in the TBE layout (the collection's
        features in order, as FBGEMM's module takes them, with ``offsets`` and
        ``per_sample_weights`` one tensor each), taken as that ``KeyedJaggedTensor``; returns
        a ``KeyedTensor``."""
        if self.training and torch.is_grad_enabled():
            raise ConfigError(TRAIN_REFUSED)
        if self._trials:  # auto's first pick on trial against close rivals (dropin_trial)
            return self._trial_forward(indices, offsets, per_sample_weights)
        if type(indices) is torch.Tensor and per_sample_weights is None:
            out = self._short(indices, offsets)
            if out is not None:
                return out
        return self._forward(indices, offsets, per_sample_weights)

    def _short(self, indices: torch.Tensor, offsets: Any) -> Any:
        """An unweighted TBE-layout batch on the short road, or None where it does not take it
        (the long road then checks the batch and says what is wrong): one group holds every
        input in order, its kernel settled (no measuring, no debug checks), the batch's ids and
        offsets 1-D int64 on the tables' device, ``n`` x B + 1 offsets. No checks are repeated
        and no ``KeyedJaggedTensor`` is made on the way: on ``mlperf``'s 26 fp16 tables the
        long road cost 44 us a call more than the concat peer (interleaved medians between
        pooling calls; issue 27). Measured with the caches flushed before each call (batch 8),
        the short road's own Python costs 3 us, the ``unbind`` into 26 outputs 27 us and a
        ``no_grad`` context 10 us, entered only where gradients are on."""
        group = self._groups[0]
        if not self._in_order or group.pending or self.config.debug:
            return None
        if type(offsets) is not torch.Tensor or offsets.dim() != 1 or indices.dim() != 1:
            return None
        if indices.dtype != torch.int64 or offsets.dtype != torch.int64:
            return None
        if indices.device != self._dev or offsets.device != self._dev:
            return None
        batch, rest = divmod(int(offsets.shape[0]) - 1, len(self._slots))
        if rest or batch < 1 or (self.torchrec and not self._kjt_whole):
            return None
        if group.parts and not self.torchrec and not self._plain:
            return None
        if torch.is_grad_enabled():
            with torch.no_grad():
                return self._short_pool(group, indices, offsets, batch)
        return self._short_pool(group, indices, offsets, batch)

    def _short_pool(
        self, group: Group, indices: torch.Tensor, offsets: torch.Tensor, batch: int
    ) -> Any:
        """``_short``'s pooling: a kernel that pools parts takes the batch whole
        (``pool_flat``), its table-major output returned as views; any other its
        ``Lookup``."""
        if self.torchrec:
            lookup = Lookup(indices=indices, offsets=offsets, batch_size=batch)
            return self._keyed([group.kernel(lookup)], batch, table_major=False)
        if not group.parts:
            lookup = Lookup(indices=indices, offsets=offsets, batch_size=batch)
            return self._outputs([group.kernel(lookup)])
        kernel = cast(PartsKernel, group.kernel)
        return list(kernel.pool_flat(indices, offsets, batch).unbind(0))

    def _trial_forward(self, indices: Any, offsets: Any, per_sample_weights: Any) -> Any:
        """One forward of a trial, with the kernel whose turn it is, on the road it runs once
        chosen (a TBE-layout batch on the short road); the verdict runs once the trial is
        done."""

        def call() -> Any:
            return self._forward(indices, offsets, per_sample_weights)

        with TRIAL_LOCK:
            if not self._trials:  # another thread's forward ended the trial
                return call()
            trial = self._trials[0]
            group = self._groups[trial.group]
            out = trial.time(group, call)
            if trial.done:
                self._trials.pop(0)
                self._tuned[(trial.group, _where(group.tables))] = trial.finish(group, self.config)
        return out

    def _forward(
        self,
        indices: Any,
        offsets: Sequence[torch.Tensor | None] | None,
        per_sample_weights: Sequence[torch.Tensor | None] | None,
    ) -> Any:
        if isinstance(indices, torch.Tensor) and self.torchrec:  # the TBE layout, as a KJT
            from recperf.embed.dropin_torchrec import tbe_kjt

            tbe = tbe_batch(len(self._slots), indices, offsets, per_sample_weights)
            return self._forward(tbe_kjt(tbe, self._features), None, None)
        if isinstance(indices, torch.Tensor):
            return self._forward_flat(indices, offsets, per_sample_weights)
        group = self._groups[0]
        if self._kjt_whole and not group.pending and offsets is None and not self.config.debug:
            from recperf.embed.dropin_torchrec import kjt_lookup

            lookup = kjt_lookup(indices, self._features, self._dev)
            if lookup is not None:  # the KJT is one TBE-layout batch: no cutting, no concat
                with torch.no_grad():
                    pooled = [group.kernel(lookup)]  # [B, T, D]
                return self._keyed(pooled, lookup.batch_size, table_major=False)
        if (self._plain and group.parts and not group.pending and per_sample_weights is None
                and not self.config.debug):  # fmt: skip
            plain = plain_parts(indices, offsets, self._ends, self._dev)
            if plain is not None:  # the common case in a few checks, no TBE layout, no casts
                with torch.no_grad():
                    return list(cast(PartsKernel, group.kernel).pool_parts(plain).unbind(0))
        with torch.no_grad():
            parts, batch = self._parts(indices, offsets, per_sample_weights)
            if batch and self.config.debug:
                self._check_values(parts)
            if batch and any(g.pending for g in self._groups):
                self._measure(parts, batch)
            pooled = self._pool(parts, batch)
        if self.torchrec:
            return self._keyed(pooled, batch)
        return self._outputs(pooled)

    def _forward_flat(self, indices: torch.Tensor, offsets: Any, weights: Any) -> Any:
        """The inputs in FBGEMM's TBE layout, as a pipeline that concatenates them delivers
        them: ``indices`` every input's ids (input 0's bags for all B samples, then input
        1's, ...), ``offsets`` int64 ``[n_inputs * B + 1]`` bag starts into it (the last, its
        length), ``per_sample_weights`` float32 like ``indices`` or None. Settled, one kernel
        pooling them all takes them as they are (``_short``, which ``forward`` tries first);
        here the first forward measures, and a batch the short road does not take is cut
        into per-input views (or refused, saying why)."""
        lookup = tbe_batch(len(self._slots), indices, offsets, weights)
        group = self._groups[0]
        same = indices.device == offsets.device == self._dev
        # one kernel takes the batch as it is (no cut per input)
        whole = self._in_order and weights is None and not self.config.debug and same
        if whole and group.pending:  # time the kernels on the roads this input takes
            with torch.no_grad():
                parts, batch = self._parts(*self._cut(lookup)[:2], None)
                if batch:
                    self._measure(parts, batch, flat=True)
        if whole:  # measured (or a trial's forward): the batch as it is, no cut
            out = self._short(indices, offsets)
            if out is not None:
                return out
        ids, offs, starts = self._cut(lookup)
        psw = None if weights is None else [weights[s:e] for s, e in itertools.pairwise(starts)]
        return self._forward(ids, offs, psw)

    def _cut(self, lookup: Lookup) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
        """A TBE-layout batch as each input's ids and offsets (views; ends where its bag has
        one), and where each input's ids start."""
        b, offsets = lookup.batch_size, lookup.offsets
        starts = offsets[::b].tolist()
        ids = [lookup.indices[s:e] for s, e in itertools.pairwise(starts)]
        offs = [offsets[i * b : (i + 1) * b + end] - starts[i] for i, end in enumerate(self._ends)]
        return ids, offs, starts

    def _outputs(self, pooled: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each slot's contiguous ``[B, D]`` in its output dtype: views of its group's
        table-major ``[T, B, D]``, made (one transposed copy, where the kernel's is batch-major)
        and cast (where its dtype is not the slots') in one op a group, not one a slot."""
        if self._in_order and pooled[0].dtype == self._dtypes[0][0] and self._groups[0].parts:
            return list(pooled[0].unbind(0))  # one group of every slot, pooled as returned
        out: list[torch.Tensor] = [pooled[0]] * len(self._slots)
        for g, p, dtypes in zip(self._groups, pooled, self._dtypes, strict=True):
            major = p if g.parts else p.transpose(0, 1)
            if len(dtypes) == 1:
                per_slot = major.to(dtypes[0]).contiguous().unbind(0)
            else:
                per_slot = tuple(m.to(dt).contiguous() for m, dt in zip(major, dtypes, strict=True))
            for s, x in zip(g.slots, per_slot, strict=True):
                out[s] = x
        return out

    def _parts(
        self,
        indices: Any,
        offsets: Sequence[torch.Tensor | None] | None,
        per_sample_weights: Sequence[torch.Tensor | None] | None,
    ) -> tuple[list[Part], int]:
        if self.torchrec:
            from recperf.embed.dropin_torchrec import kjt_inputs

            if offsets is not None or per_sample_weights is not None:
                raise ConfigError(
                    "offsets: built from TorchRec, forward takes one KeyedJaggedTensor"
                )
            indices, offsets, per_sample_weights = kjt_inputs(indices, self._slots, self.weighted)
        n = len(self._slots)
        ids_list = per_slot(indices, n, "indices")
        off_list = per_slot(offsets, n, "offsets")
        psw_list = per_slot(per_sample_weights, n, "per_sample_weights")
        parts = [
            to_part(self._input_names[i], ids_list[i], off_list[i], psw_list[i], w, spec)
            for i, (w, spec) in enumerate(zip(self._by_slot, self._slot_specs, strict=True))
        ]
        batches = [p.batch for p in parts]
        if len(set(batches)) > 1:
            bad = next(i for i, b in enumerate(batches) if b != batches[0])
            raise ConfigError(
                f"offsets[{bad}]: {batches[bad]} bags, input 0 has {batches[0]} (one batch size)"
            )
        return parts, batches[0]

    def _check_values(self, parts: list[Part]) -> None:
        """``config.debug``: every offset and id checked (one host sync for them all; on a
        failure, the input at fault named)."""
        weights = self._weights()
        rows = [int(weights[s.table].shape[0]) for s in self._slots]
        if not bool(values_ok(parts, rows)):
            for i, (slot, part) in enumerate(zip(self._slots, parts, strict=True)):
                names = self._input_names[i]
                check_values(names, part, rows[i], self._tables[slot.table])
            raise RuntimeError("inputs: values_ok refused what check_values accepts (a bug)")

    def _measure(self, parts: list[Part], batch: int, flat: bool = False) -> None:
        """``auto`` without a cached winner: each pending group timed on this batch (``flat``:
        it came in the TBE layout, and its one group takes it as it is)."""
        for g, group in enumerate(self._groups):
            if group.pending:
                lookup = to_lookup([parts[s] for s in group.slots], batch)
                given = to_parts(parts, group.slots, batch)
                dtypes = self._dtypes[g]
                dtype = dtypes[0] if len(dtypes) == 1 else None
                roads = measure(group, lookup, self.config, given, dtype, flat=flat)
                self._tuned[(g, _where(group.tables))] = group.choice
                trial = Trial.of(g, roads, self.config.confirm)
                if trial is not None:
                    self._trials.append(trial)

    def _pool(self, parts: list[Part], batch: int) -> list[torch.Tensor]:
        """Per group, its slots pooled: ``[T_group, B, D]`` in the rows' dtype where its kernel
        pools per-table inputs (``g.parts``), else ``[B, T_group, D]`` float32 from the TBE
        ``Lookup`` (no bags: zeros)."""
        out = []
        for g in self._groups:
            if not batch:
                shape = (len(g.slots), 0) if g.parts else (0, len(g.slots))
                out.append(torch.zeros(*shape, g.tables.dim, device=g.tables.device))
            elif g.parts:
                out.append(cast(PartsKernel, g.kernel).pool_parts(to_parts(parts, g.slots, batch)))
            else:
                out.append(g.kernel(to_lookup([parts[s] for s in g.slots], batch)))
        return out

    def _out_dtype(self, s: int, group: Group) -> torch.dtype:
        return self._tables[self._slots[s].table].out_dtype or group.tables.out_dtype

    def _per_slot(self, pooled: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each slot's ``[B, D]`` as its kernel pooled it (views)."""
        out: list[torch.Tensor] = [pooled[0]] * len(self._slots)
        for g, p in zip(self._groups, pooled, strict=True):
            for j, s in enumerate(g.slots):
                out[s] = p[j] if g.parts else p[:, j]
        return out

    def _keyed(self, pooled: list[torch.Tensor], batch: int, table_major: bool = True) -> Any:
        """A KeyedTensor as the collection returns it (its key order and output dtype);
        ``pooled`` per group as ``_pool`` gives it, or (``table_major`` off) one group's
        ``[B, T, D]`` whatever its kernel."""
        from recperf.embed.dropin_torchrec import keyed_tensor

        dims = self._key_dims
        one = self._groups[0]
        in_order = len(self._groups) == 1 and one.slots == tuple(range(len(self._slots)))
        if in_order and (not one.parts or not table_major):
            values = pooled[0].reshape(batch, sum(dims))  # already in key order: no copy
        else:
            values = torch.cat(self._per_slot(pooled), dim=1)
        return keyed_tensor([s.name for s in self._slots], dims, values.to(self._key_dtype))

    # -- tuning and quantizing ----------------------------------------------------------------

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
        device, ``kernels_for``, less those that remap hot rows when there are none) on this
        example input (what ``forward`` takes), cache the winners (``config.cache``, under
        ``trace``) and run them from now on; ``kernel="auto"`` finds them later."""
        check_range("reps", reps, 1, None)
        parts, batch = self._parts(indices, offsets, per_sample_weights)
        if batch == 0:
            raise ConfigError("tune: the example input has no bags")
        if self.config.debug:
            self._check_values(parts)
        lookups = [to_lookup([parts[s] for s in g.slots], batch) for g in self._groups]
        for g, group in enumerate(self._groups):
            tune_group(group, lookups[g], self.config, variants=variants, reps=reps, trace=trace)
            self._tuned[(g, _where(group.tables))] = group.choice
        return self.choices

    def quantize(
        self,
        dtype: str,
        *,
        kernel: str | None = None,
        trace: str | Trace | None = None,
        bags: int | None = None,
        pooling_factor: int | Sequence[int] | None = None,
        seed: int = 0,
    ) -> EmbeddingBags:
        """A new module over this one's float tables in row format ``dtype`` (``fp16``,
        ``bf16``, ``fp8``, ``int8`` or ``int4``: ``formats.quantize``), returning what this one
        returns (outputs in the original dtype), with the same slots, hot rows and kernel
        (or ``kernel``). Its ``quantization`` is the error report: per table the relative error
        of pooled outputs against these float rows on ``trace`` (default the bundled one;
        ``bags`` bags of ``pooling_factor`` ids). All or nothing: a table that cannot be
        converted is one ConfigError naming it and the field; this module is never changed."""
        from recperf.embed import quantize as q

        weights = self._weights()
        for t, w in enumerate(weights):
            if (fmt := self._fmt(t, w)) not in FLOAT_DTYPES:
                label = self._tables[t].label
                raise ConfigError(f"{label}: already {fmt} rows; quantize converts float tables")
        quantized, report = q.quantize_with_report(
            weights,
            dtype,
            [spec.label for spec in self._tables],
            trace=q.DEFAULT_TRACE if trace is None else trace,
            bags=q.DEFAULT_BAGS if bags is None else bags,
            pooling_factor=q.DEFAULT_POOLING_FACTOR if pooling_factor is None else pooling_factor,
            seed=seed,
        )
        tables = tuple(
            replace(
                spec,
                fmt=None if table.fmt in FLOAT_DTYPES else table.fmt,
                out_dtype=spec.out_dtype or w.dtype,
            )
            for spec, table, w in zip(self._tables, quantized, weights, strict=True)
        )
        source = replace(
            self._source,
            weights=tuple(table.weight for table in quantized),
            tables=tables,
            scale_bias=tuple(table.scale_bias for table in quantized),
        )
        config = self.config if kernel is None else replace(self.config, kernel=kernel)
        options = self.options if kernel is None else None
        out = EmbeddingBags(source, config=config, options=options, hot_rows=self._hot)
        out.quantization = report
        return out


def layout_note(kernel: object) -> str:
    """What a kernel says of the rows' layout it reads (padded int rows), or ""."""
    return str(getattr(kernel, "layout_note", ""))


def _where(tables: Tables) -> str:
    return f"{tables.device}|{tables.row_format}"


def _with_kernel(config: DropInConfig | None, kernel: str) -> DropInConfig:
    return DropInConfig(kernel=kernel) if config is None else replace(config, kernel=kernel)
