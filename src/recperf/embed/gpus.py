"""GPU memory-system specs for the L2 model: the L2 (size, persisting set-aside, line and sector),
DRAM and L2 bandwidth and SM count, bundled for a few devices as TOML files under
``recperf/data/gpus`` (each number with its source) or loaded from any ``FILE.toml``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from recperf.core.config import check_range, from_mapping, load_toml
from recperf.core.errors import ConfigError

BUNDLED = ("a100-40gb", "a100-80gb", "h100", "h200", "l4")
"""Specs shipped with recperf, by ``--gpu`` name."""
NUMBERS = (
    "l2_bytes",
    "persisting_l2_max_bytes",
    "access_policy_window_max_bytes",
    "line_bytes",
    "sector_bytes",
    "dram_gb_per_s",
    "l2_gb_per_s",
    "sm_count",
)
"""The figures a spec holds; a bundled spec gives a source for every one."""


@dataclass(kw_only=True, slots=True, frozen=True)
class GpuSpec:
    """What the L2 model needs to know about one GPU."""

    name: str
    """Short name (``h200``); a file's stem when not given."""
    device: str
    """The product it describes, e.g. ``NVIDIA H200 SXM 141GB``."""
    l2_bytes: int
    """L2 capacity the device reports (cudaDeviceProp::l2CacheSize)."""
    persisting_l2_max_bytes: int
    """Largest set-aside for persisting accesses (cudaDevAttrMaxPersistingL2CacheSize); 0: none."""
    line_bytes: int = 128
    """L2 line (tag) size: a power of two, a multiple of sector_bytes."""
    sector_bytes: int = 32
    """L2 sector size: the unit a miss fetches from DRAM."""
    dram_gb_per_s: float
    """DRAM bandwidth, GB/s (10^9 bytes); a peak figure keeps the time bound a lower bound."""
    l2_gb_per_s: float
    """L2 bandwidth, GB/s; likewise a peak figure."""
    sm_count: int
    """Streaming multiprocessors."""
    access_policy_window_max_bytes: int | None = None
    """Largest access-policy window (cudaDevAttrMaxAccessPolicyWindowSize); None: no cap."""
    match: tuple[str, ...] = ()
    """Words of torch.cuda.get_device_name() that together mean this device (a GPU run's)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Per figure, where it comes from."""
    assumptions: dict[str, str] = field(default_factory=dict)
    """Per figure that is not a published number, what was assumed and why."""

    def __post_init__(self) -> None:
        if not self.name.strip() or not self.device.strip():
            raise ConfigError("name and device must be non-empty")
        for key in ("l2_bytes", "line_bytes", "sector_bytes", "sm_count"):
            check_range(key, getattr(self, key), 1, None)
        check_range("persisting_l2_max_bytes", self.persisting_l2_max_bytes, 0, self.l2_bytes)
        if self.access_policy_window_max_bytes is not None:
            check_range("access_policy_window_max_bytes", self.access_policy_window_max_bytes, 0)
        check_range("dram_gb_per_s", self.dram_gb_per_s, 0.0, None, lo_open=True)
        check_range("l2_gb_per_s", self.l2_gb_per_s, 0.0, None, lo_open=True)
        if self.line_bytes & (self.line_bytes - 1) or self.line_bytes % self.sector_bytes:
            raise ConfigError(
                f"line_bytes = {self.line_bytes}: expected a power of two that is a multiple of "
                f"sector_bytes = {self.sector_bytes}"
            )
        if self.l2_bytes % self.line_bytes:
            why = f"not a whole number of {self.line_bytes}-byte lines"
            raise ConfigError(f"l2_bytes = {self.l2_bytes}: {why}")
        for table in ("sources", "assumptions"):
            bad = [k for k in getattr(self, table) if k not in NUMBERS]
            if bad:
                raise ConfigError(f"[{table}] {bad[0]!r}: expected one of {', '.join(NUMBERS)}")

    @property
    def l2_lines(self) -> int:
        return self.l2_bytes // self.line_bytes

    def carve_out(self, hot_bytes: int) -> int:
        """Bytes a pin of a ``hot_bytes`` region sets aside (as ``l2pin.window_bytes``)."""
        cap = self.access_policy_window_max_bytes
        window = self.persisting_l2_max_bytes if cap is None else cap
        return max(0, min(hot_bytes, self.persisting_l2_max_bytes, window))

    def unsourced(self) -> list[str]:
        """Figures given without a source (every bundled spec must have none)."""
        given = [k for k in NUMBERS if getattr(self, k) is not None]
        return [k for k in given if k not in self.sources]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "device": self.device,
            **{k: getattr(self, k) for k in NUMBERS},
            "sources": dict(self.sources),
            "assumptions": dict(self.assumptions),
        }


def _from_toml(path: Path | Any, source: str, default_name: str) -> GpuSpec:
    data = load_toml(path) if isinstance(path, Path) else _bundled_toml(path, source)
    data.setdefault("name", default_name)
    for table in ("sources", "assumptions"):
        value = data.get(table, {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ConfigError(f"{source}: [{table}] must be a table of strings")
    return from_mapping(GpuSpec, data, source)


def _bundled_toml(resource: Any, source: str) -> dict[str, Any]:
    import tomllib

    try:
        data: dict[str, Any] = tomllib.loads(resource.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:  # a packaging defect, still one line
        raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    return data


def load(name_or_path: str | Path) -> GpuSpec:
    """A bundled spec by name (``h200``) or a spec from a ``FILE.toml``; anything else, a bad or
    missing key or value is one ConfigError naming it."""
    text = str(name_or_path)
    if text in BUNDLED:
        resource = resources.files("recperf").joinpath(f"data/gpus/{text}.toml")
        return _from_toml(resource, f"gpu {text}", text)
    path = Path(text)
    if path.suffix.lower() != ".toml":
        raise ConfigError(f"--gpu {text!r}: expected one of {', '.join(BUNDLED)} or a FILE.toml")
    return _from_toml(path, str(path), path.stem)


def bundled() -> list[GpuSpec]:
    """Every bundled spec, in ``BUNDLED`` order."""
    return [load(name) for name in BUNDLED]


def for_device(device_name: str) -> GpuSpec | None:
    """The bundled spec whose ``match`` words all are words of ``device_name`` (split at spaces,
    dashes and underscores: ``NVIDIA A100-SXM4-80GB`` is a100-80gb, ``NVIDIA L40S`` not l4), or
    None; the longest match list wins."""
    words = set(re.split(r"[\s_-]+", device_name.upper()))
    hits = [s for s in bundled() if s.match and all(m.upper() in words for m in s.match)]
    return max(hits, key=lambda s: len(s.match)) if hits else None
