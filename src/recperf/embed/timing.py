"""Timing embedding kernels on the device they run on: CUDA events on GPUs (median of many
calls, rotating through inputs larger than L2 so repeats do not hit in cache), wall clock on
the CPU; and the device copy bandwidth the kernels are compared with."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from recperf.core.errors import ConfigError
from recperf.embed.kernels.base import Lookup

DEVICES = "cpu, cuda or cuda:N"


def resolve_device(device: str | None) -> str:
    """``device`` checked against this machine (None: cuda when present, else cpu); a name
    other than cpu, cuda or cuda:N, or CUDA where torch has none, is one ConfigError."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    name = device.strip().lower()
    kind, _, index = name.partition(":")
    if name == "cpu":
        return name
    if kind != "cuda" or (index and not index.isdigit()):
        raise ConfigError(f"--device {device!r}: expected {DEVICES}")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "no GPU visible"
        raise ConfigError(f"--device {device}: CUDA is not available (torch "
                          f"{torch.__version__}, {build}); use --device cpu")  # fmt: skip
    if index and int(index) >= torch.cuda.device_count():
        why = f"this machine has {torch.cuda.device_count()} GPU(s)"
        raise ConfigError(f"--device {device}: no such GPU; {why}")
    return name


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(
    fn: Callable[[Any], Any],
    inputs: Sequence[Any],
    reps: int,
    device: torch.device,
    warmup: int = 3,
) -> list[float]:
    """Seconds per call of ``fn`` over ``reps`` calls cycling through ``inputs``."""
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    synchronize(device)
    out = []
    if device.type == "cuda":
        for i in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            fn(inputs[i % len(inputs)])
            end.record()
            out.append((start, end))
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) / 1e3 for s, e in out]
    times = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn(inputs[i % len(inputs)])
        times.append(time.perf_counter() - t0)
    return times


def median_s(
    fn: Callable[[Any], Any], inputs: Sequence[Any], reps: int, device: torch.device
) -> float:
    return statistics.median(time_calls(fn, inputs, reps, device))


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth, bytes per second counting the read and the write."""
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = median_s(lambda _: dst.copy_(src), [None], reps, device)
    return 2.0 * n * 4 / t


def lookup_bytes(lookup: Lookup, dim: int, elem_bytes: int, num_tables: int) -> int:
    """Bytes a kernel must move for one batch: every looked-up row, the indices and offsets,
    per-sample weights, and the [B, T, D] float32 output."""
    n = int(lookup.indices.numel())
    out = lookup.batch_size * num_tables * dim * 4
    weights = 0 if lookup.per_sample_weights is None else n * 4
    return n * dim * elem_bytes + n * 8 + int(lookup.offsets.numel()) * 8 + weights + out
