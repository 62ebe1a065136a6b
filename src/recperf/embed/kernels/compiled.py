"""Compile the table-batched Triton kernel ahead of time for an NVIDIA architecture, on any machine
(no GPU: Triton's own ptxas turns the PTX into machine code), and read what each launch shape costs
the multiprocessor: registers, spills, shared memory, and the theoretical occupancy they leave.

This is the occupancy lever seen before any timing: ``block_n`` x ``block_d`` tiles, prefetch
buffers and ``num_warps`` trade registers per thread against resident warps. The compile uses the
specialisation the launch would (argument dtypes, 16-byte alignment, divisibility), so a shape that
compiles here compiles at launch. Triton must not be in interpreter mode in this process."""

from __future__ import annotations

import math
import re
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from recperf.core.errors import ConfigError, RecperfError
from recperf.core.progress import ProgressFn
from recperf.embed.kernels.base import Pooling, Tables
from recperf.embed.kernels.formats import check_format, quantize
from recperf.embed.kernels.rowbuffer import RowBuffer, combine
from recperf.embed.kernels.triton_tbe import _JIT_INTERPRETED, TBEConfig, _tbe_kernel, kernel_args


class ShapeCompileError(RecperfError):
    """One launch shape did not compile (the kernel, the shape or the architecture's limits)."""


RESERVED_SHARED = 1024
"""Shared memory the driver reserves per resident block on compute capability 8.0 and newer."""


@dataclass(frozen=True, slots=True)
class Arch:
    """The per-multiprocessor limits of one compute capability (CUDA's occupancy tables)."""

    cc: int
    gpus: str
    max_warps: int
    max_blocks: int
    shared_bytes: int
    registers: int = 65_536
    register_unit: int = 256
    """Registers are allocated to a warp in multiples of this."""

    @property
    def ptxas_name(self) -> str:
        # Triton builds Hopper code for the architecture-specific sm_90a.
        return f"sm_{self.cc}a" if self.cc == 90 else f"sm_{self.cc}"


ARCHS: dict[int, Arch] = {
    80: Arch(cc=80, gpus="A100, A30", max_warps=64, max_blocks=32, shared_bytes=164 * 1024),
    86: Arch(cc=86, gpus="A10, A40, RTX 30", max_warps=48, max_blocks=16, shared_bytes=100 * 1024),
    89: Arch(cc=89, gpus="L4, L40, RTX 40", max_warps=48, max_blocks=24, shared_bytes=100 * 1024),
    90: Arch(cc=90, gpus="H100, H200", max_warps=64, max_blocks=32, shared_bytes=228 * 1024),
}


def arch(cc: int) -> Arch:
    """The limits of compute capability ``cc`` (80, 86, 89 or 90)."""
    if cc not in ARCHS:
        raise ConfigError(f"arch: {cc!r} is not one of {', '.join(map(str, ARCHS))}")
    return ARCHS[cc]


@dataclass(frozen=True, slots=True)
class Occupancy:
    blocks_per_sm: int
    warps_per_sm: int
    fraction: float
    """Resident warps over the architecture's maximum."""
    limiter: str
    """What caps the resident blocks: warps, blocks, registers or shared."""


def occupancy(limits: Arch, registers: int, num_warps: int, shared_bytes: int) -> Occupancy:
    """Theoretical occupancy of a ``num_warps``-warp block using ``registers`` per thread and
    ``shared_bytes`` of shared memory (0 blocks when one block does not fit)."""
    if registers < 0 or num_warps < 1 or shared_bytes < 0:
        raise ConfigError("occupancy: registers and shared_bytes must be >= 0, num_warps >= 1")
    per_warp = math.ceil(registers * 32 / limits.register_unit) * limits.register_unit
    caps = {
        "warps": limits.max_warps // num_warps,
        "blocks": limits.max_blocks,
        "registers": limits.registers // (per_warp * num_warps) if per_warp else limits.max_blocks,
        "shared": limits.shared_bytes // (shared_bytes + RESERVED_SHARED),
    }
    limiter = min(caps, key=lambda k: caps[k])  # first of equals: warps, blocks, registers, shared
    blocks = caps[limiter]
    warps = blocks * num_warps
    return Occupancy(blocks, warps, warps / limits.max_warps, limiter)


@dataclass(frozen=True, slots=True)
class PtxasUsage:
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int


_REGS = re.compile(r"Used (\d+) registers")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas(text: str) -> PtxasUsage:
    """Registers, spills and stack of the one entry function in ``ptxas -v`` output."""
    regs, frame = _REGS.search(text), _FRAME.search(text)
    if regs is None or frame is None:
        raise RecperfError(f"compile: ptxas -v printed no resource usage: {text.strip()[:200]!r}")
    stack, stores, loads = (int(x) for x in frame.groups())
    return PtxasUsage(int(regs.group(1)), stores, loads, stack)


