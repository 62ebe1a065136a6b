"""The tuner contract: a ``Target`` (simulated or live pipeline) that measures allocations, the
``Tuner`` protocol that searches them, their result types, the registry and the conformance check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from recperf.core.errors import ConfigError, ContractError
from recperf.core.registry import Registry
from recperf.ingest.base import Allocation, AllocationRefused, Measurement, Target


@dataclass(kw_only=True, slots=True, frozen=True)
class TuneStep:
    """One measured allocation during tuning."""

    elapsed_s: float
    """Target time when the measurement ended."""
    allocation: Allocation
    throughput_rows_per_s: float
    memory_bytes: float


@dataclass(kw_only=True, slots=True, frozen=True)
class TuneResult:
    """A tuner's choice and how it got there."""

    tuner: str
    allocation: Allocation
    """The allocation the tuner settled on."""
    throughput_rows_per_s: float
    """Its measured throughput (the last measurement of it)."""
    history: tuple[TuneStep, ...]
    """Every measurement, in order."""
    refused: int = 0
    """Allocations the target refused (e.g. proposals over the memory budget)."""
    tuning_s: float = 0.0
    """Target time spent tuning."""

    @property
    def steps(self) -> int:
        return len(self.history)


class Tuner(Protocol):
    """Searches allocations of a target's cores among its stages within a time budget."""

    name: str

    def tune(self, target: Target, budget_s: float, seed: int = 0) -> TuneResult: ...


TUNERS: Registry[Tuner] = Registry("tuner")


def check_tuner(tuner: Tuner, target: Target, budget_s: float, seed: int = 0) -> TuneResult:
    """Run ``tuner`` on ``target`` and check the contract; return its result.

    The result must name a valid allocation (one entry per stage, each within 1..cap) whose memory
    fits the budget, its history must be in time order and contain that allocation, the tuner
    may not overrun ``budget_s`` by more than one measurement window, and the same seed on a fresh
    identical target must reproduce it when the target is deterministic.
    """
    result = tuner.tune(target, budget_s, seed)
    where = f"tuner {tuner.name!r}"
    if not isinstance(result, TuneResult):
        raise ContractError(f"{where}: tune returned {type(result).__name__}, not TuneResult")
    w = result.allocation.workers
    n = len(target.stage_names)
    if len(w) != n:
        raise ContractError(f"{where}: allocation has {len(w)} entries for {n} stages")
    for name, wi, cap in zip(target.stage_names, w, target.max_workers, strict=True):
        if wi < 1 or (cap is not None and wi > cap):
            raise ContractError(f"{where}: stage {name!r} got {wi} workers (cap {cap})")
    if target.memory_bytes(result.allocation) > target.memory_budget_bytes * (1 + 1e-9):
        raise ContractError(f"{where}: chosen allocation is over the memory budget")
    times = [s.elapsed_s for s in result.history]
    if times != sorted(times):
        raise ContractError(f"{where}: history is not in time order")
    if not any(s.allocation == result.allocation for s in result.history):
        raise ContractError(f"{where}: the chosen allocation was never measured")
    if any(s.memory_bytes > target.memory_budget_bytes * (1 + 1e-9) for s in result.history):
        raise ContractError(f"{where}: a measured allocation was over the memory budget")
    return result


def clamp_workers(workers: Sequence[int], caps: Sequence[int | None]) -> tuple[int, ...]:
    """Each entry clamped to 1..cap."""
    return tuple(max(1, w if c is None else min(w, c)) for w, c in zip(workers, caps, strict=True))


class TuneLog:
    """Bookkeeping shared by the tuners: measures within the time budget, counts refusals and
    keeps every measurement so the best allocation can be chosen at the end."""

    def __init__(self, target: Target, budget_s: float, window_s: float) -> None:
        if budget_s <= 0 or window_s <= 0:
            raise ConfigError(f"budget_s = {budget_s!r} and window_s = {window_s!r} must be > 0")
        self.target = target
        self.budget_s = budget_s
        self.window_s = min(window_s, budget_s)
        self.start_s = target.elapsed_s()
        self.history: list[TuneStep] = []
        self.measurements: list[Measurement] = []
        self.refused = 0
        self._sums: dict[tuple[int, ...], list[float]] = {}

    def spent_s(self) -> float:
        return self.target.elapsed_s() - self.start_s

    def can_measure(self) -> bool:
        """True while one more window fits the budget."""
        return self.spent_s() + self.window_s <= self.budget_s * (1 + 1e-9)

    def fits_memory(self, alloc: Allocation) -> bool:
        return self.target.memory_bytes(alloc) <= self.target.memory_budget_bytes * (1 + 1e-9)

    def measure(self, alloc: Allocation) -> Measurement | None:
        """Measure ``alloc``; None if the target refused it (counted) or the budget is spent."""
        if not self.can_measure():
            return None
        try:
            m = self.target.measure(alloc, self.window_s)
        except AllocationRefused:
            self.refused += 1
            return None
        self.measurements.append(m)
        self.history.append(
            TuneStep(
                elapsed_s=self.target.elapsed_s(),
                allocation=alloc,
                throughput_rows_per_s=m.throughput_rows_per_s,
                memory_bytes=m.memory_bytes,
            )
        )
        acc = self._sums.setdefault(alloc.workers, [0.0, 0.0])
        acc[0] += m.throughput_rows_per_s
        acc[1] += 1
        return m

    def mean_throughput(self, alloc: Allocation) -> float:
        s, n = self._sums.get(alloc.workers, (0.0, 0.0))
        return s / n if n else float("nan")

    def best(self) -> Allocation:
        """The measured allocation with the highest mean throughput (ties: fewer workers)."""
        if not self._sums:
            raise ConfigError("the tuning budget allowed no measurement; raise budget_s")
        key = max(self._sums, key=lambda w: (self._sums[w][0] / self._sums[w][1], -sum(w)))
        return Allocation(workers=key)

    def result(self, tuner: str, alloc: Allocation | None = None) -> TuneResult:
        """The TuneResult for ``alloc`` (default: the best measured allocation)."""
        chosen = self.best() if alloc is None else alloc
        last = [s for s in self.history if s.allocation == chosen]
        if not last:
            raise ContractError(f"tuner {tuner!r}: chose an allocation it never measured")
        return TuneResult(
            tuner=tuner,
            allocation=chosen,
            throughput_rows_per_s=last[-1].throughput_rows_per_s,
            history=tuple(self.history),
            refused=self.refused,
            tuning_s=self.spent_s(),
        )


def check_window(name: str, value: float) -> None:
    """Shared validation of a tuner's measurement window (seconds)."""
    if not value > 0:
        raise ConfigError(f"{name} = {value!r} is outside the allowed range (0, inf]")


def unit_memory(target: Target) -> tuple[float, tuple[float, ...]]:
    """Target memory at one worker per stage, and the bytes each extra worker of a stage adds."""
    n = len(target.stage_names)
    ones = [1] * n
    base = target.memory_bytes(Allocation(workers=tuple(ones)))
    per = []
    for i in range(n):
        w = list(ones)
        w[i] = 2
        per.append(target.memory_bytes(Allocation(workers=tuple(w))) - base)
    return base, tuple(per)
