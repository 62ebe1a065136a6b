"""SkyPilot-format cloud catalogs (the ``vms.csv`` files of github.com/skypilot-org/
skypilot-catalog) as the cost advisor's instance catalog, with the link and network bandwidths
they lack from recperf's own table (``data/cloud/instance-links.csv``).

How rows become instance types: a row per (type, region, zone) is reduced to one instance per
InstanceType, priced at the cheapest ``Price`` (or ``SpotPrice`` with ``spot``) over its rows,
in ``region`` only when given; empty prices do not count. A type is skipped (counted, named in the
notes, never guessed) when it has no accelerator (CPU-only: counted, not named), a fraction of a
GPU, a GPU the GPU table does not know (``A100-80GB`` is an ``A100``: a trailing memory size is
dropped before matching), no row in the bandwidth table, no price, or no GPU memory (from
``GpuInfo``, else a ``-80GB``-style name). Rows without an InstanceType (GCP's attachable GPUs)
are counted. A malformed value, or a type whose GPU name or count differs between rows, is a
``TraceFormatError`` naming the file, line and column."""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recperf.core.errors import ConfigError, TraceFormatError
from recperf.core.text import UTF8_BOM_OPTIONAL
from recperf.stalls.cost.table import LINKS, GpuModel, Instance, bundled, number, read_rows

