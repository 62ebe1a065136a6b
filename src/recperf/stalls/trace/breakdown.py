"""Stall figures from normalised per-rank traces (``kineto`` reads the files into ``RankTrace``):
per iteration data wait, compute, exposed and overlapped communication, and the summary that
``recperf stalls analyze`` writes, shaped like ``profile``'s summary.json.

Definitions, per iteration (one ``ProfilerStep#N`` span, or a recperf data wait + step):

- ``data_wait_s``: the union of the data-iterator ranges in it (DataLoader ``__next__``,
  ``recperf:data_wait``), clipped to the iteration.
- ``comm_busy_s``: the union of the collectives' execution spans started in it: on GPUs the
  NCCL kernels launched in it (linked to their launch by ``correlation``), on CPUs gloo's own
  ranges on its worker threads (``gloo:all_reduce`` ...) or recperf's ``recperf:allreduce``.
- ``exposed_comm_s`` on GPUs: comm-kernel time during which no compute kernel (any kernel but
  NCCL, memcpy and memset) runs on any stream of that GPU (HTA's comm/compute overlap; a wait
  on the CPU side while the GPU idles is not counted). On CPUs: time the critical
  (``ProfilerStep``) thread is blocked on communication, i.e. runs no compute op (any
  ``cpu_op`` but the collectives' own, e.g. ``c10d::allreduce_``) and is not in the data wait
  while a collective is outstanding (from its launch op to the end of its execution span):
  counted from the step's last collective launch on (DDP's final wait), and before it only in
  idle gaps that a collective's completion ends (a blocking collective; a gap while a bucket is
  merely in flight during backward is scheduling noise). recperf's own traces record no ops:
  there the thread counts as blocked from the step's last launch to the last completion, the
  direct instrumentation's rule.
- ``overlapped_comm_s``: busy time during which compute runs (GPU: a compute kernel; CPU: a
  compute op on the critical thread, or, in recperf's traces, before the waits);
  ``compute_s`` = iteration - data wait - exposed communication (the step without stalls)."""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from recperf.stalls.result import RankMeans, SlowestRank, StallBreakdown, StallSummary
from recperf.stalls.trace.intervals import (
    Interval,
    clip,
    complement,
    length,
    merge,
    overlap,
)


@dataclass(kw_only=True, slots=True, frozen=True)
class Comm:
    """One collective: its execution span and, when the trace shows it, its launch."""

    start: float
    """Execution start, seconds."""
    end: float
    """Execution end, seconds."""
    launch: float
    """When the training thread issued it, which places it in an iteration (= start when the
    trace does not show it)."""
    kind: str
    """Normalised collective name: allreduce, broadcast, alltoall, ..."""
    nbytes: int | None
    """Message bytes, when recorded (record_shapes, record_param_comms, kernel args)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Step:
    """One iteration on the critical thread."""

    index: int
    """The N of ProfilerStep#N (or the recperf iteration)."""
    start: float
    end: float
    phases: dict[str, Interval] = field(default_factory=dict)
    """recperf:forward / backward / optimizer ranges, when present."""
    flops: float | None = None
    """Sum of the ops' ``flops`` args (torch.profiler with_flops), when recorded."""


@dataclass(kw_only=True, slots=True, frozen=True)
class RankTrace:
    """One rank's trace, reduced to what the figures need; times in seconds."""

    source: str
    rank: int
    world_size: int | None
    backend: str
    """gloo, nccl or unknown."""
    host: str | None
    device: str
    """cpu, or cuda when the trace holds GPU kernels."""
    device_name: str
    steps: list[Step]
    data: list[Interval]
    """Data-iterator ranges (merged)."""
    comm: list[Comm]
    compute: list[Interval]
    """Merged compute: GPU compute kernels, or the critical thread's compute ops on CPUs."""
    ops_recorded: bool
    """False for recperf's own traces (no ops): the last-launch rule applies."""
    kernels: list[tuple[float, float, float]] = field(default_factory=list)
    """GPU compute kernels as (launch, start, end), to place them in iterations."""
    meta: dict[str, Any] = field(default_factory=dict)
    """The ``recperf`` metadata object of recperf traces."""
    epoch_s: float | None = None
    """Seconds to add to the trace's times for Unix time (None: its clock is unknown)."""
    run_id: str | None = None
    """What names the run the trace belongs to, when it says (recperf's run name, Kineto's
    process groups): two ranks of one run name the same."""


