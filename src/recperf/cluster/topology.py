"""Cluster shape and link speeds per level, with named presets.

A cluster is a tree of switches (``recperf.cluster.tree``): racks x machines (one switch tier),
or any host list with deeper tiers and uneven fan-out (``topology``: Lingjun's 847 hosts under
119 ToRs under 3 aggregation switches), or a GPU count cut into racks (Helios' VC sizes).
Placement levels are 0 (one GPU), 1 (one machine), ``1 + t`` (under one tier-``t`` switch) and
``top`` (across the top tier); ``Level`` names the first three, which every tree has.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from recperf.cluster import topologies
from recperf.cluster.tree import Tree, uniform
from recperf.core.config import check_range, from_mapping, load_toml
from recperf.core.errors import ConfigError
from recperf.core.files import check_input, check_name

MAX_GPUS = 10_000_000
"""The largest cluster simulated."""


class Level(IntEnum):
    """The levels every cluster has; wider ones (``2 .. top``) follow its switch tiers, and
    ``Cluster.top`` is the widest (across the top tier). A job's communication runs at its
    widest link."""

    GPU = 0  # a single GPU: no communication
    MACHINE = 1  # several GPUs of one machine (NVLink / PCIe)
    RACK = 2  # several machines under one ToR (rack) switch


@dataclass(kw_only=True, slots=True, frozen=True)
class Cluster:
    """A GPU cluster: machines of ``gpus_per_machine`` GPUs under a tree of switches."""

    name: str = "custom"
    """Label used in results."""
    racks: int = 1
    """Number of racks (without ``topology``)."""
    machines_per_rack: int = 4
    """Machines under each rack switch (without ``topology``; with a GPU-count topology, the
    rack size the machines are cut into, the last rack taking the rest)."""
    gpus_per_machine: int = 8
    """GPUs in each machine."""
    machine_gbps: float = 1200.0
    """Per-GPU bandwidth inside a machine (NVLink/PCIe), Gbit/s."""
    machine_latency_us: float = 5.0
    """Per-message latency inside a machine, microseconds."""
    rack_gbps: float = 100.0
    """Each machine's link to its rack (ToR) switch, Gbit/s."""
    rack_latency_us: float = 10.0
    """Per-message latency between machines of one rack, microseconds."""
    core_gbps: float = 400.0
    """Each switch's uplink before oversubscription, Gbit/s (unless ``uplink_gbps`` sets them
    tier by tier)."""
    core_latency_us: float = 30.0
    """Per-message latency across the top tier (and, unless ``latency_us`` sets them, under any
    switch above the ToR), microseconds."""
    oversubscription: float = 1.0
    """Factor by which uplinks are oversubscribed (>= 1): uplink share = gbps / factor (unless
    ``uplink_oversubscription`` sets it tier by tier)."""
    topology: str = ""
    """"": ``racks`` x ``machines_per_rack``. Else a host list, bundled (``lingjun``) or a CSV
    path with one row per host and a column per switch tier; or a bundled GPU count
    (``helios-venus``, ``helios-earth``, optionally ``@YYYY-MM-DD``, default the first day)."""
    tiers: tuple[str, ...] = ()
    """A host list's switch columns from the ToR up (lingjun: ASW, PSW); their names become
    the level names."""
    uplink_gbps: tuple[float, ...] = ()
    """Per switch tier (ToR first), each switch's uplink, Gbit/s; default ``core_gbps``."""
    uplink_oversubscription: tuple[float, ...] = ()
    """Per switch tier, the uplinks' oversubscription; default ``oversubscription``."""
    latency_us: tuple[float, ...] = ()
    """Per level from the ToR up, then across the top tier (tiers + 1 values); default
    ``rack_latency_us`` under a ToR and ``core_latency_us`` above it."""
    tree: Tree = field(init=False, repr=False, compare=False)
    """The switch tree (derived)."""

    def __post_init__(self) -> None:
        for name in ("racks", "machines_per_rack", "gpus_per_machine"):
            check_range(name, getattr(self, name), 1, 1_000_000)
        if self.racks * self.machines_per_rack * self.gpus_per_machine > MAX_GPUS:
            raise ConfigError(
                f"racks x machines_per_rack x gpus_per_machine = "
                f"{self.racks * self.machines_per_rack * self.gpus_per_machine:,} GPUs; "
                f"at most {MAX_GPUS:,} are simulated"
            )
        # Bounded so that every job's iteration time stays finite: 1 Mbit/s to 1 Pbit/s links,
        # latencies up to a second.
        for name in ("machine_gbps", "rack_gbps", "core_gbps"):
            check_range(name, getattr(self, name), 1e-3, 1e6)
        for name in ("machine_latency_us", "rack_latency_us", "core_latency_us"):
            check_range(name, getattr(self, name), 0.0, 1e6)
        check_range("oversubscription", self.oversubscription, 1.0, 1e6)
        object.__setattr__(self, "tree", self._build_tree())
        tiers = self.tree.tiers
        for name, values, want in (
            ("uplink_gbps", self.uplink_gbps, tiers),
            ("uplink_oversubscription", self.uplink_oversubscription, tiers),
            ("latency_us", self.latency_us, tiers + 1),
        ):
            if values and len(values) != want:
                levels = ", ".join(self.level_names[2:])
                raise ConfigError(
                    f"{name} has {len(values)} values; this cluster needs {want} ({levels})"
                )
            lo = 1.0 if name == "uplink_oversubscription" else (1e-3 if "gbps" in name else 0.0)
            for i, v in enumerate(values):
                check_range(f"{name}[{i}]", v, lo, 1e6)
        if self.gpus > MAX_GPUS:
            raise ConfigError(
                f"topology {self.topology!r}: {self.gpus:,} GPUs; at most {MAX_GPUS:,}"
            )

    def _build_tree(self) -> Tree:
        gpm = self.gpus_per_machine
        if not self.topology:
            if self.tiers:
                raise ConfigError("tiers needs a topology (a host list) to name columns of")
            return uniform(self.racks, self.machines_per_rack, gpm)
        spec, _, date = self.topology.partition("@")
        if spec in topologies.GPU_COUNTS:
            gpus = topologies.helios_gpus(spec, date)
            machines = -(-gpus // gpm)
            node = np.arange(machines, dtype=np.int64) // self.machines_per_rack
            return Tree(tier_names=("rack",), gpus_per_machine=gpm, node=(node,))
        tiers = self.tiers or topologies.default_tiers(self.topology)
        return topologies.host_tree(self.topology, tuple(tiers), gpm)

    # ------------------------------------------------------------------ shape
    @property
    def machines(self) -> int:
        return self.tree.machines

    @property
    def gpus(self) -> int:
        return self.machines * self.gpus_per_machine

    @property
    def gpus_per_rack(self) -> int:
        """GPUs under the largest ToR."""
        return self.tree.capacity(int(Level.RACK))

    def rack_free(self, free: NDArray[np.int64]) -> NDArray[np.int64]:
        """Per-ToR totals of a per-machine count."""
        return self.tree.group_free(free, int(Level.RACK))

    @property
    def top(self) -> int:
        """The widest level: across the top switch tier (3 for racks x machines)."""
        return self.tree.top

    @property
    def levels(self) -> range:
        return range(self.top + 1)

    @property
    def level_names(self) -> tuple[str, ...]:
        """``gpu``, ``machine``, one name per switch tier, ``cluster``."""
        return ("gpu", "machine", *(t.lower() for t in self.tree.tier_names), "cluster")

    @property
    def shape(self) -> str:
        """e.g. ``4x4x8=128 GPUs`` or ``847 hosts / 119 asw / 3 psw x 8 = 6,776 GPUs``."""
        t = self.tree
        if t.tiers == 1 and not self.topology:
            return f"{self.racks}x{self.machines_per_rack}x{self.gpus_per_machine}={self.gpus} GPUs"
        parts = [f"{t.machines} hosts"] + [
            f"{t.switches(i + 1)} {n.lower()}" for i, n in enumerate(t.tier_names)
        ]
        return f"{' / '.join(parts)} x {self.gpus_per_machine} = {self.gpus:,} GPUs"

    # ------------------------------------------------------------------ links
    def uplink_share_gbps(self, congestion: float = 1.0) -> tuple[float, ...]:
        """Per switch tier, an uplink's bandwidth after oversubscription times ``congestion``
        (one job alone)."""
        t = self.tree.tiers
        gbps = self.uplink_gbps or (self.core_gbps,) * t
        over = self.uplink_oversubscription or (self.oversubscription,) * t
        return tuple(g / (o * congestion) for g, o in zip(gbps, over, strict=True))

    def level_latency_us(self, level: int) -> float:
        """Per-message latency of a placement at ``level``."""
        if level <= Level.MACHINE:
            return self.machine_latency_us
        if self.latency_us:
            return self.latency_us[level - 2]
        return self.rack_latency_us if level == Level.RACK else self.core_latency_us

    # ------------------------------------------------------------------ levels
    def level_caps(self, free: NDArray[np.int64]) -> NDArray[np.int64]:
        """The largest GPU demand placeable on ``free`` at each level, indexed by level.

        ``free`` holds the free GPUs of each machine. Returns ``top + 1`` values: GPU and top
        the total free GPUs (a single GPU, or a job spanning the top tier, may use any of
        them), MACHINE the most free on one machine, each switch level the most free under one
        of its switches. A ``d``-GPU job fits within a level ``lv`` no tighter than its
        ``min_level`` exactly when ``d <= caps[lv]``; index with an array of levels to test
        many jobs at once.
        """
        return self.tree.level_caps(free)

    def group_free(self, free: NDArray[np.int64], level: int) -> NDArray[np.int64]:
        """Free GPUs per placement group at ``level`` (machines, one tier's switches, or the
        whole cluster)."""
        return self.tree.group_free(free, level)

    def min_level(self, gpus: int) -> int:
        """The tightest level a job of ``gpus`` GPUs can possibly be placed at."""
        return int(self.tree.min_levels(np.asarray([gpus]))[0])

    def min_levels(self, gpus: NDArray[np.int64]) -> NDArray[np.int8]:
        """Vectorised ``min_level``."""
        return self.tree.min_levels(gpus)

    def with_(self, **changes: Any) -> Cluster:
        return dataclasses.replace(self, **changes)


def _philly_links(name: str, racks: int, machines_per_rack: int, over: float) -> Cluster:
    # Philly machines had 8 GPUs (P100/V100 era) with 100 Gbit/s InfiniBand.
    return Cluster(
        name=name,
        racks=racks,
        machines_per_rack=machines_per_rack,
        gpus_per_machine=8,
        machine_gbps=1200.0,
        rack_gbps=100.0,
        core_gbps=400.0,
        oversubscription=over,
    )


def _philly(machines: int, name: str) -> Cluster:
    return _philly_links(name, machines // 8, 8, 2.0)  # Philly's racks of 8 machines


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
    # Microsoft ITP 2021 publishes no cluster sizes: 8-GPU machines (links as "philly"), sized so
    # the bundled file's GPU-hours over its span are about 0.3-0.45 of the GPUs and its largest
    # job fits: cluster01 (64-GPU jobs, 28 GPUs busy on average) on 64 GPUs ...
    "itp-cluster01": _philly_links("itp-cluster01", 2, 4, 2.0),
    # ... and cluster10 (16-GPU jobs, 5 GPUs busy on average) on 16.
    "itp-cluster10": _philly_links("itp-cluster10", 1, 2, 1.0),
    # Alibaba openb (every 4th pod of the default list): at most 8 GPUs a pod, 4 GPUs busy on
    # average and 20 at the peak, on two 8-GPU machines (G2 nodes have 8) with 100 Gbit/s links.
    "openb-16": _philly_links("openb-16", 1, 2, 1.0),
    # Philly raw subset (every 10th >=4-GPU job): 35 GPUs busy on average, jobs up to 32 GPUs,
    # on 64 of Philly's 8-GPU machines' GPUs (links as "philly").
    "philly-raw-tenth": _philly_links("philly-raw-tenth", 2, 4, 2.0),
}


TREE_PRESETS: dict[str, dict[str, Any]] = {
    # Alibaba Lingjun 2023 (Crux): the real host -> ToR -> aggregation layout of topo.csv, 847
    # hosts. GPUs per host and link speeds are not in the file: 8 GPUs per host, a 200 Gbit/s
    # NIC rail per GPU, non-blocking ToR uplinks and 2:1 oversubscribed aggregation uplinks
    # are assumptions (set them in TOML with topology = "lingjun").
    "lingjun": {
        "topology": "lingjun",
        "gpus_per_machine": 8,
        "machine_gbps": 1200.0,
        "rack_gbps": 200.0,
        "uplink_gbps": (1600.0, 12800.0),
        "uplink_oversubscription": (1.0, 2.0),
        "latency_us": (10.0, 20.0, 30.0),
    },
    # SenseTime Helios Venus and Earth, sized from their VC files' total GPUs on 2020-04-01
    # (968 and 784: 121 and 98 8-GPU machines), racks of 8 machines, links as "helios".
    "helios-venus": {"topology": "helios-venus", "machines_per_rack": 8, "core_gbps": 200.0,
                     "oversubscription": 2.0},
    "helios-earth": {"topology": "helios-earth", "machines_per_rack": 8, "core_gbps": 200.0,
                     "oversubscription": 2.0},
}  # fmt: skip
"""Presets built from a topology file, when first asked for."""


def preset_names() -> list[str]:
    return [*PRESETS, *TREE_PRESETS]


def _allowed() -> str:
    return f"{', '.join(preset_names())} or a .toml file"


def _cluster_table(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The file's ``[cluster]`` table, or its top level when it has none; anything beside a
    ``[cluster]`` table (another section, a key above it) is an error, not silently unread."""
    if "cluster" not in data:
        return data  # from_mapping names an unknown key or section
    table = data["cluster"]
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [cluster] must be a table")
    other = next((k for k in data if k != "cluster"), None)
    if other is not None:
        what = f"section [{other}]" if isinstance(data[other], dict) else f"key {other!r}"
        raise ConfigError(
            f"{path}: unknown {what} beside [cluster]; a cluster file holds one [cluster] table "
            "(or its keys at the top level)"
        )
    return table


def load_cluster(spec: str) -> Cluster:
    """A preset name, or a TOML file whose ``[cluster]`` table (or top level) sets the fields.
    A ``topology`` path in the file is relative to the file."""
    if spec in PRESETS:
        return PRESETS[spec]
    if spec in TREE_PRESETS:
        return from_mapping(Cluster, {"name": spec, **TREE_PRESETS[spec]}, source=spec)
    path = check_name(spec, "--cluster")
    if os.path.isdir(path):
        raise ConfigError(f"cluster {spec!r} is a directory; allowed: {_allowed()}")
    if path.suffix == ".toml" or os.path.lexists(path):
        data = load_toml(check_input(path, "--cluster"))
        table = _cluster_table(path, data)
        table = {"name": path.stem, **table}
        topo = table.get("topology")
        if isinstance(topo, str) and topo and not Path(topo).is_absolute():
            beside = path.parent / topo
            if os.path.exists(beside):
                table["topology"] = str(beside)
        return from_mapping(Cluster, table, source=str(path))
    raise ConfigError(f"unknown cluster {spec!r}; allowed: {_allowed()}")
