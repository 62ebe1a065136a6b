"""Alibaba's GPU-sharing trace of 2023 (``openb_pod_list_*.csv``, the FGD paper): one row per
Kubernetes pod, with whole GPUs (``num_gpu``) and a per-GPU share (``gpu_milli``)."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.jobs import JobTable
from recperf.cluster.topology import Cluster
from recperf.cluster.traces.common import (
    RowError,
    RowFilter,
    TraceConfig,
    check_width,
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


class _Pod(NamedTuple):
    line: int
    name: str
    gpus: int
    """0: CPU-only (skipped)."""
    arrival_s: float
    duration_s: float
    """0: deleted the second it started (skipped)."""
    fractional: bool


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
    Config = TraceConfig

    def __init__(self, config: TraceConfig | None = None) -> None:
        self.config = config or TraceConfig()

    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable:
        path, text = read_trace(source, "alibaba-gpu-2023/openb_pod_list_default-every4.csv")
        reader = csv.DictReader(io.StringIO(text, newline=""), skipinitialspace=True)
        with csv_errors(path, reader):
            return self._parse(path, reader, cluster)

    def _parse(self, path: Path, reader: csv.DictReader[str], cluster: Cluster) -> JobTable:
        header = [h.strip() for h in reader.fieldnames or []]
        reader.fieldnames = header
        missing = [f for f in REQUIRED if f not in header]
        if missing:
            why = f"missing from the header; it has: {', '.join(header)}"
            raise TraceFormatError(path, 1, missing[0], why)
        rows = RowFilter(self.config.drop_invalid)
        pods: list[_Pod] = []
        for row in reader:
            if any((v or "").strip() for v in row.values() if isinstance(v, str)):
                pod = rows.keep(_parse_row, path, reader.line_num, row)
                pods += [pod] if pod is not None else []
        unique_ids(path, "name", [(p.line, p.name) for p in pods])
        kept = [p for p in pods if p.gpus and p.duration_s]
        notes = {
            "fractional_rounded_up": sum(p.fractional for p in kept),
            "cpu_only_skipped": sum(p.gpus == 0 for p in pods),
            "zero_duration_skipped": sum(p.gpus > 0 and p.duration_s == 0 for p in pods),
        }
        return from_durations(
            cluster,
            name=[p.name for p in kept],
            model=["unknown"] * len(kept),
            arrival_s=[p.arrival_s for p in kept],
            gpus=[p.gpus for p in kept],
            duration_s=[p.duration_s for p in kept],
            trace_notes=notes,
            dropped_invalid=rows.dropped,
        )


def _parse_row(path: Path, line: int, row: Mapping[Any, Any]) -> _Pod:
    check_width(path, line, row)
    cell = {f: (row.get(f) or "").strip() for f in REQUIRED}
    milli = number(path, line, "gpu_milli", cell["gpu_milli"], positive=False, limit=1000)
    if number(path, line, "num_gpu", cell["num_gpu"], positive=False) == 0:
        return _Pod(line, cell["name"], 0, 0.0, 0.0, False)
    count = integer(path, line, "num_gpu", cell["num_gpu"])
    start_field = "scheduled_time" if cell["scheduled_time"] else "creation_time"
    created = seconds(path, line, "creation_time", cell["creation_time"], positive=False)
    start = seconds(path, line, start_field, cell[start_field], positive=False)
    end = seconds(path, line, "deletion_time", cell["deletion_time"], positive=False)
    if end < start:
        why = f"{cell['deletion_time']} is before {start_field} {cell[start_field]}"
        raise RowError(path, line, "deletion_time", why, f"deletion_time before {start_field}")
    return _Pod(line, cell["name"], count, created, end - start, count == 1 and milli < 1000)
