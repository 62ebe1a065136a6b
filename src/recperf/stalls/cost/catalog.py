"""The cloud catalog the cost advisor chooses from: instance types (GPUs, GPU model, links,
network, price) and GPU datasheet peaks, from the bundled CSVs or a user's own with the same
columns; and the time-cost Pareto frontier of candidate setups."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from recperf.core.errors import ConfigError, TraceFormatError
from recperf.core.files import check_present
from recperf.core.text import UTF8_BOM_OPTIONAL

INSTANCE_COLUMNS = ("instance", "gpus", "gpu_model", "gpu_mem_gib", "intra_node_link",
                    "network_gbps", "usd_per_hour")  # fmt: skip
GPU_COLUMNS = ("gpu_model", "fp32_tflops", "tensor_fp16_tflops", "hbm_gb_per_s",
               "nvlink_gb_per_s_per_gpu", "pcie_gb_per_s")  # fmt: skip
T = TypeVar("T")
LINKS = ("none", "pcie3", "pcie4", "nvlink2", "nvlink3", "nvlink4")


@dataclass(kw_only=True, slots=True, frozen=True)
class Instance:
    """One instance type."""

    instance: str
    gpus: int
    gpu_model: str
    gpu_mem_gib: float
    intra_node_link: str
    network_gbps: float
    usd_per_hour: float
    intra_node_gb_per_s: float | None = None
    """Per-GPU link bandwidth inside the machine; None: the GPU datasheet's for the link kind."""
    location: str = ""
    """Where the price applies (region/zone), when the catalog says."""


@dataclass(kw_only=True, slots=True, frozen=True)
class GpuModel:
    """Datasheet peaks of one GPU model."""

    gpu_model: str
    fp32_tflops: float
    tensor_fp16_tflops: float
    hbm_gb_per_s: float
    nvlink_gb_per_s_per_gpu: float
    pcie_gb_per_s: float


POSITIVE = ("gpu_mem_gib", "network_gbps", "usd_per_hour")
"""Instance columns that must be > 0 (the GPU table's peaks may be 0: not available)."""


def _rows(path: Path | str, columns: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    check_present(path, "catalog table")
    try:
        with open(path, newline="", encoding=UTF8_BOM_OPTIONAL) as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceFormatError(path, 1, missing[0], "column missing from the header")
            rows = [(i, row) for i, row in enumerate(reader, start=2)]
    except OSError as exc:
        raise TraceFormatError(path, None, None, f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, None, None, f"not UTF-8 text: {exc.reason}") from None
    except csv.Error as exc:
        raise TraceFormatError(path, None, None, f"not a CSV file: {exc}") from None
    if not rows:
        raise TraceFormatError(path, None, None, "no rows after the header")
    return rows


def _number(path: Path | str, line: int, row: dict[str, str], col: str, integer: bool) -> Any:
    """A finite number (an integer >= 1 when ``integer``; > 0 for ``POSITIVE``, else >= 0)."""
    raw = (row.get(col) or "").strip()
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        value = None
    if integer:
        allowed = "an integer >= 1"
        ok = value is not None and value >= 1
    else:
        allowed = "a finite number > 0" if col in POSITIVE else "a finite number >= 0"
        ok = value is not None and math.isfinite(value)
        ok = ok and value is not None and (value > 0 if col in POSITIVE else value >= 0)
    if not ok:
        raise TraceFormatError(path, line, col, f"expected {allowed}, got {raw!r}")
    return value


def load_instances(path: Path | str | None = None) -> list[Instance]:
    """The instance catalog (bundled AWS catalog when ``path`` is None)."""
    path = path or _bundled("aws-gpu-instances.csv")
    out = []
    for line, row in _rows(path, INSTANCE_COLUMNS):
        link = (row["intra_node_link"] or "").strip()
        if link not in LINKS:
            why = f"{link!r} is not one of {', '.join(LINKS)}"
            raise TraceFormatError(path, line, "intra_node_link", why)
        out.append(Instance(
            instance=(row["instance"] or "").strip(), gpus=_number(path, line, row, "gpus", True),
            gpu_model=(row["gpu_model"] or "").strip(),
            gpu_mem_gib=_number(path, line, row, "gpu_mem_gib", False),
            intra_node_link=link, network_gbps=_number(path, line, row, "network_gbps", False),
            usd_per_hour=_number(path, line, row, "usd_per_hour", False),
        ))  # fmt: skip
    return out


@dataclass(kw_only=True, slots=True, frozen=True)
class Catalog:
    """The instance types to choose from, and what loading them left out."""

    instances: list[Instance]
    notes: list[str]
    """One line per thing skipped or assumed (empty for the bundled format)."""
    report: dict[str, Any] | None = None
    """A SkyPilot catalog's CatalogReport, as JSON."""


def load_catalog(
    path: Path | str | None, gpu_models: Mapping[str, GpuModel], *, region: str | None = None,
    spot: bool = False, links: Path | str | None = None,
) -> Catalog:  # fmt: skip
    """The bundled catalog (``path`` None), a CSV with INSTANCE_COLUMNS, or a SkyPilot
    ``vms.csv`` (told apart by its header; see ``skypilot``), which alone takes ``region``,
    ``spot`` and a bandwidth table ``links`` (default: the bundled one)."""
    from recperf.stalls import skypilot

    if path is not None and skypilot.is_skypilot(check_present(path, "--catalog")):
        instances, report = skypilot.load_skypilot(
            path, gpu_models, region=region, spot=spot, links=skypilot.load_links(links)
        )
        return Catalog(instances=instances, notes=report.notes(), report=report.to_json())
    if region is not None or spot or links is not None:
        flag = "--region" if region is not None else "--spot" if spot else "--links"
        which = "bundled" if path is None else "given"
        raise ConfigError(f"{flag}: only for a SkyPilot catalog (--catalog vms.csv); the "
                          f"{which} catalog has one on-demand price and its own bandwidths "
                          "per row")  # fmt: skip
    return Catalog(instances=load_instances(path), notes=[])


def load_gpu_models(path: Path | str | None = None) -> dict[str, GpuModel]:
    """GPU datasheet peaks by model name (bundled table when ``path`` is None)."""
    path = path or _bundled("gpu-models.csv")
    out = {}
    for line, row in _rows(path, GPU_COLUMNS):
        nums = {c: _number(path, line, row, c, False) for c in GPU_COLUMNS[1:]}
        name = (row["gpu_model"] or "").strip()
        out[name] = GpuModel(gpu_model=name, **nums)
    return out


def _bundled(name: str) -> str:
    return str(resources.files("recperf").joinpath(f"data/cloud/{name}"))


def pareto_front(items: Sequence[T], key: Callable[[T], tuple[float, float]]) -> list[T]:
    """Items not dominated in (time, cost) — none is both as fast and as cheap and better in
    one — sorted by time; ties keep the first."""
    ranked = sorted(items, key=key)
    front: list[T] = []
    best_cost = float("inf")
    for item in ranked:
        cost = key(item)[1]
        if cost < best_cost:
            front.append(item)
            best_cost = cost
    return front
