"""Table-batched embedding bags in Triton: ``triton`` (one launch for all tables over one combined
row buffer) and ``triton-prefetch`` (the same with the next chunk's loads issued before the current
chunk is accumulated). Their Configs' fields (block_d, block_n, num_warps, bags_per_program,
prefetch) are the occupancy and latency-hiding levers an autotuner sweeps; ``TBEConfig`` is the
resolved launch shape the kernel and the ahead-of-time compiler take."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import triton  # type: ignore[import-untyped]
import triton.language as tl  # type: ignore[import-untyped]

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.embed.kernels.base import (
    KERNELS,
    KernelTraits,
    Lookup,
    Pooling,
    Tables,
    check_tables_match,
)

# triton.jit picks compiled or interpreted kernels when this module is imported.
_JIT_INTERPRETED = bool(triton.knobs.runtime.interpret)

_WARPS = (1, 2, 4, 8, 16)
_BLOCK_D = (16, 32, 64, 128, 256)
_BLOCK_N = (4, 8, 16, 32, 64)
_PREFETCH = (1, 2)
LAUNCH_SPACE: dict[str, tuple[int, ...]] = {
    "block_d": (16, 32, 64, 128, 256),
    "block_n": (8, 16, 32, 64),
    "num_warps": (1, 2, 4, 8),
    "bags_per_program": (1, 2, 4, 8),
}
"""The tunable launch fields of every Triton kernel (``triton``, ``hot-l2``)."""
PREFETCH_SPACE: dict[str, tuple[int, ...]] = {**LAUNCH_SPACE, "prefetch": _PREFETCH}
"""The launch fields and the prefetch distance (``triton-prefetch``, ``combined``)."""
GPU_SPACE: dict[str, tuple[int, ...]] = {
    "block_d": (128,),
    "block_n": (16, 32, 64),
    "num_warps": (4, 8),
    "bags_per_program": (1, 2),
}
"""The reduced grid the GPU benchmark tunes for D = 128 (12 points, 24 with the prefetch
distance); ``recperf embed compile`` sweeps it by default."""


@triton.jit
def _gather(buf_ptr, idx_ptr, psw_ptr, base, start, end, dim, d, d_ok, HAS_W, BLOCK_N):  # type: ignore[no-untyped-def]
    # One chunk of a bag: BLOCK_N ids from ``start`` (masked at ``end``) and their rows' d-block.
    n = start + tl.arange(0, BLOCK_N)
    n_ok = n < end
    rows = tl.load(idx_ptr + n, mask=n_ok, other=0) + base
    tile = tl.load(
        buf_ptr + rows[:, None] * dim + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0
    )
    w = tl.load(psw_ptr + n, mask=n_ok, other=0.0) if HAS_W else n_ok.to(tl.float32)
    return tile, w


@triton.jit
def _weigh(tile, w, HAS_W):  # type: ignore[no-untyped-def]
    # A chunk's rows in float32, each times its per-sample weight (masked rows are already 0).
    x = tile.to(tl.float32)
    if HAS_W:
        x = x * w[:, None]
    return x


@triton.jit
def _pool(buf_ptr, idx_ptr, psw_ptr, base, start, end, dim, d, d_ok, HAS_W, BLOCK_N, PREFETCH):  # type: ignore[no-untyped-def]
    # The float32 sum of one bag's (weighted) rows over the d-block ``d``. Chunks are added into
    # a [BLOCK_N, BLOCK_D] accumulator and its rows summed once at the end: summing each chunk
    # would cost a cross-warp reduction (shared memory and barriers) per chunk.
    acc = tl.zeros((BLOCK_N, d.shape[0]), dtype=tl.float32)
    if PREFETCH == 0:
        for s in range(start, end, BLOCK_N):
            t, w = _gather(buf_ptr, idx_ptr, psw_ptr, base, s, end, dim, d, d_ok, HAS_W, BLOCK_N)
            acc += _weigh(t, w, HAS_W)
    else:
        # Register double-buffering: the loads of the next PREFETCH chunks are in flight while
        # chunk s is added; loads past ``end`` are masked off and move no bytes.
        t0, w0 = _gather(buf_ptr, idx_ptr, psw_ptr, base, start, end, dim, d, d_ok, HAS_W, BLOCK_N)
        t1, w1 = t0, w0
        if PREFETCH == 2:
            s1 = start + BLOCK_N
            t1, w1 = _gather(buf_ptr, idx_ptr, psw_ptr, base, s1, end, dim, d, d_ok, HAS_W, BLOCK_N)
        for s in range(start, end, BLOCK_N):
            sn = s + PREFETCH * BLOCK_N
            tn, wn = _gather(buf_ptr, idx_ptr, psw_ptr, base, sn, end, dim, d, d_ok, HAS_W, BLOCK_N)
            acc += _weigh(t0, w0, HAS_W)
            if PREFETCH == 1:
                t0, w0 = tn, wn
            else:
                t0, w0 = t1, w1
                t1, w1 = tn, wn
    return tl.sum(acc, axis=0)


@triton.jit  # type: ignore[untyped-decorator]
def _tbe_kernel(  # type: ignore[no-untyped-def]
    buf_ptr, row_base_ptr, idx_ptr, off_ptr, psw_ptr, out_ptr, num_bags, batch, tables, dim,
    HAS_W: tl.constexpr, MEAN: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    BAGS: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    # Program (p, q) pools bags p*BAGS .. p*BAGS+BAGS-1 over columns q*BLOCK_D .. +BLOCK_D.
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < dim
    for i in tl.static_range(BAGS):
        bag = tl.program_id(0).to(tl.int64) * BAGS + i
        bag_ok = bag < num_bags
        start = tl.load(off_ptr + bag, mask=bag_ok, other=0)
        end = tl.load(off_ptr + bag + 1, mask=bag_ok, other=0)
        table = bag // batch
        base = tl.load(row_base_ptr + table, mask=bag_ok, other=0)
        acc = _pool(
            buf_ptr, idx_ptr, psw_ptr, base, start, end, dim, d, d_ok, HAS_W, BLOCK_N, PREFETCH
        )
        if MEAN:
            acc = acc / tl.maximum(end - start, 1).to(tl.float32)
        dst = out_ptr + (bag % batch) * tables * dim + table * dim + d
        # (bag broadcast to a vector first: the interpreter rejects vector & scalar masks)
        tl.store(dst, acc, mask=d_ok & (d * 0 + bag < num_bags))


def check_choice(field: str, value: object, allowed: tuple[int, ...]) -> None:
    """Raise ConfigError naming ``field`` and the ``allowed`` values unless ``value`` is one."""
    if value not in allowed:
        raise ConfigError(f"{field} = {value!r} is not one of {', '.join(map(str, allowed))}")


def check_launch(block_d: int | None, block_n: int, num_warps: int, bags_per_program: int) -> None:
    """The rules of the launch fields, shared by the kernels' Configs and ``TBEConfig``."""
    if block_d is not None:
        check_choice("block_d", block_d, _BLOCK_D)
    check_choice("block_n", block_n, _BLOCK_N)
    check_choice("num_warps", num_warps, _WARPS)
    check_range("bags_per_program", bags_per_program, 1, 64)


