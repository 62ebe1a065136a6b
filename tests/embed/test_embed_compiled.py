"""Ahead-of-time compilation of the Triton kernel for GPU architectures (no GPU needed): the
occupancy arithmetic, the ptxas parser, the per-shape loop, and real compiles for sm_90 and sm_80 in
a subprocess (this test process runs Triton in interpreter mode, set before the kernels were
imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import asdict, fields
from typing import Any

import pytest
import torch

from recperf.core.errors import ConfigError, RecperfError
from recperf.embed.kernels import compiled
from recperf.embed.kernels.compiled import (
    ARCHS,
    KernelResources,
    ShapeCompileError,
    arch,
    compile_shapes,
    compile_tbe,
    configs,
    loop_barriers,
    occupancy,
    parse_ptxas,
)
from recperf.embed.kernels.triton_tbe import TBEConfig

H100 = ARCHS[90]


def test_occupancy_limited_by_warps_registers_shared_and_nothing_fits() -> None:
    # 32 registers x 32 threads = 1024 per warp: 64 warps fit, the 64-warp cap binds first.
    o = occupancy(H100, 32, 4, 2048)
    assert (o.blocks_per_sm, o.warps_per_sm, o.fraction, o.limiter) == (16, 64, 1.0, "warps")
    # 128 registers: 4096 per warp, 16 warps per SM, 4 blocks of 4 warps.
    o = occupancy(H100, 128, 4, 0)
    assert (o.blocks_per_sm, o.fraction, o.limiter) == (4, 0.25, "registers")
    # 93 registers round up to 96 per thread (256-register warp granules): 65536 // (3072*4) = 5.
    assert occupancy(H100, 93, 4, 0).blocks_per_sm == 5
    # 100 KiB of shared memory (+1 KiB reserved) per block: 2 blocks in 228 KiB.
    o = occupancy(H100, 32, 4, 100 * 1024)
    assert (o.blocks_per_sm, o.limiter) == (2, "shared")
    # 255 registers x 16 warps needs 131072 registers: no block fits.
    o = occupancy(H100, 255, 16, 0)
    assert (o.blocks_per_sm, o.fraction) == (0, 0.0)
    # One-warp blocks hit the 32-block cap; Ada has 48 warps.
    assert occupancy(H100, 16, 1, 0).limiter == "blocks"
    assert occupancy(ARCHS[89], 32, 8, 0).warps_per_sm == 48


def test_arch_and_occupancy_reject_bad_input() -> None:
    with pytest.raises(ConfigError, match=r"arch: 75 is not one of 80, 86, 89, 90"):
        arch(75)
    with pytest.raises(ConfigError, match="num_warps"):
        occupancy(H100, 32, 0, 0)
    assert arch(90).ptxas_name == "sm_90a" and arch(80).ptxas_name == "sm_80"


def test_parse_ptxas_reads_registers_and_spills() -> None:
    text = (
        "ptxas info    : Compiling entry function '_tbe_kernel' for 'sm_90a'\n"
        "ptxas info    : Function properties for _tbe_kernel\n"
        "    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 48 registers, used 0 barriers\n"
    )
    u = parse_ptxas(text)
    assert (u.registers, u.spill_stores, u.spill_loads, u.stack_bytes) == (48, 8, 12, 16)
    with pytest.raises(RecperfError, match="no resource usage"):
        parse_ptxas("ptxas fatal : something else")


def test_compile_refuses_an_interpreted_process() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"  # tests/conftest.py, before any kernel import
    with pytest.raises(ConfigError, match="TRITON_INTERPRET"):
        compile_tbe(TBEConfig(block_d=128))


def _compile_cli(*args: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-c", "from recperf.cli.main import main; main()", "embed", "compile"]
    run = subprocess.run([*cmd, *args, "--json"], capture_output=True, text=True, env=env)
    if "ptxas is not available" in run.stderr:
        pytest.skip("this Triton has no bundled ptxas")
    assert run.returncode == 0, run.stderr[-2000:]
    data: dict[str, object] = json.loads(run.stdout)
    return data


@pytest.mark.slow
def test_kernel_compiles_for_hopper_with_prefetch_costing_registers() -> None:
    data = _compile_cli("--arch", "90", "--block-n", "16", "--num-warps", "4", "--bags", "1,2",
                        "--prefetch", "0,2")  # fmt: skip
    shapes = data["shapes"]
    assert isinstance(shapes, list) and len(shapes) == 4
    by = {(s["bags_per_program"], s["prefetch"]): s for s in shapes}
    for s in shapes:
        assert s["arch"] == 90 and 0 < s["registers"] <= 255
        assert 0 < s["occupancy"] <= 1 and s["blocks_per_sm"] >= 1
        assert s["vector_loads"] > 0  # D = 128 rows load as vectors
        assert s["loop_barriers"] == 0  # chunks are summed across warps once, after the loop
    # Two chunks in flight hold two more tiles in registers than none.
    assert by[(1, 2)]["registers"] > by[(1, 0)]["registers"]
    assert by[(1, 2)]["occupancy"] <= by[(1, 0)]["occupancy"]


@pytest.mark.slow
def test_kernel_compiles_for_ampere_fp16_weighted_mean_odd_dim() -> None:
    data = _compile_cli("--arch", "80", "--dtype", "fp16", "--weighted", "--pooling", "mean",
                        "--dim", "100", "--block-d", "32,128", "--block-n", "64",
                        "--num-warps", "8", "--bags", "4", "--prefetch", "1")  # fmt: skip
    shapes = data["shapes"]
    assert isinstance(shapes, list) and len(shapes) == 2
    for s in shapes:
        assert (s["arch"], s["fmt"], s["weighted"], s["pooling"]) == (80, "fp16", True, "mean")
        assert s["registers"] > 0 and s["blocks_per_sm"] >= 1


_COMPILE_FORMATS = """
    import json
    from recperf.embed.kernels.compiled import compile_tbe
    from recperf.embed.kernels.triton_tbe import TBEConfig
    cfg = TBEConfig(block_d=128, block_n=16, num_warps=4, prefetch=1)
    rows = [
        compile_tbe(cfg, cc=cc, fmt=fmt, weighted=True).to_json()
        for cc in (80, 90) for fmt in ("bf16", "fp8", "int8", "int4")
    ]
    print(json.dumps(rows))
