"""Philly traces in the Gavel (MSR) format, with measured per-placement speeds."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.jobs import JobTable
from recperf.cluster.network import comm_s, solve_spread_bytes
from recperf.cluster.topology import Cluster, Level
from recperf.cluster.traces.common import (
    RowError,
    RowFilter,
    TraceConfig,
    bundled,
    integer,
    number,
    read_trace,
    seconds,
)
from recperf.core.errors import RecperfError
from recperf.core.text import read_utf8

FIELDS = (
    "job_type",
    "command",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "arrival_time_s",
    "scale_factor",
)


def _parse_line(path: Path, lineno: int, line: str) -> tuple[str, float, float, int]:
    parts = line.rstrip("\n").split("\t")
    if len(parts) != len(FIELDS):
        why = f"expected {len(FIELDS)} tab-separated fields, got {len(parts)}"
        reason = "too few fields" if len(parts) < len(FIELDS) else "too many fields"
        raise RowError(path, lineno, None, why, reason)
    if not parts[0].strip():
        raise RowError(path, lineno, "job_type", "is empty", "job_type missing")
    col = {name: parts[i] for i, name in enumerate(FIELDS)}
    return (
        parts[0],
        number(path, lineno, "total_steps", col["total_steps"], positive=True),
        seconds(path, lineno, "arrival_time_s", col["arrival_time_s"], positive=False),
        integer(path, lineno, "scale_factor", col["scale_factor"]),
    )


class _Job(NamedTuple):
    name: str
    job_type: str
    steps: float
    arrival_s: float
    gpus: int
    rate: float
    ratio: float
    scale: int


@dataclass(kw_only=True, slots=True, frozen=True)
class PhillyConfig(TraceConfig):
    """Which GPU's measured speeds the jobs run at."""

    gpu_type: str = "v100"
    """A GPU type of ``throughputs.json`` (the bundled one has v100, p100 and k80)."""


class Throughputs:
    """Measured steps/s per (job type, scale factor), consolidated and spread over machines."""

    def __init__(self, path: Path, gpu_type: str) -> None:
        try:
            data: dict[str, Any] = json.loads(read_utf8(path))
        except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are
            raise RecperfError(f"{path}: cannot read throughputs: {exc}") from None
        if gpu_type not in data or f"{gpu_type}_unconsolidated" not in data:
            gpus = sorted(k for k in data if not k.endswith("_unconsolidated"))
            raise RecperfError(f"{path}: no GPU type {gpu_type!r}; allowed: {', '.join(gpus)}")
        self.path = path
        self.cons = self._table(data[gpu_type])
        self.spread = self._table(data[f"{gpu_type}_unconsolidated"])
        self.scales: dict[str, list[int]] = {}
        for jt, k in self.cons:
            self.scales.setdefault(jt, []).append(k)

    @staticmethod
    def _table(raw: dict[str, Any]) -> dict[tuple[str, int], float]:
        out: dict[tuple[str, int], float] = {}
        for key, entry in raw.items():
            inner = key.strip("()")
            name, _, k = inner.rpartition(",")
            rate = entry.get("null") if isinstance(entry, dict) else None
            if isinstance(rate, int | float) and rate > 0:
                out[(name.strip().strip("'\""), int(k))] = float(rate)
        return out

    def lookup(self, job_type: str, gpus: int) -> tuple[float, float, int]:
        """(consolidated steps/s, spread/consolidated ratio <= 1, measured scale factor)."""
        scales = self.scales.get(job_type)
        if not scales:
            raise KeyError(job_type)
        # The largest measured scale factor not above the job's; types measured only on 1 GPU
        # run at their 1-GPU rate while holding all their GPUs (no measured sensitivity).
        s = max((k for k in scales if k <= gpus), default=min(scales))
        rate = self.cons[(job_type, s)]
        spread = self.spread.get((job_type, s), rate)
        return rate, min(spread / rate, 1.0), s


@TRACE_LOADERS.register("philly")
class PhillyTrace:
    """One ``.trace`` file or a folder of them; speeds from ``throughputs.json`` beside them
    (or the bundled table). Job durations are ``total_steps / rate`` on ``gpu_type``."""

    name: ClassVar[str] = "philly"
    default_cluster: ClassVar[str] = "philly"
    Config = PhillyConfig

    def __init__(self, config: PhillyConfig | None = None) -> None:
        self.config = config or PhillyConfig()

    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable:
        src = source or bundled("philly")
        files = sorted(src.glob("*.trace")) if src.is_dir() else [src]
        if not files:
            raise RecperfError(f"{src}: no .trace files")
        tp_path = files[0].parent / "throughputs.json"
        tput = Throughputs(
            tp_path if tp_path.exists() else bundled("philly") / "throughputs.json",
            self.config.gpu_type,
        )
        rows = RowFilter(self.config.drop_invalid)
        jobs: list[_Job] = []
        for path in files:
            lines = read_trace(path, "")[1].splitlines()
            for lineno, line in enumerate(lines, 1):
                if line.strip():
                    job = rows.keep(_job, path, lineno, line, tput)
                    jobs += [job] if job is not None else []
        t_cons = 1.0 / np.asarray([j.rate for j in jobs])
        ratio = np.asarray([j.ratio for j in jobs])
        t_spread = t_cons / ratio
        s_arr = np.asarray([j.scale for j in jobs], dtype=np.int64)
        grad = solve_spread_bytes(cluster, s_arr, t_cons, t_spread)
        compute = np.maximum(t_cons - comm_s(cluster, Level.MACHINE, s_arr, grad), 0.05 * t_cons)
        return JobTable.build(
            name=[j.name for j in jobs],
            model=[j.job_type for j in jobs],
            arrival_s=[j.arrival_s for j in jobs],
            gpus=[j.gpus for j in jobs],
            total_iters=[j.steps for j in jobs],
            compute_s=compute,
            grad_bytes=grad,
            measured_slowdown=1.0 / ratio,
            dropped_invalid=rows.dropped,
        )


def _job(path: Path, lineno: int, line: str, tput: Throughputs) -> _Job:
    jt, steps, arrival, k = _parse_line(path, lineno, line)
    try:
        rate, ratio, scale = tput.lookup(jt, k)
    except KeyError:
        why = f"{jt!r} is not in {tput.path.name}"
        raise RowError(path, lineno, "job_type", why, "job_type not measured") from None
    return _Job(f"{path.stem}-{lineno}", jt, steps, arrival, k, rate, ratio, scale)
