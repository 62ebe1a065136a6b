"""Ingestion tuners on the bundled simulated pipelines (2 to 128 cores), against the oracle and
the LP bound, both over every cut pattern (where the chain is fused and where it is cut).

Run: python benchmarks/ingest_sim.py [--seeds 0-4] [--budget-s 200] [--out ingest_sim.json]
Each (spec, tuner, seed) is a fresh SimTarget with 2% measurement noise; fractions use the
model's noise-free throughput of the chosen allocation. Prints a markdown table with each
tuner's allocation (segments and workers) on the first seed.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from recperf.ingest.sim.model import BUNDLED
from recperf.ingest.tuning import simulate

TUNER_NAMES = ("static", "autotune", "plumber", "intune", "oracle")
HELD_TO = ("plumber", "intune", "oracle")
"""Tuners whose every run must reach ``TARGET`` of the oracle."""
TARGET = 0.95


def at_least(a: float, b: float) -> bool:
    """a >= b up to float rounding (equal allocations' throughputs can differ in the last bit)."""
    return a >= b or math.isclose(a, b, rel_tol=1e-12)


def seeds_arg(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def row(spec: str, tuner: str, runs: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    frac = [r["fraction_of_oracle"] for r in runs]
    return {
        "spec": spec,
        "tuner": tuner,
        "fraction_of_oracle_mean": statistics.mean(frac),
        "fraction_of_oracle_min": min(frac),
        "fraction_of_bound_mean": statistics.mean(r["fraction_of_bound"] for r in runs),
        "allocation_first_seed": runs[0]["allocation"]["label"],
        "distinct_allocations": len({r["allocation"]["label"] for r in runs}),
        "oracle_allocation": runs[0]["oracle_allocation"]["label"],
        "steps_mean": statistics.mean(r["tuning_steps"] for r in runs),
        "refused_total": sum(r["refused"] for r in runs),
        "runs_with_refusals": sum(r["refused"] > 0 for r in runs),
        "peak_memory_max_bytes": max(r["peak_memory_bytes"] for r in runs),
        "memory_budget_bytes": runs[0]["memory_budget_bytes"],
        "over_budget_runs": sum(r["peak_memory_bytes"] > r["memory_budget_bytes"] for r in runs),
        "wall_s": wall,
        "runs": runs,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| spec | tuner | mean frac. of oracle | min | frac. of LP bound | allocation, segments "
        "split by / (first seed; distinct over seeds) | steps | refused (runs) | peak / budget "
        "memory GiB | wall s |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['spec']} | {r['tuner']} | {r['fraction_of_oracle_mean']:.4f} | "
            f"{r['fraction_of_oracle_min']:.4f} | {r['fraction_of_bound_mean']:.4f} | "
            f"{r['allocation_first_seed'].replace('|', '/')} ({r['distinct_allocations']}) | "
            f"{r['steps_mean']:.0f} | {r['refused_total']} ({r['runs_with_refusals']}) | "
            f"{r['peak_memory_max_bytes'] / 2**30:.2f} / {r['memory_budget_bytes'] / 2**30:.0f} | "
            f"{r['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """One line per spec: the oracle's allocation, and whether each held tuner reached TARGET
    of it on every seed (and intune at least autotune and plumber on the mean)."""
    out = []
    for spec in dict.fromkeys(r["spec"] for r in rows):
        by = {r["tuner"]: r for r in rows if r["spec"] == spec}
        first = next(iter(by.values()))
        held = [
            f"{t} min {by[t]['fraction_of_oracle_min']:.4f} "
            f"({'met' if by[t]['fraction_of_oracle_min'] >= TARGET else 'MISSED'})"
            for t in HELD_TO
            if t in by
        ]
        line = f"{spec}: oracle {first['oracle_allocation']}; >= {TARGET} of it: {', '.join(held)}"
        if "intune" in by:
            it = by["intune"]
            rivals = [by[t]["fraction_of_oracle_mean"] for t in ("autotune", "plumber") if t in by]
            beats = all(at_least(it["fraction_of_oracle_mean"], x) for x in rivals)
            line += f"; intune >= autotune/plumber: {beats}; over budget: {it['over_budget_runs']}"
        out.append(line)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=seeds_arg, default=seeds_arg("0-4"))
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--tuners", default=",".join(TUNER_NAMES))
    ap.add_argument("--out", default=None, help="Write all results as JSON here.")
    args = ap.parse_args()
    rows = []
    t_all = time.perf_counter()
    for spec in BUNDLED:
        for tuner in args.tuners.split(","):
            t0 = time.perf_counter()
            runs = [simulate(spec, tuner, seed=s, budget_s=args.budget_s) for s in args.seeds]
            rows.append(row(spec, tuner, runs, time.perf_counter() - t0))
    print(table(rows))
    print("\n" + "\n".join(targets(rows)))
    wall = time.perf_counter() - t_all
    print(f"\ntotal wall {wall:.1f} s on {platform.node()} ({platform.processor() or 'cpu'})")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump({"budget_s": args.budget_s, "seeds": args.seeds, "wall_s": wall,
                       "machine": platform.platform(), "rows": rows}, fh, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
