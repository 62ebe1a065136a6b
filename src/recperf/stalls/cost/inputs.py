"""What the cost advisor is asked (``AdvisorConfig``) and what it reads of a profile or an
analysis summary (``ProfileSummary``: per-iteration compute, data stall with its spread, gradient
shape), one ConfigError naming a missing figure and the flag that supplies it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recperf.core.config import check_range
from recperf.core.errors import ConfigError

REAL_DATA_RUNS = ("warm", "cold")
"""The profile's runs that read real data (their direct data waits give the stall's spread)."""
BACKWARD_FRACTION = 2.0 / 3.0
"""Share of compute spent in the backward pass when the profile does not say."""
PRECISIONS = ("fp32", "fp16")


@dataclass(kw_only=True, slots=True, frozen=True)
class AdvisorConfig:
    """What the training run needs and how optimistic the compute prediction is."""

    budget_h: float
    """Training time budget in hours for all ``epochs`` epochs (> 0)."""
    epoch_samples: int
    """Samples in one epoch (>= 1)."""
    epochs: float = 1.0
    """Epochs to train (> 0; fractions allowed)."""
    max_instances: int = 16
    """Largest instance count tried; counts 1..max_instances are evaluated (>= 1)."""
    efficiency: float = 0.4
    """Fraction of datasheet peak FLOP/s achieved when predicting from FLOPs (0, 1]."""
    precision: str = "fp32"
    """Peak used: "fp32" (fp32_tflops) or "fp16" (tensor_fp16_tflops)."""
    optimizer_bytes_per_param_byte: float = 3.0
    """Extra GPU memory per parameter byte (grads + 2 Adam moments = 3) (>= 0)."""

    def __post_init__(self) -> None:
        check_range("budget_h", self.budget_h, 0.0, None, lo_open=True)
        check_range("epoch_samples", self.epoch_samples, 1, None)
        check_range("epochs", self.epochs, 0.0, None, lo_open=True)
        check_range("max_instances", self.max_instances, 1, None)
        check_range("efficiency", self.efficiency, 0.0, 1.0, lo_open=True)
        check_range("optimizer_bytes_per_param_byte", self.optimizer_bytes_per_param_byte, 0.0)
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision = {self.precision!r} is not one of fp32, fp16")


@dataclass(kw_only=True, slots=True, frozen=True)
class ProfileSummary:
    """The per-iteration, per-rank figures of one profile that the advisor uses."""

    compute_s: float
    """Measured compute seconds per iteration on the profiling device."""
    backward_s: float
    """Backward part of compute_s (2/3 of it when the profile does not say)."""
    data_fetch_stall_s: float
    """Seconds per iteration waiting for data to arrive."""
    data_prep_stall_s: float
    """Seconds per iteration waiting for data to be preprocessed."""
    grad_bytes: int
    """Gradient bytes all-reduced per iteration."""
    num_layers: int
    """All-reduce buckets per iteration (>= 1)."""
    param_bytes: int
    """Bytes of model parameters."""
    flops_per_iter: float
    """Forward + backward FLOPs per rank per iteration (0 when unknown)."""
    batch_size: int
    """Samples per rank per iteration (>= 1)."""
    device: str
    """Profiling device kind: "cpu" or "cuda"."""
    device_name: str
    """Torch device name, e.g. "NVIDIA H200" ("" when unknown)."""
    data_stall_s: float
    """The data stall carried to every setup, per iteration (see ``_data_stall``)."""
    data_stall_low_s: float
    data_stall_high_s: float
    """The range of the data stall over the profile's measurements of it."""
    data_stall_method: str
    """Where data_stall_s came from and why."""

    @staticmethod
    def from_mapping(summary: Mapping[str, Any]) -> ProfileSummary:
        """Validate a loaded summary.json; a bad key raises ConfigError naming it."""
        compute = _key(summary, "compute_s", False)
        backward = _key(summary, "backward_s", False, compute * BACKWARD_FRACTION)
        if backward > compute:
            raise ConfigError(f"profile summary: 'backward_s' = {backward} exceeds compute_s")
        device = summary.get("device")
        if device not in ("cpu", "cuda"):
            raise ConfigError(f"profile summary: 'device' = {device!r}: expected cpu or cuda")
        name = summary.get("device_name", "")
        if not isinstance(name, str):
            raise ConfigError(f"profile summary: 'device_name' = {name!r}: expected a string")
        stall, low, high, method = _data_stall(summary)
        return ProfileSummary(
            compute_s=compute, backward_s=backward,
            data_fetch_stall_s=_key(summary, "data_fetch_stall_s", False),
            data_prep_stall_s=_key(summary, "data_prep_stall_s", False), data_stall_s=stall,
            data_stall_low_s=low, data_stall_high_s=high, data_stall_method=method,
            grad_bytes=_key(summary, "grad_bytes", True),
            num_layers=_key(summary, "num_layers", True),
            param_bytes=_key(summary, "param_bytes", True),
            flops_per_iter=_key(summary, "flops_per_iter", False, 0.0),
            batch_size=_key(summary, "batch_size", True), device=device, device_name=name,
        )  # fmt: skip

    @property
    def backward_fraction(self) -> float:
        return self.backward_s / self.compute_s if self.compute_s > 0 else BACKWARD_FRACTION