"""


@pytest.mark.slow
def test_every_quantized_row_format_compiles_for_ampere_and_hopper() -> None:
    # sm_80 has no fp8 conversion instructions: fp8 compiling there shows the integer decode.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = textwrap.dedent(_COMPILE_FORMATS)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if "ptxas is not available" in run.stderr:
        pytest.skip("this Triton has no bundled ptxas")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(run.stdout)
    got = [(r["arch"], r["fmt"]) for r in rows]
    assert got == [(cc, f) for cc in (80, 90) for f in ("bf16", "fp8", "int8", "int4")]
    for r in rows:
        assert 0 < r["registers"] <= 255 and r["spill_bytes"] == 0, r
        assert r["vector_loads"] > 0, r  # D = 128 codes (int4: 64 bytes a row) load as vectors
        assert r["loop_barriers"] == 0 and r["blocks_per_sm"] >= 1, r


def test_stand_in_rows_are_laid_out_as_the_kernels_lay_out_tables() -> None:
    rows = compiled.stand_in_rows("int4", 128)
    assert rows.data.shape == (1, 64) and rows.data.dtype == torch.uint8
    # row 0's scale and bias just before its codes (4 bytes: the pointer's alignment at launch)
    assert rows.scale_bias.dtype == torch.float16
    assert rows.data.data_ptr() - rows.scale_bias.data_ptr() == 4
    assert compiled.stand_in_rows("bf16", 8).data.dtype == torch.bfloat16
    with pytest.raises(ConfigError, match=r"^dim: int4 packs two columns per byte; 5 is odd"):
        compiled.stand_in_rows("int4", 5)
    with pytest.raises(ConfigError, match=r"^fmt: 'int9' is not a row format"):
        compiled.stand_in_rows("int9", 4)


def _fake_compile_tbe(cfg: TBEConfig, **kwargs: Any) -> KernelResources:
    """Stands in for Triton: prefetch 1 does not compile; the others echo their arguments."""
    if cfg.prefetch == 1:
        raise ShapeCompileError(f"compile: prefetch={cfg.prefetch} failed")
    dims = {"registers": kwargs["dim"], "shared_bytes": kwargs["batch"]}
    return KernelResources(
        arch=kwargs["cc"],
        fmt=kwargs["fmt"],
        weighted=kwargs["weighted"],
        pooling=kwargs["pooling"],
        **asdict(cfg),
        **dims,
        spill_bytes=0,
        stack_bytes=0,
        vector_loads=kwargs["tables"],
        loop_barriers=0,
        blocks_per_sm=1,
        warps_per_sm=4,
        occupancy=0.0625,
        limiter="registers",
        compile_s=0.0,
    )


def test_compile_shapes_makes_one_row_per_shape_and_a_failed_shape_a_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compiled, "compile_tbe", _fake_compile_tbe)
    shapes = configs((64,), (16, 32), (4,), (1,), (0, 1))
    fractions: list[float] = []
    rows = compile_shapes(
        shapes, cc=80, fmt="int4", weighted=True, pooling="mean", dim=100, batch=512,
        tables=3, progress=fractions.append,
    )  # fmt: skip
    assert fractions == [0.25, 0.5, 0.75, 1.0]
    assert [(r["block_n"], r["prefetch"]) for r in rows] == [(16, 0), (16, 1), (32, 0), (32, 1)]
    assert rows[1] == {**asdict(shapes[1]), "error": "compile: prefetch=1 failed"}
    ok = rows[0]
    assert set(ok) == {f.name for f in fields(KernelResources)}
    setup = (80, "int4", True, "mean")
    assert (ok["arch"], ok["fmt"], ok["weighted"], ok["pooling"]) == setup
    assert (ok["registers"], ok["shared_bytes"], ok["vector_loads"]) == (100, 512, 3)
    assert compile_shapes([]) == []


def test_compile_shapes_raises_what_stops_every_shape() -> None:
    fractions: list[float] = []
    with pytest.raises(ConfigError, match="TRITON_INTERPRET"):  # this process is interpreted
        compile_shapes([TBEConfig(block_d=128)], progress=fractions.append)
    assert fractions == []


_COMPILE_SHAPES = """
    import json
    from recperf.embed.kernels.compiled import compile_shapes, compile_tbe, configs
    shapes = configs((128,), (16,), (4,), (1,), (0, 2))
    fractions = []
    rows = compile_shapes(shapes, cc=90, progress=fractions.append)
    direct = [compile_tbe(cfg, cc=90).to_json() for cfg in shapes]
    print(json.dumps({"rows": rows, "direct": direct, "fractions": fractions}))
