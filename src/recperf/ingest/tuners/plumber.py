"""The ``plumber`` tuner (after Kuchnik et al., MLSys 2022): measure each stage's CPU cost per
row and the hand-off's (on a target that runs threads, also each stage's GIL fraction, from one
probe of several threads), solve the resource model exactly for the cuts, the thread shapes and
the integer workers (the LP over every cut pattern and shape, rounded the exact way), measure,
refine once; on a target with in-flight options, probe them last."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recperf.core.config import check_range
from recperf.ingest.base import Allocation, Measurement, Target, even_split
from recperf.ingest.sim import solve
from recperf.ingest.tuners.base import TUNERS, TuneLog, TuneResult, check_window
from recperf.ingest.tuners.model import measured_spec
from recperf.ingest.tuners.shape import pick_inflight, probe_gil


@dataclass(kw_only=True, slots=True, frozen=True)
class PlumberConfig:
    """Options of the plumber tuner."""

    window_s: float = 1.0
    """Length of each measurement window, seconds."""
    oversubscribe: float = 4.0
    """Most workers per uncapped segment as a multiple of the cores (1..16): the LP's fractional
    core shares are realised by letting the OS time-share rounded-up workers."""
    refine: bool = True
    """Re-estimate costs at the first solution and solve once more."""

    def __post_init__(self) -> None:
        check_window("window_s", self.window_s)
        check_range("oversubscribe", self.oversubscribe, 1.0, 16.0)


@TUNERS.register("plumber")
class Plumber:
    """Cost measurement, exact model solve over every cut pattern; one optional refinement."""

    name: str = "plumber"
    Config = PlumberConfig

    def __init__(self, config: PlumberConfig | None = None) -> None:
        self.config = config or PlumberConfig()

    def _solve(self, target: Target, ms: Sequence[Measurement]) -> Allocation:
        spec = measured_spec(target, ms, name="plumber")
        # The LP's optimum (solve.lp_bound, over every cut pattern and thread shape) rounded the
        # exact way: the least integer workers that reach each candidate rate, best feasible
        # one kept (solve.oracle on the measured model, with its GIL fractions).
        limit = max(1, round(self.config.oversubscribe * target.cores))
        return solve.oracle(spec, worker_limit=limit).normalized(len(target.stage_names))

    def tune(self, target: Target, budget_s: float, seed: int = 0) -> TuneResult:
        log = TuneLog(target, budget_s, self.config.window_s)
        first = log.measure(even_split(target))
        if first is None:
            return log.result(self.name)
        probe_gil(log)  # measures nothing on a target without threads
        alloc = self._solve(target, log.measurements)
        m = log.measure(alloc)
        if m is not None and self.config.refine:
            refined = self._solve(target, log.measurements)
            if refined != alloc:
                log.measure(refined)
        log.settle()
        return log.result(self.name, pick_inflight(log, log.best()))
