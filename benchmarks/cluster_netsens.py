"""Network-sensitive scheduling under congestion: netsens vs tiresias, consolidate and fifo.

Run: python benchmarks/cluster_netsens.py [--seeds 0-4] [--congestion 1,2,4] [--jitter-s 600]
         [--workers 2] [--out out/bench/netsens] [--figures benchmarks/figures] [--quick]

1. The main sweep: the Philly trace on ``philly-third`` (a third of Philly's machines, where
   queues form; on its own 352 machines the trace loads the cluster to ~0.1 and every scheduler
   ties) and the Helios 500-job trace on ``helios``, at each congestion level and seed. Seeds
   jitter every arrival by a uniform draw in +-jitter seconds, so they are different
   interleavings of the same real jobs.
2. The timer sweep: netsens with fixed delay timers (a grid) on the same runs, to find the best
   fixed timers per trace and congestion and compare the auto-tuned ones with them.

Writes runs.parquet / sweep.json per sweep under --out, ``netsens.json`` (all figures) and
``netsens.md`` (the tables for RESULTS.md), and PNG plots under --figures.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from recperf.cluster.api import RunSpec
from recperf.cluster.sweep import Sweep, run_sweep, write_sweep
from recperf.core.config import parse_floats, parse_seeds
from recperf.core.results import write_json, write_text

TRACES = ("philly@philly-third", "helios-500")
SCHEDULERS = ("netsens", "tiresias", "consolidate", "fifo")
TIMER_GRID = ("0,0", "300,1800", "1800,7200", "7200,28800", "28800,86400", "1e9,1e9")
METRICS = ("makespan_s", "jct_mean_s", "jct_p95_s", "comm_overhead_frac")


def run(sweep: Sweep, out: Path, workers: int, keep_jobs: bool, label: str) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    done = [0.0]

    def progress(frac: float) -> None:
        if frac - done[0] >= 0.1 or frac >= 1.0:
            done[0] = frac
            print(f"  {label}: {frac:.0%} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)

    result = run_sweep(
        sweep, backend="local", workers=workers, keep_jobs=keep_jobs, progress=progress
    )
    write_sweep(out, result)
    for f in result.failed:
        print(f"  FAILED {f['trace']} {f['scheduler']} {f['congestion']} {f['seed']}: {f['error']}")
    return [r for r in result.rows if r["status"] == "ok"]


def mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def group(rows: list[dict[str, Any]], key: tuple[str, ...]) -> dict[tuple[Any, ...], list[dict]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in key)].append(r)
    return out


def fmt(x: float, digits: int = 0) -> str:
    if x != x:
        return "n/a"
    return f"{x:,.{digits}f}"


def main_tables(rows: list[dict[str, Any]], congestion: tuple[float, ...]) -> tuple[str, dict]:
    """Per trace x congestion: one row per scheduler, plus the targets' verdicts."""
    lines: list[str] = []
    verdicts: dict[str, Any] = {}
    by = group(rows, ("trace", "congestion", "scheduler"))
    for trace in TRACES:
        lines += [f"#### {trace}", ""]
        lines.append(
            "| congestion | scheduler | makespan (s) | mean JCT (s) | p95 JCT (s) | comm overhead "
            "| preemptions | waited for locality | mean locality wait (s) |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for c in congestion:
            stats: dict[str, dict[str, tuple[float, float]]] = {}
            for s in SCHEDULERS:
                rs = by.get((trace, c, s), [])
                stats[s] = {
                    m: mean_std([float(r[m]) for r in rs])
                    for m in (
                        *METRICS,
                        "preemptions",
                        "locality_wait_share",
                        "locality_wait_mean_s",
                    )
                }
                st = stats[s]
                lines.append(
                    f"| {c:g}x | {s} | {fmt(st['makespan_s'][0])} ± {fmt(st['makespan_s'][1])} "
                    f"| {fmt(st['jct_mean_s'][0])} ± {fmt(st['jct_mean_s'][1])} "
                    f"| {fmt(st['jct_p95_s'][0])} | {fmt(st['comm_overhead_frac'][0], 4)} "
                    f"| {fmt(st['preemptions'][0], 1)} | {fmt(st['locality_wait_share'][0], 3)} "
                    f"| {fmt(st['locality_wait_mean_s'][0])} |"
                )
            ns = stats["netsens"]
            others = [s for s in SCHEDULERS if s != "netsens"]
            best_mk = min(stats[s]["makespan_s"][0] for s in others)
            best_jct = min(stats[s]["jct_mean_s"][0] for s in others)
            tir_comm = stats["tiresias"]["comm_overhead_frac"][0]
            seeds_jct_best = sum(
                1
                for seed_rows in group(
                    [r for r in rows if r["trace"] == trace and r["congestion"] == c], ("seed",)
                ).values()
                if min(seed_rows, key=lambda r: r["jct_mean_s"])["scheduler"] == "netsens"
            )
            verdicts[f"{trace}@{c:g}x"] = {
                "netsens_makespan_s": ns["makespan_s"][0],
                "best_other_makespan_s": best_mk,
                "makespan_best": ns["makespan_s"][0] <= best_mk,
                "netsens_jct_mean_s": ns["jct_mean_s"][0],
                "best_other_jct_mean_s": best_jct,
                "jct_best": ns["jct_mean_s"][0] <= best_jct,
                "jct_vs_best_other": ns["jct_mean_s"][0] / best_jct,
                "seeds_where_netsens_has_lowest_jct": seeds_jct_best,
                "comm_vs_tiresias": ns["comm_overhead_frac"][0] / tir_comm
                if tir_comm > 0
                else float("nan"),
            }
        lines.append("")
    return "\n".join(lines), verdicts


def timer_table(
    auto_rows: list[dict[str, Any]], fixed: dict[str, list[dict[str, Any]]], congestion: tuple
) -> tuple[str, dict]:
    lines = [
        "| trace | congestion | auto mean JCT (s) | best fixed timers (rack,net s) "
        "| its mean JCT (s) | auto / best fixed | worst fixed mean JCT (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    out: dict[str, Any] = {}
    auto_by = group(auto_rows, ("trace", "congestion"))
    for trace in TRACES:
        for c in congestion:
            auto = mean_std([float(r["jct_mean_s"]) for r in auto_by.get((trace, c), [])])[0]
            per_setting = {}
            for setting, rows in fixed.items():
                sel = [
                    float(r["jct_mean_s"])
                    for r in rows
                    if (r["trace"], r["congestion"]) == (trace, c)
                ]
                per_setting[setting] = mean_std(sel)[0]
            best = min(per_setting, key=lambda k: per_setting[k])
            worst = max(per_setting.values())
            ratio = auto / per_setting[best]
            out[f"{trace}@{c:g}x"] = {
                "auto_jct_mean_s": auto,
                "fixed_jct_mean_s": per_setting,
                "best_fixed": best,
                "auto_over_best_fixed": ratio,
            }
            lines.append(
                f"| {trace} | {c:g}x | {fmt(auto)} | {best} | {fmt(per_setting[best])} "
                f"| {ratio:.3f} | {fmt(worst)} |"
            )
    return "\n".join(lines), out


def plots(
    rows: list[dict[str, Any]], jobs_path: Path, figures: Path, congestion: tuple
) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots (pip install matplotlib)", file=sys.stderr)
        return []
    figures.mkdir(parents=True, exist_ok=True)
    made = []
    by = group(rows, ("trace", "congestion", "scheduler"))
    for metric, label in (("jct_mean_s", "mean JCT (h)"), ("comm_overhead_frac", "comm overhead")):
        fig, axes = plt.subplots(1, len(TRACES), figsize=(10, 3.6))
        for ax, trace in zip(axes, TRACES, strict=True):
            width = 0.8 / len(SCHEDULERS)
            for i, s in enumerate(SCHEDULERS):
                vals = [
                    mean_std([float(r[metric]) for r in by.get((trace, c, s), [])])
                    for c in congestion
                ]
                scale = 3600.0 if metric.endswith("_s") else 1.0
                ax.bar(
                    np.arange(len(congestion)) + i * width,
                    [v[0] / scale for v in vals],
                    width,
                    yerr=[v[1] / scale for v in vals],
                    label=s,
                )
            ax.set_xticks(np.arange(len(congestion)) + 0.4 - width / 2)
            ax.set_xticklabels([f"{c:g}x" for c in congestion])
            ax.set_title(trace)
            ax.set_ylabel(label)
            if metric == "jct_mean_s" and trace.startswith("philly"):
                ax.set_yscale("log")
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        path = figures / f"cluster_netsens_{metric}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(str(path))
    if jobs_path.exists():
        jobs = pq.read_table(
            jobs_path, columns=["trace", "scheduler", "congestion", "seed", "jct_s"]
        ).to_pandas()
        c_max = max(congestion)
        fig, axes = plt.subplots(1, len(TRACES), figsize=(10, 3.6))
        for ax, trace in zip(axes, TRACES, strict=True):
            for s in SCHEDULERS:
                sel = jobs[
                    (jobs.trace == trace)
                    & (jobs.scheduler == s)
                    & (jobs.congestion == c_max)
                    & (jobs.seed == jobs.seed.min())
                ]
                x = np.sort(sel.jct_s.to_numpy() / 3600.0)
                ax.plot(x, np.arange(1, x.size + 1) / max(x.size, 1), label=s)
            ax.set_xscale("log")
            ax.set_xlabel("JCT (h)")
            ax.set_ylabel("fraction of jobs")
            ax.set_title(f"{trace}, {c_max:g}x congestion")
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        path = figures / "cluster_netsens_jct_cdf.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(str(path))
    return made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--congestion", default="1,2,4")
    ap.add_argument("--jitter-s", type=float, default=600.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("out/bench/netsens"))
    ap.add_argument("--figures", type=Path, default=Path("benchmarks/figures"))
    ap.add_argument("--skip-timers", action="store_true", help="Only the main sweep.")
    args = ap.parse_args()
    seeds = parse_seeds(args.seeds)
    congestion = parse_floats(args.congestion, "--congestion")
    base = RunSpec(jitter_s=args.jitter_s)
    t0 = time.perf_counter()
    main_rows = run(
        Sweep(traces=TRACES, schedulers=SCHEDULERS, congestion=congestion, seeds=seeds, base=base),
        args.out / "main",
        args.workers,
        keep_jobs=True,
        label="main sweep",
    )
    table, verdicts = main_tables(main_rows, congestion)
    timers_md, timers = "", {}
    if not args.skip_timers:
        fixed: dict[str, list[dict[str, Any]]] = {}
        for setting in TIMER_GRID:
            sweep = Sweep(
                traces=TRACES,
                schedulers=("netsens",),
                congestion=congestion,
                seeds=seeds,
                scheduler_options={"netsens": {"timers": setting}},
                base=base,
            )
            name = setting.replace(",", "_")
            fixed[setting] = run(sweep, args.out / f"timers_{name}", args.workers, False, setting)
        auto_rows = [r for r in main_rows if r["scheduler"] == "netsens"]
        timers_md, timers = timer_table(auto_rows, fixed, congestion)
    made = plots(main_rows, args.out / "main" / "jobs.parquet", args.figures, congestion)
    wall = time.perf_counter() - t0
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} {platform.machine()} ({platform.processor() or 'cpu'})",
        "python": platform.python_version(),
        "command": " ".join(["python", *sys.argv]),
        "seeds": list(seeds),
        "congestion": list(congestion),
        "jitter_s": args.jitter_s,
        "wall_s": wall,
    }
    write_json(
        args.out / "netsens.json",
        {"meta": meta, "verdicts": verdicts, "timers": timers, "runs": main_rows},
    )
    md = [
        f"Measured {meta['date']} on {meta['machine']}, `{meta['command']}` ({wall / 60:.1f} min).",
        "",
        "Mean ± std over seeds "
        + ", ".join(map(str, seeds))
        + f" (arrivals jittered ±{args.jitter_s:g} s).",
        "",
        table,
        "Targets (netsens vs the best other scheduler, means over seeds):",
        "",
        "| trace@congestion | netsens makespan / best other | netsens mean JCT / best other "
        "| seeds where netsens has the lowest mean JCT | netsens comm / tiresias comm |",
        "|---|---|---|---|---|",
    ]
    for k, v in verdicts.items():
        md.append(
            f"| {k} | {v['netsens_makespan_s'] / v['best_other_makespan_s']:.4f} "
            f"| {v['jct_vs_best_other']:.4f} "
            f"| {v['seeds_where_netsens_has_lowest_jct']}/{len(seeds)} "
            f"| {v['comm_vs_tiresias']:.3f} |"
        )
    if timers_md:
        md += [
            "",
            "Auto-tuned vs fixed delay timers (netsens mean JCT, mean over seeds):",
            "",
            timers_md,
        ]
    md += [""] + [f"![{Path(p).stem}](figures/{Path(p).name})" for p in made]
    write_text(args.out / "netsens.md", "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