def check_prefetch(prefetch: int) -> None:
    """A prefetching variant loads 1 or 2 chunks ahead (0 would be the plain kernel)."""
    check_choice("prefetch", prefetch, _PREFETCH)


@dataclass(kw_only=True, slots=True, frozen=True)
class TritonConfig:
    """Options of ``triton``: the launch fields every table-batched Triton kernel shares."""

    block_d: int | None = None
    """Columns per program: 16, 32, 64, 128 or 256 (D is masked when not a multiple); None: the
    smallest covering D, at most 128."""
    block_n: int = 16
    """Ids gathered per chunk as one [block_n, block_d] tile: 4, 8, 16, 32 or 64."""
    num_warps: int = 4
    """Warps per program: 1, 2, 4, 8 or 16."""
    bags_per_program: int = 1
    """Bags each program pools one after the other, 1..64: fewer, fatter programs."""

    def __post_init__(self) -> None:
        check_launch(self.block_d, self.block_n, self.num_warps, self.bags_per_program)


@dataclass(kw_only=True, slots=True, frozen=True)
class TritonPrefetchConfig(TritonConfig):
    """Options of ``triton-prefetch``: the launch fields and the prefetch distance."""

    prefetch: int = 1
    """Chunks loaded ahead of the one being summed: 1 or 2."""

    def __post_init__(self) -> None:
        TritonConfig.__post_init__(self)  # (zero-argument super() fails in slots dataclasses)
        check_prefetch(self.prefetch)


@dataclass(kw_only=True, slots=True, frozen=True)
class TBEConfig:
    """The resolved launch shape of the table-batched kernel (what a launch and the compiler
    take); the kernels' Configs resolve to it through ``launch_config``."""

    block_d: int
    """Columns per program: 16, 32, 64, 128 or 256."""
    block_n: int = 16
    """Ids gathered per chunk: 4, 8, 16, 32 or 64."""
    num_warps: int = 4
    """Warps per program: 1, 2, 4, 8 or 16."""
    bags_per_program: int = 1
    """Bags each program pools, 1..64."""
    prefetch: int = 0
    """Chunks loaded ahead of the one being summed: 0 (none), 1 or 2."""

    def __post_init__(self) -> None:
        check_launch(self.block_d, self.block_n, self.num_warps, self.bags_per_program)
        check_choice("prefetch", self.prefetch, (0, *_PREFETCH))


def default_block_d(dim: int) -> int:
    """The smallest allowed block_d covering ``dim``, at most 128."""
    return next((b for b in _BLOCK_D if b >= min(dim, 128)), _BLOCK_D[-1])


