"""The cloud catalog the cost advisor chooses from: instance types (GPUs, GPU model, links,
network, price) and GPU datasheet peaks, from the bundled CSVs or a user's own with the same
columns; and the time-cost Pareto frontier of candidate setups."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from recperf.core.errors import ConfigError, TraceFormatError
from recperf.core.files import check_present
from recperf.stalls.cost import skypilot
from recperf.stalls.cost.table import (
    GPU_COLUMNS,
    INSTANCE_COLUMNS,
    LINKS,
    GpuModel,
    Instance,
    bundled,
    number,
    read_rows,
)

__all__ = ["GPU_COLUMNS", "INSTANCE_COLUMNS", "LINKS", "Catalog", "GpuModel", "Instance",
           "load_catalog", "load_gpu_models", "load_instances", "pareto_front"]  # fmt: skip

T = TypeVar("T")


def load_instances(path: Path | str | None = None) -> list[Instance]:
    """The instance catalog (bundled AWS catalog when ``path`` is None)."""
    path = path or bundled("aws-gpu-instances.csv")
    out = []
    for line, row in read_rows(path, INSTANCE_COLUMNS):
        link = (row["intra_node_link"] or "").strip()
        if link not in LINKS:
            why = f"{link!r} is not one of {', '.join(LINKS)}"
            raise TraceFormatError(path, line, "intra_node_link", why)
        out.append(Instance(
            instance=(row["instance"] or "").strip(), gpus=number(path, line, row, "gpus", True),
            gpu_model=(row["gpu_model"] or "").strip(),
            gpu_mem_gib=number(path, line, row, "gpu_mem_gib", False),
            intra_node_link=link, network_gbps=number(path, line, row, "network_gbps", False),
            usd_per_hour=number(path, line, row, "usd_per_hour", False),
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
    path = path or bundled("gpu-models.csv")
    out = {}
    for line, row in read_rows(path, GPU_COLUMNS):
        nums = {c: number(path, line, row, c, False) for c in GPU_COLUMNS[1:]}
        name = (row["gpu_model"] or "").strip()
        out[name] = GpuModel(gpu_model=name, **nums)
    return out


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
