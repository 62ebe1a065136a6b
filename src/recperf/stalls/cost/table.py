"""The catalog tables' row types (``Instance``, ``GpuModel``) and the CSV reading that the
bundled format and SkyPilot's share: a header check, line-numbered rows, checked numbers."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from recperf.core.errors import TraceFormatError
from recperf.core.files import check_present
from recperf.core.text import UTF8_BOM_OPTIONAL

INSTANCE_COLUMNS = ("instance", "gpus", "gpu_model", "gpu_mem_gib", "intra_node_link",
                    "network_gbps", "usd_per_hour")  # fmt: skip
GPU_COLUMNS = ("gpu_model", "fp32_tflops", "tensor_fp16_tflops", "hbm_gb_per_s",
               "nvlink_gb_per_s_per_gpu", "pcie_gb_per_s")  # fmt: skip
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


def read_rows(path: Path | str, columns: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    """The rows of a CSV table with their file line numbers; a missing column is refused."""
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


def number(path: Path | str, line: int, row: dict[str, str], col: str, integer: bool) -> Any:
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


def bundled(name: str) -> str:
    """The path of a bundled table under recperf's ``data/cloud/``."""
    return str(resources.files("recperf").joinpath(f"data/cloud/{name}"))
