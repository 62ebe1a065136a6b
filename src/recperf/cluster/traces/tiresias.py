"""The Tiresias simulator's CSV trace: job_id,num_gpu,submit_time,iterations,model_name,duration."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import ClassVar

import numpy as np

from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.jobs import JobTable
from recperf.cluster.models import grad_bytes_for
from recperf.cluster.network import calibrate_reference
from recperf.cluster.topology import Cluster
from recperf.cluster.traces.common import (
    csv_errors,
    integer,
    number,
    read_trace,
    seconds,
    unique_ids,
)
from recperf.core.errors import TraceFormatError

REQUIRED = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration")


@TRACE_LOADERS.register("tiresias")
class TiresiasTrace:
    """Durations in the trace are taken as the job's run time at its tightest placement."""

    name: ClassVar[str] = "tiresias"
    default_cluster: ClassVar[str] = "tiresias-n32g4"

    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable:
        path, text = read_trace(source, "tiresias/trace-480.csv")
        reader = csv.DictReader(text.splitlines())
        with csv_errors(path, reader):
            return self._parse(path, reader, cluster)

    @staticmethod
    def _parse(path: Path, reader: csv.DictReader[str], cluster: Cluster) -> JobTable:
        missing = [f for f in REQUIRED if f not in (reader.fieldnames or [])]
        if missing:
            raise TraceFormatError(path, 1, missing[0], "missing from the header")
        cols: dict[str, list[float]] = {"gpus": [], "arr": [], "iters": [], "dur": []}
        names: list[str] = []
        models: list[str] = []
        ids: list[tuple[int | None, str]] = []
        for row in reader:
            line = reader.line_num
            cols["gpus"].append(integer(path, line, "num_gpu", row["num_gpu"]))
            cols["arr"].append(
                seconds(path, line, "submit_time", row["submit_time"], positive=False)
            )
            cols["iters"].append(number(path, line, "iterations", row["iterations"], positive=True))
            cols["dur"].append(seconds(path, line, "duration", row["duration"], positive=True))
            names.append(str(row["job_id"]))
            models.append(str(row["model_name"]))
            ids.append((line, names[-1]))
        unique_ids(path, "job_id", ids)
        gpus_arr = np.asarray(cols["gpus"], dtype=np.int64)
        iters = np.asarray(cols["iters"])
        iter_s = np.asarray(cols["dur"]) / iters
        grad = np.asarray([grad_bytes_for(m) for m in models])
        compute, grad = calibrate_reference(cluster, gpus_arr, iter_s, grad)
        return JobTable.build(
            name=names,
            model=models,
            arrival_s=cols["arr"],
            gpus=gpus_arr,
            total_iters=iters,
            compute_s=compute,
            grad_bytes=grad,
        )
