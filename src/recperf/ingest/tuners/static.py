"""The ``static`` tuner: the even split of the cores, measured as is (the baseline)."""

from __future__ import annotations

from dataclasses import dataclass

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.ingest.sim import Allocation
from recperf.ingest.tuners.base import TUNERS, Target, TuneLog, TuneResult, check_window


def even_split(target: Target) -> Allocation:
    """One worker per stage, then the rest of the cores dealt round-robin, skipping stages at
    their cap or whose next worker would go over the memory budget (sim.even for a Target)."""
    n = len(target.stage_names)
    w = [1] * n
    if target.memory_bytes(Allocation(workers=tuple(w))) > target.memory_budget_bytes:
        raise ConfigError("even split: one worker per stage is already over the memory budget")
    left = target.cores - n
    while left > 0:
        gave = False
        for i, cap in enumerate(target.max_workers):
            if left == 0:
                break
            if cap is not None and w[i] >= cap:
                continue
            w[i] += 1
            if target.memory_bytes(Allocation(workers=tuple(w))) > target.memory_budget_bytes:
                w[i] -= 1
                continue
            left -= 1
            gave = True
        if not gave:
            break
    return Allocation(workers=tuple(w))


@dataclass(kw_only=True, slots=True, frozen=True)
class StaticConfig:
    """Options of the static tuner."""

    window_s: float = 1.0
    """Length of each measurement window, seconds."""
    repeats: int = 1
    """How many windows to measure the even split for (1..100)."""

    def __post_init__(self) -> None:
        check_window("window_s", self.window_s)
        check_range("repeats", self.repeats, 1, 100)


@TUNERS.register("static")
class Static:
    """Even split, no search."""

    name: str = "static"
    Config = StaticConfig

    def __init__(self, config: StaticConfig | None = None) -> None:
        self.config = config or StaticConfig()

    def tune(self, target: Target, budget_s: float, seed: int = 0) -> TuneResult:
        log = TuneLog(target, budget_s, self.config.window_s)
        alloc = even_split(target)
        for _ in range(self.config.repeats):
            log.measure(alloc)
        return log.result(self.name, alloc)
