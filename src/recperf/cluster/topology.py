"""Cluster shape (racks x machines x GPUs) and link speeds per level, with named presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from recperf.core.config import check_range, from_mapping, load_toml
from recperf.core.errors import ConfigError

MAX_GPUS = 10_000_000
"""The largest cluster simulated."""


class Level(IntEnum):
    """How widely a placement spans the cluster; a job's communication runs at its widest link."""

    GPU = 0  # a single GPU: no communication
    MACHINE = 1  # several GPUs of one machine (NVLink / PCIe)
    RACK = 2  # several machines under one rack switch
    CLUSTER = 3  # several racks, through the rack uplinks to the core


@dataclass(kw_only=True, slots=True, frozen=True)
class Cluster:
    """A homogeneous GPU cluster."""

    name: str = "custom"
    """Label used in results."""
    racks: int = 1
    """Number of racks."""
    machines_per_rack: int = 4
    """Machines under each rack switch."""
    gpus_per_machine: int = 8
    """GPUs in each machine."""
    machine_gbps: float = 1200.0
    """Per-GPU bandwidth inside a machine (NVLink/PCIe), Gbit/s."""
    machine_latency_us: float = 5.0
    """Per-message latency inside a machine, microseconds."""
    rack_gbps: float = 100.0
    """Each machine's link to its rack switch, Gbit/s."""
    rack_latency_us: float = 10.0
    """Per-message latency between machines of one rack, microseconds."""
    core_gbps: float = 400.0
    """Each rack's uplink to the core before oversubscription, Gbit/s."""
    core_latency_us: float = 30.0
    """Per-message latency between racks, microseconds."""
    oversubscription: float = 1.0
    """Factor by which rack uplinks are oversubscribed (>= 1): uplink share = core_gbps / factor."""

    def __post_init__(self) -> None:
        for name in ("racks", "machines_per_rack", "gpus_per_machine"):
            check_range(name, getattr(self, name), 1, 1_000_000)
        if self.gpus > MAX_GPUS:  # the engine keeps arrays per machine and per GPU
            raise ConfigError(
                f"racks x machines_per_rack x gpus_per_machine = {self.gpus:,} GPUs; "
                f"at most {MAX_GPUS:,} are simulated"
            )
        # Bounded so that every job's iteration time stays finite: 1 Mbit/s to 1 Pbit/s links,
        # latencies up to a second.
        for name in ("machine_gbps", "rack_gbps", "core_gbps"):
            check_range(name, getattr(self, name), 1e-3, 1e6)
        for name in ("machine_latency_us", "rack_latency_us", "core_latency_us"):
            check_range(name, getattr(self, name), 0.0, 1e6)
        check_range("oversubscription", self.oversubscription, 1.0, 1e6)

    @property
    def machines(self) -> int:
        return self.racks * self.machines_per_rack

    @property
    def gpus(self) -> int:
        return self.machines * self.gpus_per_machine

    @property
    def gpus_per_rack(self) -> int:
        return self.machines_per_rack * self.gpus_per_machine

    def rack_free(self, free: NDArray[np.int64]) -> NDArray[np.int64]:
        """Per-rack totals of a per-machine count (machines are numbered rack by rack)."""
        out: NDArray[np.int64] = free.reshape(self.racks, self.machines_per_rack).sum(axis=1)
        return out

    def level_caps(self, free: NDArray[np.int64]) -> NDArray[np.int64]:
        """The largest GPU demand placeable on ``free`` at each Level, indexed by Level.

        ``free`` holds the free GPUs of each machine (length ``machines``, numbered rack by
        rack). Returns 4 values: GPU and CLUSTER the total free GPUs (a single GPU, or a job
        spanning racks, may use any of them), MACHINE the most free on one machine, RACK the
        most free under one rack switch. A ``d``-GPU job fits within a level ``lv`` no tighter than
        its ``min_level`` exactly when ``d <= caps[lv]``; index with an array of levels to test
        many jobs at once.
        """
        total = int(free.sum())
        return np.asarray(
            [total, int(free.max()), int(self.rack_free(free).max()), total], dtype=np.int64
        )

    def min_level(self, gpus: int) -> Level:
        """The tightest level a job of ``gpus`` GPUs can possibly be placed at."""
        if gpus <= 1:
            return Level.GPU
        if gpus <= self.gpus_per_machine:
            return Level.MACHINE
        if gpus <= self.gpus_per_rack:
            return Level.RACK
        return Level.CLUSTER

    def min_levels(self, gpus: NDArray[np.int64]) -> NDArray[np.int8]:
        """Vectorised ``min_level``."""
        g = np.asarray(gpus)
        out = np.full(g.shape, int(Level.CLUSTER), dtype=np.int8)
        out[g <= self.gpus_per_rack] = int(Level.RACK)
        out[g <= self.gpus_per_machine] = int(Level.MACHINE)
        out[g <= 1] = int(Level.GPU)
        return out

    def with_(self, **changes: Any) -> Cluster:
        return dataclasses.replace(self, **changes)


