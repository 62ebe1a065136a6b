"""Simulator speed: the whole Philly trace per scheduler, and large synthetic traces.

Run: python benchmarks/cluster_speed.py [--repeats 3] [--skip-large] [--json out.json]
     python benchmarks/cluster_speed.py --million [--large-schedulers fifo,tiresias]
Each timed run is a fresh simulation of an already-loaded trace. The large run (default:
100,000 jobs with tiresias on 1,024 GPUs; ``--million``: 1,000,000 jobs on 2,048 GPUs with fifo
and tiresias, Philly skipped) happens in a child process per scheduler, so that each peak RSS
is its own.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

from recperf.cluster.api import RunSpec, load_jobs, simulate
from recperf.cluster.topology import Cluster, load_cluster
from recperf.cluster.traces.synthetic import SyntheticConfig, SyntheticTrace

SCHEDULERS = ("fifo", "sjf", "srtf", "tiresias", "consolidate", "netsens")


def synthetic_cluster(gpus: int) -> Cluster:
    """``synthetic-1024`` (8 racks x 16 machines x 8 GPUs) widened to ``gpus`` by adding racks:
    2,048 GPUs is 16 racks."""
    base = load_cluster("synthetic-1024")
    racks, rest = divmod(gpus, base.gpus_per_rack)
    if rest or racks < 1:
        raise SystemExit(f"--large-gpus must be a multiple of {base.gpus_per_rack}")
    return base if racks == base.racks else base.with_(racks=racks, name=f"synthetic-{gpus}")


def time_runs(spec: RunSpec, repeats: int) -> dict[str, Any]:
    loaded = load_jobs(spec)
    walls, events = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = simulate(spec, loaded=loaded)
        walls.append(time.perf_counter() - t0)
        events = res.events + res.decisions
    med = statistics.median(walls)
    return {
        "trace": spec.trace,
        "cluster": loaded[1].name,
        "gpus": loaded[1].gpus,
        "jobs": len(loaded[0]),
        "scheduler": spec.scheduler,
        "wall_median_s": med,
        "wall_all_s": walls,
        "events_plus_decisions": events,
        "events_per_s": events / med,
    }


def large_child(jobs: int, gpus: int, scheduler: str) -> None:
    """In a child process: ``jobs`` synthetic jobs at load 0.8 on ``gpus`` GPUs with
    ``scheduler``; prints JSON with wall and peak RSS."""
    cluster = synthetic_cluster(gpus)
    spec = RunSpec(
        trace="synthetic", scheduler=scheduler, synthetic=SyntheticConfig(jobs=jobs, load=0.8)
    )
    t0 = time.perf_counter()
    table = SyntheticTrace(spec.synthetic).load(None, cluster, np.random.default_rng(spec.seed))
    t_load = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(spec, loaded=(table, cluster))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {
        "scheduler": scheduler,
        "jobs": len(table),
        "gpus": cluster.gpus,
        "load_s": t_load,
        "wall_s": wall,
        "cpu_s": cpu,  # on a shared machine, less disturbed by other work than wall time
        "events": res.events,
        "decisions": res.decisions,
        "events_plus_decisions": res.events + res.decisions,
        "events_per_s": (res.events + res.decisions) / wall,
        "peak_rss_mib": peak_kib / 1024,
        "preemptions": int(res.preemptions.sum()),
    }
    print(json.dumps(out))


def run_large(jobs: int, gpus: int, scheduler: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--large-child", scheduler]
    cmd += ["--large-jobs", str(jobs), "--large-gpus", str(gpus)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    large: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"synthetic {large['jobs']:,} jobs on {large['gpus']} GPUs, {scheduler}: "
        f"{large['wall_s']:.2f} s ({large['cpu_s']:.2f} s CPU; "
        f"+{large['load_s']:.2f} s to generate), "
        f"{large['events']:,} events + {large['decisions']:,} decisions, "
        f"{large['events_per_s']:,.0f} events+decisions/s, "
        f"peak RSS {large['peak_rss_mib']:.0f} MiB",
        flush=True,
    )
    return large


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clusters", default="philly,philly-third")
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--json", default=None, help="Also write all figures to this file.")
    ap.add_argument("--million", action="store_true", help="1M jobs on 2,048 GPUs; no Philly.")
    ap.add_argument("--large-jobs", type=int, default=None, help="Jobs of the large run.")
    ap.add_argument("--large-gpus", type=int, default=None, help="GPUs of the large run.")
    ap.add_argument("--large-schedulers", default=None, help="Comma-separated (one child each).")
    ap.add_argument("--large-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    jobs = args.large_jobs or (1_000_000 if args.million else 100_000)
    gpus = args.large_gpus or (2048 if args.million else 1024)
    if args.large_child:
        large_child(jobs, gpus, args.large_child)
        return
    rows = []
    cpu = platform.processor() or platform.machine()
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {cpu}")
    for cluster in [] if args.million else args.clusters.split(","):
        for sched in SCHEDULERS:
            row = time_runs(RunSpec(trace="philly", scheduler=sched, cluster=cluster), args.repeats)
            rows.append(row)
            print(
                f"philly on {row['cluster']:>13} ({row['gpus']} GPUs) {sched:>12}: "
                f"median {row['wall_median_s']:6.2f} s of {args.repeats}, "
                f"{row['events_per_s']:,.0f} events+decisions/s",
                flush=True,
            )
    large = []
    if not args.skip_large:
        default = "fifo,tiresias" if args.million else "tiresias"
        for sched in (args.large_schedulers or default).split(","):
            large.append(run_large(jobs, gpus, sched))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"philly": rows, "large": large}, fh, indent=2)


if __name__ == "__main__":
    main()
