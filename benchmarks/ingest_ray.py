"""recperf's tuners driving Ray Data (issue 26), against Ray Data's own autoscaling.

``scale``: on a local Ray cluster of logical nodes (default 4 x 16 logical CPUs), each spec's
synthetic pipeline (stages sleep their cost per row, so 64 logical CPUs fit on a small machine)
under Ray Data's default (every operator an autoscaling actor pool, 1..its cap) and under each
recperf tuner's allocation, against the LP bound (with a CPU row per node); the final
allocations side by side. One cluster for the whole run; specs in turn.

    python benchmarks/ingest_ray.py scale --out benchmarks/results/ingest_ray_scale.json

``real``: the 1M-row TSV and Parquet of ``ingest_live.py`` on this machine, in interleaved
rounds, each configuration in a fresh process under ``ingest_peers.measure`` (rows/s, cores,
peak PSS, time to the first batch): Ray Data default, recperf-tuned Ray Data (plumber), recperf
native (``--alloc auto``) and torchdata.nodes (threads, its best worker count of issue 25's
sitting); medians.

    python benchmarks/ingest_ray.py real --out benchmarks/results/ingest_ray_real.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import ingest_peers

from recperf.ingest.base import Allocation
from recperf.ingest.data.criteo import GenerateConfig, generate
from recperf.ingest.data.limits import BUNDLED_SPECS
from recperf.ingest.live.batch import Batch, PipelineConfig
from recperf.ingest.raydata import api
from recperf.ingest.raydata.runtime import ClusterSpec, RayRuntime
from recperf.ingest.sim.model import load_spec

TUNERS = ("plumber",)
REAL_MODES = ("ray-default", "ray-tuned", "native", "torchdata_nodes")
PACKAGED = Path(__file__).resolve().parent.parent / "src/recperf/data/ingest/bench_ray.json"
"""What the report's Ray comparison shows: {"scale": ..., "real": ...} of the two commands."""


def machine() -> str:
    return (
        f"{platform.node()} ({os.cpu_count()} CPUs, {platform.processor() or platform.machine()})"
    )


# ------------------------------------------------------------------------------------- scale


def scale(args: argparse.Namespace) -> dict[str, Any]:
    specs = args.specs.split(",")
    tuners = [t for t in args.tuners.split(",") if t]
    cluster = ClusterSpec(nodes=args.nodes, cpus_per_node=args.cpus_per_node)
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with RayRuntime(cluster) as rt:
        print(f"cluster up: {rt.node_cpus} logical CPUs ({time.monotonic() - t0:.0f} s)",
              file=sys.stderr, flush=True)  # fmt: skip
        for name in specs:
            spec = load_spec(name)
            for alloc in ((api.RAY_DEFAULT,) if args.default else ()) + tuple(tuners):
                t = time.monotonic()
                out = api.spec_run(spec, rt, alloc, seconds=args.seconds, budget_s=args.budget_s,
                                   warmup_s=args.warmup_s, seed=0)  # fmt: skip
                out["run_wall_s"] = time.monotonic() - t
                rows.append(out)
                if args.partial:  # what has run so far survives a run cut short
                    Path(args.partial).write_text(json.dumps({"runs": rows}, default=str))
                print(f"{name} {alloc}: {out['throughput_rows_per_s']:,.0f} rows/s = "
                      f"{out['fraction_of_bound']:.2f} of the bound; "
                      f"{[o['workers'] for o in out['operators']]} workers, idle "
                      f"{out['idle_logical_cpus']} ({out['run_wall_s']:.0f} s)",
                      file=sys.stderr, flush=True)  # fmt: skip
    return {"runs": rows, "targets": scale_targets(rows)}