COLUMNS = ("InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "SpotPrice", "Region")
"""The columns read (vCPUs, MemoryGiB, AvailabilityZone, GpuInfo, Arch ... may follow)."""
LINK_COLUMNS = ("instance", "intra_node_link", "intra_node_gb_per_s", "network_gbps", "source")
REASONS = {
    "fractional_gpu": "with a fraction of a GPU",
    "unknown_gpu": "whose GPU is not in the GPU table",
    "no_bandwidth": "not in the bandwidth table",
    "no_price": "without a price",
    "no_gpu_memory": "without a GPU memory size",
}
"""Why a GPU instance type is skipped, in the order checked."""
MEMORY_SUFFIX = re.compile(r"-(\d+)GB$", re.IGNORECASE)


def is_skypilot(path: Path | str) -> bool:
    """Whether the CSV's header is SkyPilot's (it names InstanceType and AcceleratorName)."""
    try:
        with open(path, newline="", encoding=UTF8_BOM_OPTIONAL) as fh:
            header = next(csv.reader(fh), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False  # the bundled-format loader reports what is wrong with the file
    return "InstanceType" in header and "AcceleratorName" in header


@dataclass(kw_only=True, slots=True, frozen=True)
class Link:
    """The bandwidths of one instance type."""

    instance: str
    intra_node_link: str
    intra_node_gb_per_s: float
    """Per GPU, GB/s (0 for one GPU)."""
    network_gbps: float
    source: str


def load_links(path: Path | str | None = None) -> dict[str, Link]:
    """The bandwidth table by instance type (bundled when ``path`` is None)."""
    path = path or bundled("instance-links.csv")
    out = {}
    for line, row in read_rows(path, LINK_COLUMNS):
        kind = (row["intra_node_link"] or "").strip()
        if kind not in LINKS:
            raise TraceFormatError(path, line, "intra_node_link",
                                   f"{kind!r} is not one of {', '.join(LINKS)}")  # fmt: skip
        name = (row["instance"] or "").strip()
        out[name] = Link(
            instance=name, intra_node_link=kind, source=(row["source"] or "").strip(),
            intra_node_gb_per_s=number(path, line, row, "intra_node_gb_per_s", False),
            network_gbps=number(path, line, row, "network_gbps", False),
        )  # fmt: skip
    return out


@dataclass(kw_only=True, slots=True, frozen=True)
class CatalogReport:
    """What a SkyPilot catalog held and what the advisor took from it."""

    path: str
    price: str
    """on-demand or spot."""
    region: str | None
    regions: int
    """Regions the prices were taken from."""
    rows: int
    instance_types: int
    """GPU instance types in the catalog (in ``region`` when given)."""
    used: dict[str, str] = field(default_factory=dict)
    """Instance type -> where its price is (region/zone)."""
    cpu_only: int = 0
    no_instance_type_rows: int = 0
    skipped: dict[str, list[str]] = field(default_factory=dict)
    """Reason (a REASONS key) -> instance types."""

    def notes(self) -> list[str]:
        where = f"in {self.region}" if self.region else f"across {self.regions} region(s)"
        out = [f"catalog {self.path}: {len(self.used)} of {self.instance_types} GPU instance "
               f"types used, each at its cheapest {self.price} price {where}"]  # fmt: skip
        if self.cpu_only:
            out.append(f"skipped {self.cpu_only} CPU-only instance type(s)")
        if self.no_instance_type_rows:
            out.append(f"skipped {self.no_instance_type_rows} row(s) without an InstanceType")
        no_price = f"without {'an' if self.price == 'on-demand' else 'a'} {self.price} price"
        for reason, names in self.skipped.items():
            why = no_price if reason == "no_price" else REASONS[reason]
            if names:
                out.append(f"skipped {len(names)} instance type(s) {why}: " + ", ".join(names))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "skypilot", "path": self.path, "price": self.price, "region": self.region,
            "regions": self.regions, "rows": self.rows, "instance_types": self.instance_types,
            "used": self.used, "cpu_only": self.cpu_only,
            "no_instance_type_rows": self.no_instance_type_rows, "skipped": self.skipped,
        }  # fmt: skip


@dataclass(slots=True)
class _Type:
    name: str
    accelerator: str
    count: float
    line: int
    gpu_info: str
    best: tuple[float, str] | None = None
    """(price, region/zone) of the cheapest row so far."""


def _value(path: Path | str, line: int, row: Mapping[str, str], col: str) -> float | None:
    """An empty cell (None) or a finite number (> 0 for prices, >= 0 for counts)."""
    raw = (row.get(col) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    positive = col != "AcceleratorCount"
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        allowed = "a finite number > 0" if positive else "a number >= 0"
        raise TraceFormatError(path, line, col, f"expected {allowed} or empty, got {raw!r}")
    return value


def gpu_name(accelerator: str, gpu_models: Mapping[str, GpuModel]) -> str | None:
    """The GPU table's name for a SkyPilot AcceleratorName (case-insensitive, a trailing
    ``-NNGB`` dropped when the exact name is unknown), None when unknown."""
    known = {name.lower(): name for name in gpu_models}
    for candidate in (accelerator, MEMORY_SUFFIX.sub("", accelerator)):
        if candidate.lower() in known:
            return known[candidate.lower()]
    return None


def gpu_memory_gib(gpu_info: str, accelerator: str) -> float | None:
    """Memory per GPU from SkyPilot's GpuInfo (``{'Gpus': [{'MemoryInfo': {'SizeInMiB': N}}]}``,
    Python- or JSON-quoted), else from a ``-80GB``-style AcceleratorName; None when neither."""
    data: Any = None
    for parse in (ast.literal_eval, json.loads):
        try:
            data = parse(gpu_info)
            break
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    gpus = data.get("Gpus") if isinstance(data, dict) else None
    first = gpus[0] if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict) else {}
    mem = first.get("MemoryInfo")
    mib = mem.get("SizeInMiB") if isinstance(mem, dict) else None
    if isinstance(mib, int | float) and not isinstance(mib, bool) and 0 < mib < math.inf:
        return float(mib) / 1024
    match = MEMORY_SUFFIX.search(accelerator)
    return float(match.group(1)) if match else None


def _types(path: Path | str, rows: list[tuple[int, dict[str, str]]], region: str | None,
           spot: bool) -> tuple[dict[str, _Type], set[str], set[str], int]:  # fmt: skip
    """GPU instance types (in ``region``) with their cheapest price, CPU-only names, all
    regions seen, and rows without an InstanceType; consistency checked over every row."""
    types: dict[str, _Type] = {}
    first: dict[str, _Type] = {}
    cpu: set[str] = set()
    regions: set[str] = set()
    nameless = 0
    for line, row in rows:
        name, accel = (row["InstanceType"] or "").strip(), (row["AcceleratorName"] or "").strip()
        count = _value(path, line, row, "AcceleratorCount") or 0.0
        prices = (_value(path, line, row, "Price"), _value(path, line, row, "SpotPrice"))
        where = (row["Region"] or "").strip()
        regions.add(where)
        seen = first.setdefault(
            name,
            _Type(
                name=name,
                accelerator=accel,
                count=count,
                line=line,
                gpu_info=row.get("GpuInfo") or "",
            ),
        )
        for col, mine, theirs in (("AcceleratorName", accel, seen.accelerator),
                                  ("AcceleratorCount", count, seen.count)):  # fmt: skip
            if name and mine != theirs:
                raise TraceFormatError(path, line, col, f"{name!r} has {mine!r} here but "
                                       f"{theirs!r} at line {seen.line}")  # fmt: skip
        if region is not None and where != region:
            continue
        if not name:
            nameless += 1 if accel else 0
            continue
        if not accel or count == 0:
            cpu.add(name)
            continue
        t = types.setdefault(name, _Type(name=name, accelerator=accel, count=count, line=line,
                                         gpu_info=seen.gpu_info))  # fmt: skip
        price = prices[1] if spot else prices[0]
        zone = (row.get("AvailabilityZone") or "").strip()
        if price is not None and (t.best is None or price < t.best[0]):
            t.best = (price, f"{where}/{zone}" if zone else where)
    return types, cpu, regions, nameless


def load_skypilot(
    path: Path | str, gpu_models: Mapping[str, GpuModel], *, region: str | None = None,
    spot: bool = False, links: Mapping[str, Link] | None = None,
) -> tuple[list[Instance], CatalogReport]:  # fmt: skip
    """The usable instance types of a SkyPilot catalog and a report of what was skipped."""
    links = load_links() if links is None else links
    rows = read_rows(path, COLUMNS)
    types, cpu, regions, nameless = _types(path, rows, region, spot)
    if region is not None and region not in regions:
        shown = ", ".join(sorted(regions)[:12]) + (", ..." if len(regions) > 12 else "")
        raise ConfigError(f"--region {region}: not in {path} (regions: {shown})")
    skipped: dict[str, list[str]] = {reason: [] for reason in REASONS}
    instances, used = [], {}
    for t in sorted(types.values(), key=lambda t: t.name):
        gpu = gpu_name(t.accelerator, gpu_models)
        link = links.get(t.name)
        mem = gpu_memory_gib(t.gpu_info, t.accelerator)
        checks = {"fractional_gpu": t.count < 1 or not t.count.is_integer(),
                  "unknown_gpu": gpu is None, "no_bandwidth": link is None,
                  "no_price": t.best is None, "no_gpu_memory": mem is None}  # fmt: skip
        reason = next((r for r in REASONS if checks[r]), None)
        if reason is not None:
            skipped[reason].append(t.name if reason != "unknown_gpu" else
                                   f"{t.name} ({t.accelerator})")  # fmt: skip
            continue
        assert gpu is not None and link is not None and t.best is not None and mem is not None
        instances.append(Instance(
            instance=t.name, gpus=int(t.count), gpu_model=gpu, gpu_mem_gib=mem,
            intra_node_link=link.intra_node_link, network_gbps=link.network_gbps,
            usd_per_hour=t.best[0], location=t.best[1],
            intra_node_gb_per_s=link.intra_node_gb_per_s or None,
        ))  # fmt: skip
        used[t.name] = t.best[1]
    report = CatalogReport(
        path=str(path), price="spot" if spot else "on-demand", region=region,
        regions=1 if region is not None else len(regions), rows=len(rows),
        instance_types=len(types), used=used, cpu_only=len(cpu),
        no_instance_type_rows=nameless, skipped={r: n for r, n in skipped.items() if n},
    )  # fmt: skip
    if not instances:
        raise ConfigError(f"{path}: no usable GPU instance type: " + "; ".join(report.notes()[1:]))
    return instances, report