def _philly(machines: int, name: str) -> Cluster:
    # Philly machines had 8 GPUs (P100/V100 era) with 100 Gbit/s InfiniBand; racks of 8.
    return Cluster(
        name=name,
        racks=machines // 8,
        machines_per_rack=8,
        gpus_per_machine=8,
        machine_gbps=1200.0,
        rack_gbps=100.0,
        core_gbps=400.0,
        oversubscription=2.0,
    )


PRESETS: dict[str, Cluster] = {
    # The 11 published Philly VCs total 352 8-GPU machines: the trace's own cluster, which it
    # loads to about 0.1. At a third of that (120 machines) queues form and schedulers differ.
    "philly": _philly(352, "philly"),
    "philly-third": _philly(120, "philly-third"),
    # Tiresias' simulator shapes (n32g4.csv, n256g8.csv): switches x nodes x GPUs.
    "tiresias-n32g4": Cluster(
        name="tiresias-n32g4",
        racks=1,
        machines_per_rack=32,
        gpus_per_machine=4,
        machine_gbps=400.0,
        rack_gbps=100.0,
        core_gbps=400.0,
    ),
    "tiresias-n256g8": Cluster(
        name="tiresias-n256g8",
        racks=8,
        machines_per_rack=32,
        gpus_per_machine=8,
        machine_gbps=1200.0,
        rack_gbps=100.0,
        core_gbps=800.0,
        oversubscription=2.0,
    ),
    # Helios (SenseTime) runs 8-GPU machines on 100 Gbit/s InfiniBand; 128 GPUs in 4 racks loads
    # the 500-job extract to about 0.65.
    "helios": Cluster(
        name="helios",
        racks=4,
        machines_per_rack=4,
        gpus_per_machine=8,
        machine_gbps=1200.0,
        rack_gbps=100.0,
        core_gbps=200.0,
        oversubscription=2.0,
    ),
    # 1,024 GPUs for large synthetic runs.
    "synthetic-1024": Cluster(
        name="synthetic-1024",
        racks=8,
        machines_per_rack=16,
        gpus_per_machine=8,
        machine_gbps=1200.0,
        rack_gbps=100.0,
        core_gbps=800.0,
        oversubscription=2.0,
    ),
}


def load_cluster(spec: str) -> Cluster:
    """A preset name, or a TOML file whose ``[cluster]`` table (or top level) sets the fields."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if path.is_dir():
        raise ConfigError(
            f"cluster {spec!r} is a directory; allowed: {', '.join(PRESETS)} or a .toml file"
        )
    if path.suffix == ".toml" or path.exists():
        data = load_toml(path)
        table = data.get("cluster", data)
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [cluster] must be a table")
        table = {"name": path.stem, **table}
        return from_mapping(Cluster, table, source=str(path))
    raise ConfigError(f"unknown cluster {spec!r}; allowed: {', '.join(PRESETS)} or a .toml file")
