"""Accuracy and overhead of the stall profiler (issue 5's evidence).

1. Two emulated nodes (network namespaces, tc tbf) at 200 Mbit/s, 500 Mbit/s and 1 Gbit/s:
   the network stall measured by differential runs versus the direct (DDP hook) method, and the
   communication model fitted on the other bandwidths' all-reduce measurements predicting it.
2. Profiler overhead: instrumented versus plain runs, same ranks, interleaved.
3. An injected data stall (a sleep in the data iterator) and how much of it is attributed.
4. ``launch`` on the plain DDP script examples/ddp_train.py, 2 ranks on 2 emulated nodes at
   each bandwidth: the network stall by difference (2 nodes - 1 node) and directly (exposed
   communication in its torch.profiler traces) versus the ring all-reduce physics,
   2(n-1)/n * gradient bytes / bandwidth, less what the traces show overlapped.

    python benchmarks/stalls_accuracy.py [--workload dlrm] [--iters 20] [--out DIR]

Needs root for the namespaces (parts 1 and 4); parts 2 and 3 run anywhere.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from recperf.stalls.model.comm import CommSample, exposed_stall_s
from recperf.stalls.model.fit import fit
from recperf.stalls.run import netem, runner
from recperf.stalls.run.differential import run_stats_from_files
from recperf.stalls.run.profile import ProfileConfig, profile
from recperf.stalls.run.spec import RunSpec
from recperf.stalls.study import LATENCY_HOLD

BANDWIDTHS = ("200mbit", "500mbit", "1gbit")


def predicted_network_stall(model: Any, s: dict[str, Any]) -> float:
    """Exposed all-reduce across the nodes minus exposed all-reduce inside one node."""
    bw = s["bandwidth_bits_per_s"] / 8
    args = (s["grad_bytes"], s["num_layers"], s["ranks"])
    net = model.predict(*args, s["nodes"], bw)
    intra = model.predict(*args, 1, None)
    exposed = [exposed_stall_s(c, s["backward_s"], s["num_layers"]) for c in (net, intra)]
    return exposed[0] - exposed[1]


def network_part(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    profiles = {}
    for bw in BANDWIDTHS:
        cfg = ProfileConfig(
            workload=args.workload,
            ranks=2,
            nodes=2,
            bandwidth=bw,
            iters=args.iters,
            real_data=bw == "500mbit",
            seed=args.seed,
        )
        t0 = time.perf_counter()
        profiles[bw] = profile(cfg, root / f"net-{bw}").to_json()
        print(f"profiled {bw} in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for bw, s in profiles.items():
        others = [
            CommSample(**c) for b, p in profiles.items() if b != bw for c in p["comm_samples"]
        ]
        # one world size: the step latency is held, as the study holds it (fit refuses otherwise)
        model = fit(others, hold=LATENCY_HOLD if len({c.ranks for c in others}) < 2 else None)
        predicted = predicted_network_stall(model, s)
        check = s["cross_check"]["network_stall_s"]
        measured = s["network_stall_s"]
        rows.append(
            {
                "bandwidth": bw,
                "iteration_s": s["iteration_s"],
                "network_stall_s": measured,
                "direct_network_stall_s": check["direct_s"],
                "cross_check_rel_diff": check["rel_diff"],
                "predicted_network_stall_s": predicted,
                "prediction_rel_err": abs(predicted - measured) / measured,
                "model_fitted_on": [b for b in BANDWIDTHS if b != bw],
                "model_rel_rmse": model.rel_rmse,
            }
        )
    full = profiles["500mbit"]
    breakdown = {
        k: full[k]
        for k in (
            "iteration_s",
            "compute_s",
            "data_fetch_stall_s",
            "data_prep_stall_s",
            "interconnect_stall_s",
            "network_stall_s",
            "contention_s",
        )
    }
    return {
        "rows": rows,
        "breakdown_500mbit": breakdown,
        "cross_check_500mbit": full["cross_check"],
    }


def _spec(args: argparse.Namespace, name: str, **kw: Any) -> RunSpec:
    return RunSpec(
        name=name, workload=args.workload, ranks=2, iters=args.iters, warmup=3, seed=args.seed, **kw
    )


def overhead_part(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    ratios, plain_s, inst_s = [], [], []
    for rep in range(args.repeats):
        times = {}
        order = (False, True) if rep % 2 == 0 else (True, False)
        for instrument in order:
            spec = _spec(args, "instrumented" if instrument else "plain", instrument=instrument)
            paths = runner.launch(spec, root / "overhead" / spec.name)
            times[instrument] = run_stats_from_files(spec, paths).iteration_median_s
        plain_s.append(times[False])
        inst_s.append(times[True])
        ratios.append(times[True] / times[False])
        print(
            f"overhead repeat {rep}: plain {times[False] * 1e3:.2f} ms, "
            f"instrumented {times[True] * 1e3:.2f} ms",
            flush=True,
        )
    cost = instrumentation_cost_us()["per_iteration_us"]
    return overhead_interleaved(args, root) | {
        "instrumentation_us_per_iteration": cost,
        "instrumentation_frac_of_iteration": cost / 1e6 / statistics.median(plain_s),
        "plain_iteration_s": statistics.median(plain_s),
        "instrumented_iteration_s": statistics.median(inst_s),
        "overhead_median": statistics.median(ratios) - 1.0,
        "ratios": ratios,
    }


def instrumentation_cost_us(iters: int = 20000) -> dict[str, float]:
    """In one process: microseconds of CPU the Profiler adds per iteration (data wrap, step,
    three phases) over a bare loop, median of 5 interleaved trials (thread CPU time, so that
    other processes on a busy machine do not count)."""
    from recperf.stalls.run.hook import Profiler

    def bare() -> float:
        t0 = time.thread_time()
        for _ in iter(range(iters)):
            pass
        return time.thread_time() - t0

    def instrumented() -> float:
        prof = Profiler(cuda=False)
        t0 = time.thread_time()
        for _ in prof.data(range(iters)):
            with prof.step():
                for name in ("forward", "backward", "optimizer"):
                    with prof.phase(name):
                        pass
        return time.thread_time() - t0

    costs = [(instrumented() - bare()) / iters * 1e6 for _ in range(5)]
    return {"per_iteration_us": statistics.median(costs)}


OVERHEAD_VARIANTS = ("plain", "builtin", "hook", "profiler-hook", "profiler")
"""The interleaved copies of the model: DDP's default (the 1/world scaling fused into its copy
into the bucket, C++ all-reduce), DDP's built-in C++ ALLREDUCE comm hook (what any comm hook
costs: a separate scaling pass), the Profiler's timing hook alone, the whole Profiler with its
timing hook (``comm="hook"``: data wrap, step and phases too), and the whole Profiler as it
comes on the CPU (``comm="ddp-timers"``: no hook, DDP's own reducer timers read each step)."""


def overhead_rank(blocks: int, block_iters: int, out: Path) -> None:
    """One rank of the interleaved overhead measurement: a DDP copy of the same DLRM per
    variant, trained in blocks of ``block_iters`` iterations in the same processes, one block
    of each variant per round in a balanced order; wall and process CPU time of every
    iteration."""
    import gc
    import os

    import torch
    import torch.distributed as dist
    from torch import nn

    from recperf.stalls.base import DataSpec
    from recperf.stalls.run.hook import Profiler
    from recperf.stalls.run.workloads import DlrmWorkload

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    w = DlrmWorkload()
    models = {v: nn.parallel.DistributedDataParallel(w.build(0)) for v in OVERHEAD_VARIANTS}
    models["builtin"]._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    Profiler(models["hook"], cuda=False, comm="hook")
    profs = {"profiler-hook": Profiler(models["profiler-hook"], cuda=False, comm="hook"),
             "profiler": Profiler(models["profiler"], cuda=False)}  # fmt: skip
    assert profs["profiler"].comm_timing == "ddp-timers"
    opts = {v: torch.optim.SGD(m.parameters(), lr=1e-3) for v, m in models.items()}
    it = w.synthetic(DataSpec(batch_size=256, rank=dist.get_rank(), world=2))

    def train(v: str) -> None:
        model, opt = models[v], opts[v]
        if v in profs:
            prof = profs[v]
            for batch in prof.data([next(it)]):
                with prof.step():
                    with prof.phase("forward"):
                        loss = w.loss(model, batch)
                    with prof.phase("backward"):
                        loss.backward()
                    with prof.phase("optimizer"):
                        opt.step()
                        opt.zero_grad(set_to_none=True)
        else:
            w.loss(model, next(it)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    for v in OVERHEAD_VARIANTS:  # DDP settles its buckets after the first iterations
        for _ in range(3):
            train(v)
    n = len(OVERHEAD_VARIANTS)
    # rows of a Williams Latin square: every n rounds each variant runs once in each position
    # and once right after each other variant, so order and carry-over effects cancel
    base = [0] + [(k + 1) // 2 if k % 2 else n - k // 2 for k in range(1, n)]
    record = []
    for r in range(max(1, blocks // n)):
        # an odd n needs the mirrored square too (every other n rounds) to balance carry-over
        order = base[::-1] if n % 2 and (r // n) % 2 else base
        for v in (OVERHEAD_VARIANTS[(b + r) % n] for b in order):
            wall, cpu = [], []
            for _ in range(block_iters):
                dist.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                train(v)
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            record.append({"variant": v, "round": r, "wall": wall, "cpu": cpu})
    dist.barrier()
    for held in (profs, opts, models):  # DDP's reducers go before the process group they use
        held.clear()
    gc.collect()
    dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        out.write_text(json.dumps(record))


def _spread(xs: list[float], seed: int) -> dict[str, Any]:
    """Median, quartiles and a bootstrap 95% interval (seeded) of the median of ``xs``."""
    import random

    rng = random.Random(seed)
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    boot = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(2000))
    return {"median": statistics.median(xs), "iqr": [q[0], q[2]],
            "ci95": [boot[49], boot[1949]], "n": len(xs)}  # fmt: skip


def overhead_interleaved(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The interleaved variants' median iteration times and their overhead over DDP's
    default: of the pooled medians, and per round (each variant's block median over the plain
    block's in the same round) with quartiles and a bootstrap interval over rounds."""
    import os
    import subprocess
    import sys

    out = root / "interleaved.json"
    env = dict(
        os.environ,
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(runner.free_port()),
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
    )
    cmd = [
        sys.executable,
        __file__,
        "--overhead-rank",
        str(out),
        "--repeats",
        str(args.interleaved_repeats),
    ]
    procs = [subprocess.Popen(cmd, env=env | {"RANK": str(r)}) for r in range(2)]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("interleaved overhead ranks failed")
    blocks = json.loads(out.read_text())
    pooled = {v: [t for b in blocks if b["variant"] == v for t in b["wall"]]
              for v in OVERHEAD_VARIANTS}  # fmt: skip
    per_round: dict[str, dict[int, tuple[float, float]]] = {v: {} for v in OVERHEAD_VARIANTS}
    for b in blocks:
        per_round[b["variant"]][b["round"]] = (statistics.median(b["wall"]),
                                               statistics.median(b["cpu"]))  # fmt: skip
    plain = statistics.median(pooled["plain"])
    variants = {}
    for v in OVERHEAD_VARIANTS[1:]:
        rounds = sorted(per_round[v])
        wall = [per_round[v][r][0] / per_round["plain"][r][0] - 1.0 for r in rounds]
        cpu = [per_round[v][r][1] / per_round["plain"][r][1] - 1.0 for r in rounds]
        variants[v] = {
            "iteration_s": statistics.median(pooled[v]),
            "overhead": statistics.median(pooled[v]) / plain - 1.0,
            "round_overhead": _spread(wall, args.seed),
            "round_cpu_overhead": _spread(cpu, args.seed),
        }
    inst = variants["profiler"]
    return {
        "interleaved_plain_iteration_s": plain,
        "interleaved_instrumented_iteration_s": inst["iteration_s"],
        "interleaved_overhead": inst["overhead"],
        "interleaved_round_overhead": inst["round_overhead"],
        "interleaved_iterations_each": len(pooled["plain"]),
        "interleaved_variants": variants,
    }


def data_stall_part(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    out = {}
    for delay in (0.0, args.delay_ms):
        spec = _spec(args, f"delay{delay:g}", delay_ms=delay)
        out[delay] = run_stats_from_files(spec, runner.launch(spec, root / "delay" / spec.name))
    injected = args.delay_ms / 1e3
    direct = out[args.delay_ms].data_wait_s - out[0.0].data_wait_s
    differential = out[args.delay_ms].iteration_s - out[0.0].iteration_s
    return {
        "injected_s": injected,
        "direct_data_stall_s": direct,
        "direct_rel_err": abs(direct - injected) / injected,
        "differential_data_stall_s": differential,
        "differential_rel_err": abs(differential - injected) / injected,
    }


LAUNCH_SHAPE = {"hidden": 1024, "layers": 2, "batch_size": 8, "steps": 30, "skip": 4}
"""examples/ddp_train.py's shape for the launch part: 8.4 MB of gradients in two DDP buckets;
only the first (4.2 MB, ready before the first layer's backward) can overlap compute, a few ms
of a 67-336 ms all-reduce, so the all-reduce is almost all exposed. What the traces show
overlapped is subtracted from the physics explicitly."""


def ring_allreduce_s(grad_bytes: float, nodes: int, bandwidth_bits: float) -> float:
    """Ring all-reduce over ``nodes`` machines: each link carries 2(n-1)/n of the bytes."""
    return 2 * (nodes - 1) / nodes * grad_bytes / (bandwidth_bits / 8)


LAUNCH_REPEATS = 3
"""Launches per bandwidth (the bandwidths interleaved), the median reported: the 1-node run's
all-reduce is CPU-bound and swings with the machine's load."""


def launch_part(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """``launch`` on the plain DDP example, 2 ranks on 2 emulated nodes at each bandwidth: the
    network stall by difference and directly versus the ring all-reduce physics of its gradient
    bytes, less the communication the traces show overlapped with compute."""
    import sys

    from recperf.stalls.run.launch import LaunchConfig, launch

    example = Path(__file__).resolve().parents[1] / "examples" / "ddp_train.py"
    shape = LAUNCH_SHAPE
    command = (sys.executable, str(example), "--steps", str(shape["steps"]),
               "--skip", str(shape["skip"]), "--hidden", str(shape["hidden"]),
               "--layers", str(shape["layers"]), "--batch-size", str(shape["batch_size"]),
               "--seed", str(args.seed))  # fmt: skip
    h, layers = shape["hidden"], shape["layers"]
    expected_grad = 4 * (layers * (h * h + h) + h + 1)
    reps: dict[str, list[dict[str, float]]] = {bw: [] for bw in BANDWIDTHS}
    for rep in range(LAUNCH_REPEATS):
        for bw in BANDWIDTHS:
            t0 = time.perf_counter()
            config = LaunchConfig(command=command, ranks=2, nodes=2, bandwidth=bw)
            s = launch(config, root / f"launch-{bw}-{rep}").to_json()
            print(f"launch {bw} repeat {rep}: {time.perf_counter() - t0:.0f} s", flush=True)
            if s["grad_bytes"] != expected_grad:
                raise SystemExit(f"launch {bw}: {s['grad_bytes']} gradient bytes in the traces, "
                                 f"expected {expected_grad}")  # fmt: skip
            ring = ring_allreduce_s(s["grad_bytes"], s["nodes"], s["bandwidth_bits_per_s"])
            reps[bw].append(
                {
                    "iteration_s": s["iteration_s"],
                    "local_iteration_s": s["runs"][0]["iteration_s"],
                    "ring_allreduce_s": ring,
                    "overlapped_comm_s": s["overlapped_comm_s"],  # the network run's
                    "physics_network_stall_s": ring - s["overlapped_comm_s"],
                    "network_stall_s": s["network_stall_s"],
                    "direct_network_stall_s": s["direct"]["network_stall_s"],
                    "local_exposed_comm_s": s["direct"]["local_exposed_comm_s"],
                    "network_exposed_comm_s": s["direct"]["network_exposed_comm_s"],
                    "cross_check_rel_diff": s["cross_check"]["network_stall_s"]["rel_diff"],
                }
            )
    rows = []
    for bw, runs in reps.items():
        row: dict[str, Any] = {
            "bandwidth": bw,
            "grad_bytes": expected_grad,
            **{k: statistics.median(r[k] for r in runs) for k in runs[0]},
        }
        physics = row["physics_network_stall_s"]
        for key, name in (
            ("network_stall_s", "differential"),
            ("direct_network_stall_s", "direct"),
        ):
            row[f"{name}_rel_err"] = abs(row[key] - physics) / physics
            row[f"{name}_repeats_s"] = [r[key] for r in runs]
        rows.append(row)
    return {"command": ["python", "examples/ddp_train.py", *command[2:]],
            "repeats": LAUNCH_REPEATS, "rows": rows}  # fmt: skip


ANALYZE_KEYS = ("iteration_s", "compute_s", "data_wait_s", "exposed_comm_s")


def analyze_part(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """``stalls analyze`` on the torch.profiler traces of a profile's runs (every timed
    iteration captured) versus the direct instrumentation of the same iterations: 2 ranks, on 2
    emulated nodes at 500 Mbit/s when root allows, with an injected data stall."""
    from recperf.stalls.trace.kineto import analyze_paths

    nodes = 2 if netem.available() is None else 1
    cfg = ProfileConfig(
        workload=args.workload, ranks=2, nodes=nodes, bandwidth="500mbit", iters=args.iters,
        real_data=False, seed=args.seed, delay_ms=args.delay_ms, torch_trace_iters=args.iters,
    )  # fmt: skip
    t0 = time.perf_counter()
    summary = profile(cfg, root / "analyze").to_json()
    print(f"profiled for analyze in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for direct in summary["runs"]:
        run_dir = root / "analyze" / "runs" / direct["name"]
        t0 = time.perf_counter()
        traced = analyze_paths(sorted(run_dir.glob("torch_rank*.json"))).to_json()
        row: dict[str, Any] = {"run": direct["name"], "analyze_s": time.perf_counter() - t0}
        for key in ANALYZE_KEYS:
            a, d = traced[key], direct[key]
            row[key] = {"analyze": a, "direct": d,
                        "rel_diff": abs(a - d) / max(abs(d), 1e-12)}  # fmt: skip
        rows.append(row)
    return {"nodes": nodes, "bandwidth": "500mbit" if nodes > 1 else None, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="dlrm")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5, help="Overhead pairs.")
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--parts",
        default="network,overhead,data,launch,analyze",
        help="Comma-separated parts (interleaved: only overhead's Latin-square run).",
    )
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/stalls_accuracy.json"))
    ap.add_argument(
        "--interleaved-repeats",
        type=int,
        default=100,
        help="Rounds of 10-iteration blocks, one per variant, in the interleaved overhead run.",
    )
    ap.add_argument("--overhead-rank", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.overhead_rank is not None:
        n = len(OVERHEAD_VARIANTS)
        overhead_rank(blocks=n * args.repeats, block_iters=10, out=args.overhead_rank)
        return
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "args": vars(args) | {"out": str(args.out)},
    }
    with tempfile.TemporaryDirectory(prefix="rp-stalls-") as tmp:
        root = Path(tmp)
        parts = set(args.parts.split(","))
        why = netem.available()
        if "network" in parts:
            result["network"] = network_part(args, root) if why is None else {"skipped": why}
        if "overhead" in parts:
            result["overhead"] = overhead_part(args, root)
        elif "interleaved" in parts:  # the Latin-square overhead run alone
            result["overhead"] = overhead_interleaved(args, root)
        if "data" in parts:
            result["data_stall"] = data_stall_part(args, root)
        if "analyze" in parts:
            result["analyze"] = analyze_part(args, root)
        if "launch" in parts:
            result["launch"] = launch_part(args, root) if why is None else {"skipped": why}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
