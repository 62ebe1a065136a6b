"""The embedding-kernel plug-in contract: ``Tables`` (the weights) and ``Lookup`` (one TBE batch)
in, pooled ``[B, T, D]`` float32 out (and, for a kernel with the ``parts`` trait, per-table
``Parts`` in, table-major out in the rows' dtype); ``KERNELS`` names the implementations with their
Config and tunable space, ``make_lookup`` draws random batches and ``check_kernel`` proves a kernel
equals the reference on random shapes."""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import torch

from recperf.core.config import check_range
from recperf.core.errors import ConfigError, ContractError
from recperf.core.registry import Registry
from recperf.embed.kernels.formats import (
    FLOAT_DTYPES,
    INTEGER_FORMATS,
    ROW_FORMATS,
    SCALE_BIAS_BYTES,
    check_format,
    dequantize,
    dim_of,
    format_of,
    quantize,
    scales,
)
from recperf.embed.kernels.formats import row_bytes as format_row_bytes

Pooling = Literal["sum", "mean"]
POOLINGS: tuple[str, ...] = get_args(Pooling)
DTYPES = tuple(FLOAT_DTYPES.values())
"""The float dtypes a table's weights may have (other formats are ``uint8`` with a ``fmt``)."""
RTOL = {"fp32": 1e-6, "fp16": 1e-3, "bf16": 8e-3, "fp8": 1e-5, "int8": 1e-5, "int4": 1e-5}
"""Relative tolerance of a kernel against the reference, by row format: both accumulate in
float32 from the same dequantized values, so the order of the summation is all that differs
(and for fp16/bf16 the precision a kernel may multiply in)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Tables:
    """The embedding tables of one model: same width, row format and device."""

    weights: tuple[torch.Tensor, ...]
    """Per table a ``[rows_t, columns]`` tensor (rows_t >= 1): float32, float16 or bfloat16
    rows, or the codes of fp8/int8/int4 ones (``uint8``; int4 two per byte, ``formats``)."""
    pooling: Pooling = "sum"
    """How a bag's rows are pooled: ``sum`` or ``mean`` (of the per-sample-weighted rows)."""
    fmt: str | None = None
    """The row format (``formats.ROW_FORMATS``); None: the float weights' own dtype."""
    scale_bias: tuple[torch.Tensor, ...] | None = None
    """int8/int4 only: per table its ``uint8 [rows_t, 4]`` float16 scale and bias per row."""

    def __post_init__(self) -> None:
        if not isinstance(self.weights, tuple) or not self.weights:
            raise ConfigError("weights: expected a non-empty tuple of 2-D tensors")
        first = self.weights[0]
        if not isinstance(first, torch.Tensor):
            raise ConfigError("weights[0]: expected a [rows >= 1, D] tensor")
        fmt = self.fmt if self.fmt is not None else format_of(first.dtype)
        if fmt is None:
            raise ConfigError(
                f"fmt: {first.dtype} weights need a row format (fp8, int8 or int4); "
                f"allowed: {', '.join(ROW_FORMATS)}"
            )
        check_format(fmt, "fmt")
        object.__setattr__(self, "fmt", fmt)
        want = FLOAT_DTYPES.get(fmt)
        for t, w in enumerate(self.weights):
            if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[0] < 1:
                raise ConfigError(f"weights[{t}]: expected a [rows >= 1, D] tensor")
            if want is not None and w.dtype != want:
                raise ConfigError(f"weights[{t}]: {fmt} rows need dtype {want}, got {w.dtype}")
            if want is None and w.dtype != torch.uint8 and format_of(w.dtype) != fmt:
                raise ConfigError(f"weights[{t}]: {fmt} rows need dtype torch.uint8, got {w.dtype}")
            if (w.shape[1], w.dtype, w.device) != (first.shape[1], first.dtype, first.device):
                raise ConfigError(f"weights[{t}]: D, dtype and device must equal table 0's")
        if first.shape[1] < 1:
            raise ConfigError("weights: D must be >= 1")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"pooling: {self.pooling!r} is not one of {', '.join(POOLINGS)}")
        self._check_scale_bias(fmt)

    def _check_scale_bias(self, fmt: str) -> None:
        if fmt not in INTEGER_FORMATS:
            if self.scale_bias is not None:
                raise ConfigError(f"scale_bias: {fmt} rows have no scale and bias")
            return
        sb = self.scale_bias
        if not isinstance(sb, tuple) or len(sb) != len(self.weights):
            raise ConfigError(f"scale_bias: {fmt} rows need one scale-and-bias tensor per table")
        for t, (w, s) in enumerate(zip(self.weights, sb, strict=True)):
            shape = (int(w.shape[0]), SCALE_BIAS_BYTES)
            if not isinstance(s, torch.Tensor) or s.dtype != torch.uint8 or tuple(s.shape) != shape:
                got = f"{tuple(s.shape)} {s.dtype}" if isinstance(s, torch.Tensor) else repr(s)
                raise ConfigError(
                    f"scale_bias[{t}]: expected uint8 {list(shape)} "
                    f"(float16 scale, bias), got {got}"
                )
            if s.device != w.device:
                raise ConfigError(f"scale_bias[{t}]: on {s.device}, its table on {w.device}")
            scale, bias = scales(s)
            if not bool(torch.isfinite(scale).all() & torch.isfinite(bias).all()):
                row = int((~(torch.isfinite(scale) & torch.isfinite(bias))).nonzero()[0])
                raise ConfigError(f"scale_bias[{t}]: row {row} has a NaN or infinite scale or bias")

    @property
    def num_tables(self) -> int:
        return len(self.weights)

    @property
    def row_format(self) -> str:
        """The row format (``fmt`` once validated)."""
        assert self.fmt is not None
        return self.fmt

    @property
    def dim(self) -> int:
        return dim_of(self.row_format, int(self.weights[0].shape[1]))

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype (``uint8`` for int8/int4 rows; see ``row_format``)."""
        return self.weights[0].dtype

    @property
    def row_bytes(self) -> int:
        """Bytes one row takes, scale and bias included."""
        return format_row_bytes(self.row_format, self.dim)

    @property
    def out_dtype(self) -> torch.dtype:
        """The dtype a module over these tables returns: the weights' for float rows (as
        ``nn.EmbeddingBag``), float32 for quantized ones (as TorchRec's quantized collection)."""
        return FLOAT_DTYPES.get(self.row_format, torch.float32)

    def dequantized(self, t: int) -> torch.Tensor:
        """Table ``t``'s rows as float32 ``[rows, D]`` (``dequantize``: float32 rows as they
        are, others a new tensor)."""
        sb = None if self.scale_bias is None else self.scale_bias[t]
        return dequantize(self.weights[t], sb, self.row_format)

    def with_weights(self, weights: tuple[torch.Tensor, ...]) -> Tables:
        """The same tables over other float32 weights of the same shapes (e.g. their |values|)."""
        return Tables(weights=weights, pooling=self.pooling)

    @property
    def device(self) -> torch.device:
        return self.weights[0].device

    @property
    def rows(self) -> tuple[int, ...]:
        return tuple(int(w.shape[0]) for w in self.weights)


@dataclass(kw_only=True, slots=True, frozen=True)
class Lookup:
    """One batch of look-ups over T tables in the TBE layout (table-major bags)."""

    indices: torch.Tensor
    """int64 ``[N]``: table 0's bags for all B samples, then table 1's, ... (row ids per table)."""
    offsets: torch.Tensor
    """int64 ``[T*B + 1]``: bag starts into ``indices``; offsets[0] = 0, offsets[-1] = N."""
    batch_size: int
    """B, the samples in the batch (>= 1)."""
    per_sample_weights: torch.Tensor | None = None
    """Optional float32 ``[N]``: each id's weight in its bag's pooled sum (or mean)."""

    def __post_init__(self) -> None:
        # Shape and dtype checks only: value checks (validate_lookup) would sync a GPU per call.
        check_range("batch_size", self.batch_size, 1, None)
        if self.indices.dtype != torch.int64 or self.indices.dim() != 1:
            raise ConfigError("indices: expected a 1-D int64 tensor")
        if self.offsets.dtype != torch.int64 or self.offsets.dim() != 1:
            raise ConfigError("offsets: expected a 1-D int64 tensor")
        bags = self.offsets.shape[0] - 1
        if bags < 1 or bags % self.batch_size:
            raise ConfigError(f"offsets: length {bags + 1} is not T*batch_size + 1 with T >= 1")
        w = self.per_sample_weights
        if w is not None and (w.dtype != torch.float32 or w.shape != self.indices.shape):
            raise ConfigError("per_sample_weights: expected float32 with the shape of indices")

    @property
    def num_bags(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def num_tables(self) -> int:
        return self.num_bags // self.batch_size


def validate_lookup(tables: Tables, lookup: Lookup) -> None:
    """Raise ConfigError unless ``lookup``'s values fit ``tables`` (syncs a GPU: not per call)."""
    check_tables_match(tables, lookup)
    off = lookup.offsets.cpu()
    n = lookup.indices.shape[0]
    if off[0] != 0 or off[-1] != n or bool((off[1:] < off[:-1]).any()):
        raise ConfigError(f"offsets: must rise from 0 to len(indices) = {n}")
    idx = lookup.indices.cpu()
    b = lookup.batch_size
    for t, rows in enumerate(tables.rows):
        ids = idx[int(off[t * b]) : int(off[(t + 1) * b])]
        bad = ((ids < 0) | (ids >= rows)).nonzero()
        if bad.numel():
            at = int(bad[0]) + int(off[t * b])
            raise ConfigError(
                f"indices: table {t} has rows 0..{rows - 1}, got id {int(idx[at])} at indices[{at}]"
            )


def check_tables_match(tables: Tables, lookup: Lookup) -> None:
    """The cheap per-call check every kernel runs: the lookup covers exactly these tables."""
    if lookup.num_tables != tables.num_tables:
        raise ConfigError(
            f"offsets: lookup has {lookup.num_tables} tables, kernel {tables.num_tables}"
        )


@runtime_checkable
class EmbeddingKernel(Protocol):
    """Pools the rows a ``Lookup`` names out of the tables it was built on."""

    name: str

    def __call__(self, lookup: Lookup) -> torch.Tensor:
        """``[B, T, D]`` float32 (accumulated in float32); an empty bag pools to zeros."""
        ...


@dataclass(frozen=True, slots=True)
class Parts:
    """One batch over T tables as per-table inputs (no checks here: a drop-in checks what it
    hands over; ``parts_of`` cuts one out of a ``Lookup``)."""

    indices: tuple[torch.Tensor, ...]
    """Per table its ids, int64 ``[N_t]``."""
    offsets: tuple[torch.Tensor, ...]
    """Per table its bag starts into its own ids, int64, B of them, or B + 1 with the end of
    the last bag (which must be ``N_t``); each table's bags end where the next bag starts."""
    batch_size: int
    """B, the samples in the batch (>= 1)."""
    per_sample_weights: tuple[torch.Tensor | None, ...] | None = None
    """Per table its floats ``[N_t]`` (None: weight 1), or None for none at all."""


@runtime_checkable
class PartsKernel(Protocol):
    """A kernel with the ``parts`` trait."""

    def pool_parts(self, parts: Parts) -> torch.Tensor:
        """``[T, B, D]`` table-major (so table t's ``[B, D]`` is a contiguous view), in the
        rows' dtype for float rows (fp16/bf16 accumulated in float32, as ``nn.EmbeddingBag``
        does), float32 for others; the same pooling as ``__call__``."""
        ...

    def pool_lookup(self, lookup: Lookup) -> torch.Tensor:
        """``pool_parts`` of a batch in the TBE layout (the tables' ids already concatenated)."""
        ...

    def pool_flat(self, indices: torch.Tensor, offsets: torch.Tensor, batch: int) -> torch.Tensor:
        """``pool_lookup`` of an unweighted TBE-layout batch whose shapes, dtypes and device
        the caller checked against the tables (the drop-in's short road): no ``Lookup`` made,
        no check run."""
        ...


def bag_starts(offsets: Sequence[torch.Tensor], batch: int) -> torch.Tensor:
    """int64 ``[T, B]``: each table's first B offsets (its bag starts) stacked, in one copy
    (a view of it where some carry the end of their last bag)."""
    lengths = {int(o.shape[0]) for o in offsets}
    if lengths == {batch}:
        return torch.stack(list(offsets))
    if len(lengths) == 1:
        return torch.stack(list(offsets))[:, :batch]
    return torch.stack([o[:batch] for o in offsets])


def tbe_offsets(offsets: Sequence[torch.Tensor], sizes: Sequence[int], batch: int) -> torch.Tensor:
    """Each table's ``batch`` bag starts (into its own ``sizes[t]`` ids) shifted by its first
    id in the tables' ids concatenated, and the end: TBE offsets ``[T * batch + 1]``, int64,
    in a few dispatches whatever T."""
    dev = offsets[0].device
    offs = torch.empty(len(sizes) * batch + 1, dtype=torch.int64, device=dev)
    bases = torch.tensor([0, *itertools.accumulate(sizes)][:-1], device=dev).view(-1, 1)
    torch.add(bag_starts(offsets, batch), bases, out=offs[:-1].view(len(sizes), batch))
    offs[-1:].fill_(sum(sizes))
    return offs


def pools_alike(got: torch.Tensor, want: torch.Tensor, fmt: str) -> bool:
    """Whether two kernels' pooled outputs of ``fmt`` rows agree: the same shape, and equal
    within ``RTOL[fmt]`` (at least 1e-5) of the larger output's magnitude."""
    tol = max(RTOL[fmt], 1e-5)
    return got.shape == want.shape and torch.allclose(
        got.float(), want.float(), rtol=tol, atol=tol * float(want.abs().max() + 1)
    )


def parts_of(lookup: Lookup) -> Parts:
    """``lookup`` as per-table inputs (views of its ids; one host copy of the table bounds)."""
    b = lookup.batch_size
    starts = lookup.offsets[::b].tolist()
    bounds = list(itertools.pairwise(starts))
    w = lookup.per_sample_weights
    return Parts(
        indices=tuple(lookup.indices[s:e] for s, e in bounds),
        offsets=tuple(lookup.offsets[t * b : (t + 1) * b] - s for t, (s, _) in enumerate(bounds)),
        batch_size=b,
        per_sample_weights=None if w is None else tuple(w[s:e] for s, e in bounds),
    )


KERNELS: Registry[EmbeddingKernel] = Registry("embedding kernel", package="recperf.embed.kernels")
"""Built by ``build_kernel(name, options, tables, hot_rows)`` (or ``KERNELS.build``):
``options`` validate into the kernel's Config; ``KERNELS.entry(name).space`` is its tunable
space and ``kernel_traits(name)`` what else callers need to know of it."""

Layout = Literal["tables", "tables-hot", "combined", "hot-first"]
"""How a kernel lays out rows: the tables as given, each table hottest rows first, all tables in
one buffer, or one buffer with every table's hot rows first (the L2 model reads this)."""
FLOAT_PAIR = frozenset({"fp32", "fp16"})


@dataclass(frozen=True, slots=True)
class KernelTraits:
    """What callers need to know of an embedding kernel beyond its Config: the one place for it
    (a user's ``package.module:attr`` kernel gives its own as a class attribute ``traits``)."""

    formats: frozenset[str] = FLOAT_PAIR
    """The row formats it reads (``formats.ROW_FORMATS``)."""
    cpu: bool = False
    """Runs natively on a CPU (the Triton kernels only under ``TRITON_INTERPRET=1``)."""
    gpu: bool = True
    """Runs on a CUDA device (off for a peer whose installed build is CPU-only)."""
    hot_rows: bool = False
    """Takes ``hot_rows`` (remaps ids so that the hottest rows come first)."""
    layout: Layout = "combined"
    """How it lays out the rows."""
    fused: bool = True
    """One launch for all tables (the L2 model bounds time over their sum) or one per table."""
    pins_l2: bool = False
    """Pins its hot region in the GPU's persisting L2."""
    reads_fp32: bool = False
    """Reads float32 copies of the rows, whatever their format."""
    peer: str = ""
    """The library whose operator it runs (``fbgemm``, ``torch``), "" for recperf's own."""
    parts: bool = False
    """Also pools a batch as per-table inputs (``PartsKernel.pool_parts``: what a list of
    ``nn.EmbeddingBag`` takes), into table-major outputs in the float rows' own dtype, so a
    drop-in skips building the TBE layout and casting through float32 (issue 27)."""

    def __post_init__(self) -> None:
        bad = sorted(set(self.formats) - set(ROW_FORMATS))
        if bad:
            raise ConfigError(f"traits.formats: {bad[0]!r}; allowed: {', '.join(ROW_FORMATS)}")


def kernel_traits(name: str) -> KernelTraits:
    """Kernel ``name``'s traits: its registered ones, else (a plug-in that gives none) the
    defaults, with ``hot_rows`` when its factory takes them."""
    entry = KERNELS.entry(name)
    if isinstance(entry.traits, KernelTraits):
        return entry.traits
    try:
        takes = "hot_rows" in inspect.signature(entry.factory).parameters
    except (TypeError, ValueError):  # a factory whose signature Python cannot read
        takes = False
    return KernelTraits(hot_rows=takes)


def kernels_for(fmt: str, device_type: str, *, native: bool = True) -> list[str]:
    """The registered kernels that read ``fmt`` rows and run on ``device_type``: on a GPU those
    with the ``gpu`` trait, elsewhere (with ``native``) those that run on a CPU without an
    interpreter."""
    gpu = device_type == "cuda"
    return [
        n
        for n in KERNELS.names()
        if fmt in (tr := kernel_traits(n)).formats and (tr.gpu if gpu else (tr.cpu or not native))
    ]


def check_reads(name: str, tables: Tables) -> KernelTraits:
    """Kernel ``name``'s traits, or one ConfigError when it cannot read ``tables``' rows."""
    tr = kernel_traits(name)
    if tables.row_format not in tr.formats:
        raise ConfigError(
            f"kernel {name!r} does not read {tables.row_format} rows "
            f"(it reads {', '.join(f for f in ROW_FORMATS if f in tr.formats)})"
        )
    return tr


def build_kernel(
    name: str,
    options: Mapping[str, Any] | None,
    tables: Tables,
    hot_rows: Sequence[torch.Tensor] | None = None,
) -> EmbeddingKernel:
    """Kernel ``name`` over ``tables``, given ``hot_rows`` when it takes them; one ConfigError
    when it cannot read their row format or the options are bad."""
    extra: dict[str, Any] = {}
    if check_reads(name, tables).hot_rows and hot_rows is not None:
        extra["hot_rows"] = tuple(hot_rows)
    return KERNELS.build(name, options, tables, **extra)


def make_lookup(
    tables: Tables,
    *,
    batch_size: int,
    pooling_factor: int,
    seed: int = 0,
    weighted: bool = False,
    skew: float = 0.0,
) -> Lookup:
    """A random ``Lookup``: bag lengths uniform in ``0..2*pooling_factor`` (so empty bags occur),
    ids uniform or, with ``skew`` > 0, Zipf-like (p ∝ 1/rank^skew over a random row order)."""
    check_range("batch_size", batch_size, 1, None)
    check_range("pooling_factor", pooling_factor, 0, None)
    check_range("skew", skew, 0.0, None)
    g = torch.Generator().manual_seed(seed)
    bags = tables.num_tables * batch_size
    lengths = torch.randint(0, 2 * pooling_factor + 1, (bags,), generator=g)
    parts = []
    for t, rows in enumerate(tables.rows):
        n = int(lengths[t * batch_size : (t + 1) * batch_size].sum())
        parts.append(_draw_ids(rows, n, skew, g))
    offsets = torch.zeros(bags + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    indices = torch.cat(parts)
    w = torch.rand(indices.shape[0], generator=g) * 2 - 0.5 if weighted else None
    dev = tables.device
    return Lookup(
        indices=indices.to(dev),
        offsets=offsets.to(dev),
        batch_size=batch_size,
        per_sample_weights=None if w is None else w.to(dev),
    )


def _draw_ids(rows: int, n: int, skew: float, g: torch.Generator) -> torch.Tensor:
    if skew == 0.0 or n == 0:
        return torch.randint(0, rows, (n,), generator=g, dtype=torch.int64)
    p = 1.0 / torch.arange(1, rows + 1, dtype=torch.float64) ** skew
    rank = torch.multinomial(p, n, replacement=True, generator=g)
    return torch.randperm(rows, generator=g)[rank]


def mismatch(out: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, fmt: str) -> str:
    """Why ``out`` is not the reference ``ref`` ("" when it is). ``bound`` is the pooled magnitude
    (the reference on |weights| and |per-sample weights|): the summation order may move a result
    by at most ``RTOL[fmt] * bound`` (``fmt`` the row format), whatever cancellation happened."""
    if out.shape != ref.shape:
        return f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    if out.dtype != torch.float32:
        return f"dtype {out.dtype}, expected torch.float32"
    if out.device != ref.device:
        return f"device {out.device}, expected {ref.device}"
    err = (out.double() - ref.double()).abs().cpu()
    tol = RTOL[fmt] * bound.double().abs().cpu() + 1e-30
    bad = ~(err <= tol)  # NaN counts as bad
    if bool(bad.any()):
        i = tuple(int(x) for x in bad.nonzero()[0])
        return f"at [b, t, d] = {list(i)}: {float(out[i])} != reference {float(ref[i])}"
    return ""


@dataclass(kw_only=True, slots=True, frozen=True)
class KernelCase:
    """One random shape ``check_kernel`` tries."""

    rows: tuple[int, ...]
    """Rows per table."""
    dim: int
    """D, the embedding width."""
    fmt: str
    """Row format."""
    pooling: Pooling
    """sum or mean."""
    batch_size: int
    """B."""
    max_len: int
    """Bag lengths are drawn from 0..max_len."""
    weighted: bool
    """Whether the lookup has per-sample weights."""
    seed: int
    """Seed of the tables and the lookup."""


def random_case(
    rng: torch.Generator, seed: int, formats: Sequence[str] = ("fp32", "fp16")
) -> KernelCase:
    """A small random case over the shapes every kernel must support, in one of ``formats``."""

    def pick(n: int) -> int:
        return int(torch.randint(0, n, (1,), generator=rng))

    pooling: Pooling = "sum" if pick(2) else "mean"
    fmt = formats[pick(len(formats))]
    return KernelCase(
        rows=tuple(1 + pick(40) for _ in range(1 + pick(3))),
        dim=((2, 4, 8, 34) if fmt == "int4" else (1, 3, 8, 33))[pick(4)],
        fmt=fmt,
        pooling=pooling,
        batch_size=1 + pick(4),
        max_len=pick(6),
        weighted=bool(pick(2)),
        seed=seed,
    )


def case_inputs(case: KernelCase, device: str = "cpu") -> tuple[Tables, Lookup]:
    """The tables and lookup of ``case`` on ``device``."""
    g = torch.Generator().manual_seed(case.seed)
    coded = [quantize(torch.randn(r, case.dim, generator=g), case.fmt) for r in case.rows]
    weights = tuple(w.to(device) for w, _ in coded)
    sbs = tuple(sb.to(device) for _, sb in coded if sb is not None)
    tables = Tables(weights=weights, pooling=case.pooling, fmt=case.fmt, scale_bias=sbs or None)
    lookup = make_lookup(
        tables,
        batch_size=case.batch_size,
        pooling_factor=math.ceil(case.max_len / 2),
        seed=case.seed,
        weighted=case.weighted,
    )
    return tables, lookup


def magnitude(tables: Tables, lookup: Lookup) -> torch.Tensor:
    """The reference pooled over |weights| and |per-sample weights|: bounds summation error.
    For int8/int4 rows each value counts as |q * scale| + |bias|, the terms its dequantization
    adds: they may cancel, and a kernel that fuses them (FBGEMM's fma) rounds differently."""
    abs_tables = tables.with_weights(tuple(_abs_terms(tables, t) for t in range(tables.num_tables)))
    w = lookup.per_sample_weights
    abs_lookup = Lookup(
        indices=lookup.indices,
        offsets=lookup.offsets,
        batch_size=lookup.batch_size,
        per_sample_weights=None if w is None else w.abs(),
    )
    return KERNELS.build("torch", None, abs_tables)(abs_lookup)


def _abs_terms(tables: Tables, t: int) -> torch.Tensor:
    sb = None if tables.scale_bias is None else tables.scale_bias[t]
    if sb is not None:  # codes are unsigned: q * |scale| + |bias| = |q * scale| + |bias|
        sb = sb.contiguous().view(torch.float16).abs().view(torch.uint8)
    return dequantize(tables.weights[t], sb, tables.row_format).abs()


def check_kernel(
    name: str,
    device: str = "cpu",
    seed: int = 0,
    cases: int = 8,
    options: Mapping[str, Any] | None = None,
) -> None:
    """Run kernel ``name`` (built with ``options``, validated into its Config) on ``cases`` random
    shapes in every row format it reads (``cases`` each) and compare with the ``torch``
    reference; raise ContractError naming the case on the first mismatch (bad options are a
    ConfigError from ``KERNELS.build``)."""
    formats = [f for f in ROW_FORMATS if f in kernel_traits(name).formats]
    rng = torch.Generator().manual_seed(seed)
    for i in range(cases * len(formats)):
        case = random_case(rng, seed * 1000 + i, formats=(formats[i % len(formats)],))
        tables, lookup = case_inputs(case, device)
        kernel = build_kernel(name, options, tables)
        if not isinstance(kernel, EmbeddingKernel):
            raise ContractError(f"{name}: {kernel!r} does not implement EmbeddingKernel")
        ref = KERNELS.build("torch", None, tables)(lookup)
        bound = magnitude(tables, lookup)
        why = mismatch(kernel(lookup), ref, bound, tables.row_format)
        if not why and kernel_traits(name).parts:
            why = _parts_mismatch(kernel, tables, lookup, ref, bound)
        if why:
            raise ContractError(f"embedding kernel {name!r} on {case}: {why}")


def _parts_mismatch(
    kernel: EmbeddingKernel, tables: Tables, lookup: Lookup, ref: torch.Tensor, bound: torch.Tensor
) -> str:
    """Why ``pool_parts`` (and, unweighted, ``pool_flat``) of a ``parts`` kernel is not the
    reference ("" when it is)."""
    if not isinstance(kernel, PartsKernel):
        return "has the parts trait but not pool_parts, pool_lookup and pool_flat"
    pooled = {"pool_parts": kernel.pool_parts(parts_of(lookup))}
    if lookup.per_sample_weights is None:
        pooled["pool_flat"] = kernel.pool_flat(lookup.indices, lookup.offsets, lookup.batch_size)
    want = FLOAT_DTYPES.get(tables.row_format, torch.float32)
    for name, got in pooled.items():
        if got.dtype != want:
            return f"{name}: dtype {got.dtype}, expected {want}"
        why = mismatch(got.transpose(0, 1).float(), ref, bound, tables.row_format)
        if why:
            return f"{name}: {why}"
    return ""
