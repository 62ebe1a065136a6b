"""Trace loaders, one module per format, and the traces bundled with recperf by name."""

from __future__ import annotations

from pathlib import Path

from recperf.cluster.base import BundledTrace
from recperf.cluster.traces import helios, philly, synthetic, tiresias
from recperf.cluster.traces.common import bundled

BUNDLED: dict[str, BundledTrace] = {
    "philly": BundledTrace("philly", ("philly",), "Microsoft Philly, 15,264 jobs (Gavel format)"),
    "tiresias-480": BundledTrace("tiresias", ("tiresias/trace-480.csv",), "Tiresias, 480 jobs"),
    "tiresias-60": BundledTrace("tiresias", ("tiresias/trace-60.csv",), "Tiresias, 60 jobs"),
    "helios-500": BundledTrace("helios", ("helios/sense-500.json",), "SenseTime Helios, 500 jobs"),
    "synthetic": BundledTrace("synthetic", (), "generated: Poisson arrivals at a set load"),
}


def bundled_path(trace: BundledTrace) -> Path | None:
    if not trace.files:
        return None
    return bundled(trace.files[0])


__all__ = ["BUNDLED", "bundled_path", "helios", "philly", "synthetic", "tiresias"]
