"""What the sweep tests share: a small cross-rack cluster and a sweep of 8 runs on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recperf.cluster.api import RunSpec
from recperf.cluster.sweep import Sweep

# 4 racks of 2 machines x 2 GPUs with thin uplinks: the trace's 8-GPU jobs must cross racks, so
# congestion changes their communication time.
CROSS_RACK_TOML = (
    "[cluster]\nracks = 4\nmachines_per_rack = 2\ngpus_per_machine = 2\ncore_gbps = 100.0\n"
)


def small_sweep(cluster_toml: Path) -> Sweep:
    """8 runs of 60 jobs: two schedulers, two congestion levels, two seeds."""
    return Sweep(
        traces=(f"tiresias-60@{cluster_toml}",),
        schedulers=("fifo", "tiresias"),
        congestion=(1.0, 2.0),
        seeds=(0, 1),
        base=RunSpec(jitter_s=300.0),
    )


def metrics(row: dict[str, Any]) -> dict[str, Any]:
    """A run's row without its wall time (the one field that is a measurement)."""
    return {k: v for k, v in row.items() if k != "wall_s"}


class NoRayCluster:
    """Stands in for the ``ray`` module where no cluster can be reached: ``init`` fails as
    Ray's does, with a multi-line message."""

    @staticmethod
    def is_initialized() -> bool:
        return False

    @staticmethod
    def init(**kwargs: object) -> None:
        raise ConnectionError("Could not find any running Ray instance.\nMore text.")
