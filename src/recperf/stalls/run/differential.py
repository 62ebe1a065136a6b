"""From rank traces to stall figures: per-run statistics computed from the traces (the direct
method; ``ranktrace`` reads them), and the differential decomposition across runs that each add
one source of stall (the DS-Analyzer method), with the two cross-checked."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recperf.core.errors import ConfigError
from recperf.stalls.model.comm import CommSample
from recperf.stalls.result import STALLS
from recperf.stalls.run.netem import parse_bandwidth
from recperf.stalls.run.ranktrace import META_KEYS, RankRun, RunMeta, load_rank_run
from recperf.stalls.run.spec import RunSpec


@dataclass(kw_only=True, slots=True, frozen=True)
class RunStats:
    """Per-iteration means over the timed iterations, averaged over ranks."""

    name: str
    ranks: int
    nodes: int
    iteration_s: float
    iteration_median_s: float
    data_wait_s: float
    compute_s: float
    """Step time less the exposed all-reduce wait."""
    backward_s: float
    """Backward pass less the exposed all-reduce wait."""
    exposed_comm_s: float
    """From the last bucket's launch to the last completion: communication nothing overlaps."""
    overlapped_comm_s: float
    comm_busy_s: float
    buckets: float
    meta: RunMeta
    """The run's metadata, from its first rank's trace (summary.json lists its fields flat)."""
    iteration_sem_s: float | None = None
    """Standard error of the mean iteration time: each rank's over its timed iterations,
    averaged over ranks (ranks move in step, so averaging them narrows nothing). None: fewer
    than two timed iterations, or a run recorded before it was kept."""

    def to_json(self) -> dict[str, Any]:
        """The run as summary.json lists it (no ``iteration_sem_s`` where none was kept, so
        older documents read back unchanged)."""
        out = asdict(self)
        out |= out.pop("meta")
        if out["iteration_sem_s"] is None:
            del out["iteration_sem_s"]
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RunStats:
        """A run as ``to_json`` wrote it."""
        meta = RunMeta(**{k: doc[k] for k in META_KEYS})
        return cls(**{k: v for k, v in doc.items() if k not in META_KEYS}, meta=meta)


Z95 = 1.96
"""Normal quantile of a two-sided 95% interval."""


def run_stats(spec: RunSpec, traces: Sequence[RankRun]) -> RunStats:
    """Means over timed iterations per rank, then over ranks (medians of iteration time too)."""
    per_rank, medians, sems = [], [], []
    for tr in traces:
        figs = tr.iterations
        if not figs:
            raise ConfigError(f"run {spec.name}: a rank trace has no timed iterations")
        per_rank.append({k: statistics.fmean(f[k] for f in figs) for k in figs[0]})
        medians.append(statistics.median(f["iteration_s"] for f in figs))
        if len(figs) > 1:
            times = [f["iteration_s"] for f in figs]
            sems.append(statistics.stdev(times) / math.sqrt(len(times)))
    mean = {k: statistics.fmean(r[k] for r in per_rank) for k in per_rank[0]}
    return RunStats(
        name=spec.name,
        ranks=spec.ranks,
        nodes=spec.nodes,
        iteration_median_s=statistics.fmean(medians),
        iteration_sem_s=statistics.fmean(sems) if len(sems) == len(traces) else None,
        meta=traces[0].meta,
        **mean,
    )


def run_stats_from_files(spec: RunSpec, paths: Sequence[Path]) -> RunStats:
    """``run_stats`` of the rank trace files ``paths``, each checked first."""
    runs = [load_rank_run(p) for p in paths]
    for path, run in zip(paths, runs, strict=True):
        if not run.iterations:
            raise ConfigError(f"{path}: the rank trace has no timed iterations")
    return run_stats(spec, runs)


def comm_samples(spec: RunSpec, traces: Sequence[RankRun]) -> list[CommSample]:
    """The run's all-reduce microbenchmark (mean over ranks of each size's median)."""
    if spec.ranks < 2 or not spec.comm:
        return []
    bandwidth = parse_bandwidth(spec.bandwidth) / 8 if spec.nodes > 1 and spec.bandwidth else None
    rows = [tr.microbench for tr in traces]
    out = []
    for k, (nbytes, _) in enumerate(rows[0]):
        seconds = statistics.fmean(r[k][1] for r in rows)
        out.append(
            CommSample(
                grad_bytes=nbytes,
                buckets=1,
                ranks=spec.ranks,
                nodes=spec.nodes,
                bandwidth_bytes_per_s=bandwidth,
                seconds=seconds,
            )
        )
    return out


def _pos(x: float) -> float:
    return max(0.0, x)


@dataclass(kw_only=True, slots=True, frozen=True)
class Differential:
    """Stalls as differences of consecutive runs' iteration times (seconds per iteration)."""

    iteration_s: float
    compute_s: float
    interconnect_stall_s: float
    network_stall_s: float
    data_prep_stall_s: float
    data_fetch_stall_s: float
    contention_s: float
    """Slow-down of compute when ranks share the machine (control less compute)."""
    unexplained_s: float
    method: Mapping[str, str]
    """The runs each figure came from, by figure name."""
    half_width_s: Mapping[str, float]
    """Half-width of each figure's 95% interval, where its runs' standard errors are known."""

    def measured(self, key: str) -> bool:
        return not self.method[key].startswith("not measured")


