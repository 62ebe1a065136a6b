"""Table-batched embedding bags in Triton: ``triton`` (one launch for all tables over one combined
row buffer) and ``triton-prefetch`` (the same with the next chunk's loads issued before the current
chunk is accumulated), reading every row format: one kernel body, the format a compile-time switch
(``FMT``), the rows loaded as stored and dequantized in registers, pooled in float32. Their
Configs' fields (block_d, block_n, num_warps, bags_per_program,
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
from recperf.embed.kernels.formats import INTEGER_FORMATS, ROW_FORMATS, dim_of
from recperf.embed.kernels.rowbuffer import RowBuffer, combine, table_bases

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
def _gather(  # type: ignore[no-untyped-def]
    buf_ptr, sb_ptr, idx_ptr, psw_ptr, base, start, end, stride, c, c_ok, HAS_W, BLOCK_N, FMT
):  # fmt: skip
    # One chunk of a bag: BLOCK_N ids from ``start`` (masked at ``end``), their rows' stored
    # columns ``c`` (floats or codes; int4: bytes, two columns each) and, for int8/int4, their
    # scale and bias. Nothing is converted here, so a prefetched chunk's loads stay in flight
    # until ``_weigh`` uses them.
    n = start + tl.arange(0, BLOCK_N)
    n_ok = n < end
    rows = tl.load(idx_ptr + n, mask=n_ok, other=0) + base
    tile = tl.load(
        buf_ptr + rows[:, None] * stride + c[None, :], mask=n_ok[:, None] & c_ok[None, :], other=0
    )
    w = tl.load(psw_ptr + n, mask=n_ok, other=0.0) if HAS_W else n_ok.to(tl.float32)
    if FMT == "int8" or FMT == "int4":
        # Row r's scale and bias lie 4r bytes before row 0's (rowbuffer.combine); masked rows
        # get 0 and 0, so their codes (also 0) pool to exactly 0.
        scale = tl.load(sb_ptr - 2 * rows, mask=n_ok, other=0.0)
        bias = tl.load(sb_ptr - 2 * rows + 1, mask=n_ok, other=0.0)
    else:
        scale = w
        bias = w
    return tile, scale, bias, w


@triton.jit
def _fp8_e4m3(code):  # type: ignore[no-untyped-def]
    # e4m3fn bytes to float32 by integer operations, so every architecture (sm_80 has no fp8
    # conversion) and the interpreter decode alike, exactly: a normal number's exponent is
    # re-biased (7 -> 127) and its 3 mantissa bits moved up; a subnormal is m * 2^-9; 0x7F (with
    # either sign) is NaN, and there are no infinities.
    bits = code.to(tl.int32)
    mag = bits & 0x7F
    normal = tl.where(mag == 0x7F, 0x7FC00000, (mag << 20) + (120 << 23)).to(
        tl.float32, bitcast=True
    )
    x = tl.where(mag < 8, (mag & 7).to(tl.float32) * 0.001953125, normal)
    return tl.where((bits & 0x80) != 0, -x, x)


@triton.jit
def _dequant(q, scale, bias):  # type: ignore[no-untyped-def]
    # q * scale + bias per row, multiplied and then added: two roundings, as the reference's
    # dequantized rows (the launch turns FMA contraction off for these formats).
    return q.to(tl.float32) * scale.to(tl.float32)[:, None] + bias.to(tl.float32)[:, None]


@triton.jit
def _weigh(tile, scale, bias, w, HAS_W, FMT):  # type: ignore[no-untyped-def]
    # A chunk's rows in float32, dequantized in registers, each times its per-sample weight
    # (masked rows are already 0): two tiles, the even and the odd columns, for int4 (one byte
    # holds column 2k in its low nibble and 2k + 1 in its high one); the same tile twice else.
    if FMT == "int4":
        x = _dequant(tile & 0xF, scale, bias)
        y = _dequant(tile >> 4, scale, bias)
    elif FMT == "int8":
        x = _dequant(tile, scale, bias)
        y = x
    elif FMT == "fp8":
        x = _fp8_e4m3(tile)
        y = x
    else:
        x = tile.to(tl.float32)
        y = x
    if HAS_W:
        x = x * w[:, None]
        y = y * w[:, None]
    return x, y


@triton.jit
def _pool(  # type: ignore[no-untyped-def]
    buf_ptr, sb_ptr, idx_ptr, psw_ptr, base, start, end, stride, c, c_ok, HAS_W, BLOCK_N, PREFETCH,
    FMT,
):  # fmt: skip
    # The float32 sum of one bag's (weighted) rows over the stored columns ``c`` (int4: also the
    # odd columns' sum). Chunks are added into a [BLOCK_N, len(c)] accumulator and its rows summed
    # once at the end: summing each chunk would cost a cross-warp reduction (shared memory and
    # barriers) per chunk.
    acc = tl.zeros((BLOCK_N, c.shape[0]), dtype=tl.float32)
    odd = tl.zeros((BLOCK_N, c.shape[0]), dtype=tl.float32)
    if PREFETCH == 0:
        for s in range(start, end, BLOCK_N):
            t, k, b, w = _gather(
                buf_ptr, sb_ptr, idx_ptr, psw_ptr, base, s, end, stride, c, c_ok, HAS_W, BLOCK_N,
                FMT,
            )  # fmt: skip
            x, y = _weigh(t, k, b, w, HAS_W, FMT)
            acc += x
            if FMT == "int4":
                odd += y
    else:
        # Register double-buffering: the loads of the next PREFETCH chunks are in flight while
        # chunk s is added; loads past ``end`` are masked off and move no bytes.
        t0, k0, b0, w0 = _gather(
            buf_ptr, sb_ptr, idx_ptr, psw_ptr, base, start, end, stride, c, c_ok, HAS_W, BLOCK_N,
            FMT,
        )  # fmt: skip
        t1, k1, b1, w1 = t0, k0, b0, w0
        if PREFETCH == 2:
            t1, k1, b1, w1 = _gather(
                buf_ptr, sb_ptr, idx_ptr, psw_ptr, base, start + BLOCK_N, end, stride, c, c_ok,
                HAS_W, BLOCK_N, FMT,
            )  # fmt: skip
        for s in range(start, end, BLOCK_N):
            tn, kn, bn, wn = _gather(
                buf_ptr, sb_ptr, idx_ptr, psw_ptr, base, s + PREFETCH * BLOCK_N, end, stride, c,
                c_ok, HAS_W, BLOCK_N, FMT,
            )  # fmt: skip
            x, y = _weigh(t0, k0, b0, w0, HAS_W, FMT)
            acc += x
            if FMT == "int4":
                odd += y
            if PREFETCH == 1:
                t0, k0, b0, w0 = tn, kn, bn, wn
            else:
                t0, k0, b0, w0 = t1, k1, b1, w1
                t1, k1, b1, w1 = tn, kn, bn, wn
    return tl.sum(acc, axis=0), tl.sum(odd, axis=0)


@triton.jit  # type: ignore[untyped-decorator]
def _tbe_kernel(  # type: ignore[no-untyped-def]
    buf_ptr, sb_ptr, row_base_ptr, idx_ptr, off_ptr, psw_ptr, out_ptr, num_bags, batch, tables,
    dim, stride,
    HAS_W: tl.constexpr, MEAN: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    BAGS: tl.constexpr, PREFETCH: tl.constexpr, FMT: tl.constexpr,
):  # fmt: skip
    # Program (p, q) pools bags p*BAGS .. p*BAGS+BAGS-1 over columns q*BLOCK_D .. +BLOCK_D. A row
    # is ``stride`` stored columns of ``buf_ptr``: D, or D/2 bytes of int4 codes, which a program
    # loads BLOCK_D/2 at a time (contiguous bytes, so they load as vectors) and stores as the
    # even and the odd output columns.
    if FMT == "int4":
        c = tl.program_id(1) * (BLOCK_D // 2) + tl.arange(0, BLOCK_D // 2)
    else:
        c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    c_ok = c < stride
    for i in tl.static_range(BAGS):
        bag = tl.program_id(0).to(tl.int64) * BAGS + i
        bag_ok = bag < num_bags
        start = tl.load(off_ptr + bag, mask=bag_ok, other=0)
        end = tl.load(off_ptr + bag + 1, mask=bag_ok, other=0)
        table = bag // batch
        base = tl.load(row_base_ptr + table, mask=bag_ok, other=0)
        acc, odd = _pool(
            buf_ptr, sb_ptr, idx_ptr, psw_ptr, base, start, end, stride, c, c_ok, HAS_W, BLOCK_N,
            PREFETCH, FMT,
        )  # fmt: skip
        if MEAN:
            length = tl.maximum(end - start, 1).to(tl.float32)
            acc = acc / length
            odd = odd / length
        dst = out_ptr + (bag % batch) * tables * dim + table * dim
        # (bag broadcast to a vector first: the interpreter rejects vector & scalar masks)
        ok = c_ok & (c * 0 + bag < num_bags)
        if FMT == "int4":
            tl.store(dst + 2 * c, acc, mask=ok)
            tl.store(dst + 2 * c + 1, odd, mask=ok)
        else:
            tl.store(dst + c, acc, mask=ok)


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


def kernel_args(
    rows: RowBuffer,
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
    bags, num_tables, dim = int(offsets.shape[0]) - 1, int(out.shape[1]), int(out.shape[2])
    psw = out if weights is None else weights  # never read when HAS_W is False
    buf, stride = rows.data, int(rows.data.shape[1])
    args = (buf, rows.scale_bias, row_base, indices, offsets, psw, out, bags, batch, num_tables,
            dim, stride)  # fmt: skip
    kwargs = {
        "HAS_W": weights is not None,
        "MEAN": pooling == "mean",
        "BLOCK_D": cfg.block_d,
        "BLOCK_N": cfg.block_n,
        "BAGS": cfg.bags_per_program,
        "PREFETCH": cfg.prefetch,
        "FMT": rows.fmt,
        "num_warps": cfg.num_warps,
        # Fused multiply-adds for the weighted sums, asked for explicitly (Triton 3.9 warns when
        # its default is relied on, and that default flips in 3.10); off for int8/int4 rows, so
        # that q * scale + bias rounds twice, as the reference's dequantized rows do.
        "enable_fp_fusion": rows.fmt not in INTEGER_FORMATS,
    }
    return args, kwargs


def tbe_forward(
    rows: RowBuffer, row_base: torch.Tensor, lookup: Lookup, pooling: Pooling, cfg: TBEConfig
) -> torch.Tensor:
    """Pool ``lookup`` out of ``rows`` (bag b of table t reads rows row_base[t] + id) in one
    launch; ``[B, T, D]`` float32."""
    b, bags = lookup.batch_size, lookup.num_bags
    num_tables, dim = bags // b, dim_of(rows.fmt, int(rows.data.shape[1]))
    out = torch.empty(b, num_tables, dim, dtype=torch.float32, device=rows.data.device)
    args, kwargs = kernel_args(
        rows, row_base, lookup.indices, lookup.offsets, lookup.per_sample_weights, out,
        batch=b, pooling=pooling, cfg=cfg,
    )  # fmt: skip
    grid = (triton.cdiv(bags, cfg.bags_per_program), triton.cdiv(dim, cfg.block_d))
    _tbe_kernel[grid](*args, **kwargs)
    return out


class TritonTBE:
    """``triton`` and ``triton-prefetch``: the tables combined once (in their row format), one
    launch per lookup."""

    name: str

    def __init__(self, tables: Tables, name: str, config: TritonConfig) -> None:
        require_triton(tables.device)
        self.name = name
        self.tables = tables
        self.options = config
        self.config = launch_config(config, tables.dim)
        self.rows = combine(tables)
        self.row_base = table_bases(tables).to(tables.device)

    def __call__(self, lookup: Lookup) -> torch.Tensor:
        check_tables_match(self.tables, lookup)
        return tbe_forward(self.rows, self.row_base, lookup, self.tables.pooling, self.config)


TRITON_TRAITS = KernelTraits(formats=frozenset(ROW_FORMATS), layout="combined")
"""The table-batched Triton kernels: GPU (or interpreted), every table in one buffer, every row
format (fp8 too: decoded by integer operations, so sm_80 reads it as sm_89+ does)."""


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
