"""Launch one profiled run on this machine: one process per rank with the environment
``torch.distributed`` expects (as ``torchrun`` would set it), each inside its emulated node's
network namespace when the run spans nodes; page-cache preparation for real data; collect the
rank traces. A failed or hung rank stops the whole run with its log's last lines."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from recperf.core.errors import RecperfError
from recperf.stalls.run.netem import EmulatedNetwork
from recperf.stalls.run.spec import RunSpec


class RunError(RecperfError):
    """A rank of a profiled run failed or timed out."""

    def __init__(self, message: str, *, exit_codes: Sequence[int | None] = ()) -> None:
        super().__init__(message)
        self.exit_codes = list(exit_codes)
        """Each rank's exit code when the run stopped (None: still running, then killed)."""


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


@dataclass(kw_only=True, slots=True, frozen=True)
class Rendezvous:
    """Where and how a run's ranks meet: the world's shape and rank 0's address."""

    ranks: int
    """World size."""
    nodes: int
    """Machines the ranks are spread over (ranks // nodes per machine, in rank order)."""
    addr: str
    """MASTER_ADDR: rank 0's address."""
    port: int
    """MASTER_PORT: the TCP store rank 0 hosts."""
    ifname: str
    """The network interface gloo and NCCL use (lo, or eth0 inside an emulated node)."""
    threads: int
    """OMP_NUM_THREADS of every rank."""
    run_id: str = "recperf"
    """TORCHELASTIC_RUN_ID."""


def torchrun_env(rdzv: Rendezvous, rank: int) -> dict[str, str]:
    """The variables ``torchrun`` sets for global rank ``rank`` (one static group of one role,
    no restarts), so that ``init_process_group()`` with its ``env://`` default works unchanged;
    rank 0 hosts the store (there is no elastic agent's store to join)."""
    per_node = rdzv.ranks // rdzv.nodes
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(rdzv.ranks),
        "LOCAL_RANK": str(rank % per_node),
        "LOCAL_WORLD_SIZE": str(per_node),
        "GROUP_RANK": str(rank // per_node),
        "GROUP_WORLD_SIZE": str(rdzv.nodes),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(rdzv.ranks),
        "MASTER_ADDR": rdzv.addr,
        "MASTER_PORT": str(rdzv.port),
        "TORCHELASTIC_RUN_ID": rdzv.run_id,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "GLOO_SOCKET_IFNAME": rdzv.ifname,
        "NCCL_SOCKET_IFNAME": rdzv.ifname,
        "OMP_NUM_THREADS": str(rdzv.threads),
        "PYTHONUNBUFFERED": "1",
    }


def _rank_env(spec: RunSpec, rank: int, addr: str, port: int, ifname: str) -> dict[str, str]:
    rdzv = Rendezvous(ranks=spec.ranks, nodes=spec.nodes, addr=addr, port=port, ifname=ifname,
                      threads=spec.threads, run_id=spec.name)  # fmt: skip
    return {**os.environ, **torchrun_env(rdzv, rank)}


def launch(spec: RunSpec, run_dir: Path, net: EmulatedNetwork | None = None) -> list[Path]:
    """Run ``spec`` with its ranks as local processes; return the rank trace files in rank order
    (read them with ``ranktrace.load_rank_run``). ``net`` (required when ``spec.nodes > 1``)
    holds the emulated nodes."""
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
    commands, envs, logs = [], [], []
    for rank in range(spec.ranks):
        cmd = [sys.executable, "-m", "recperf.stalls.run.rank", str(spec_path)]
        if net is not None and spec.nodes > 1:
            cmd = net.nodes[rank // per_node].command(cmd)
        commands.append(cmd)
        envs.append(_rank_env(spec, rank, addr, port, ifname))
        logs.append(run_dir / f"rank{rank}.log")
    run_processes(f"run {spec.name}", commands, envs, logs, spec.timeout_s)
    return [run_dir / f"rank{r}.json" for r in range(spec.ranks)]


def run_processes(
    what: str,
    commands: Sequence[Sequence[str]],
    envs: Sequence[Mapping[str, str]],
    logs: Sequence[Path],
    timeout_s: float,
) -> list[int]:
    """Run one process per command (its own session, stdout and stderr to its log) and wait
    for all; return their exit codes (all 0). A process that fails, or the time limit, raises
    RunError naming ``what`` (with the failed one's last log lines); every process group still
    running is killed on the way out, also on Ctrl-C or SIGTERM (which the CLI raises as
    KeyboardInterrupt)."""
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for cmd, env, log in zip(commands, envs, logs, strict=True):
            with log.open("wb") as fh:
                try:
                    p = subprocess.Popen(
                        list(cmd),
                        env=dict(env),
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                except OSError as exc:
                    raise RunError(f"{what}: cannot start {cmd[0]!r}: {exc.strerror}") from None
            procs.append((p, log))
        return _wait(what, procs, timeout_s)
    finally:
        for p, _ in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _wait(
    what: str, procs: list[tuple[subprocess.Popen[bytes], Path]], timeout_s: float
) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p, _ in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                raise RunError(
                    f"{what}: rank {rank} exited with {code}: {_tail(procs[rank][1])}",
                    exit_codes=codes,
                )
        if all(c == 0 for c in codes):
            return [0] * len(codes)
        if time.monotonic() > deadline:
            raise RunError(f"{what}: timed out after {timeout_s:.0f} s", exit_codes=codes)
        time.sleep(0.05)


def _tail(log: Path, lines: int = 3) -> str:
    text = log.read_text(errors="replace").strip().splitlines()
    return " | ".join(text[-lines:]) if text else "(no output)"