def differential(runs: Mapping[str, RunStats]) -> Differential:
    """Stalls as differences of consecutive runs' iteration times (negative noise clipped to 0);
    each figure names the runs it came from, and ``half_width_s`` holds the half-width of its
    95% interval from those runs' standard errors (where both are known)."""
    t = {name: r.iteration_s for name, r in runs.items()}
    base = "control" if "control" in t else "compute"
    comm_top = "network" if "network" in t else "intra" if "intra" in t else base
    last = "cold" if "cold" in t else "warm" if "warm" in t else comm_top
    out: dict[str, float] = {"iteration_s": t[last], "compute_s": t[base]}
    method = {
        "iteration_s": f"measured: run '{last}'",
        "compute_s": f"measured: run '{base}'"
        + (
            " (N ranks, no communication: includes CPU contention between ranks)"
            if base == "control"
            else ""
        ),
    }
    pairs = {
        "interconnect_stall_s": ("intra", base),
        "network_stall_s": ("network", "intra"),
        "data_prep_stall_s": ("warm", comm_top),
        "data_fetch_stall_s": ("cold", "warm"),
    }
    sem = {name: r.iteration_sem_s for name, r in runs.items()}
    half: dict[str, float] = {}
    for key, run in (("iteration_s", last), ("compute_s", base)):
        known = sem[run]
        if known is not None:
            half[key] = Z95 * known
    for key, (hi, lo) in pairs.items():
        if hi in t and lo in t:
            out[key] = _pos(t[hi] - t[lo])
            method[key] = f"differential: run '{hi}' - run '{lo}'"
            a, b = sem[hi], sem[lo]
            if a is not None and b is not None:
                half[key] = Z95 * math.hypot(a, b)
        else:
            out[key] = 0.0
            method[key] = f"not measured (no run '{hi}'): 0"
    contention = _pos(t[base] - t["compute"]) if base == "control" else 0.0
    unexplained = out["iteration_s"] - out["compute_s"] - sum(out[k] for k in STALLS)
    return Differential(**out, contention_s=contention, unexplained_s=unexplained,
                        method=method, half_width_s=half)  # fmt: skip


@dataclass(kw_only=True, slots=True, frozen=True)
class Direct:
    """The same stalls from the rank traces alone (seconds per iteration): the last run's
    figures, and each stall where the runs that show it were made (None otherwise)."""

    run: str
    iteration_s: float
    compute_s: float
    data_stall_s: float
    exposed_comm_s: float
    overlapped_comm_s: float
    backward_s: float
    buckets: float
    interconnect_stall_s: float | None = None
    network_stall_s: float | None = None
    data_stall_added_s: float | None = None
    """The last (data) run's data wait beyond the top communication run's."""

    def to_json(self) -> dict[str, Any]:
        """summary.json's ``direct`` object: the stalls not measured are left out."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def direct(runs: Mapping[str, RunStats]) -> Direct:
    """The same stalls from the traces alone: data wait, and exposed all-reduce time."""
    last = next(n for n in ("cold", "warm", "network", "intra", "control", "compute") if n in runs)
    r = runs[last]
    comm_top = "network" if "network" in runs else "intra" if "intra" in runs else None
    intra, network = runs.get("intra"), runs.get("network")
    added = None
    if comm_top is not None and last in ("warm", "cold"):
        added = _pos(r.data_wait_s - runs[comm_top].data_wait_s)
    return Direct(
        run=last,
        iteration_s=r.iteration_s,
        compute_s=r.compute_s,
        data_stall_s=r.data_wait_s,
        exposed_comm_s=r.exposed_comm_s,
        overlapped_comm_s=r.overlapped_comm_s,
        backward_s=r.backward_s,
        buckets=r.buckets,
        interconnect_stall_s=intra.exposed_comm_s if intra is not None else None,
        network_stall_s=(
            _pos(network.exposed_comm_s - intra.exposed_comm_s)
            if network is not None and intra is not None
            else None
        ),
        data_stall_added_s=added,
    )


@dataclass(kw_only=True, slots=True, frozen=True)
class Agreement:
    """One stall by both methods, and their difference relative to the larger."""

    differential_s: float
    direct_s: float
    rel_diff: float

    @classmethod
    def of(cls, a: float, b: float) -> Agreement:
        scale = max(abs(a), abs(b), 1e-12)
        return cls(differential_s=a, direct_s=b, rel_diff=abs(a - b) / scale)

    def to_json(self) -> dict[str, float]:
        return asdict(self)


def cross_check(diff: Differential, dirc: Direct) -> dict[str, Agreement]:
    """Differential versus direct figure for each stall both methods measured."""
    out = {}
    for key in ("interconnect_stall_s", "network_stall_s"):
        measured = getattr(dirc, key)
        if measured is not None and diff.measured(key):
            out[key] = Agreement.of(getattr(diff, key), measured)
    if dirc.data_stall_added_s is not None:
        both = diff.data_prep_stall_s + diff.data_fetch_stall_s
        out["data_stall_s"] = Agreement.of(both, dirc.data_stall_added_s)
    return out