def _data_stall(summary: Mapping[str, Any]) -> tuple[float, float, float, str]:
    """The data stall per iteration carried to the target setups, its low and high ends, and
    how it was read. A ``profile`` summary measures it directly (the training loop's own wait for
    the next batch): that figure is carried, its range over the real-data runs' direct waits. The
    differential fetch + prep stall is a difference of two runs' iteration times (~0.2 s each
    here), which on a shared CPU host moves with the host's load by more than the stall itself
    (0 and 54 ms in two identical report profiles, beside direct waits of 2.1 and 2.6 ms); carried
    onto a GPU's sub-millisecond compute it moved the recommendation between identical runs. It is
    used only when the summary has no direct figure (e.g. from ``stalls analyze``)."""
    differential = _key(summary, "data_fetch_stall_s", False) + _key(
        summary, "data_prep_stall_s", False
    )
    direct = summary.get("direct")
    if not isinstance(direct, Mapping) or direct.get("data_stall_s") is None:
        how = "fetch + prep stall per iteration carried over from the profile (differential)"
        return differential, differential, differential, how
    wait = _key(direct, "data_stall_s", False)
    runs = [r for r in summary.get("runs") or [] if isinstance(r, Mapping)]
    real = [r for r in runs if r.get("name") in REAL_DATA_RUNS and r.get("data_wait_s") is not None]
    waits = [wait] + [_key(r, "data_wait_s", False) for r in real]
    how = (
        f"direct: the training loop's measured wait for the next batch in run "
        f"'{direct.get('run')}', {wait * 1e3:.3g} ms ({min(waits) * 1e3:.3g}-"
        f"{max(waits) * 1e3:.3g} ms over the real-data runs), not the differential fetch + prep "
        f"stall ({differential * 1e3:.3g} ms), a difference of two runs' iteration times that "
        "moves with the host's load"
    )
    return wait, min(waits), max(waits), how


ANALYZE_FLAGS = {"batch_size": "--batch-size", "param_bytes": "--param-bytes"}
"""The summary fields ``stalls analyze`` takes from flags, named when a summary lacks them."""


def _key(summary: Mapping[str, Any], key: str, integer: bool, default: Any = None) -> Any:
    if key not in summary or summary[key] is None:
        if default is None:
            hint = ANALYZE_FLAGS.get(key)
            hint = f" (a trace cannot give it: run stalls analyze with {hint})" if hint else ""
            raise ConfigError(f"profile summary: {key!r} missing{hint}")
        return default
    value = summary[key]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (integer and not float(value).is_integer()):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"profile summary: {key!r} = {value!r} is not {kind}")
    if value < 0 or (key in ("batch_size", "num_layers") and value < 1):
        raise ConfigError(f"profile summary: {key!r} = {value!r} is out of range")
    return int(value) if integer else float(value)
