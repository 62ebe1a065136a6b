"""Accuracy and overhead of the stall profiler (issue 5's evidence).

1. Two emulated nodes (network namespaces, tc tbf) at 200 Mbit/s, 500 Mbit/s and 1 Gbit/s:
   the network stall measured by differential runs versus the direct (DDP hook) method, and the
   communication model fitted on the other bandwidths' all-reduce measurements predicting it.
2. Profiler overhead: instrumented versus plain runs, same ranks, interleaved.
3. An injected data stall (a sleep in the data iterator) and how much of it is attributed.

    python benchmarks/stalls_accuracy.py [--workload dlrm] [--iters 20] [--out DIR]

Needs root for the namespaces (part 1); parts 2 and 3 run anywhere.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from recperf.stalls import netem, runner
from recperf.stalls.analysis import run_stats
from recperf.stalls.commmodel import CommSample, exposed_stall_s, fit
from recperf.stalls.profile import ProfileConfig, profile
from recperf.stalls.spec import RunSpec

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
        profiles[bw] = profile(cfg, root / f"net-{bw}")
        print(f"profiled {bw} in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for bw, s in profiles.items():
        others = [
            CommSample(**c) for b, p in profiles.items() if b != bw for c in p["comm_samples"]
        ]
        model = fit(others)
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
            traces = runner.launch(spec, root / "overhead" / spec.name)
            times[instrument] = run_stats(spec, traces).iteration_median_s
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
    """In one process: microseconds the Profiler adds per iteration (data wrap, step, three
    phases) over a bare loop, median of 5 interleaved trials."""
    from recperf.stalls.profiler import Profiler

    def bare() -> float:
        t0 = time.perf_counter()
        for _ in iter(range(iters)):
            pass
        return time.perf_counter() - t0

    def instrumented() -> float:
        prof = Profiler(cuda=False)
        t0 = time.perf_counter()
        for _ in prof.data(range(iters)):
            with prof.step():
                for name in ("forward", "backward", "optimizer"):
                    with prof.phase(name):
                        pass
        return time.perf_counter() - t0

    costs = [(instrumented() - bare()) / iters * 1e6 for _ in range(5)]
    return {"per_iteration_us": statistics.median(costs)}


def overhead_rank(blocks: int, block_iters: int, out: Path) -> None:
    """One rank of the interleaved overhead measurement: two DDP copies of the same DLRM, one
    plain (DDP's built-in all-reduce) and one under the Profiler (timing hook, data wrap, step
    and phases), trained in alternating blocks in the same processes."""
    import os

    import torch
    import torch.distributed as dist
    from torch import nn

    from recperf.stalls.base import DataSpec
    from recperf.stalls.profiler import Profiler
    from recperf.stalls.workloads import DlrmWorkload

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    w = DlrmWorkload()
    models = [nn.parallel.DistributedDataParallel(w.build(0)) for _ in range(2)]
    opts = [torch.optim.SGD(m.parameters(), lr=1e-3) for m in models]
    prof = Profiler(models[1], cuda=False)
    it = w.synthetic(DataSpec(batch_size=256, rank=dist.get_rank(), world=2))
    times: dict[str, list[float]] = {"plain": [], "instrumented": []}
    for b in range(blocks):
        instrumented = (b % 2 == 1) != (b // 2 % 2 == 1)  # ABBA order
        model, opt = models[instrumented], opts[instrumented]
        for _ in range(block_iters):
            dist.barrier()
            t0 = time.perf_counter()
            if instrumented:
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
            times["instrumented" if instrumented else "plain"].append(time.perf_counter() - t0)
    dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        out.write_text(json.dumps(times))


def overhead_interleaved(args: argparse.Namespace, root: Path) -> dict[str, Any]:
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
    times = json.loads(out.read_text())
    plain, inst = (statistics.median(times[k]) for k in ("plain", "instrumented"))
    return {
        "interleaved_plain_iteration_s": plain,
        "interleaved_instrumented_iteration_s": inst,
        "interleaved_overhead": inst / plain - 1.0,
        "interleaved_iterations_each": len(times["plain"]),
    }


def data_stall_part(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    out = {}
    for delay in (0.0, args.delay_ms):
        spec = _spec(args, f"delay{delay:g}", delay_ms=delay)
        out[delay] = run_stats(spec, runner.launch(spec, root / "delay" / spec.name))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="dlrm")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5, help="Overhead pairs.")
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parts", default="network,overhead,data", help="Comma-separated parts.")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/stalls_accuracy.json"))
    ap.add_argument(
        "--interleaved-repeats",
        type=int,
        default=20,
        help="ABBA block quadruples of 10 iterations in the interleaved overhead run.",
    )
    ap.add_argument("--overhead-rank", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.overhead_rank is not None:
        overhead_rank(blocks=4 * args.repeats, block_iters=10, out=args.overhead_rank)
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
        if "data" in parts:
            result["data_stall"] = data_stall_part(args, root)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
