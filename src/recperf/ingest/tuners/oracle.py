"""The ``oracle`` tuner, for evaluation: the best integer allocation by exhaustive search (the
exact solver on the simulator, measuring every allocation on any other target)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, Target
from recperf.ingest.sim import model as sim
from recperf.ingest.tuners.base import TUNERS, TuneLog, TuneResult, check_window


@dataclass(kw_only=True, slots=True, frozen=True)
class OracleConfig:
    """Options of the oracle tuner."""

    window_s: float = 1.0
    """Length of each measurement window, seconds."""
    max_total: int | None = None
    """Most workers in all (default: stages + cores); for targets without a model."""
    worker_limit: int | None = None
    """Most workers of an uncapped stage for the exact solver (default: 8 x cores)."""

    def __post_init__(self) -> None:
        check_window("window_s", self.window_s)
        if self.max_total is not None:
            check_range("max_total", self.max_total, 1, 4096)
        if self.worker_limit is not None:
            check_range("worker_limit", self.worker_limit, 1, 65536)


def candidates(target: Target, max_total: int) -> list[Allocation]:
    """Every allocation with each stage in 1..cap, at most ``max_total`` workers, within memory."""
    caps = [max_total if c is None else min(c, max_total) for c in target.max_workers]
    out = []
    for w in itertools.product(*(range(1, c + 1) for c in caps)):
        if sum(w) > max_total:
            continue
        alloc = Allocation(workers=w)
        if target.memory_bytes(alloc) <= target.memory_budget_bytes * (1 + 1e-9):
            out.append(alloc)
    return out


@TUNERS.register("oracle")
class Oracle:
    """Exhaustive search: exact on a target with a ``.spec`` model, measured otherwise."""

    name: str = "oracle"
    Config = OracleConfig

    def __init__(self, config: OracleConfig | None = None) -> None:
        self.config = config or OracleConfig()

    def tune(self, target: Target, budget_s: float, seed: int = 0) -> TuneResult:
        log = TuneLog(target, budget_s, self.config.window_s)
        spec = getattr(target, "spec", None)
        if isinstance(spec, sim.PipelineSpec):
            best = sim.oracle(spec, worker_limit=self.config.worker_limit)
            log.measure(best)
            return log.result(self.name, best)
        n = len(target.stage_names)
        total = self.config.max_total or n + target.cores
        allocs = candidates(target, total)
        if not allocs:
            raise ConfigError("oracle: no allocation fits the caps, max_total and memory")
        for alloc in allocs:
            if log.measure(alloc) is None and not log.can_measure():
                break
        return log.result(self.name)
