"""``launch``: run the user's own training command as N rank processes with the environment
``torchrun`` sets, on one machine or on emulated ones, collect the traces it writes where
``RECPERF_TRACE_DIR`` says, and analyse them. With nodes > 1 the command runs twice, at one
node and at M, so the network stall comes both by difference and directly from the traces.

A script finds its trace directory with ``trace_dir()`` / ``trace_path()`` or by reading the
variable itself, and writes there with torch.profiler's ``tensorboard_trace_handler(dir)`` or
``export_chrome_trace``, or with ``recperf.stalls.Profiler.write_trace``."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.core.results import write_json
from recperf.stalls.result import FIGURES, StallSummary
from recperf.stalls.run import netem, runner

TRACE_DIR_ENV = "RECPERF_TRACE_DIR"
"""The variable naming the directory each rank writes its trace into."""
Progress = Callable[[float, str], None]


def trace_dir() -> Path | None:
    """The directory ``recperf stalls launch`` asks this rank to write traces into (None when
    the script runs without it)."""
    value = os.environ.get(TRACE_DIR_ENV)
    return Path(value) if value else None


def trace_path(rank: int | None = None) -> Path | None:
    """``rank{R}.json`` in ``trace_dir()`` (rank from ``RANK`` by default), None without it."""
    directory = trace_dir()
    if directory is None:
        return None
    return directory / f"rank{int(os.environ.get('RANK', 0)) if rank is None else rank}.json"


@dataclass(kw_only=True, slots=True, frozen=True)
class LaunchConfig:
    """What to run and on what emulated topology."""

    command: tuple[str, ...] = ()
    """The training command and its arguments, run once per rank (required)."""
    ranks: int = 2
    """Rank processes (>= 1)."""
    nodes: int = 1
    """Emulated machines (1..ranks, dividing ranks); > 1 also runs at 1 node for the difference."""
    bandwidth: str = "1gbit"
    """Link bandwidth of each emulated machine."""
    threads: int | None = None
    """OMP_NUM_THREADS per rank (default: $OMP_NUM_THREADS as torchrun keeps it, else this
    machine's cores / ranks, at least 1)."""
    timeout_s: float = 600.0
    """Time limit of each run."""
    skip_steps: int = 0
    """Traced steps to leave out of the analysis at the start of each trace (>= 0)."""

    def __post_init__(self) -> None:
        if not self.command or not all(isinstance(a, str) for a in self.command):
            raise ConfigError(
                "command: give the training command after --, e.g. -- python train.py --steps 20"
            )
        check_range("ranks", self.ranks, 1, None)
        check_range("nodes", self.nodes, 1, self.ranks)
        if self.ranks % self.nodes:
            raise ConfigError(f"ranks = {self.ranks}: must be a multiple of nodes = {self.nodes}")
        netem.parse_bandwidth(self.bandwidth)
        if self.threads is not None:
            check_range("threads", self.threads, 1, None)
        check_range("timeout_s", self.timeout_s, 0.0, None, lo_open=True)
        check_range("skip_steps", self.skip_steps, 0, None)

    @property
    def threads_per_rank(self) -> int:
        """Every emulated machine shares this one's cores, so the fair share is cores / ranks,
        the same in the 1-node and the M-node run (their difference must not be compute)."""
        env = os.environ.get("OMP_NUM_THREADS", "")
        if self.threads is None and env.isdigit() and int(env) > 0:
            return int(env)
        return self.threads or max(1, (os.cpu_count() or 1) // self.ranks)


def resolve_command(command: Sequence[str]) -> list[str]:
    """``command`` with its program as an absolute path (namespaces exec it by path)."""
    program = shutil.which(command[0])
    if program is None:
        raise ConfigError(f"command {command[0]!r}: not found (not a file, nor on PATH)")
    return [os.path.abspath(program), *command[1:]]  # not resolved: a venv's python is a link


def visible_gpus() -> list[str]:
    """The GPUs ranks may use: $CUDA_VISIBLE_DEVICES, else the NVIDIA driver's list."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [g for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    gpus = Path("/proc/driver/nvidia/gpus")
    return [str(i) for i in range(len(list(gpus.iterdir())))] if gpus.is_dir() else []


def rank_env(
    rdzv: runner.Rendezvous, rank: int, run_dir: Path, host_id: str | None
) -> dict[str, str]:
    """This environment plus torchrun's variables for ``rank``, ``RECPERF_TRACE_DIR`` and
    torchrun's per-rank error file (where ``@record`` puts an uncaught exception). On an
    emulated machine (``host_id``) NCCL gets that machine's NCCL_HOSTID, so its ranks count as
    another host's and talk through the emulated network, not through shared memory; and with
    a GPU per rank, the machine sees only its own (LOCAL_RANK counts from 0 on each)."""
    env = {
        **os.environ,
        **runner.torchrun_env(rdzv, rank),
        TRACE_DIR_ENV: str(run_dir / "traces"),
        "TORCHELASTIC_ERROR_FILE": str(run_dir / f"rank{rank}.error.json"),
    }
    if host_id is not None:
        env["NCCL_HOSTID"] = host_id
        gpus, per_node = visible_gpus(), rdzv.ranks // rdzv.nodes
        if len(gpus) >= rdzv.ranks:
            node = rank // per_node
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[node * per_node : (node + 1) * per_node])
    return env


def _rendezvous(
    config: LaunchConfig, name: str, net: netem.EmulatedNetwork | None
) -> runner.Rendezvous:
    """Where the ranks meet: the first emulated machine's address, else loopback."""
    if net is not None:
        addr, port, ifname = net.nodes[0].address, 29500, "eth0"
    else:
        addr, port, ifname = "127.0.0.1", runner.free_port(), "lo"
    return runner.Rendezvous(ranks=config.ranks, nodes=len(net.nodes) if net is not None else 1,
                             addr=addr, port=port, ifname=ifname,
                             threads=config.threads_per_rank, run_id=f"recperf-{name}")  # fmt: skip


@dataclass(kw_only=True, slots=True, frozen=True)
class RunRecord:
    """How one run of the command went (``exit.json``'s keys, plus the traces it wrote)."""

    name: str
    nodes: int
    command: tuple[str, ...]
    """The command as run (its program resolved to an absolute path)."""
    cwd: str
    ranks: int
    exit_codes: tuple[int, ...]
    wall_s: float
    traces: tuple[str, ...]
    """The trace files, relative to the run's directory."""

    def to_json(self) -> dict[str, Any]:
        """The run's object in summary.json's ``runs`` (before its figures)."""
        return {"name": self.name, "nodes": self.nodes, "command": list(self.command),
                "cwd": self.cwd, "ranks": self.ranks, "exit_codes": list(self.exit_codes),
                "wall_s": self.wall_s, "traces": list(self.traces)}  # fmt: skip


@dataclass(kw_only=True, slots=True, frozen=True)
class LaunchRun:
    """One run of the command: the analysis of its traces and how it went."""

    analysis: StallSummary
    run: RunRecord


def run_once(config: LaunchConfig, run_dir: Path, net: netem.EmulatedNetwork | None) -> LaunchRun:
    """Run the command once (on ``net``'s machines, else all on loopback), then analyse the
    traces it wrote; return that analysis and how the run went (also in ``exit.json``)."""
    nodes = len(net.nodes) if net is not None else 1
    run_dir = run_dir.resolve()
    traces = run_dir / "traces"
    shutil.rmtree(traces, ignore_errors=True)
    traces.mkdir(parents=True)
    for old in run_dir.glob("rank*.error.json"):
        old.unlink()
    cmd = resolve_command(config.command)
    rdzv = _rendezvous(config, run_dir.name, net)
    per_node = config.ranks // nodes
    machines = [net.nodes[r // per_node] if net is not None else None for r in range(config.ranks)]
    commands = [m.command(cmd) if m is not None else cmd for m in machines]
    envs = [
        rank_env(rdzv, r, run_dir, m.namespace if m is not None else None)
        for r, m in enumerate(machines)
    ]
    logs = [run_dir / f"rank{r}.log" for r in range(config.ranks)]
    record: dict[str, Any] = {
        "name": run_dir.name,
        "nodes": nodes,
        "command": cmd,
        "cwd": os.getcwd(),
        "ranks": config.ranks,
    }
    t0 = time.perf_counter()
    try:
        codes = runner.run_processes(f"run {run_dir.name}", commands, envs, logs, config.timeout_s)
    except runner.RunError as exc:
        write_json(
            run_dir / "exit.json", {**record, "exit_codes": exc.exit_codes, "error": str(exc)}
        )
        raise
    record |= {"exit_codes": codes, "wall_s": time.perf_counter() - t0}
    write_json(run_dir / "exit.json", record)
    if not any(traces.iterdir()):
        raise ConfigError(
            f"run {run_dir.name}: the command wrote no trace into {TRACE_DIR_ENV}={traces} "
            "(write one per rank there, e.g. with torch.profiler's tensorboard_trace_handler)"
        )
    from recperf.stalls.trace import kineto  # after the run: pandas and torch are not needed before

    paths = kineto.find_traces([traces])
    analysis = kineto.analyze_paths(paths, ranks_per_node=per_node, skip_steps=config.skip_steps)
    write_json(run_dir / "analysis.json", analysis.to_json())
    run = RunRecord(name=run_dir.name, nodes=nodes, command=tuple(cmd), cwd=record["cwd"],
                    ranks=config.ranks, exit_codes=tuple(codes), wall_s=record["wall_s"],
                    traces=tuple(str(p.relative_to(run_dir)) for p in paths))  # fmt: skip
    return LaunchRun(analysis=analysis, run=run)


def launch(config: LaunchConfig, out: Path, progress: Progress | None = None) -> StallSummary:
    """Run the command at 1 node (and at ``config.nodes`` when > 1), analyse, write
    ``out/summary.json`` (each run's traces, logs, exit codes and analysis under
    ``out/runs/``); return the summary."""
    resolve_command(config.command)  # a missing program fails before any work
    skipped: dict[str, str] = {}
    nodes = config.nodes
    why = netem.available() if nodes > 1 else None
    if why:
        skipped["network"] = f"{why}; ran at one node only"
        nodes = 1
    plan = [("local", 1)] + ([("network", nodes)] if nodes > 1 else [])
    results: dict[str, LaunchRun] = {}
    with netem.machines(nodes, config.bandwidth) as net:
        for i, (name, m) in enumerate(plan):
            if progress is not None:
                progress(i / len(plan), f"run {name}: {config.ranks} rank(s) on {m} node(s)")
            results[name] = run_once(config, out / "runs" / name, net if m > 1 else None)
    if progress is not None:
        progress(1.0, "analysed")
    summary = combine(config, results, skipped)
    write_json(out / "summary.json", summary.to_json())
    return summary


def exposed_comm_s(analysis: StallSummary) -> float:
    """Communication nothing overlapped, per iteration: the interconnect and network stalls
    the trace analysis found (at one node, all of it is interconnect)."""
    return analysis.interconnect_stall_s + analysis.network_stall_s


def _network(
    local: LaunchRun, top: LaunchRun
) -> tuple[dict[str, float], dict[str, str], dict[str, float], dict[str, dict[str, float]]]:
    """(figures, methods, direct figures, cross-check) of the network stall from the local and
    the M-node run: by difference of iteration times, and directly from exposed communication."""
    diff = max(0.0, top.analysis.iteration_s - local.analysis.iteration_s)
    dirc = max(0.0, exposed_comm_s(top.analysis) - exposed_comm_s(local.analysis))
    figures = {
        "compute_s": local.analysis.compute_s,
        "interconnect_stall_s": exposed_comm_s(local.analysis),
        "network_stall_s": diff,
    }
    method = {
        "compute_s": "direct: run 'local' (all ranks on one node), iteration less data "
        "wait and exposed communication",
        "interconnect_stall_s": "direct: exposed communication in run 'local'",
        "network_stall_s": f"differential: run 'network' ({top.run.nodes} nodes) - "
        "run 'local' (1 node), iteration time",
    }
    direct = {
        "network_stall_s": dirc,
        "local_exposed_comm_s": exposed_comm_s(local.analysis),
        "network_exposed_comm_s": exposed_comm_s(top.analysis),
    }
    cross = {"differential_s": diff, "direct_s": dirc,
             "rel_diff": abs(diff - dirc) / max(diff, dirc, 1e-12)}  # fmt: skip
    return figures, method, direct, {"network_stall_s": cross}


def combine(
    config: LaunchConfig, results: Mapping[str, LaunchRun], skipped: Mapping[str, str]
) -> StallSummary:
    """The summary: the top run's figures (the M-node one when it ran), with the network stall
    by difference of the two runs and directly, cross-checked, in ``profile``'s shape."""
    local = results["local"]
    top = results.get("network", local)
    analysis = top.analysis
    figures = {k: float(getattr(analysis, k)) for k in ("iteration_s", *FIGURES)}
    method = {k: str(v) for k, v in analysis.method.items()}
    direct = dict(analysis.direct)
    cross: dict[str, dict[str, float]] = {}
    if "network" in results:
        more, how, measured, cross = _network(local, top)
        figures, method, direct = figures | more, method | how, direct | measured
    networked = "network" in results
    details = {
        **analysis.details,
        "command": list(config.command),
        "cwd": top.run.cwd,
        "ranks": config.ranks,
        "nodes": top.run.nodes,
        "bandwidth": config.bandwidth if networked else None,
        "bandwidth_bits_per_s": netem.parse_bandwidth(config.bandwidth) if networked else None,
        "threads_per_rank": config.threads_per_rank,
        "runs": [
            r.run.to_json() | {k: getattr(r.analysis, k) for k in ("iteration_s", *FIGURES)}
            for r in results.values()
        ],
    }
    result = StallSummary(
        created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
        source="launch",
        iteration_s=figures["iteration_s"],
        compute_s=figures["compute_s"],
        data_fetch_stall_s=figures["data_fetch_stall_s"],
        data_prep_stall_s=figures["data_prep_stall_s"],
        interconnect_stall_s=figures["interconnect_stall_s"],
        network_stall_s=figures["network_stall_s"],
        contention_s=analysis.contention_s,
        unexplained_s=figures["iteration_s"] - sum(figures[k] for k in FIGURES),
        method=method,
        direct=direct,
        cross_check=cross,
        skipped=dict(skipped),
        details=details,
    )
    return result