@dataclass(frozen=True, slots=True)
class KernelResources:
    """One launch shape compiled for one architecture."""

    arch: int
    fmt: str
    """The row format (``formats.ROW_FORMATS``)."""
    weighted: bool
    pooling: str
    block_d: int
    block_n: int
    num_warps: int
    bags_per_program: int
    prefetch: int
    registers: int
    spill_bytes: int
    """Spill stores plus spill loads per thread (0 for a shape that fits in registers)."""
    stack_bytes: int
    shared_bytes: int
    vector_loads: int
    """``ld.global`` instructions in the PTX moving 2, 4 or 8 elements at once."""
    loop_barriers: int
    """Barriers inside the gather loop (see ``loop_barriers``)."""
    blocks_per_sm: int
    warps_per_sm: int
    occupancy: float
    limiter: str
    compile_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_VECTOR_LOAD = re.compile(r"\bld\.global(?:\.\w+)*\.v[248]\b")
_LABEL = re.compile(r"^\s*(\$L\w+):", re.MULTILINE)
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L\w+);")
_BARRIER = re.compile(r"\bbar(?:rier)?\.sync\b")


def loop_barriers(ptx: str) -> int:
    """``bar.sync`` instructions inside loops: a loop spans from a label to a later branch back
    to it (LLVM does not always mark the header). The gather loop should have none: a barrier
    there makes every warp of the program wait for the slowest at every chunk."""
    labels = {m.group(1): m.start() for m in _LABEL.finditer(ptx)}
    spans = sorted(
        (labels[m.group(1)], m.start())
        for m in _BRANCH.finditer(ptx)
        if labels.get(m.group(1), len(ptx)) < m.start()
    )
    merged: list[list[int]] = []
    for a, b in spans:  # nested or overlapping loops count their barriers once
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return sum(len(_BARRIER.findall(ptx, a, b)) for a, b in merged)


def _ptxas(cc: int) -> str:
    try:
        from triton.backends.nvidia.compiler import get_ptxas  # type: ignore[import-untyped]

        path: str = get_ptxas(cc).path
    except Exception as exc:  # Triton without its NVIDIA backend, or another layout
        raise RecperfError(f"compile: Triton's ptxas is not available: {exc}") from exc
    return path


