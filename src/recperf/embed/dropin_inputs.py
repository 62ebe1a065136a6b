"""What a drop-in ``EmbeddingBags`` takes in and gives back: the checks that a torch module pools
as a recperf kernel can and that a table's rows are what their row format says (naming the
table), and each input (as ``torch.nn.EmbeddingBag`` or a TorchRec ``KeyedJaggedTensor`` carries
it) turned into the TBE layout of one ``Lookup``, checked as the original module checks it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from recperf.core.errors import ConfigError
from recperf.embed.kernels.base import DTYPES, Lookup, Parts, Pooling, Tables, tbe_offsets
from recperf.embed.kernels.formats import INTEGER_FORMATS


@dataclass(frozen=True, slots=True)
class TableSpec:
    """What the drop-in needs to know of one table besides its weights."""

    label: str
    """How errors name it: ``bags[2]`` or ``table 't1'``."""
    pooling: Pooling
    """sum or mean."""
    include_last_offset: bool
    """Whether its offsets carry the end of the last bag (B + 1 of them), as the bag's flag."""
    fmt: str | None = None
    """Its row format when the weights are codes (fp8, int8, int4: ``uint8``); None: float rows,
    whose format is the weights' dtype (and follows ``.half()``)."""
    out_dtype: torch.dtype | None = None
    """The dtype its pooled output is returned in; None: the weights' own (as
    ``nn.EmbeddingBag``)."""
    weighted_mean: bool = False
    """Takes per-sample weights with mean pooling (FBGEMM's TBE does: the weighted sum over the
    bag's length); ``nn.EmbeddingBag`` takes them with sum only."""


@dataclass(frozen=True, slots=True)
class Source:
    """What a drop-in module is built over: the tables' rows and the inputs pooled from them."""

    weights: tuple[torch.Tensor, ...]
    """Per table its weights (float rows, or the codes of fp8/int8/int4 ones), shared."""
    tables: tuple[TableSpec, ...]
    """Per table what the module needs besides its weights."""
    slots: tuple[Slot, ...]
    """The inputs, in output order."""
    scale_bias: tuple[torch.Tensor | None, ...] = field(default=())
    """Per table its ``uint8 [rows, 4]`` scale and bias (int8/int4 rows), else None; () for
    none at all."""
    torchrec: bool = False
    """Built from a TorchRec collection: takes a KeyedJaggedTensor, returns a KeyedTensor."""
    weighted: bool = False
    """A weighted TorchRec collection: the features' weights are read."""
    names: tuple[str, ...] = ()
    """TorchRec: the tables' names (``hot_rows`` may be given by name)."""

    def scale_bias_of(self, t: int) -> torch.Tensor | None:
        return self.scale_bias[t] if self.scale_bias else None


@dataclass(frozen=True, slots=True)
class Slot:
    """One input pooled from one table: a bag (torch) or a feature (TorchRec)."""

    name: str
    """Its output key (TorchRec's embedding name) or ``bags[i]``."""
    feature: str
    """Its input key (TorchRec's feature name) or ``bags[i]``."""
    table: int


@dataclass(frozen=True, slots=True)
class Part:
    """One slot's input, checked for what needs no look at its values."""

    ids: torch.Tensor
    """int64 [N]."""
    offsets: torch.Tensor
    """int64: its bag starts into ``ids`` (B of them; each bag ends where the next starts),
    then, with ``has_end``, the given end of the last bag (must be N)."""
    has_end: bool
    """Whether ``offsets`` carry the end of the last bag (``include_last_offset``)."""
    weights: torch.Tensor | None
    """Its per-sample weights ``[N]`` as given (any float dtype), or None."""

    @property
    def batch(self) -> int:
        return int(self.offsets.shape[0]) - self.has_end

    @property
    def starts(self) -> torch.Tensor:
        """int64 [B]: where each bag starts in ``ids``."""
        return self.offsets[:-1] if self.has_end else self.offsets

    @property
    def end(self) -> torch.Tensor | None:
        """With ``has_end``: the given end of the last bag (``[1]``)."""
        return self.offsets[-1:] if self.has_end else None


