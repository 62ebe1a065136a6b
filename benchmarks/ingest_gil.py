"""Does the simulator know the GIL? The live pipeline runs the fused chain on 1, 2 and 4 threads,
as threads of the consumer's process (T = 0) and as one worker process of T threads, in
interleaved rounds; a simulator spec is calibrated from the 1- and 2-thread windows only (stage
costs, hand-off, consumer cost and each stage's GIL fraction from per-thread CPU versus wall
time), and predicts every shape, the 4-thread ones held out. The issue's check: predicted and
measured throughput within 15%.

    python benchmarks/ingest_gil.py --data /tmp/recperf-bench-ingest/parquet \\
        --out benchmarks/results/ingest_gil.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from recperf.ingest.base import Allocation, Measurement
from recperf.ingest.live.batch import PipelineConfig
from recperf.ingest.live.executor import Pipeline
from recperf.ingest.live.target import LiveTarget, calibrate
from recperf.ingest.sim.model import PipelineSpec

THREADS = (1, 2, 4)
FIT = (1, 2)
"""Thread counts whose windows calibrate the spec; the others are predicted out of sample."""
TOLERANCE = 0.15


def shapes() -> list[tuple[str, Allocation]]:
    out = []
    for t in THREADS:
        out.append((f"consumer x{t}", Allocation(workers=(t,), cuts=(), threads=(0,))))
        out.append((f"process 1x{t}t", Allocation(workers=(1,), cuts=(), threads=(t,))))
    return out


def threads_of(alloc: Allocation) -> int:
    (w,), (t,) = alloc.workers, alloc.segment_threads()
    return w if t == 0 else t


def predict(spec: PipelineSpec, alloc: Allocation) -> float:
    return float(spec.throughput(alloc))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path("/tmp/recperf-bench-ingest/parquet"))
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/ingest_gil.json"))
    args = ap.parse_args()
    cfg = PipelineConfig(epochs=None, shuffle_window=0, shuffle_splits=False)
    runs: dict[str, list[Measurement]] = {}
    allocs = dict(shapes())
    t0 = time.monotonic()
    with Pipeline(args.data, cfg, allocation=allocs["process 1x1t"]) as p:
        target = LiveTarget(p, settle_s=1.0, warmup_s=2.0)
        for r in range(args.reps):
            for name, alloc in allocs.items():
                m = target.measure(alloc, args.seconds)
                runs.setdefault(name, []).append(m)
                print(f"round {r}: {name:16s} {m.throughput_rows_per_s:12,.0f} rows/s",
                      file=sys.stderr)  # fmt: skip
        fit = [m for name, ms in runs.items() for m in ms if threads_of(allocs[name]) in FIT]
        target.measurements = fit
        spec = calibrate(target, name="gil-check")
    rows: list[dict[str, Any]] = []
    for name, alloc in allocs.items():
        measured = statistics.median(m.throughput_rows_per_s for m in runs[name])
        pred = predict(spec, alloc)
        rows.append({
            "shape": name,
            "threads": threads_of(alloc),
            "held_out": threads_of(alloc) not in FIT,
            "measured_rows_per_s": measured,
            "measured_all": [m.throughput_rows_per_s for m in runs[name]],
            "predicted_rows_per_s": pred,
            "error": pred / measured - 1,
        })  # fmt: skip
    ok = all(abs(r["error"]) <= TOLERANCE for r in rows)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "command": "python benchmarks/ingest_gil.py " + " ".join(sys.argv[1:]),
        "data": str(args.data),
        "wall_s": time.monotonic() - t0,
        "spec": {
            "stages": [s.name for s in spec.stages],
            "cost_us_per_row": [s.cost_us_per_row for s in spec.stages],
            "gil_frac": [s.gil_frac for s in spec.stages],
            "transfer_us_per_row": spec.transfer_us_per_row,
            "consumer_us_per_row": spec.consumer_us_per_row,
            "process_cost_factor": spec.process_cost_factor,
        },
        "rows": rows,
        "within_tolerance": ok,
        "tolerance": TOLERANCE,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("| shape | threads | measured rows/s (median) | predicted | error |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        held = " (held out)" if r["held_out"] else ""
        print(f"| {r['shape']}{held} | {r['threads']} | {r['measured_rows_per_s']:,.0f} | "
              f"{r['predicted_rows_per_s']:,.0f} | {r['error']:+.1%} |")  # fmt: skip
    print(f"all within {TOLERANCE:.0%}: {ok}")


if __name__ == "__main__":
    main()