def _root(exc: BaseException) -> str:
    """The innermost cause's type and last line (Triton wraps it in source listings)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:300]


def _shape(cfg: TBEConfig) -> str:
    return (
        f"block_d={cfg.block_d} block_n={cfg.block_n} num_warps={cfg.num_warps} "
        f"bags_per_program={cfg.bags_per_program} prefetch={cfg.prefetch}"
    )


def stand_in_rows(fmt: str, dim: int) -> RowBuffer:
    """One zero row of width ``dim`` in ``fmt``, laid out as the kernels lay out their tables (so
    its pointers have the launch's alignment and its row stride the launch's); a ConfigError
    naming the field for a width the format cannot hold (int4 with an odd ``dim``)."""
    data, sb = quantize(torch.zeros(1, dim), check_format(fmt, "fmt"))
    return combine(Tables(weights=(data,), fmt=fmt, scale_bias=None if sb is None else (sb,)))


def compile_tbe(
    cfg: TBEConfig,
    *,
    cc: int = 90,
    fmt: str = "fp32",
    weighted: bool = False,
    pooling: Pooling = "sum",
    dim: int = 128,
    batch: int = 2048,
    tables: int = 12,
) -> KernelResources:
    """Compile ``_tbe_kernel`` for compute capability ``cc`` with ``cfg``, rows in ``fmt`` (any row
    format) and these shapes (the integer arguments are specialised as at launch, e.g. on
    divisibility by 16)."""
    import triton  # type: ignore[import-untyped]
    from triton.backends.compiler import GPUTarget  # type: ignore[import-untyped]
    from triton.compiler import ASTSource, make_backend  # type: ignore[import-untyped]
    from triton.runtime.jit import create_function_from_signature  # type: ignore[import-untyped]

    limits = arch(cc)
    if _JIT_INTERPRETED:
        raise ConfigError(
            "compile: TRITON_INTERPRET=1 was set when the kernels were imported; unset it to "
            "compile for a GPU"
        )
    for name, value in (("dim", dim), ("batch", batch), ("tables", tables)):
        if value < 1:
            raise ConfigError(f"{name}: {value} must be >= 1")
    # Small CPU stand-ins: only dtypes, alignment and the integer arguments reach the compiler.
    rows = stand_in_rows(fmt, dim)
    ids = torch.zeros(2, dtype=torch.int64)
    args, kwargs = kernel_args(
        rows,
        torch.zeros(tables, dtype=torch.int64),
        ids,
        torch.zeros(tables * batch + 1, dtype=torch.int64),
        torch.ones(2) if weighted else None,
        torch.empty(batch, tables, dim),
        batch=batch,
        pooling=pooling,
        cfg=cfg,
    )
    t0 = time.perf_counter()
    target = GPUTarget("cuda", cc, 32)
    try:
        backend = make_backend(target)
        binder = create_function_from_signature(_tbe_kernel.signature, _tbe_kernel.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = _tbe_kernel._pack_args(
            backend, kwargs, bound, specialization, options
        )
        source = ASTSource(_tbe_kernel, signature, constexprs, attrs)
    except (AttributeError, TypeError) as exc:  # Triton's internals moved
        raise RecperfError(
            f"compile: this Triton ({triton.__version__}) is not supported: {exc}"
        ) from exc
    try:
        kernel = triton.compile(source, target=target, options=options.__dict__)
    except Exception as exc:  # Triton's CompilationError, ptxas errors, out of resources
        raise ShapeCompileError(f"compile: {_shape(cfg)} failed for sm_{cc}: {_root(exc)}") from exc
    ptx: str = kernel.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "tbe.ptx"
        src.write_text(ptx)
        run = subprocess.run(
            [_ptxas(cc), "-v", f"--gpu-name={limits.ptxas_name}", str(src), "-o", f"{tmp}/o"],
            capture_output=True,
            text=True,
            check=False,
        )
    if run.returncode != 0:
        raise RecperfError(f"compile: ptxas failed: {(run.stderr or run.stdout).strip()[:300]}")
    usage = parse_ptxas(run.stdout + run.stderr)
    shared = int(kernel.metadata.shared)
    occ = occupancy(limits, usage.registers, cfg.num_warps, shared)
    return KernelResources(
        arch=cc,
        fmt=fmt,
        weighted=weighted,
        pooling=pooling,
        block_d=cfg.block_d,
        block_n=cfg.block_n,
        num_warps=cfg.num_warps,
        bags_per_program=cfg.bags_per_program,
        prefetch=cfg.prefetch,
        registers=usage.registers,
        spill_bytes=usage.spill_stores + usage.spill_loads,
        stack_bytes=usage.stack_bytes,
        shared_bytes=shared,
        vector_loads=len(_VECTOR_LOAD.findall(ptx)),
        loop_barriers=loop_barriers(ptx),
        blocks_per_sm=occ.blocks_per_sm,
        warps_per_sm=occ.warps_per_sm,
        occupancy=occ.fraction,
        limiter=occ.limiter,
        compile_s=time.perf_counter() - t0,
    )


def compile_shapes(
    shapes: Sequence[TBEConfig],
    *,
    cc: int = 90,
    fmt: str = "fp32",
    weighted: bool = False,
    pooling: Pooling = "sum",
    dim: int = 128,
    batch: int = 2048,
    tables: int = 12,
    progress: ProgressFn | None = None,
) -> list[dict[str, object]]:
    """``compile_tbe`` each launch shape in turn: one row per shape, its ``KernelResources`` JSON,
    or the shape's fields and ``error`` where that shape alone did not compile. Anything that
    stops every shape (the interpreter on, no ptxas, a bad argument) raises. ``progress`` gets
    the fraction of shapes done after each."""
    rows: list[dict[str, object]] = []
    for i, cfg in enumerate(shapes):
        try:
            res = compile_tbe(
                cfg, cc=cc, fmt=fmt, weighted=weighted, pooling=pooling, dim=dim,
                batch=batch, tables=tables,
            )  # fmt: skip
            rows.append(res.to_json())
        except ShapeCompileError as exc:  # a shape that does not compile is a row, not the end
            rows.append({**asdict(cfg), "error": str(exc)})
        if progress is not None:
            progress((i + 1) / len(shapes))
    return rows


def configs(
    block_d: Sequence[int],
    block_n: Sequence[int],
    num_warps: Sequence[int],
    bags_per_program: Sequence[int],
    prefetch: Sequence[int],
) -> list[TBEConfig]:
    """Every combination, each validated (an unknown value is a ConfigError naming it)."""
    return [
        TBEConfig(block_d=d, block_n=n, num_warps=w, bags_per_program=b, prefetch=p)
        for d in block_d
        for n in block_n
        for w in num_warps
        for b in bags_per_program
        for p in prefetch
    ]