def check_bag(bag: object, label: str) -> TableSpec:
    """What a kernel needs to pool as ``bag`` pools; one ConfigError naming what it cannot."""
    if not isinstance(bag, nn.EmbeddingBag):
        kind = type(bag).__name__
        why = " (a sequence embedding: its rows are not pooled)" if kind == "Embedding" else ""
        raise ConfigError(f"{label}: expected a torch.nn.EmbeddingBag, got {kind}{why}")
    if bag.mode not in ("sum", "mean"):
        raise ConfigError(f"{label}: mode {bag.mode!r} is not supported (sum or mean)")
    if bag.padding_idx is not None:
        raise ConfigError(f"{label}: padding_idx = {bag.padding_idx} is not supported")
    if bag.max_norm is not None:
        raise ConfigError(f"{label}: max_norm (re-normalising rows on lookup) is not supported")
    if bag.weight.dtype not in DTYPES:
        raise ConfigError(
            f"{label}: weight dtype {bag.weight.dtype} is not float32, float16 or bfloat16"
        )
    pooling: Pooling = "sum" if bag.mode == "sum" else "mean"
    return TableSpec(label, pooling, bool(bag.include_last_offset))


_FIELD = re.compile(r"^(weights|scale_bias|fmt|dim|weight)(\[\d+\])?: ")


def relabel(label: str, exc: Exception) -> ConfigError:
    """``exc`` (a one-table ``Tables`` or ``formats`` error naming a field) as one line naming
    the table by ``label`` and the field: ``table 't1' scale_bias: row 3 has a NaN ...``."""
    msg = str(exc)
    m = _FIELD.match(msg)
    if m is None:
        return ConfigError(f"{label}: {msg}")
    name = "weight" if m.group(1) == "weights" else m.group(1)
    return ConfigError(f"{label} {name}: {msg[m.end() :]}")


def check_rows(
    label: str, weight: torch.Tensor, fmt: str | None, scale_bias: torch.Tensor | None
) -> None:
    """One ConfigError naming table ``label`` and the field unless ``weight`` (and
    ``scale_bias``) are rows of format ``fmt`` (None: the weight's float dtype): shapes, dtypes,
    devices, and finite scales and biases (``Tables``' checks, once at build)."""
    sb = (scale_bias,) if scale_bias is not None or fmt in INTEGER_FORMATS else None
    try:
        Tables(weights=(weight,), fmt=fmt, scale_bias=sb)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise relabel(label, exc) from None


def per_slot(values: Any, n: int, what: str) -> list[Any]:
    """``values`` as one entry per input (None: None for each)."""
    if values is None:
        return [None] * n
    if isinstance(values, torch.Tensor) or not isinstance(values, Sequence):
        got = "one tensor" if isinstance(values, torch.Tensor) else type(values).__name__
        raise ConfigError(f"{what}: expected a list of {n} tensors (one per table), got {got}")
    if len(values) != n:
        raise ConfigError(f"{what}: {len(values)} tensors for {n} tables")
    return list(values)


def _check_tensor(
    x: Any, where: str, kinds: tuple[torch.dtype, ...], device: torch.device
) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ConfigError(f"{where}: expected a tensor, got {type(x).__name__}")
    if x.device != device:
        raise ConfigError(f"{where}: is on {x.device}, the table's weights on {device}")
    if kinds and x.dtype not in kinds:
        raise ConfigError(f"{where}: dtype {x.dtype} is not {' or '.join(map(str, kinds))}")
    return x


_INDEX_DTYPES = (torch.int64, torch.int32)


def labels(i: int, feature: str | None = None) -> tuple[str, str, str]:
    """How errors name input ``i``'s ids, offsets and weights (TorchRec: by ``feature``)."""
    if feature is None:
        return f"indices[{i}]", f"offsets[{i}]", f"per_sample_weights[{i}]"
    key = f"features[{feature!r}]"
    return f"{key}.values", f"{key}.offsets", f"{key}.weights"


