"""The ``static`` tuner: the even split of the cores, measured as is (the baseline)."""

from __future__ import annotations

from dataclasses import dataclass

from recperf.core.config import check_range
from recperf.ingest.base import Target, even_split
from recperf.ingest.tuners.base import TUNERS, TuneLog, TuneResult, check_window


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
