"""The drop-in's own per-call overhead (issue 27, item 6): ``EmbeddingBags.from_torch(bags,
kernel="torch")`` against calling the plain ``nn.EmbeddingBag`` list on the same inputs (one
tensor of ids and one of offsets per bag, from the bundled reuse trace), with the value checks
off (the default) and on (``DropInConfig(debug=True)``), and ``kernel="auto"`` (which times the
kernels on its first call, the warm-up here). Outputs are checked equal first; calls are
interleaved over rotating batches (in a new seeded order each round); each variant's median,
and its overhead as the median over rounds of its call minus the plain call of the same round.

    python benchmarks/embed_dropin_overhead.py [--config small] [--batch-size N] [--threads 1]
        [--calls 200] [--clock wall|cpu] [--out benchmarks/results/embed_dropin_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

import recperf.embed.bench as eb
from recperf.embed.dropin import DropInConfig, EmbeddingBags
from recperf.embed.model import EmbedConfig, config

OUT = Path("benchmarks/results/embed_dropin_overhead.json")
Inputs = tuple[list[torch.Tensor], list[torch.Tensor]]


def per_bag_inputs(
    cfg_name: str, batches: int, rows_cap: int, batch_size: int | None = None
) -> tuple[EmbedConfig, list[nn.EmbeddingBag], list[Inputs]]:
    """The configuration (tables capped at ``rows_cap`` rows), its bags (seeded) and
    ``batches`` inputs cut from the bundled trace as a list of ``nn.EmbeddingBag`` takes them
    (per bag: its ids and B offsets)."""
    cfg = config(cfg_name, rows_cap=rows_cap, batch_size=batch_size)
    cfg = replace(cfg, table_rows=tuple(min(r, rows_cap) for r in cfg.table_rows))
    torch.manual_seed(0)
    bags = [nn.EmbeddingBag(r, cfg.dim, mode="sum") for r in cfg.table_rows]
    trace = eb.bench_trace(cfg, "reuse-medium-500k")
    out = []
    for lk in eb.make_lookups(cfg, trace, batches, "cpu"):
        b = lk.batch_size
        starts = lk.offsets[::b].tolist()
        ids = [lk.indices[starts[t] : starts[t + 1]] for t in range(len(bags))]
        offs = [lk.offsets[t * b : (t + 1) * b] - starts[t] for t in range(len(bags))]
        out.append((ids, offs))
    return cfg, bags, out


def interleaved(
    fns: list[Callable[[Inputs], Any]],
    inputs: list[Inputs],
    calls: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[list[float]]:
    """Seconds of each call of each fn by ``clock`` (after 5 warm-up rounds), in turn on the
    same batch, in a new (seeded) order each round (not merely rotating: each fn then always
    followed the same one)."""
    times: list[list[float]] = [[] for _ in fns]
    rng = random.Random(0)
    for i in range(calls + 5):
        x = inputs[i % len(inputs)]
        order = list(range(len(fns)))
        rng.shuffle(order)
        for k in order:
            t0 = clock()
            fns[k](x)
            if i >= 5:
                times[k].append(clock() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="small", help="small, paper or mlperf")
    ap.add_argument("--rows-cap", type=int, default=60_000, help="rows of a table at most")
    ap.add_argument("--batch-size", type=int, default=None, help="default: the config's")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=200, help="timed calls per variant")
    ap.add_argument("--batches", type=int, default=4, help="distinct inputs rotated through")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: perf_counter; cpu: this thread's CPU time (with --threads 1 torch computes on "
        "it), steadier on a machine other jobs share",
    )
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg, bags, inputs = per_bag_inputs(args.config, args.batches, args.rows_cap, args.batch_size)

    def plain(x: Inputs) -> list[torch.Tensor]:
        with torch.no_grad():
            return [bag(i, o) for bag, i, o in zip(bags, *x, strict=True)]

    variants: dict[str, Callable[[Inputs], Any]] = {"nn.EmbeddingBag list": plain}
    modules: dict[str, EmbeddingBags] = {}
    for name, cfg_ in (
        ("EmbeddingBags(torch)", DropInConfig()),
        ("EmbeddingBags(torch, debug)", DropInConfig(debug=True)),
        ("EmbeddingBags(auto)", DropInConfig(kernel="auto", cache=None)),
    ):
        modules[name] = module = EmbeddingBags.from_torch(bags, cfg_.kernel, config=cfg_)
        variants[name] = lambda x, m=module: m(*x)
    want = plain(inputs[0])
    for name, fn in variants.items():  # also the warm-up that lets auto time its kernels
        got = fn(inputs[0])
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(
                a, b, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
            )
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    samples = interleaved(list(variants.values()), inputs, args.calls, clock)
    base = statistics.median(samples[0])
    rows = []
    for (name, _), times in zip(variants.items(), samples, strict=True):
        med = statistics.median(times)
        q1, _, q3 = statistics.quantiles(times, n=4)
        # Paired: each round's call minus the plain call of the same round (same batch, same
        # moment's load), the median of those; steadier than a difference of medians.
        paired = statistics.median(t - b for t, b in zip(times, samples[0], strict=True))
        rows.append(
            {"variant": name, "ms_per_call": med * 1e3, "ms_q1": q1 * 1e3, "ms_q3": q3 * 1e3,
             "overhead_ms": paired * 1e3, "vs_plain": med / base}
        )  # fmt: skip
    auto = modules["EmbeddingBags(auto)"]
    doc = {
        "config": cfg.name,
        "tables": [cfg.num_tables, max(cfg.table_rows), cfg.dim],
        "batch_size": cfg.batch_size,
        "ids_per_call": int(sum(i.numel() for i in inputs[0][0])),
        "threads": args.threads,
        "calls": args.calls,
        "clock": args.clock,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.processor() or ''}",
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "auto_chose": [c.kernel for c in auto.choices],
        "variants": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{cfg.name}: {doc['tables']} tables x rows x dim, batch {cfg.batch_size}, "
          f"{doc['ids_per_call']:,} ids a call, {args.threads} thread(s); auto chose "
          f"{', '.join(doc['auto_chose'])}")  # fmt: skip
    for r in rows:
        iqr = f"(IQR {r['ms_q1']:.3f}-{r['ms_q3']:.3f})"
        print(f"  {r['variant']:<30} {r['ms_per_call']:8.3f} ms {iqr}  "
              f"overhead {r['overhead_ms']:+8.3f} ms  {r['vs_plain']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