def to_part(
    names: tuple[str, str, str],
    ids: Any,
    off: Any,
    psw: Any,
    weight: torch.Tensor,
    table: TableSpec,
) -> Part:
    """One input as torch.nn.EmbeddingBag takes it (1-D ids with offsets, or 2-D fixed-length
    bags without), in the TBE layout; checks what needs no look at the values (``check_values``
    does that). ``names`` (from ``labels``) name its ids, offsets and weights in errors."""
    dev = weight.device
    ids_name, off_name, psw_name = names
    ids = _check_tensor(ids, ids_name, _INDEX_DTYPES, dev)
    has_end = False
    if ids.dim() == 2:
        if off is not None:
            raise ConfigError(f"{off_name}: must be None with 2-D indices (fixed-length bags)")
        b, length = ids.shape
        off = torch.arange(b, dtype=torch.int64, device=dev) * length
    elif ids.dim() == 1:
        if off is None:
            raise ConfigError(f"{off_name}: needed with 1-D indices")
        off = _check_tensor(off, off_name, _INDEX_DTYPES, dev)
        if off.dim() != 1:
            raise ConfigError(f"{off_name}: expected a 1-D tensor, got {off.dim()}-D")
        if off.dtype != torch.int64:
            off = off.to(torch.int64)
        has_end = table.include_last_offset
        if has_end and off.shape[0] < 1:
            raise ConfigError(f"{off_name}: include_last_offset needs at least one offset")
    else:
        raise ConfigError(f"{ids_name}: expected 1-D (with offsets) or 2-D, got {ids.dim()}-D")
    weights = None
    if psw is not None:
        psw = _check_tensor(psw, psw_name, (), dev)
        if not psw.is_floating_point() or psw.shape != ids.shape:
            raise ConfigError(f"{psw_name}: expected floats shaped as indices {tuple(ids.shape)}")
        if table.pooling != "sum" and not table.weighted_mean:
            raise ConfigError(
                f"{psw_name}: {table.label} pools by {table.pooling}; "
                "torch.nn.EmbeddingBag takes them only with mode='sum'"
            )
        weights = psw.reshape(-1) if psw.dim() != 1 else psw
    if ids.dim() != 1:
        ids = ids.reshape(-1)
    if ids.dtype != torch.int64:
        ids = ids.to(torch.int64)
    return Part(ids=ids, offsets=off, has_end=has_end, weights=weights)


def values_ok(parts: Sequence[Part], rows: Sequence[int]) -> torch.Tensor:
    """A 0-d bool tensor on the parts' device (read it once: one host sync for all the checks):
    every part's bag starts rise from 0 up to at most len(ids), its given end (if any) is
    len(ids), and its ids lie within its table's ``rows``. The parts have one batch >= 1."""
    dev = parts[0].ids.device
    sizes = torch.tensor([p.ids.numel() for p in parts], dtype=torch.int64, device=dev)
    firsts = torch.stack([p.starts[0] for p in parts])
    lasts = torch.stack([p.starts[-1] for p in parts])
    steps = torch.cat([p.starts.diff() for p in parts])
    bad = (firsts != 0).any() | (lasts > sizes).any() | (steps < 0).any()
    ended = [i for i, p in enumerate(parts) if p.end is not None]
    if ended:
        ends = torch.cat([cast(torch.Tensor, parts[i].end) for i in ended])
        bad |= (ends != sizes[ended]).any()
    used = [i for i, p in enumerate(parts) if p.ids.numel()]
    if used:  # one min/max pass per part: cheaper than comparing every id with its table's rows
        lo_hi = [torch.aminmax(parts[i].ids) for i in used]
        limit = torch.tensor([rows[i] for i in used], dtype=torch.int64, device=dev)
        bad |= (torch.stack([m.min for m in lo_hi]) < 0).any()
        bad |= (torch.stack([m.max for m in lo_hi]) >= limit).any()
    return ~bad


def check_values(names: tuple[str, str, str], part: Part, rows: int, table: TableSpec) -> None:
    """Raise the ConfigError naming what is wrong with ``part``'s offsets or ids, if anything
    (run on the parts ``values_ok`` refused, to say which and why)."""
    ids_name, off_name, _ = names
    starts, n = part.starts, part.ids.numel()
    if int(starts[0]) != 0:
        raise ConfigError(f"{off_name}: must start at 0, got {int(starts[0])}")
    if part.end is not None and int(part.end[0]) != n:
        raise ConfigError(f"{off_name}: last offset {int(part.end[0])} is not len(indices) = {n}")
    if bool((starts[1:] < starts[:-1]).any()) or int(starts[-1]) > n:
        raise ConfigError(f"{off_name}: must not decrease, nor pass len(indices) = {n}")
    if n:
        lo, hi = int(part.ids.min()), int(part.ids.max())
        if lo < 0 or hi >= rows:
            raise ConfigError(
                f"{ids_name}: id {lo if lo < 0 else hi} is outside "
                f"{table.label}'s rows 0..{rows - 1}"
            )


