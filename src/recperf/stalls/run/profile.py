"""``profile``: the differential runs of one workload and topology, each adding one source of
stall, analysed both ways and written as ``summary.json`` (plus every run's spec, rank traces
and logs under ``runs/``)."""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import torch

from recperf.core.config import check_range, check_seed
from recperf.core.errors import ConfigError
from recperf.core.results import write_json
from recperf.stalls.base import WORKLOADS, DataSpec, Workload, grad_bytes
from recperf.stalls.model.comm import CommSample
from recperf.stalls.result import FIGURES, StallSummary
from recperf.stalls.run import differential, netem, runner
from recperf.stalls.run.ranktrace import load_rank_run
from recperf.stalls.run.spec import RunSpec, data_batches
from recperf.stalls.trace import breakdown, kineto

Progress = Callable[[float, str], None]
DDP_FIRST_BUCKET = 1 << 20
DDP_BUCKET = 25 << 20


@dataclass(kw_only=True, slots=True, frozen=True)
class ProfileConfig:
    """What to profile and how."""

    workload: str = "dlrm"
    """Registered workload or package.module:attr."""
    workload_options: dict[str, Any] = field(default_factory=dict)
    """Fields of the workload's Config (values may be CLI strings; validated when built)."""
    ranks: int = 2
    """Data-parallel ranks (>= 1)."""
    nodes: int = 1
    """Emulated machines (1..ranks, dividing ranks); > 1 needs root for namespaces."""
    bandwidth: str = "1gbit"
    """Link bandwidth of each emulated machine."""
    iters: int = 20
    """Timed iterations per run (>= 1)."""
    warmup: int = 3
    """Untimed iterations per run (>= 0)."""
    batch_size: int = 256
    """Samples per rank per iteration."""
    seed: int = 0
    """Model and data seed."""
    threads: int | None = None
    """torch threads per rank (default: this machine's cores / ranks, at least 1)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """cpu (gloo) or cuda (NCCL)."""
    real_data: bool = True
    """Run the warm- and cold-cache real-data runs (when the workload has real data)."""
    data_dir: Path | None = None
    """Where real data is generated and read (default: OUT/data)."""
    delay_ms: float = 0.0
    """Injected data stall in every run's data iterator (to validate attribution)."""
    timeout_s: float = 600.0
    """Per-run time limit."""
    torch_trace_iters: int = 0
    """Timed iterations of every run also captured with torch.profiler (0: none)."""
    fit_bandwidths: tuple[str, ...] = ()
    """Other link bandwidths at which the network run's all-reduce microbenchmark is measured
    again (one short run each, nodes > 1 only): samples at two bandwidths or more let ``stalls
    fit`` separate the per-byte term from the bandwidth term with this profile alone."""

    def __post_init__(self) -> None:
        check_range("ranks", self.ranks, 1, None)
        check_range("nodes", self.nodes, 1, self.ranks)
        if self.ranks % self.nodes:
            raise ConfigError(f"ranks = {self.ranks}: must be a multiple of nodes = {self.nodes}")
        netem.parse_bandwidth(self.bandwidth)
        check_range("iters", self.iters, 1, None)
        check_range("warmup", self.warmup, 0, None)
        check_range("batch_size", self.batch_size, 1, None)
        check_seed(self.seed)
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device = {self.device!r}: expected cpu or cuda")
        if self.threads is not None:
            check_range("threads", self.threads, 1, None)
        check_range("delay_ms", self.delay_ms, 0.0, None)
        check_range("timeout_s", self.timeout_s, 0.0, None, lo_open=True)
        check_range("torch_trace_iters", self.torch_trace_iters, 0, self.iters)
        rates = [netem.parse_bandwidth(b) for b in (self.bandwidth, *self.fit_bandwidths)]
        if len(set(rates)) < len(rates):
            raise ConfigError(
                f"fit_bandwidths = {', '.join(self.fit_bandwidths)}: each must differ from the "
                f"others and from bandwidth = {self.bandwidth}"
            )

    @property
    def threads_per_rank(self) -> int:
        return self.threads or max(1, (os.cpu_count() or 1) // self.ranks)


def ddp_buckets(param_bytes: list[int]) -> int:
    """Buckets DDP forms (reverse parameter order, 1 MiB first bucket then 25 MiB)."""
    buckets, fill, cap = 0, 0, DDP_FIRST_BUCKET
    for n in reversed(param_bytes):
        if fill == 0:
            buckets += 1
        fill += n
        if fill >= cap:
            fill, cap = 0, DDP_BUCKET
    return max(buckets, 1)


def plan(
    config: ProfileConfig, data_dir: Path, has_data: bool, sizes: tuple[int, ...]
) -> list[RunSpec]:
    """The runs, each adding one source of stall to the one before."""
    base = RunSpec(
        name="compute",
        workload=config.workload,
        workload_options=dict(config.workload_options),
        ranks=1,
        comm=False,
        iters=config.iters,
        warmup=config.warmup,
        batch_size=config.batch_size,
        seed=config.seed,
        threads=config.threads_per_rank,
        device=config.device,
        delay_ms=config.delay_ms,
        timeout_s=config.timeout_s,
        torch_trace_iters=min(config.torch_trace_iters, config.iters),
    )
    runs = [base]
    n, m = config.ranks, config.nodes
    if n > 1:
        runs.append(replace(base, name="control", ranks=n))
        runs.append(replace(base, name="intra", ranks=n, comm=True, microbench_bytes=sizes))
    top = runs[-1]
    if m > 1:
        top = replace(top, name="network", nodes=m, bandwidth=config.bandwidth)
        runs.append(top)
    if has_data and config.real_data:
        real = replace(top, data="real", data_dir=str(data_dir), microbench_bytes=())
        runs += [replace(real, name="warm", cache="warm"), replace(real, name="cold", cache="cold")]
    return runs


def _real_data(
    config: ProfileConfig, workload: Workload, data_dir: Path, skipped: dict[str, str]
) -> list[Path]:
    """The real-data files the warm and cold runs read (none: those runs are noted skipped)."""
    if not config.real_data:
        return []
    batches = data_batches(config.warmup, config.iters)
    data_spec = DataSpec(
        batch_size=config.batch_size, world=config.ranks, batches=batches, seed=config.seed
    )
    files = workload.prepare_data(data_dir, data_spec)
    if not files:
        skipped["warm"] = skipped["cold"] = f"workload {config.workload} has no real data"
    return files


def profile(config: ProfileConfig, out: Path, progress: Progress | None = None) -> StallSummary:
    """Run every differential run, analyse, write ``out/summary.json`` (the summary's
    ``to_json``); return the summary."""
    if config.device == "cuda" and torch.cuda.device_count() < config.ranks:
        raise ConfigError(
            f"device = cuda: {config.ranks} ranks need as many GPUs; "
            f"this machine has {torch.cuda.device_count()}"
        )
    workload: Workload = WORKLOADS.build(config.workload, config.workload_options)
    model = workload.build(config.seed)
    gbytes = grad_bytes(model)
    sizes = tuple(sorted({1 << 16, 1 << 18, 1 << 20, 1 << 22, gbytes, 2 * gbytes}))
    data_dir = config.data_dir or out / "data"
    skipped: dict[str, str] = {}
    files = _real_data(config, workload, data_dir, skipped)
    nodes = config.nodes
    why = netem.available() if nodes > 1 else None
    if why:
        skipped["network"] = f"{why}; ran the single-node parts only"
        config, nodes = replace(config, nodes=1), 1
    runs = plan(config, data_dir, bool(files), sizes)
    stats: dict[str, differential.RunStats] = {}
    torch_figs: dict[str, dict[str, float]] = {}
    loads: dict[str, float] = {}
    samples = []
    with netem.machines(nodes, config.bandwidth) as net:
        for i, spec in enumerate(runs):
            if progress is not None:
                progress(i / len(runs), f"run {spec.name} ({i + 1}/{len(runs)})")
            if spec.data == "real":
                (runner.warm if spec.cache == "warm" else runner.evict)(files)
            run_dir = out / "runs" / spec.name
            traces = [load_rank_run(p) for p in runner.launch(spec, run_dir, net)]
            stats[spec.name] = differential.run_stats(spec, traces)
            loads[spec.name] = host_load()
            if spec.torch_trace_iters:
                paths = sorted(run_dir.glob("torch_rank*.json"))
                torch_figs[spec.name] = torch_trace_figures(paths)
            samples += differential.comm_samples(spec, traces)
    network = next((r for r in runs if r.name == "network"), None)
    if network is not None:
        samples += bandwidth_samples(network, config.fit_bandwidths, out)
    if progress is not None:
        progress(1.0, "analysing")
    result = _summary(
        config, stats, samples, skipped, [p.numel() * p.element_size() for p in model.parameters()]
    )
    cores = os.cpu_count() or 1
    host = {"host_cores": cores, "host_load_1min": loads,
            "warnings": [w for w in (busy_warning(loads, cores),) if w]}  # fmt: skip
    if torch_figs:
        host["torch_trace"] = torch_figs
    method = {**result.method, "torch_trace": TORCH_TRACE_METHOD} if torch_figs else result.method
    result = replace(result, details={**result.details, **host}, method=method)
    write_json(out / "summary.json", result.to_json())
    return result


def host_load() -> float:
    """The host's 1-minute load average (0 where the system keeps none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return 0.0


def busy_warning(loads: dict[str, float], cores: int) -> str | None:
    """A warning when a run ended with more runnable work than cores: a figure by difference
    between runs then moves with the load (measured here: the 2-node network stall at 0.83-0.90
    of the ring's wire time at load 1.3 on 2 cores, 0.41-1.05 at load 10-13), because a
    one-machine run's compute stretches while a network run's ranks wait on the wire."""
    busy = {name: load for name, load in loads.items() if load > cores}
    if not busy:
        return None
    return (
        f"the host was busy during run(s) {', '.join(busy)} (1-minute load up to "
        f"{max(busy.values()):.1f} on {cores} cores): figures by difference between runs move "
        "with the load; the direct figures ('direct') hold better"
    )


def bandwidth_samples(network: RunSpec, bandwidths: tuple[str, ...], out: Path) -> list[CommSample]:
    """The network run's all-reduce microbenchmark again at each of ``bandwidths``: one short
    run (one iteration) each, on machines emulated at that bandwidth, under ``out/runs``."""
    samples = []
    for bandwidth in bandwidths:
        spec = replace(network, name=f"network-{bandwidth}", bandwidth=bandwidth, iters=1,
                       warmup=0, torch_trace_iters=0)  # fmt: skip
        with netem.machines(network.nodes, bandwidth) as net:
            paths = runner.launch(spec, out / "runs" / spec.name, net)
        samples += differential.comm_samples(spec, [load_rank_run(p) for p in paths])
    return samples


TORCH_TRACE_METHOD = (
    "direct, from torch.profiler traces read as stalls analyze reads them: recperf:data_wait/step "
    "ranges; exposed communication is the step thread idle while a collective it launched is "
    "outstanding (on GPUs: NCCL kernel time no compute kernel overlaps)"
)
TORCH_TRACE_KEYS = ("iteration_s", "data_wait_s", "compute_s", "backward_s", "exposed_comm_s",
                    "overlapped_comm_s", "comm_busy_s")  # fmt: skip
"""summary.json's ``torch_trace`` figures per run (and ``buckets``: all-reduces per iteration)."""


def torch_trace_figures(paths: Sequence[Path]) -> dict[str, float]:
    """One run's torch.profiler rank traces read by the Kineto reader (``stalls analyze``'s):
    per-iteration means over each rank's iterations, then over ranks (``backward_s`` NaN when
    the traces hold no ``recperf:backward`` ranges)."""
    rows = []
    for trace in kineto.load_rank_traces(paths):
        rows.append(breakdown.rank_means(trace, breakdown.iteration_figures(trace)))
    out = {}
    for key, name in (*((k, k) for k in TORCH_TRACE_KEYS), ("allreduces", "buckets")):
        values = [getattr(r, key) for r in rows]
        out[name] = math.nan if None in values else statistics.fmean(values)
    return out


def _layers(stats: dict[str, differential.RunStats], param_sizes: list[int]) -> tuple[int, str]:
    """DDP's buckets per iteration: counted by the hook in the communicating run, else estimated."""
    comm_run = stats.get("network", stats.get("intra"))
    if comm_run is not None and comm_run.buckets > 0:
        return round(comm_run.buckets), f"measured: DDP hook calls in run '{comm_run.name}'"
    return ddp_buckets(param_sizes), "estimated: DDP bucketing (1 MiB, then 25 MiB)"


def _config_keys(config: ProfileConfig) -> dict[str, Any]:
    """What the profile was asked for, as summary.json names it."""
    nodes = config.nodes > 1
    return {
        "workload": config.workload,
        "workload_options": config.workload_options,
        "ranks": config.ranks,
        "nodes": config.nodes,
        "bandwidth": config.bandwidth if nodes else None,
        "bandwidth_bits_per_s": netem.parse_bandwidth(config.bandwidth) if nodes else None,
        "iters": config.iters,
        "batch_size": config.batch_size,
        "threads_per_rank": config.threads_per_rank,
        "device": config.device,
        "delay_ms": config.delay_ms,
    }


def _summary(
    config: ProfileConfig,
    stats: dict[str, differential.RunStats],
    samples: list[CommSample],
    skipped: dict[str, str],
    param_sizes: list[int],
) -> StallSummary:
    diff = differential.differential(stats)
    dirc = differential.direct(stats)
    base = stats.get("control", stats["compute"])
    layers, layers_method = _layers(stats, param_sizes)
    details = _config_keys(config) | {
        "device_name": base.meta.device_name,
        "backward_s": base.backward_s,
        "grad_bytes": base.meta.grad_bytes,
        "param_bytes": base.meta.param_bytes,
        "num_layers": layers,
        "num_param_tensors": base.meta.num_param_tensors,
        "flops_per_iter": base.meta.flops_per_iter,
        "runs": [s.to_json() for s in stats.values()],
        "comm_samples": [s.to_json() for s in samples],
    }
    figures: dict[str, Any] = {k: getattr(diff, k) for k in ("iteration_s", *FIGURES)}
    return StallSummary(
        created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
        **figures,
        contention_s=diff.contention_s,
        unexplained_s=diff.unexplained_s,
        method={
            **diff.method,
            "num_layers": layers_method,
            "grad_bytes": "measured: trainable parameter bytes (what DDP all-reduces)",
        },
        direct=dirc.to_json(),
        cross_check={k: a.to_json() for k, a in differential.cross_check(diff, dirc).items()},
        skipped=skipped,
        half_width_s=diff.half_width_s,
        details=details,
    )