def _step_comm(trace: RankTrace, step: Step, nxt: float) -> list[Comm]:
    return [c for c in trace.comm if step.start <= c.launch < nxt]


def iteration_figures(trace: RankTrace, skip_steps: int = 0) -> list[StallBreakdown]:
    """Figures of each iteration (after the first ``skip_steps``), as the module docstring
    defines them."""
    steps = trace.steps
    return [
        _iteration(trace, step, steps[k + 1].start if k + 1 < len(steps) else step.end)
        for k, step in enumerate(steps)
        if k >= skip_steps
    ]


def _iteration(trace: RankTrace, step: Step, nxt: float) -> StallBreakdown:
    """One iteration's figures; ``nxt``: when the next one starts (its collectives launched
    before then count in this one)."""
    comms = _step_comm(trace, step, max(nxt, step.end))
    busy = merge((c.start, c.end) for c in comms)
    data = clip(trace.data, step.start, step.end)
    if trace.device == "cuda":
        exposed = length(busy) - overlap(busy, trace.compute)
        overlapped = length(busy) - exposed
    else:
        exposed, overlapped = _cpu_exposed(trace, step, comms, busy, data)
    it = step.end - step.start
    gpu_compute = None
    if trace.device == "cuda":
        end = max(nxt, step.end)
        gpu_compute = length(merge((a, b) for at, a, b in trace.kernels if step.start <= at < end))
    bwd = step.phases.get("backward")
    backward = None
    if bwd is not None:
        backward = max(0.0, bwd[1] - bwd[0] - _cpu_wait_in(trace, comms, bwd))
    return StallBreakdown(
        rank=trace.rank,
        step=step.index,
        iteration_s=it,
        data_wait_s=length(data),
        compute_s=max(0.0, it - length(data) - exposed),
        exposed_comm_s=exposed,
        overlapped_comm_s=overlapped,
        comm_busy_s=length(busy),
        collectives=len(comms),
        allreduces=sum(c.kind == "allreduce" for c in comms),
        comm_bytes=_bytes(comms),
        allreduce_bytes=_bytes([c for c in comms if c.kind == "allreduce"]),
        flops=step.flops,
        gpu_compute_s=gpu_compute,
        backward_s=backward,
    )


def _bytes(comms: Sequence[Comm]) -> int | None:
    if not comms:
        return 0
    if any(c.nbytes is None for c in comms):
        return None
    return sum(int(c.nbytes or 0) for c in comms)


def _waits(
    trace: RankTrace, comms: Sequence[Comm], lo: float, hi: float, data: Sequence[Interval]
) -> list[Interval]:
    """When, in [lo, hi], the critical thread is blocked on communication (merged): idle while
    a collective is outstanding, from the step's last launch on (all its buckets are issued,
    as DDP's final wait); before it only in gaps a collective's completion ends (a blocking
    collective: an idle gap during backward with one merely in flight is the OS's, not a wait)."""
    spans = merge((c.launch, c.end) for c in comms)
    last = max((c.launch for c in comms), default=hi)
    if not trace.ops_recorded:  # recperf traces: blocked from the last launch to the end
        return clip(spans, max(lo, last), hi)
    working = merge([*clip(trace.compute, lo, hi), *data])
    ends = sorted(c.end for c in comms)
    out = []
    for g0, g1 in complement(working, lo, hi):
        if g1 > last:
            out += clip(spans, max(g0, last), g1)
        k = bisect.bisect_right(ends, min(g1, last)) - 1
        if g0 < last and k >= 0 and ends[k] >= g0:  # a collective's completion ends the gap
            out += clip(spans, g0, ends[k])
    return merge(out)