"""


@pytest.mark.slow
def test_compile_shapes_for_hopper_equals_compiling_each_shape() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = textwrap.dedent(_COMPILE_SHAPES)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if "ptxas is not available" in run.stderr:
        pytest.skip("this Triton has no bundled ptxas")
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    rows, direct = out["rows"], out["direct"]
    assert out["fractions"] == [0.5, 1.0]
    shapes = [(r["block_d"], r["block_n"], r["prefetch"]) for r in rows]
    assert shapes == [(128, 16, 0), (128, 16, 2)]
    for row, same in zip(rows, direct, strict=True):
        setup = (row["arch"], row["fmt"], row["pooling"], row["weighted"])
        assert setup == (90, "fp32", "sum", False)
        assert 0 < row["registers"] <= 255 and row["loop_barriers"] == 0
        # the loop adds nothing to one shape's compile but its time
        assert {k: v for k, v in row.items() if k != "compile_s"} == {
            k: v for k, v in same.items() if k != "compile_s"
        }
    assert rows[1]["registers"] > rows[0]["registers"]  # two chunks in flight hold two more tiles


def test_compile_errors_name_the_innermost_cause() -> None:
    from recperf.embed.kernels.compiled import _root

    try:
        try:
            raise ValueError("arange's range must be a power of 2")
        except ValueError as inner:
            raise RuntimeError("at 16:14:\n    acc = _pool(\n          ^") from inner
    except RuntimeError as outer:
        assert _root(outer) == "ValueError: arange's range must be a power of 2"


_PTX = """
$L__BB0_3:                              // =>This Inner Loop Header: Depth=1
\tld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd24 + 0 ];
\t{BODY}
\t@%p12 bra \t$L__BB0_3;
\tbra.uni \t$L__BB0_4;
$L__BB0_4:
\tbar.sync \t0;
"""


def test_loop_barriers_counts_only_barriers_inside_loops() -> None:
    assert loop_barriers(_PTX.replace("{BODY}", "add.f32 %r5, %r1, %r2;")) == 0
    assert loop_barriers(_PTX.replace("{BODY}", "bar.sync \t0;\n\tbar.sync \t0;")) == 2
    assert loop_barriers("no loops here\nbar.sync 0;") == 0
    # A header LLVM left unmarked, and a forward branch that is no loop.
    unmarked = "$L__BB0_2:    // %.lr.ph\n bar.sync 0;\n @%p20 bra \t$L__BB0_2;\n"
    assert loop_barriers(unmarked) == 1
    assert loop_barriers("@%p1 bra \t$L__BB0_9;\n bar.sync 0;\n$L__BB0_9:\n") == 0
