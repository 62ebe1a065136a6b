"""How stable the emulated network stall is across runs, and what moves it (issue 24).

1. The shaped link alone: a gloo all-reduce of the dlrm workload's gradient bytes between two
   emulated nodes, after 0.1 s idle each time (the token bucket refills as during compute),
   against the wire time: 2(n-1)/n * bytes * 1514/1448 (Ethernet frames per TCP payload) /
   bandwidth.
2. ``stalls profile`` (dlrm, 2 ranks on 2 nodes) repeated: the network stall by difference (run
   'network' - run 'intra'), directly (exposed all-reduce, network run - intra run), and the
   network run's own exposed all-reduce, each against the ring wire time.

    python benchmarks/stalls_netem_stability.py [--bandwidth 500mbit] [--repeats 4]

Needs root (network namespaces and tc).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from recperf.stalls.run import netem
from recperf.stalls.run.profile import ProfileConfig, profile

FRAME_PER_PAYLOAD = 1514 / 1448
RANK = r"""
import json, sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
addr, rank, nbytes, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("gloo", init_method=f"tcp://{addr}:29512", rank=rank, world_size=2)
t, out = torch.ones(nbytes // 4), []
for _ in range(reps + 2):
    dist.barrier(); time.sleep(0.1)
    t0 = time.perf_counter(); dist.all_reduce(t); out.append(time.perf_counter() - t0)
if rank == 0:
    print(json.dumps(out[2:]))
dist.destroy_process_group()
"""


def wire_s(nbytes: float, bandwidth_bits: float, nodes: int = 2) -> float:
    """A ring all-reduce's seconds on the wire, frame headers included."""
    return 2 * (nodes - 1) / nodes * nbytes * FRAME_PER_PAYLOAD / (bandwidth_bits / 8)


def link_alone(bandwidth: str, nbytes: int, reps: int) -> list[float]:
    """All-reduce seconds over the shaped link / wire time, one per all-reduce."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    with netem.EmulatedNetwork(2, bandwidth) as net:
        addr = net.nodes[0].address
        procs = [subprocess.Popen(node.command([sys.executable, "-c", RANK, addr, str(r),
                                                str(nbytes), str(reps)]),
                                  stdout=subprocess.PIPE, text=True, env=env)
                 for r, node in enumerate(net.nodes)]  # fmt: skip
        out = procs[0].communicate(timeout=600)[0]
        procs[1].wait(timeout=60)
    wire = wire_s(nbytes, netem.parse_bandwidth(bandwidth))
    return [t / wire for t in json.loads(out)]


def profiled(bandwidth: str, iters: int) -> dict[str, Any]:
    """One profile's three network figures against the wire time."""
    with tempfile.TemporaryDirectory(prefix="rp-netem-") as tmp:
        config = ProfileConfig(workload="dlrm", ranks=2, nodes=2, bandwidth=bandwidth,
                               iters=iters, warmup=3, real_data=False)  # fmt: skip
        s = profile(config, Path(tmp)).to_json()
    wire = wire_s(s["grad_bytes"], s["bandwidth_bits_per_s"])
    runs = {r["name"]: r for r in s["runs"]}
    return {
        "differential": s["network_stall_s"] / wire,
        "direct": s["direct"]["network_stall_s"] / wire,
        "network_run_exposed": runs["network"]["exposed_comm_s"] / wire,
        "iteration_ms": {k: round(r["iteration_s"] * 1e3, 1) for k, r in runs.items()},
        "load_average": os.getloadavg()[0],
        "grad_bytes": s["grad_bytes"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bandwidth", default="500mbit")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--iters", type=int, default=15)
    args = ap.parse_args()
    why = netem.available()
    if why:
        raise SystemExit(why)
    rows = [profiled(args.bandwidth, args.iters) for _ in range(args.repeats)]
    for row in rows:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    for _ in range(args.repeats):
        ratios = link_alone(args.bandwidth, rows[0]["grad_bytes"], 15)
        print(f"link alone: median {statistics.median(ratios):.3f} of the wire time "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}, 15 all-reduces)")  # fmt: skip


if __name__ == "__main__":
    main()