def to_lookup(parts: Sequence[Part], batch: int) -> Lookup:
    """The parts of one group, table-major, as one TBE ``Lookup`` (a few tensor ops whatever
    the number of parts: this runs on every call)."""
    dev = parts[0].ids.device
    if len(parts) == 1:
        p = parts[0]
        n = torch.tensor([p.ids.numel()], dtype=torch.int64, device=dev)
        return Lookup(
            indices=p.ids,
            offsets=torch.cat([p.starts, n]),
            batch_size=batch,
            per_sample_weights=None if p.weights is None else p.weights.to(torch.float32),
        )
    sizes = [p.ids.numel() for p in parts]
    weights = None
    if any(p.weights is not None for p in parts):
        weights = torch.cat(
            [
                p.weights.to(torch.float32) if p.weights is not None else torch.ones(n, device=dev)
                for p, n in zip(parts, sizes, strict=True)
            ]
        )
    return Lookup(
        indices=torch.cat([p.ids for p in parts]),
        offsets=tbe_offsets([p.offsets for p in parts], sizes, batch),
        batch_size=batch,
        per_sample_weights=weights,
    )


def to_parts(parts: Sequence[Part], slots: Sequence[int], batch: int) -> Parts:
    """The parts of ``slots`` as a ``Parts`` batch (per-table inputs, no copies)."""
    chosen = [parts[s] for s in slots]
    weights = None
    if any(p.weights is not None for p in chosen):
        weights = tuple(p.weights for p in chosen)
    return Parts(
        indices=tuple(p.ids for p in chosen),
        offsets=tuple(p.offsets for p in chosen),
        batch_size=batch,
        per_sample_weights=weights,
    )


def plain_parts(
    ids: Any, offsets: Any, has_end: Sequence[bool], device: torch.device
) -> Parts | None:
    """The inputs as a ``Parts`` batch (no copies) when they are the plain case: one 1-D int64
    tensor of ids and one of offsets per table (``has_end``: whether that table's carry the
    end of the last bag), all on ``device``, one batch size >= 1 and no per-sample weights;
    else None, and ``to_part`` checks them one by one, naming what is wrong. The checks of
    ``to_part`` in a few attribute reads a table (~1 us, against ~4 us for the general path)."""
    n = len(has_end)
    if not isinstance(ids, list | tuple) or not isinstance(offsets, list | tuple):
        return None
    if len(ids) != n or len(offsets) != n:
        return None
    batch = -1
    long = torch.int64
    for i, o, end in zip(ids, offsets, has_end, strict=True):
        if not isinstance(i, torch.Tensor) or not isinstance(o, torch.Tensor):
            return None
        if i.dtype != long or o.dtype != long or i.dim() != 1 or o.dim() != 1:
            return None
        if i.device != device or o.device != device:
            return None
        b = o.shape[0] - end
        if b != batch:
            if batch >= 0:
                return None
            batch = b
    if batch < 1:
        return None
    return Parts(indices=tuple(ids), offsets=tuple(offsets), batch_size=batch)


def tbe_batch(n: int, indices: torch.Tensor, offsets: Any, weights: Any) -> Lookup:
    """``n`` inputs' batch in FBGEMM's TBE layout as a ``Lookup`` (no copies), or one error
    naming what does not fit: ``offsets`` one 1-D tensor of ``n`` x B bag starts and the end,
    ``weights`` one tensor or None."""
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1:
        raise ConfigError(f"offsets: with indices as one tensor (the TBE layout), one 1-D "
                          f"tensor of {n} inputs x B bag starts + 1")  # fmt: skip
    bags = int(offsets.shape[0]) - 1
    if bags < n or bags % n:
        raise ConfigError(f"offsets: length {bags + 1} is not {n} inputs x B + 1 (B >= 1)")
    if weights is not None and not isinstance(weights, torch.Tensor):
        raise ConfigError("per_sample_weights: with indices as one tensor, one tensor too")
    return Lookup(indices=indices, offsets=offsets, batch_size=bags // n,
                  per_sample_weights=weights)  # fmt: skip
