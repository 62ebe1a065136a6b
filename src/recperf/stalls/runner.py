"""Launch one profiled run on this machine: one process per rank with the environment
``torch.distributed`` expects (as ``torchrun`` would set it), each inside its emulated node's
network namespace when the run spans nodes; page-cache preparation for real data; collect the
rank traces. A failed or hung rank stops the whole run with its log's last lines."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recperf.core.errors import RecperfError
from recperf.stalls.netem import EmulatedNetwork
from recperf.stalls.spec import RunSpec


class RunError(RecperfError):
    """A rank of a profiled run failed or timed out."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def evict(paths: Sequence[Path]) -> int:
    """Drop ``paths`` from the page cache (posix_fadvise DONTNEED after fsync); bytes evicted."""
    total = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def warm(paths: Sequence[Path]) -> int:
    """Read ``paths`` whole so they sit in the page cache; bytes read."""
    total = 0
    for path in paths:
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                total += len(chunk)
    return total


def _rank_env(spec: RunSpec, rank: int, addr: str, port: int, ifname: str) -> dict[str, str]:
    per_node = spec.ranks // spec.nodes
    env = dict(os.environ)
    env.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(spec.ranks),
            "LOCAL_RANK": str(rank % per_node),
            "LOCAL_WORLD_SIZE": str(per_node),
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": ifname,
            "OMP_NUM_THREADS": str(spec.threads),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def launch(
    spec: RunSpec, run_dir: Path, net: EmulatedNetwork | None = None
) -> list[dict[str, Any]]:
    """Run ``spec`` with its ranks as local processes; return the rank traces in rank order.
    ``net`` (required when ``spec.nodes > 1``) holds the emulated nodes."""
    if spec.nodes > 1 and (net is None or len(net.nodes) != spec.nodes):
        raise RunError(f"run {spec.name}: {spec.nodes} nodes need an emulated network of as many")
    run_dir.mkdir(parents=True, exist_ok=True)
    for pattern in ("rank*.json", "torch_rank*.json"):
        for old in run_dir.glob(pattern):
            old.unlink()
    spec_path = spec.save(run_dir / "spec.json")
    per_node = spec.ranks // spec.nodes
    if net is not None and spec.nodes > 1:
        addr, port, ifname = net.nodes[0].address, 29500, "eth0"
    else:
        addr, port, ifname = "127.0.0.1", free_port(), "lo"
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for rank in range(spec.ranks):
            cmd = [sys.executable, "-m", "recperf.stalls.rank", str(spec_path)]
            if net is not None and spec.nodes > 1:
                cmd = net.nodes[rank // per_node].command(cmd)
            log = run_dir / f"rank{rank}.log"
            with log.open("wb") as fh:
                p = subprocess.Popen(
                    cmd,
                    env=_rank_env(spec, rank, addr, port, ifname),
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            procs.append((p, log))
        _wait(spec, procs)
    finally:
        for p, _ in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(spec.ranks)]


def _wait(spec: RunSpec, procs: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    deadline = time.monotonic() + spec.timeout_s
    while True:
        codes = [p.poll() for p, _ in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                raise RunError(
                    f"run {spec.name}: rank {rank} exited with {code}: {_tail(procs[rank][1])}"
                )
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            raise RunError(f"run {spec.name}: timed out after {spec.timeout_s:.0f} s")
        time.sleep(0.05)


def _tail(log: Path, lines: int = 3) -> str:
    text = log.read_text(errors="replace").strip().splitlines()
    return " | ".join(text[-lines:]) if text else "(no output)"
