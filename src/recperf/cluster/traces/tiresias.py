"""The Tiresias simulator's CSV trace: job_id,num_gpu,submit_time,iterations,model_name,duration."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.jobs import JobTable
from recperf.cluster.models import grad_bytes_for
from recperf.cluster.network import calibrate_reference
from recperf.cluster.topology import Cluster
from recperf.cluster.traces.common import (
    Arrivals,
    RowError,
    RowFilter,
    TraceConfig,
    check_width,
    csv_errors,
    integer,
    number,
    read_trace,
    seconds,
    unique_ids,
)
from recperf.core.errors import TraceFormatError

REQUIRED = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration")


class _Job(NamedTuple):
    line: int
    name: str
    model: str
    gpus: int
    iters: float
    duration_s: float
    arrival: float
    raw_arrival: str


@TRACE_LOADERS.register("tiresias")
class TiresiasTrace:
    """Durations in the trace are taken as the job's run time at its tightest placement;
    ``submit_time`` is seconds, or Unix-epoch seconds (rebased to the first job) where the
    column reaches past 10 years."""

    name: ClassVar[str] = "tiresias"
    default_cluster: ClassVar[str] = "tiresias-n32g4"
    Config = TraceConfig

    def __init__(self, config: TraceConfig | None = None) -> None:
        self.config = config or TraceConfig()

    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable:
        path, text = read_trace(source, "tiresias/trace-480.csv")
        reader = csv.DictReader(io.StringIO(text, newline=""))
        with csv_errors(path, reader):
            return self._parse(path, reader, cluster)

    def _parse(self, path: Path, reader: csv.DictReader[str], cluster: Cluster) -> JobTable:
        missing = [f for f in REQUIRED if f not in (reader.fieldnames or [])]
        if missing:
            raise TraceFormatError(path, 1, missing[0], "missing from the header")
        rows = RowFilter(self.config.drop_invalid)
        arrivals = Arrivals(path, "submit_time", dates=False)
        jobs: list[_Job] = []
        for row in reader:
            if any((v or "").strip() for v in row.values() if isinstance(v, str)):
                job = rows.keep(_parse_row, path, reader.line_num, row, arrivals)
                jobs += [job] if job is not None else []
        unique_ids(path, "job_id", [(j.line, j.name) for j in jobs])
        gpus_arr = np.asarray([j.gpus for j in jobs], dtype=np.int64)
        iters = np.asarray([j.iters for j in jobs], dtype=np.float64)
        iter_s = np.asarray([j.duration_s for j in jobs], dtype=np.float64) / iters
        models = [j.model for j in jobs]
        grad = np.asarray([grad_bytes_for(m) for m in models])
        compute, grad = calibrate_reference(cluster, gpus_arr, iter_s, grad)
        return JobTable.build(
            name=[j.name for j in jobs],
            model=models,
            arrival_s=arrivals.rebase(
                [j.arrival for j in jobs], [(j.line, j.raw_arrival) for j in jobs]
            ),
            gpus=gpus_arr,
            total_iters=iters,
            compute_s=compute,
            grad_bytes=grad,
            dropped_invalid=rows.dropped,
        )


def _parse_row(path: Path, line: int, row: Mapping[Any, Any], arrivals: Arrivals) -> _Job:
    check_width(path, line, row)
    absent = next((f for f in REQUIRED if row.get(f) is None), None)
    if absent is not None:
        raise RowError(path, line, absent, "is missing (the row is short)", "too few fields")
    return _Job(
        line=line,
        name=str(row["job_id"]),
        model=str(row["model_name"]),
        gpus=integer(path, line, "num_gpu", row["num_gpu"]),
        iters=number(path, line, "iterations", row["iterations"], positive=True),
        duration_s=seconds(path, line, "duration", row["duration"], positive=True),
        arrival=arrivals.parse(line, row["submit_time"]),
        raw_arrival=str(row["submit_time"]),
    )