def launch_config(config: TritonConfig, dim: int) -> TBEConfig:
    """The launch shape ``config`` gives tables of width ``dim``: ``block_d`` None covers D (at
    most 128); the prefetching kernels' Configs carry a ``prefetch`` field, the others none (0)."""
    return TBEConfig(
        block_d=config.block_d or default_block_d(dim),
        block_n=config.block_n,
        num_warps=config.num_warps,
        bags_per_program=config.bags_per_program,
        prefetch=getattr(config, "prefetch", 0),
    )


def require_triton(device: torch.device) -> None:
    """Raise ConfigError unless Triton can run kernels on ``device`` in this process."""
    interpret = bool(triton.knobs.runtime.interpret)
    if device.type != "cuda" and not interpret:
        raise ConfigError(
            "device: triton kernels need a CUDA device, or TRITON_INTERPRET=1 to run on the CPU "
            "(slowly)"
        )
    if interpret != _JIT_INTERPRETED:
        raise ConfigError(
            f"TRITON_INTERPRET: is {os.environ.get('TRITON_INTERPRET')!r} now but was "
            f"{int(_JIT_INTERPRETED)} when {__name__} was imported; set it before importing"
        )


def combine(weights: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """All tables in one contiguous ``[Σ rows, D]`` buffer and each table's first row in it."""
    buffer = torch.cat([w.contiguous() for w in weights]).contiguous()
    rows = torch.tensor([0] + [w.shape[0] for w in weights[:-1]], dtype=torch.int64)
    return buffer, torch.cumsum(rows, 0).to(buffer.device)


def kernel_args(
    buffer: torch.Tensor,
    row_base: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor | None,
    out: torch.Tensor,
    *,
    batch: int,
    pooling: Pooling,
    cfg: TBEConfig,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``_tbe_kernel``'s positional and keyword arguments for one launch (shared by the launch and
    the ahead-of-time compiler, so both see the same signature and specialisation)."""
    bags, num_tables, dim = int(offsets.shape[0]) - 1, int(out.shape[1]), int(buffer.shape[1])
    psw = out if weights is None else weights  # never read when HAS_W is False
    args = (buffer, row_base, indices, offsets, psw, out, bags, batch, num_tables, dim)
    kwargs = {
        "HAS_W": weights is not None,
        "MEAN": pooling == "mean",
        "BLOCK_D": cfg.block_d,
        "BLOCK_N": cfg.block_n,
        "BAGS": cfg.bags_per_program,
        "PREFETCH": cfg.prefetch,
        "num_warps": cfg.num_warps,
        # Fused multiply-adds for the weighted sums, asked for explicitly: Triton 3.9 warns when
        # its default is relied on (and that default flips in 3.10).
        "enable_fp_fusion": True,
    }
    return args, kwargs


def tbe_forward(
    buffer: torch.Tensor, row_base: torch.Tensor, lookup: Lookup, pooling: Pooling, cfg: TBEConfig
) -> torch.Tensor:
    """Pool ``lookup`` out of ``buffer`` (bag b of table t reads rows row_base[t] + id) in one
    launch; ``[B, T, D]`` float32."""
    b, bags = lookup.batch_size, lookup.num_bags
    num_tables, dim = bags // b, int(buffer.shape[1])
    out = torch.empty(b, num_tables, dim, dtype=torch.float32, device=buffer.device)
    args, kwargs = kernel_args(
        buffer, row_base, lookup.indices, lookup.offsets, lookup.per_sample_weights, out,
        batch=b, pooling=pooling, cfg=cfg,
    )  # fmt: skip
    grid = (triton.cdiv(bags, cfg.bags_per_program), triton.cdiv(dim, cfg.block_d))
    _tbe_kernel[grid](*args, **kwargs)
    return out


class TritonTBE:
    """``triton`` and ``triton-prefetch``: the tables combined once, one launch per lookup."""

    name: str

    def __init__(self, tables: Tables, name: str, config: TritonConfig) -> None:
        require_triton(tables.device)
        self.name = name
        self.tables = tables
        self.options = config
        self.config = launch_config(config, tables.dim)
        self.buffer, self.row_base = combine(tables.weights)

    def __call__(self, lookup: Lookup) -> torch.Tensor:
        check_tables_match(self.tables, lookup)
        return tbe_forward(self.buffer, self.row_base, lookup, self.tables.pooling, self.config)


TRITON_TRAITS = KernelTraits(layout="combined")
"""The table-batched Triton kernels: GPU (or interpreted), every table in one buffer."""


@KERNELS.register("triton", config=TritonConfig, space=LAUNCH_SPACE, traits=TRITON_TRAITS)
def make_triton(tables: Tables, *, config: TritonConfig) -> TritonTBE:
    """The plain table-batched kernel."""
    return TritonTBE(tables, "triton", config)


@KERNELS.register(
    "triton-prefetch", config=TritonPrefetchConfig, space=PREFETCH_SPACE, traits=TRITON_TRAITS
)
def make_triton_prefetch(tables: Tables, *, config: TritonPrefetchConfig) -> TritonTBE:
    """The table-batched kernel with ``config.prefetch`` (1 or 2) chunks loaded ahead."""
    return TritonTBE(tables, "triton-prefetch", config)
