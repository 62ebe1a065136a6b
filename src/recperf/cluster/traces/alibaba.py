"""Alibaba's GPU-sharing trace of 2023 (``openb_pod_list_*.csv``, the FGD paper): one row per
Kubernetes pod, with whole GPUs (``num_gpu``) and a per-GPU share (``gpu_milli``)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import ClassVar

import numpy as np

from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.jobs import JobTable
from recperf.cluster.topology import Cluster
from recperf.cluster.traces.common import (
    csv_errors,
    from_durations,
    integer,
    number,
    read_trace,
    seconds,
    unique_ids,
)
from recperf.core.errors import TraceFormatError

REQUIRED = ("name", "num_gpu", "gpu_milli", "creation_time", "scheduled_time", "deletion_time")


@TRACE_LOADERS.register("alibaba-gpu-2023")
class AlibabaGpuTrace:
    """A pod arrives at ``creation_time`` and runs ``deletion_time - scheduled_time`` seconds
    (``- creation_time`` for the pods never scheduled, whose ``scheduled_time`` is empty).

    The simulator allocates whole GPUs, so a pod asking for a share of one GPU (``num_gpu`` 1,
    ``gpu_milli`` < 1000) is rounded up to a whole GPU and counted (``fractional_rounded_up``);
    CPU-only pods (``num_gpu`` 0) and pods deleted the second they started are skipped and
    counted (``cpu_only_skipped``, ``zero_duration_skipped``). Pods carry no model: they get
    the default model's gradient size.
    """

    name: ClassVar[str] = "alibaba-gpu-2023"
    default_cluster: ClassVar[str] = "openb-16"

    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable:
        path, text = read_trace(source, "alibaba-gpu-2023/openb_pod_list_default-every4.csv")
        reader = csv.DictReader(io.StringIO(text, newline=""), skipinitialspace=True)
        with csv_errors(path, reader):
            return self._parse(path, reader, cluster)

    @staticmethod
    def _parse(path: Path, reader: csv.DictReader[str], cluster: Cluster) -> JobTable:
        header = [h.strip() for h in reader.fieldnames or []]
        reader.fieldnames = header
        missing = [f for f in REQUIRED if f not in header]
        if missing:
            why = f"missing from the header; it has: {', '.join(header)}"
            raise TraceFormatError(path, 1, missing[0], why)
        names: list[str] = []
        ids: list[tuple[int | None, str]] = []
        arrivals: list[float] = []
        gpus: list[int] = []
        durations: list[float] = []
        notes = {"fractional_rounded_up": 0, "cpu_only_skipped": 0, "zero_duration_skipped": 0}
        for row in reader:
            line = reader.line_num
            cell = {f: (row.get(f) or "").strip() for f in REQUIRED}
            ids.append((line, cell["name"]))
            milli = number(path, line, "gpu_milli", cell["gpu_milli"], positive=False, limit=1000)
            if number(path, line, "num_gpu", cell["num_gpu"], positive=False) == 0:
                notes["cpu_only_skipped"] += 1
                continue
            count = integer(path, line, "num_gpu", cell["num_gpu"])
            start_field = "scheduled_time" if cell["scheduled_time"] else "creation_time"
            created = seconds(path, line, "creation_time", cell["creation_time"], positive=False)
            start = seconds(path, line, start_field, cell[start_field], positive=False)
            end = seconds(path, line, "deletion_time", cell["deletion_time"], positive=False)
            if end < start:
                why = f"{cell['deletion_time']} is before {start_field} {cell[start_field]}"
                raise TraceFormatError(path, line, "deletion_time", why)
            if end == start:
                notes["zero_duration_skipped"] += 1
                continue
            notes["fractional_rounded_up"] += int(count == 1 and milli < 1000)
            names.append(cell["name"])
            arrivals.append(created)
            gpus.append(count)
            durations.append(end - start)
        unique_ids(path, "name", ids)
        return from_durations(
            cluster,
            name=names,
            model=["unknown"] * len(names),
            arrival_s=arrivals,
            gpus=gpus,
            duration_s=durations,
            trace_notes=notes,
        )