def scale_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per spec and tuner: fraction of the bound (>= 0.9) and the ratio to Ray's default
    (>= 1.3 where the default leaves CPUs idle)."""
    out = []
    by = {(r["spec"], r["chosen_by"]): r for r in rows}
    for (spec, how), r in by.items():
        if how == api.RAY_DEFAULT:
            continue
        d = by.get((spec, api.RAY_DEFAULT))
        ratio = r["throughput_rows_per_s"] / d["throughput_rows_per_s"] if d else None
        idle = d and (d["idle_logical_cpus"] or 0) >= 1
        out.append({
            "spec": spec,
            "tuner": how,
            "fraction_of_bound": r["fraction_of_bound"],
            "bound_target_met": r["fraction_of_bound"] >= 0.9,
            "vs_default": ratio,
            "default_idle_cpus": d["idle_logical_cpus"] if d else None,
            "default_target_met": None if not idle else (ratio or 0) >= 1.3,
            "default_workers": [o["workers"] for o in d["operators"]] if d else None,
            "tuned_workers": {o["operator"]: o["workers"] for o in r["operators"]},
        })  # fmt: skip
    return out


def scale_table(res: dict[str, Any]) -> str:
    lines = ["| spec | allocation by | operators (workers) | rows/s | of LP bound | idle CPUs | "
             "Ray gap ms/task |", "|---|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in res["runs"]:
        ops = ", ".join(f"{o['operator']} x{o['workers']}" for o in r["operators"])
        lines.append(
            f"| {r['spec']} | {r['chosen_by']} | {ops} | {r['throughput_rows_per_s']:,.0f} | "
            f"{r['fraction_of_bound']:.2f} | {r['idle_logical_cpus']} | "
            f"{r['ray_overhead_ms_per_task'] or float('nan'):.1f} |"
        )
    return "\n".join(lines)


# -------------------------------------------------------------------------------------- real


def ray_iter(data: str, mode: str, budget_s: float) -> Iterator[Batch]:
    """Batches of the Criteo pipeline on a local Ray (this machine's cores): Ray Data's
    default pools, or plumber's allocation tuned first within ``budget_s``."""
    from recperf.ingest.raydata.criteo import CHUNK, CriteoPipeline, batch_of
    from recperf.ingest.raydata.engine import OperatorPlan, build_dataset
    from recperf.ingest.raydata.meter import start_meter
    from recperf.ingest.raydata.target import RayTarget

    # as ingest_peers' recperf peer without --shuffle: batches of 4096, no shuffle stage
    cfg = PipelineConfig(batch_size=ingest_peers.BATCH_ROWS, shuffle_window=0,
                         shuffle_splits=False, epochs=None)  # fmt: skip
    with RayRuntime(ClusterSpec()) as rt:
        pipe = CriteoPipeline(data, cfg, repeat_epochs=200)
        n = len(pipe.stage_names)
        if mode == "ray-default":
            alloc: Allocation | None = None
            segs = tuple((i, i + 1) for i in range(n))
        else:
            with RayTarget(rt, pipe) as target:
                alloc, how = api.choose(target, "plumber", budget_s=budget_s, seed=0)
            assert alloc is not None
            print(f"plumber chose {alloc.label(pipe.stage_names)} in {how['tuning_s']:.0f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
            segs = alloc.segments(n)
        works = pipe.works(segs)
        # as RayTarget runs them: workers share the cores, each a share of the logical CPUs
        cpus = min(1.0, rt.cpus / (len(segs) if alloc is None else alloc.total))
        cap = max(1, int(rt.cpus / cpus))
        plans = [
            OperatorPlan(work=w, workers=None if alloc is None else alloc.workers[j],
                         cap=cap, cpus=cpus)
            for j, w in enumerate(works)
        ]  # fmt: skip
        ds = build_dataset(rt.ray, pipe.items(), plans, start_meter(rt.ray), rt.node_ids)
        for block in ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=2):
            for chunk in block[CHUNK]:
                for cols in chunk:
                    yield batch_of(cols)


def real_one(args: argparse.Namespace) -> None:
    """One configuration in this (fresh) process: one JSON line."""
    if args.mode in ("ray-default", "ray-tuned"):
        out = ingest_peers.measure(lambda: ray_iter(args.data, args.mode, args.budget_s),
                                   lambda b: int(b.size), args.seconds, args.warmup_s)  # fmt: skip
    else:
        raise SystemExit(f"unknown mode {args.mode}")
    print(json.dumps({"mode": args.mode, **out}))


def real(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(args.data_root)
    for fmt in ("tsv", "parquet"):
        if not (root / fmt / "manifest.json").exists():
            generate(GenerateConfig(rows=1_000_000, shards=8, seed=0, format=fmt), root / fmt)
    runs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        for fmt in ("tsv", "parquet"):
            data = str(root / fmt)
            order = REAL_MODES if rnd % 2 == 0 else tuple(reversed(REAL_MODES))
            for mode in order:
                res = run_mode(mode, data, fmt, args)
                res.update(round=rnd, format=fmt, mode=mode)
                runs.append(res)
                print(f"round {rnd} {fmt} {mode}: {res.get('throughput_rows_per_s', 0):,.0f} "
                      f"rows/s {res.get('error', '')}", file=sys.stderr, flush=True)  # fmt: skip
    return {"runs": runs, "medians": real_medians(runs)}


def run_mode(mode: str, data: str, fmt: str, args: argparse.Namespace) -> dict[str, Any]:
    timing = ["--seconds", str(args.seconds), "--warmup-s", str(args.warmup_s)]
    if mode == "native":
        argv = ["run", "--peer", "recperf", "--variant", "auto", "--workers", "2",
                "--format", fmt, "--data", data, *timing]  # fmt: skip
        out, err = ingest_peers.run_child("recperf", argv, args.timeout_s)
    elif mode == "torchdata_nodes":
        argv = ["run", "--peer", "torchdata_nodes", "--variant", "thread", "--workers",
                "3" if fmt == "tsv" else "2", "--format", fmt, "--data", data, *timing]  # fmt: skip
        out, err = ingest_peers.run_child("torchdata_nodes", argv, args.timeout_s)
    else:
        import subprocess

        cmd = [sys.executable, __file__, "one", "--mode", mode, "--data", data,
               "--budget-s", str(args.budget_s), *timing]  # fmt: skip
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s,
                           check=False)  # fmt: skip
        lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
        out = json.loads(lines[-1]) if lines else None
        err = "" if out else p.stderr[-600:]
    return out or {"error": err}


def real_medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for fmt in ("tsv", "parquet"):
        for mode in REAL_MODES:
            rs = [r for r in runs if r["format"] == fmt and r["mode"] == mode
                  and r.get("throughput_rows_per_s")]  # fmt: skip
            if not rs:
                continue
            med = {
                k: statistics.median(r[k] for r in rs)
                for k in ("throughput_rows_per_s", "cores_used", "peak_pss_mib", "startup_s")
            }
            med["runs"] = [r["throughput_rows_per_s"] for r in rs]
            out.setdefault(fmt, {})[mode] = med
    return out


def real_table(res: dict[str, Any]) -> str:
    lines = ["| data | configuration | rows/s (median) | runs | cores used | peak PSS MiB | "
             "first batch s |", "|---|---|---:|---|---:|---:|---:|"]  # fmt: skip
    for fmt, modes in res["medians"].items():
        for mode, m in modes.items():
            runs = ", ".join(f"{x / 1e3:,.0f}k" for x in m["runs"])
            lines.append(f"| {fmt} | {mode} | {m['throughput_rows_per_s']:,.0f} | {runs} | "
                         f"{m['cores_used']:.2f} | {m['peak_pss_mib']:,.0f} | "
                         f"{m['startup_s']:.1f} |")  # fmt: skip
    return "\n".join(lines)


# -------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sc = sub.add_parser("scale", help="spec pipelines on a local multi-node Ray cluster")
    sc.add_argument("--nodes", type=int, default=4)
    sc.add_argument("--cpus-per-node", type=int, default=16)
    sc.add_argument("--specs", default=",".join(("ray-65540", *(
        s for s in BUNDLED_SPECS if s != "ray-65540"))))  # fmt: skip
    sc.add_argument("--tuners", default=",".join(TUNERS))
    sc.add_argument("--seconds", type=float, default=20.0)
    sc.add_argument("--warmup-s", type=float, default=20.0, help="Ray default's autoscaling")
    sc.add_argument("--budget-s", type=float, default=900.0)
    sc.add_argument("--out", default="benchmarks/results/ingest_ray_scale.json")
    sc.add_argument("--partial", default="", help="write the runs so far here after each")
    sc.add_argument("--no-default", dest="default", action="store_false",
                    help="only the tuners (Ray's default measured in an earlier run)")  # fmt: skip
    re_ = sub.add_parser("real", help="the Criteo data on this machine, interleaved rounds")
    re_.add_argument("--data-root", default="/tmp/recperf-bench-ingest")
    re_.add_argument("--rounds", type=int, default=3)
    re_.add_argument("--seconds", type=float, default=10.0)
    re_.add_argument("--warmup-s", type=float, default=3.0)
    re_.add_argument("--budget-s", type=float, default=90.0)
    re_.add_argument("--timeout-s", type=float, default=600.0)
    re_.add_argument("--out", default="benchmarks/results/ingest_ray_real.json")
    pk = sub.add_parser("package", help="merge the two results into the report's bundled file")
    pk.add_argument("--scale", default="benchmarks/results/ingest_ray_scale.json")
    pk.add_argument("--real", default="benchmarks/results/ingest_ray_real.json")
    one = sub.add_parser("one", help=argparse.SUPPRESS)
    one.add_argument("--mode", required=True)
    one.add_argument("--data", required=True)
    one.add_argument("--seconds", type=float, default=10.0)
    one.add_argument("--warmup-s", type=float, default=3.0)
    one.add_argument("--budget-s", type=float, default=90.0)
    args = ap.parse_args()
    if args.cmd == "one":
        real_one(args)
        return
    if args.cmd == "package":
        doc = {k: json.loads(Path(getattr(args, k)).read_text()) for k in ("scale", "real")}
        PACKAGED.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {PACKAGED}")
        return
    t0 = time.monotonic()
    res = scale(args) if args.cmd == "scale" else real(args)
    doc = {"date": date.today().isoformat(), "machine": machine(),
           "command": "python benchmarks/ingest_ray.py " + " ".join(sys.argv[1:]),
           "wall_s": time.monotonic() - t0, **res}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(scale_table(res) if args.cmd == "scale" else real_table(res))


if __name__ == "__main__":
    main()
