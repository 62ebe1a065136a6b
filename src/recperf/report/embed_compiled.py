"""The embedding section's table of the table-batched Triton kernel compiled ahead of time for
Hopper on this machine (no GPU needed): registers, spills, loop barriers and occupancy per launch
shape, from ``recperf.embed.kernels.compiled``. Cells are escaped by ``table_html``."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from recperf.core.errors import RecperfError
from recperf.report.section import fmt_num, table_html

COMPILE_ARCH = 90
COMPILE_DIM = 128
"""The kernel is compiled as ``recperf embed compile`` does by default: fp32, sum pooling,
D = 128 (the paper configuration's), batch 2048, 12 tables."""
COMPILE_GRID = {"block_n": (16, 32, 64), "num_warps": (4, 8), "bags_per_program": (1,),
                "prefetch": (0, 1, 2)}  # fmt: skip
QUICK_COMPILE_GRID = {"block_n": (16,), "num_warps": (4,), "bags_per_program": (1,),
                      "prefetch": (0, 2)}  # fmt: skip
"""Launch shapes compiled for the section (block_d covers D)."""


def compile_for_gpu(quick: bool) -> dict[str, Any]:
    """The table-batched kernel compiled for ``COMPILE_ARCH`` over the section's launch shapes,
    as ``recperf embed compile --json`` writes it; ``{"error": why}`` where nothing compiles
    here: no triton, no ptxas, or Triton interpreted in this process (TRITON_INTERPRET=1 when
    the kernels were imported, which cannot be undone in-process)."""
    try:  # triton is optional
        from recperf.embed.kernels.compiled import arch, compile_shapes, configs
        from recperf.embed.kernels.triton_tbe import default_block_d
    except ModuleNotFoundError as exc:
        if exc.name != "triton":
            raise
        return {"error": str(exc)}
    grid = QUICK_COMPILE_GRID if quick else COMPILE_GRID
    try:
        shapes = configs((default_block_d(COMPILE_DIM),), **grid)
        rows = compile_shapes(shapes, cc=COMPILE_ARCH, dim=COMPILE_DIM)
    except RecperfError as exc:
        return {"error": str(exc)}
    return {"arch": COMPILE_ARCH, "gpus": arch(COMPILE_ARCH).gpus, "shapes": rows}


def compiled_html(compiled: Mapping[str, Any]) -> str:
    """What each compiled launch shape costs, as a paragraph and a table (a shape that did not
    compile is a row with its error), or the one line saying why nothing compiled."""
    if "error" in compiled:
        why = f"The Triton kernel could not be compiled for sm_{COMPILE_ARCH}: {compiled['error']}"
        return f"<p>{html.escape(why)}</p>"
    arch, gpus = compiled.get("arch", COMPILE_ARCH), compiled.get("gpus", "")
    text = (
        f"The table-batched Triton kernel compiled for sm_{arch} ({gpus}) on this machine, no GPU "
        f"needed (recperf embed compile): what each launch shape costs a multiprocessor. Not "
        f"timings: deeper prefetching and bigger chunks hold more registers and leave fewer "
        f"resident warps; the autotuner weighs that on the device."
    )
    header = ["block_n", "warps", "prefetch", "registers", "spilled bytes", "barriers in loop",
              "occupancy", "limited by"]  # fmt: skip
    rows = [
        [s["block_n"], s["num_warps"], s["prefetch"], "", "", "", "", s["error"]]
        if "error" in s
        else [
            s["block_n"],
            s["num_warps"],
            s["prefetch"],
            s["registers"],
            s["spill_bytes"],
            s["loop_barriers"],
            f"{fmt_num(100.0 * float(s['occupancy']), 1)}%",
            s["limiter"],
        ]
        for s in compiled.get("shapes", [])
    ]
    block_d = {s.get("block_d") for s in compiled.get("shapes", [])}
    caption = (
        f"Launch shapes (block_d {', '.join(map(str, sorted(block_d)))}, fp32, one bag per "
        f"program) compiled for sm_{arch}: registers per thread, spills, barriers inside the "
        f"gather loop, and theoretical occupancy."
    )
    return f"<p>{html.escape(text)}</p>" + table_html(header, rows, caption=caption, left_cols=0)
