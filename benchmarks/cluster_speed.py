"""Simulator speed: the whole Philly trace per scheduler, and 100,000 synthetic jobs on 1,024 GPUs.

Run: python benchmarks/cluster_speed.py [--repeats 3] [--skip-large] [--json out.json]
Each timed run is a fresh simulation of an already-loaded trace; the 100k-job run happens in a
child process so that its peak RSS is its own.
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

from recperf.cluster.api import RunSpec, load_jobs, simulate
from recperf.cluster.traces.synthetic import SyntheticConfig

SCHEDULERS = ("fifo", "sjf", "srtf", "tiresias", "consolidate", "netsens")


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


def large_child() -> None:
    """In a child process: 100k synthetic jobs with tiresias; prints JSON with wall and peak RSS."""
    spec = RunSpec(
        trace="synthetic",
        scheduler="tiresias",
        cluster="synthetic-1024",
        synthetic=SyntheticConfig(jobs=100_000, load=0.8),
    )
    t0 = time.perf_counter()
    loaded = load_jobs(spec)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = simulate(spec, loaded=loaded)
    wall = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {
        "jobs": len(loaded[0]),
        "gpus": loaded[1].gpus,
        "load_s": t_load,
        "wall_s": wall,
        "events_plus_decisions": res.events + res.decisions,
        "events_per_s": (res.events + res.decisions) / wall,
        "peak_rss_mib": peak_kib / 1024,
        "preemptions": int(res.preemptions.sum()),
    }
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clusters", default="philly,philly-third")
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--json", default=None, help="Also write all figures to this file.")
    ap.add_argument("--large-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.large_child:
        large_child()
        return
    rows = []
    cpu = platform.processor() or platform.machine()
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {cpu}")
    for cluster in args.clusters.split(","):
        for sched in SCHEDULERS:
            row = time_runs(RunSpec(trace="philly", scheduler=sched, cluster=cluster), args.repeats)
            rows.append(row)
            print(
                f"philly on {row['cluster']:>13} ({row['gpus']} GPUs) {sched:>12}: "
                f"median {row['wall_median_s']:6.2f} s of {args.repeats}, "
                f"{row['events_per_s']:,.0f} events+decisions/s",
                flush=True,
            )
    large = None
    if not args.skip_large:
        proc = subprocess.run(
            [sys.executable, __file__, "--large-child"], capture_output=True, text=True, check=True
        )
        large = json.loads(proc.stdout.strip().splitlines()[-1])
        print(
            f"synthetic 100,000 jobs on {large['gpus']} GPUs, tiresias: {large['wall_s']:.2f} s "
            f"(+{large['load_s']:.2f} s to generate), "
            f"{large['events_per_s']:,.0f} events+decisions/s, "
            f"peak RSS {large['peak_rss_mib']:.0f} MiB"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"philly": rows, "large": large}, fh, indent=2)


if __name__ == "__main__":
    main()