def _cpu_exposed(
    trace: RankTrace,
    step: Step,
    comms: Sequence[Comm],
    busy: Sequence[Interval],
    data: Sequence[Interval],
) -> tuple[float, float]:
    """(exposed, overlapped) on a CPU trace: the thread's waits on communication; busy time
    the thread computes (or, without recorded ops, busy time before the waits)."""
    waits = _waits(trace, comms, step.start, step.end, data)
    working = merge([*clip(trace.compute, step.start, step.end), *data])
    if not trace.ops_recorded:
        working = complement(merge([*waits, *data]), step.start, step.end)
    return length(waits), overlap(merge(busy), working)


def _cpu_wait_in(trace: RankTrace, comms: Sequence[Comm], span: Interval) -> float:
    """Exposed communication inside ``span`` (the backward pass, which holds DDP's wait)."""
    if trace.device == "cuda":
        return 0.0
    return length(_waits(trace, comms, span[0], span[1], clip(trace.data, *span)))


MEAN_KEYS = ("iteration_s", "data_wait_s", "compute_s", "exposed_comm_s", "overlapped_comm_s",
             "comm_busy_s", "collectives", "allreduces", "comm_bytes", "allreduce_bytes",
             "flops", "backward_s", "gpu_compute_s")  # fmt: skip


def _mean(figs: Sequence[StallBreakdown], key: str) -> float | None:
    values = [getattr(f, key) for f in figs]
    if not values or any(v is None for v in values):
        return None
    return statistics.fmean(float(v) for v in values if v is not None)


def rank_means(trace: RankTrace, figs: Sequence[StallBreakdown]) -> RankMeans:
    """One rank's means over its iterations, plus its median iteration time."""
    means = {key: _mean(figs, key) for key in MEAN_KEYS}
    return RankMeans(rank=trace.rank, source=trace.source, host=trace.host, iterations=len(figs),
                     iteration_median_s=statistics.median(f.iteration_s for f in figs),
                     **means)  # fmt: skip


def slowest_rank(rows: Sequence[RankMeans]) -> SlowestRank | None:
    """The rank with the largest median iteration time and its margin over the others'
    median; None with one rank."""
    if len(rows) < 2:
        return None
    worst = max(rows, key=lambda r: r.iteration_median_s)
    others = statistics.median(r.iteration_median_s for r in rows if r is not worst)
    margin = worst.iteration_median_s - others
    return SlowestRank(rank=worst.rank, iteration_median_s=worst.iteration_median_s,
                       others_median_s=others, margin_s=margin,
                       margin_frac=margin / others if others > 0 else math.nan)  # fmt: skip


def nodes_of(traces: Sequence[RankTrace], world: int, rpn: int | None) -> tuple[int, str]:
    """Machines the world spans, and how that was found."""
    if rpn is not None:
        return math.ceil(world / rpn), f"given by --ranks-per-node {rpn}"
    hosts = {t.host for t in traces}
    if None not in hosts:
        return len(hosts), f"from the traces' host names ({', '.join(sorted(map(str, hosts)))})"
    return 1, "assumed: no --ranks-per-node and no host names in the traces"


DIRECT = ("iteration_s", "compute_s", "data_wait_s", "exposed_comm_s", "overlapped_comm_s",
          "comm_busy_s")  # fmt: skip


