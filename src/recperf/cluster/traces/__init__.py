"""Trace loaders, one module per format, and the traces bundled with recperf by name."""

from __future__ import annotations

from pathlib import Path

from recperf.cluster.base import BundledTrace
from recperf.cluster.traces import (
    alibaba,
    helios,
    itp,
    philly,
    philly_raw,
    synthetic,
    tabular,
    tiresias,
)
from recperf.cluster.traces.common import bundled

BUNDLED: dict[str, BundledTrace] = {
    "philly": BundledTrace("philly", ("philly",), "Microsoft Philly, 15,264 jobs (Gavel format)"),
    "tiresias-480": BundledTrace("tiresias", ("tiresias/trace-480.csv",), "Tiresias, 480 jobs"),
    "tiresias-60": BundledTrace("tiresias", ("tiresias/trace-60.csv",), "Tiresias, 60 jobs"),
    "helios-500": BundledTrace("helios", ("helios/sense-500.json",), "SenseTime Helios, 500 jobs"),
    "itp-cluster01": BundledTrace(
        "itp", ("itp/cluster01.csv",), "Microsoft ITP 2021 cluster 1, 1,595 jobs"
    ),
    "itp-cluster10": BundledTrace(
        "itp", ("itp/cluster10.csv",), "Microsoft ITP 2021 cluster 10, 260 jobs"
    ),
    "alibaba-gpu-2023": BundledTrace(
        "alibaba-gpu-2023",
        ("alibaba-gpu-2023/openb_pod_list_default-every4.csv",),
        "Alibaba openb GPU pods, every 4th of 8,152",
    ),
    "philly-raw": BundledTrace(
        "philly-raw",
        ("philly-raw/jobs_pass_ge4gpu-every10.json",),
        "Philly >=4-GPU jobs with attempts, every 10th of 3,034",
    ),
    "csv-itp-cluster10": BundledTrace(
        "csv", ("csv/itp-cluster10.csv",), "itp-cluster10 as a plain CSV (id,arrival,...)"
    ),
    "synthetic": BundledTrace("synthetic", (), "generated: Poisson arrivals at a set load"),
}

BUNDLED_CLUSTERS: dict[str, str] = {
    "itp-cluster10": "itp-cluster10",
    "csv-itp-cluster10": "itp-cluster10",
}
"""Bundled traces whose cluster is not their format's default."""


def bundled_path(trace: BundledTrace) -> Path | None:
    if not trace.files:
        return None
    return bundled(trace.files[0])


__all__ = [
    "BUNDLED",
    "BUNDLED_CLUSTERS",
    "alibaba",
    "bundled_path",
    "helios",
    "itp",
    "philly",
    "philly_raw",
    "synthetic",
    "tabular",
    "tiresias",
]
