"""The hot-row remap on the CPU (issue 6): the ``torch`` reference against ``torch-hot`` (the
same pooling over tables whose hottest rows were moved to the front), on the bundled reuse
trace and on uniform ids, for the ``paper`` tables (12 x 500,000 x 128, 150 ids per bag) at a
CPU-sized batch. Calls are interleaved (reference, remapped pooling, remap + pooling, ...) over
rotating batches and compared by their medians, so machine noise hits all three alike.

    python benchmarks/embed_cpu.py [--batch-size 64] [--calls 60] [--hot-fraction 0.02,0.1,0.3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import recperf.embed.bench as eb
from recperf.embed import traces
from recperf.embed.kernels import KERNELS, Lookup
from recperf.embed.model import config, random_tables


def interleaved(fns: list[Any], inputs: list[list[Any]], calls: int) -> list[float]:
    """Median seconds of each fn, calling them in turn on the same rotating batch index."""
    times: list[list[float]] = [[] for _ in fns]
    for i in range(calls + 3):
        for k, fn in enumerate(fns):
            x = inputs[k][i % len(inputs[k])]
            t0 = time.perf_counter()
            fn(x)
            if i >= 3:
                times[k].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def run(trace_name: str, fraction: float, args: argparse.Namespace) -> dict[str, Any]:
    cfg = config("paper", batch_size=args.batch_size)
    rows = None if trace_name == "reuse-medium-500k" else 500_000
    trace = traces.resolve(trace_name, rows=rows, tables=cfg.num_tables, seed=args.seed)
    tables = random_tables(cfg, torch.float32, "cpu", args.seed)
    lookups = eb.make_lookups(cfg, trace, args.inputs, "cpu")
    eb.CPU_HOT_FRACTION = fraction
    hot = eb.hot_rows_for(cfg, trace, tables)
    ref = KERNELS.build("torch", None, tables)
    hot_kernel = KERNELS.build("torch-hot", None, tables, hot_rows=hot)
    remapped = [
        Lookup(
            indices=torch.cat(
                [
                    hot_kernel._remap[t][s]  # type: ignore[attr-defined]
                    for t, s in enumerate(hot_kernel._segments(lk))
                ]
            ),  # type: ignore[attr-defined]
            offsets=lk.offsets,
            batch_size=lk.batch_size,
        )
        for lk in lookups
    ]
    pool = super(type(hot_kernel), hot_kernel).__call__  # the reference pooling, permuted tables
    assert torch.allclose(pool(remapped[0]), ref(lookups[0]), rtol=1e-5, atol=1e-6)
    t_ref, t_pool, t_all = interleaved(
        [ref, pool, hot_kernel], [lookups, remapped, lookups], args.calls
    )
    return {
        "trace": trace_name,
        "hot_fraction": fraction,
        "hot_rows_per_table": int(hot[0].numel()),
        "reference_ms": t_ref * 1e3,
        "remapped_pooling_ms": t_pool * 1e3,
        "remap_and_pooling_ms": t_all * 1e3,
        "pooling_speedup": t_ref / t_pool,
        "speedup_with_remap": t_ref / t_all,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--inputs", type=int, default=8, help="Distinct batches rotated through.")
    ap.add_argument("--hot-fraction", default="0.02,0.1,0.3")
    ap.add_argument("--traces", default="reuse-medium-500k,uniform")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/embed_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for trace in args.traces.split(","):
        for fraction in (float(f) for f in args.hot_fraction.split(",")):
            row = run(trace, fraction, args)
            rows.append(row)
            print(
                f"{trace:18s} hot {fraction:4.2f}: reference {row['reference_ms']:.2f} ms, "
                f"remapped pooling {row['remapped_pooling_ms']:.2f} ms "
                f"({row['pooling_speedup']:.2f}x), with the remap {row['remap_and_pooling_ms']:.2f}"
                f" ms ({row['speedup_with_remap']:.2f}x)",
                flush=True,
            )
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "args": vars(args) | {"out": str(args.out)},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
