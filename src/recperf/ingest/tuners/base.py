"""The tuner contract: a ``Target`` (simulated or live pipeline) that measures allocations, the
``Tuner`` protocol that searches them, their result types, the registry and the conformance check.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from recperf.core.confidence import t_quantile
from recperf.core.config import check_range
from recperf.core.errors import ConfigError, ContractError
from recperf.core.registry import Registry
from recperf.ingest.base import Allocation, Measurement, Target, segment_caps


@dataclass(kw_only=True, slots=True, frozen=True)
class TuneStep:
    """One measured allocation during tuning."""

    elapsed_s: float
    """Target time when the measurement ended."""
    allocation: Allocation
    """The allocation measured (cuts and workers, normalized)."""
    throughput_rows_per_s: float
    memory_bytes: float
    throughput_ci: tuple[float, float] | None = None
    """90% interval of the throughput (None: the measurement stated none, as the simulator's)."""
    samples: int = 1
    """Sub-windows the throughput was estimated from."""


@dataclass(kw_only=True, slots=True, frozen=True)
class TuneResult:
    """A tuner's choice and how it got there."""

    tuner: str
    allocation: Allocation
    """The allocation the tuner settled on (cuts and workers, normalized)."""
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
    """Searches allocations of a target (where its chain is cut and how many workers run each
    segment) within a time budget."""

    name: str

    def tune(self, target: Target, budget_s: float, seed: int = 0) -> TuneResult: ...


TUNERS: Registry[Tuner] = Registry("tuner", "recperf.ingest.tuners")


def check_tuner(
    tuner: Tuner,
    target: Target,
    budget_s: float,
    seed: int = 0,
    *,
    target_factory: Callable[[], Target] | None = None,
    overrun_s: float | None = None,
) -> TuneResult:
    """Run ``tuner`` on ``target`` and check the contract; return its result. A broken rule
    raises ContractError naming it. The rules:

    - the result is a TuneResult naming a valid allocation (cuts within the chain, a worker
      count per segment, each within 1..the segment's cap) whose memory fits the budget;
    - its history is in time order and contains that allocation, and no measured allocation
      was over the memory budget;
    - time, on the target's clock (``target.elapsed_s()`` before and after ``tune``): apart
      from its last measurement (and its own time just before it), the tuner spent at most
      ``budget_s``. The last may overrun, as a tuner starts a window while the window fits but
      a live target takes longer (it resizes and settles first). ``overrun_s`` bounds the
      overrun: the whole run then takes at most ``budget_s + overrun_s``; 0 on a target whose
      clock moves by exactly the windows asked for (the simulator);
    - with ``target_factory``, determinism: ``tuner`` runs again with the same seed on
      ``target_factory()``, a fresh target equal to ``target`` as passed (same pipeline, seed
      and clock), and must return a result equal in ``_COMPARED``'s fields (allocation,
      history, throughput, refusals, tuning time). Without it (the live pipeline, which cannot
      be repeated) determinism is not checked.
    """
    check_range("budget_s", budget_s, 0.0, None, lo_open=True)
    where = f"tuner {tuner.name!r}"
    start_s = target.elapsed_s()
    result = tuner.tune(target, budget_s, seed)
    spent_s = target.elapsed_s() - start_s
    if not isinstance(result, TuneResult):
        raise ContractError(f"{where}: tune returned {type(result).__name__}, not TuneResult")
    _check_result(result, target, where)
    _check_budget(result, start_s, spent_s, budget_s, overrun_s, where)
    if target_factory is not None:
        _check_repeat(tuner, result, target_factory(), budget_s, seed, where)
    return result


_COMPARED = ("allocation", "history", "throughput_rows_per_s", "refused", "tuning_s")
"""The TuneResult fields two runs with one seed must agree on."""


def _check_repeat(
    tuner: Tuner, result: TuneResult, fresh: Target, budget_s: float, seed: int, where: str
) -> None:
    """``tuner`` on ``fresh`` with ``seed`` gives ``result`` again."""
    again = tuner.tune(fresh, budget_s, seed)
    differ = [f for f in _COMPARED if getattr(again, f, None) != getattr(result, f)]
    if differ:
        raise ContractError(
            f"{where}: two runs with seed {seed} on fresh targets differ in "
            f"{', '.join(differ)} (tune must depend only on the target, budget and seed)"
        )


def _check_result(result: TuneResult, target: Target, where: str) -> None:
    """The chosen allocation and the history, against ``target``'s chain and memory budget."""
    n = len(target.stage_names)
    chosen = _checked(result.allocation, target, where)
    limit = target.memory_budget_bytes * (1 + 1e-9)
    if target.memory_bytes(result.allocation) > limit:
        raise ContractError(f"{where}: chosen allocation is over the memory budget")
    times = [s.elapsed_s for s in result.history]
    if times != sorted(times):
        raise ContractError(f"{where}: history is not in time order")
    if not any(_same(s.allocation, chosen, n) for s in result.history):
        raise ContractError(f"{where}: the chosen allocation was never measured")
    if any(s.memory_bytes > limit for s in result.history):
        raise ContractError(f"{where}: a measured allocation was over the memory budget")


def _check_budget(
    result: TuneResult,
    start_s: float,
    spent_s: float,
    budget_s: float,
    overrun_s: float | None,
    where: str,
) -> None:
    """``spent_s`` of target time from ``start_s`` within ``budget_s`` (see check_tuner)."""
    limit = budget_s * (1 + 1e-9)
    if overrun_s is not None and spent_s > limit + overrun_s:
        allowed = f"the budget of {budget_s:g} s" + (f" + {overrun_s:g} s" if overrun_s else "")
        raise ContractError(f"{where}: spent {spent_s:g} s of target time, over {allowed}")
    # The last measurement's length, with the tuner's own time before it: what may overrun.
    ends = [s.elapsed_s - start_s for s in result.history]
    last_s = ends[-1] - (ends[-2] if len(ends) > 1 else 0.0)
    if spent_s - last_s > limit:
        raise ContractError(
            f"{where}: spent {spent_s - last_s:g} s of target time besides its last "
            f"measurement, over the budget of {budget_s:g} s"
        )


def _checked(alloc: Allocation, target: Target, where: str) -> Allocation:
    """``alloc`` normalized for ``target``'s chain; ContractError if it does not fit it."""
    names = target.stage_names
    try:
        norm = alloc.normalized(len(names))
    except ConfigError as exc:
        raise ContractError(f"{where}: {exc}") from None
    segs = norm.segments(len(names))
    caps = segment_caps(target.max_workers, segs)
    for (a, b), w, cap in zip(segs, norm.workers, caps, strict=True):
        if w < 1 or (cap is not None and w > cap):
            label = "+".join(names[a:b])
            raise ContractError(f"{where}: segment {label!r} got {w} workers (cap {cap})")
    return norm


def _same(a: Allocation, b: Allocation, n_stages: int) -> bool:
    try:
        return a.normalized(n_stages) == b.normalized(n_stages)
    except ConfigError:
        return False


class TuneLog:
    """Bookkeeping shared by the tuners: measures within the time budget, counts refusals and
    keeps every measurement so the best allocation can be chosen at the end. Allocations are
    kept normalized (``Allocation.normalized``), so the same cuts spelled two ways are one.

    The choice does not move on one noisy window: where measurements state an interval (the
    live target), an allocation with a higher mean replaces the incumbent (the best so far, in
    the order first measured) only if the lower end of its interval is above the incumbent's
    mean. Without intervals (the simulator) the highest mean wins, as it always did."""

    def __init__(self, target: Target, budget_s: float, window_s: float) -> None:
        check_range("budget_s", budget_s, 0.0, None, lo_open=True)
        check_range("window_s", window_s, 0.0, None, lo_open=True)
        self.target = target
        self.n_stages = len(target.stage_names)
        self.budget_s = budget_s
        self.window_s = min(window_s, budget_s)
        self.start_s = target.elapsed_s()
        self.history: list[TuneStep] = []
        self.measurements: list[Measurement] = []
        self.refused = 0
        self._sums: dict[Allocation, list[float]] = {}
        self._by_alloc: dict[Allocation, list[Measurement]] = {}

    def spent_s(self) -> float:
        return self.target.elapsed_s() - self.start_s

    def can_measure(self) -> bool:
        """True while one more window fits the budget."""
        return self.spent_s() + self.window_s <= self.budget_s * (1 + 1e-9)

    def fits_memory(self, alloc: Allocation) -> bool:
        return self.target.memory_bytes(alloc) <= self.target.memory_budget_bytes * (1 + 1e-9)

    def measure(self, alloc: Allocation) -> Measurement | None:
        """Measure ``alloc``; None if the target refused it (counted; so is an allocation that
        does not match the chain) or the budget is spent."""
        if not self.can_measure():
            return None
        try:
            alloc = alloc.normalized(self.n_stages)
            m = self.target.measure(alloc, self.window_s)
        except ConfigError:  # AllocationRefused, or cuts that do not fit the chain
            self.refused += 1
            return None
        self.record(m)
        return m

    def record(self, m: Measurement) -> None:
        """Add a measurement of this log's target taken now, to the history and the means."""
        self.adopt(m)
        ci = m.throughput_ci if all(math.isfinite(x) for x in m.throughput_ci) else None
        self.history.append(
            TuneStep(
                elapsed_s=self.target.elapsed_s(),
                allocation=m.allocation.normalized(self.n_stages),
                throughput_rows_per_s=m.throughput_rows_per_s,
                memory_bytes=m.memory_bytes,
                throughput_ci=ci,
                samples=m.samples,
            )
        )

    def adopt(self, m: Measurement) -> None:
        """Count a measurement taken earlier (logged elsewhere) in the means, not the history."""
        self.measurements.append(m)
        alloc = m.allocation.normalized(self.n_stages)
        acc = self._sums.setdefault(alloc, [0.0, 0.0])
        acc[0] += m.throughput_rows_per_s
        acc[1] += 1
        self._by_alloc.setdefault(alloc, []).append(m)

    def mean_throughput(self, alloc: Allocation) -> float:
        s, n = self._sums.get(alloc.normalized(self.n_stages), (0.0, 0.0))
        return s / n if n else float("nan")

    def count(self, alloc: Allocation) -> int:
        """How many windows measured ``alloc``."""
        return int(self._sums.get(alloc.normalized(self.n_stages), (0.0, 0.0))[1])

    def interval(self, alloc: Allocation) -> tuple[float, float] | None:
        """90% interval of ``alloc``'s mean throughput over its windows; None if any of them
        stated none. Its half-width is the larger of the windows' own (their sub-windows'
        standard errors pooled) and, with two windows or more, their spread."""
        ms = self._by_alloc.get(alloc.normalized(self.n_stages), [])
        if not ms or any(not math.isfinite(x) for m in ms for x in m.throughput_ci):
            return None
        k = len(ms)
        var, df = 0.0, 0
        for m in ms:
            if m.samples >= 2:
                lo, hi = m.throughput_ci
                var += ((hi - lo) / 2 / t_quantile(m.samples - 1)) ** 2
                df += m.samples - 1
        half = t_quantile(df) * math.sqrt(var) / k if df else 0.0
        if k >= 2:
            spread = statistics.stdev(m.throughput_rows_per_s for m in ms)
            half = max(half, t_quantile(k - 1) * spread / math.sqrt(k))
        mean = self.mean_throughput(alloc)
        return (mean - half, mean + half)

    def best(self) -> Allocation:
        """The measured allocation with the highest mean throughput (ties: fewer workers, then
        fewer segments), moving off the incumbent only on an interval above its mean (see the
        class)."""
        if not self._sums:
            raise ConfigError("the tuning budget allowed no measurement; raise budget_s")

        key = self._rank
        incumbent: Allocation | None = None
        for a in self._sums:  # first-measured order; strictly greater keeps max()'s choice
            if incumbent is None or (key(a) > key(incumbent) and self._clears(a, incumbent)):
                incumbent = a
        assert incumbent is not None
        return incumbent

    def _rank(self, a: Allocation) -> tuple[float, int, int]:
        """Higher mean first; ties to fewer workers, then fewer segments."""
        return (self.mean_throughput(a), -a.total, -len(a.workers))

    def settle(self, rounds: int = 2) -> None:
        """Where the allocation measured fastest has not cleared the incumbent (its interval
        reaches below the incumbent's mean), measure the two again, the faster first, while the
        budget allows, at most ``rounds`` more windows each: from two windows an interval also
        holds their spread, so the choice rests on more than one window's sub-window noise
        (on Ray, 4 sub-windows of a few blocks each). Without intervals nothing is measured."""
        for _ in range(rounds):
            if not self._sums:
                return
            chosen = self.best()
            top = max(self._sums, key=self._rank)
            if top == chosen or self.measure(top) is None or self.measure(chosen) is None:
                return

    def _clears(self, a: Allocation, incumbent: Allocation) -> bool:
        """``a`` (higher mean) may replace ``incumbent``: no intervals to judge by, or ``a``'s
        interval lies above the incumbent's mean."""
        ci, other = self.interval(a), self.interval(incumbent)
        return ci is None or other is None or ci[0] > self.mean_throughput(incumbent)

    def result(self, tuner: str, alloc: Allocation | None = None) -> TuneResult:
        """The TuneResult for ``alloc`` (default: the best measured allocation)."""
        chosen = self.best() if alloc is None else alloc.normalized(self.n_stages)
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