def summarise(
    traces: Sequence[RankTrace],
    figs: Sequence[Sequence[StallBreakdown]],
    *,
    ranks_per_node: int | None,
    skip_steps: int,
) -> StallSummary:
    """The summary of ``analyze``: ``profile``'s top-level figures where traces measure
    them, the per-rank means, every iteration's figures and the slowest rank."""
    rows = [rank_means(t, f) for t, f in zip(traces, figs, strict=True)]
    first = traces[0]
    world = first.world_size or len(traces)
    nodes, nodes_how = nodes_of(traces, world, ranks_per_node)

    def mean(key: str) -> float | None:
        values = [getattr(r, key) for r in rows]
        return None if None in values else statistics.fmean(values)

    exposed, spans = mean("exposed_comm_s") or 0.0, nodes > 1
    grad, layers, flops = mean("allreduce_bytes"), mean("allreduces"), mean("flops")
    slow = slowest_rank(rows)
    details = {
        "traces": [t.source for t in traces],
        "workload": first.meta.get("workload"),
        "ranks": len(traces),
        "world_size": world,
        "nodes": nodes,
        "ranks_per_node": ranks_per_node,
        "backend": first.backend,
        "device": first.device,
        "device_name": first.device_name,
        "iters": min(len(f) for f in figs),
        "skip_steps": skip_steps,
        **{k: mean(k) for k in ("data_wait_s", "overlapped_comm_s", "comm_busy_s", "comm_bytes")},
        "exposed_comm_s": exposed,
        "grad_bytes": round(grad) if grad else None,
        "num_layers": round(layers) if layers else None,
        "flops_per_iter": flops if flops else None,
        "backward_s": mean("backward_s"),
        "per_rank": [r.to_json() for r in rows],
        "iterations": {
            str(t.rank): [b.to_json() for b in f] for t, f in zip(traces, figs, strict=True)
        },
        "slowest_rank": slow.to_json() if slow is not None else None,
    }
    direct = {k: mean(k) for k in DIRECT}
    direct["data_stall_s"] = direct.pop("data_wait_s")
    return StallSummary(
        created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
        source="traces",
        iteration_s=mean("iteration_s") or 0.0,
        compute_s=mean("compute_s") or 0.0,
        data_fetch_stall_s=mean("data_wait_s") or 0.0,
        data_prep_stall_s=0.0,
        interconnect_stall_s=0.0 if spans else exposed,
        network_stall_s=exposed if spans else 0.0,
        method=_method(first, nodes, nodes_how, spans, grad, flops),
        direct=direct,
        details=details,
    )


def _method(
    first: RankTrace, nodes: int, nodes_how: str, spans: bool, grad: float | None,
    flops: float | None,
) -> dict[str, str]:  # fmt: skip
    if first.device == "cuda":
        exposed = "NCCL kernel time not overlapped by compute kernels on any stream"
    elif first.ops_recorded:
        exposed = "the step thread idle while a collective it launched is outstanding"
    else:
        exposed = "from the step's last all-reduce launch to the last completion"
    where = f"{nodes} node(s), {nodes_how}"
    net = (
        f"measured: exposed communication ({exposed}); the world spans {where}, so a ring "
        "all-reduce is paced by its inter-node hops: all of it is network stall"
    )
    intra = f"measured: exposed communication ({exposed}); the world is on {where}"
    return {
        "iteration_s": "measured: ProfilerStep#N spans (recperf: data wait + step)",
        "compute_s": "measured: iteration - data wait - exposed communication",
        "data_fetch_stall_s": "measured: data-iterator wait (DataLoader __next__, "
        "recperf:data_wait); fetch and preparation together: one trace cannot split them",
        "data_prep_stall_s": "not separable from a trace: counted in data_fetch_stall_s",
        "interconnect_stall_s": "0: the world spans nodes" if spans else intra,
        "network_stall_s": net if spans else "0: the world is on one node",
        "grad_bytes": "measured: all-reduce message bytes per iteration"
        if grad
        else "not recorded (torch.profiler record_shapes=True records message sizes)",
        "num_layers": "measured: all-reduce calls per iteration",
        "flops_per_iter": "measured: ops' flops (torch.profiler with_flops=True)"
        if flops
        else "not recorded (torch.profiler with_flops=True)",
        "batch_size": "from --batch-size (a trace does not record it)",
    }
