"""The embedding-kernel plug-in contract: ``Tables`` (the weights) and ``Lookup`` (one TBE batch)
in, pooled ``[B, T, D]`` float32 out; ``KERNELS`` names the implementations with their Config and
tunable space, ``make_lookup`` draws random batches and ``check_kernel`` proves a kernel equals the
reference on random shapes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import torch

from recperf.core.config import check_range
from recperf.core.errors import ConfigError, ContractError
from recperf.core.registry import Registry

Pooling = Literal["sum", "mean"]
POOLINGS: tuple[str, ...] = get_args(Pooling)
DTYPES = (torch.float32, torch.float16)
# Relative tolerance of a kernel against the reference, by weight dtype; both accumulate in
# float32, so the only difference allowed is the order of the summation.
RTOL = {torch.float32: 1e-6, torch.float16: 1e-3}


@dataclass(kw_only=True, slots=True, frozen=True)
class Tables:
    """The embedding tables of one model: same width, dtype and device."""

    weights: tuple[torch.Tensor, ...]
    """Per table a ``[rows_t, D]`` tensor (rows_t >= 1), float32 or float16."""
    pooling: Pooling = "sum"
    """How a bag's rows are pooled: ``sum`` or ``mean`` (of the per-sample-weighted rows)."""

    def __post_init__(self) -> None:
        if not isinstance(self.weights, tuple) or not self.weights:
            raise ConfigError("weights: expected a non-empty tuple of 2-D tensors")
        first = self.weights[0]
        for t, w in enumerate(self.weights):
            if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[0] < 1:
                raise ConfigError(f"weights[{t}]: expected a [rows >= 1, D] tensor")
            if w.dtype not in DTYPES:
                raise ConfigError(f"weights[{t}]: dtype {w.dtype} is not float32 or float16")
            if (w.shape[1], w.dtype, w.device) != (first.shape[1], first.dtype, first.device):
                raise ConfigError(f"weights[{t}]: D, dtype and device must equal table 0's")
        if first.shape[1] < 1:
            raise ConfigError("weights: D must be >= 1")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"pooling: {self.pooling!r} is not one of {', '.join(POOLINGS)}")

    @property
    def num_tables(self) -> int:
        return len(self.weights)

    @property
    def dim(self) -> int:
        return int(self.weights[0].shape[1])

    @property
    def dtype(self) -> torch.dtype:
        return self.weights[0].dtype

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
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= rows):
            raise ConfigError(f"indices: table {t} has rows 0..{rows - 1}, got {ids.tolist()}")


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


KERNELS: Registry[EmbeddingKernel] = Registry("embedding kernel", package="recperf.embed.kernels")
"""Built by ``KERNELS.build(name, options, tables, hot_rows=...)``: ``options`` validate into the
kernel's Config; ``KERNELS.entry(name).space`` is its tunable space."""


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


def mismatch(out: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, dtype: torch.dtype) -> str:
    """Why ``out`` is not the reference ``ref`` ("" when it is). ``bound`` is the pooled magnitude
    (the reference on |weights| and |per-sample weights|): the summation order may move a result
    by at most ``RTOL[dtype] * bound``, whatever cancellation happened."""
    if out.shape != ref.shape:
        return f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    if out.dtype != torch.float32:
        return f"dtype {out.dtype}, expected torch.float32"
    if out.device != ref.device:
        return f"device {out.device}, expected {ref.device}"
    err = (out.double() - ref.double()).abs().cpu()
    tol = RTOL[dtype] * bound.double().abs().cpu() + 1e-30
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
    dtype: torch.dtype
    """Weight dtype."""
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


def random_case(rng: torch.Generator, seed: int) -> KernelCase:
    """A small random case over the shapes every kernel must support."""

    def pick(n: int) -> int:
        return int(torch.randint(0, n, (1,), generator=rng))

    pooling: Pooling = "sum" if pick(2) else "mean"
    return KernelCase(
        rows=tuple(1 + pick(40) for _ in range(1 + pick(3))),
        dim=(1, 3, 8, 33)[pick(4)],
        dtype=DTYPES[pick(2)],
        pooling=pooling,
        batch_size=1 + pick(4),
        max_len=pick(6),
        weighted=bool(pick(2)),
        seed=seed,
    )


def case_inputs(case: KernelCase, device: str = "cpu") -> tuple[Tables, Lookup]:
    """The tables and lookup of ``case`` on ``device``."""
    g = torch.Generator().manual_seed(case.seed)
    weights = tuple(
        (torch.randn(r, case.dim, generator=g)).to(device=device, dtype=case.dtype)
        for r in case.rows
    )
    tables = Tables(weights=weights, pooling=case.pooling)
    lookup = make_lookup(
        tables,
        batch_size=case.batch_size,
        pooling_factor=math.ceil(case.max_len / 2),
        seed=case.seed,
        weighted=case.weighted,
    )
    return tables, lookup


def magnitude(tables: Tables, lookup: Lookup) -> torch.Tensor:
    """The reference pooled over |weights| and |per-sample weights|: bounds summation error."""
    abs_tables = Tables(weights=tuple(w.abs() for w in tables.weights), pooling=tables.pooling)
    w = lookup.per_sample_weights
    abs_lookup = Lookup(
        indices=lookup.indices,
        offsets=lookup.offsets,
        batch_size=lookup.batch_size,
        per_sample_weights=None if w is None else w.abs(),
    )
    return KERNELS.build("torch", None, abs_tables)(abs_lookup)


def check_kernel(
    name: str,
    device: str = "cpu",
    seed: int = 0,
    cases: int = 8,
    options: Mapping[str, Any] | None = None,
) -> None:
    """Run kernel ``name`` (built with ``options``, validated into its Config) on ``cases`` random
    shapes and compare with the ``torch`` reference; raise ContractError naming the case on the
    first mismatch (bad options are a ConfigError from ``KERNELS.build``)."""
    rng = torch.Generator().manual_seed(seed)
    for i in range(cases):
        case = random_case(rng, seed * 1000 + i)
        tables, lookup = case_inputs(case, device)
        kernel = KERNELS.build(name, options, tables)
        if not isinstance(kernel, EmbeddingKernel):
            raise ContractError(f"{name}: {kernel!r} does not implement EmbeddingKernel")
        ref = KERNELS.build("torch", None, tables)(lookup)
        why = mismatch(kernel(lookup), ref, magnitude(tables, lookup), tables.dtype)
        if why:
            raise ContractError(f"embedding kernel {name!r} on {case}: {why}")
