"""The ``autotune`` tuner, after tf.data AUTOTUNE: a static fusion of the chain (a graph rewrite,
decided before anything is measured), an analytic model from measured per-row costs, greedy hill
climbing of each segment's parallelism up to the CPU budget, and tf.data's RAM rule, which
charges only buffer memory against the budget (not per-worker memory). On a target that runs
threads, a measured hill climb over each segment's threads after the first proposal (the shape
then holds: later proposals place the same units of parallelism in workers of those threads);
on a target with in-flight options, a probe of them after it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recperf.core.config import check_range
from recperf.ingest.base import Allocation, Target, segment_caps
from recperf.ingest.tuners.base import TUNERS, TuneLog, TuneResult, check_window
from recperf.ingest.tuners.model import measured_costs, measured_handoff
from recperf.ingest.tuners.shape import climb_threads, pick_inflight


@dataclass(kw_only=True, slots=True, frozen=True)
class AutotuneConfig:
    """Options of the autotune tuner."""

    window_s: float = 1.0
    """Length of each measurement window, seconds."""
    ram_fraction: float = 0.5
    """Share of the memory budget buffers may use (tf.data: 50%), (0, 1]."""
    reoptimize_every: int = 10
    """Windows between re-optimisations from fresh cost estimates (1..1000)."""

    def __post_init__(self) -> None:
        check_window("window_s", self.window_s)
        check_range("ram_fraction", self.ram_fraction, 0.0, 1.0, lo_open=True)
        check_range("reoptimize_every", self.reoptimize_every, 1, 1000)


def static_cuts(caps: Sequence[int | None], cores: int) -> tuple[int, ...]:
    """Where the static rewrite cuts the chain: around every stage whose cap is below the cores.

    tf.data fuses adjacent maps by rewriting the graph, knowing no costs. What it can know
    statically is a stage's parallelism limit; a fused segment would inherit it, and a limit
    below the cores is one the hill climb (which stays within the cores) could hit, so such a
    stage keeps a segment of its own and every other run of stages is fused. The price of this
    blindness: the rewrite never weighs a cut's hand-off against what it buys, nor a fused
    worker's memory (the sum of its stages') against the budget."""
    tight = [c is not None and c < cores for c in caps]
    return tuple(i for i in range(1, len(caps)) if tight[i] or tight[i - 1])


def hill_climb(costs: list[float], caps: tuple[int | None, ...], cpu_budget: int) -> list[int]:
    """Units of parallelism added one at a time, in order: the modelled output rate of a chain
    is min_i w_i / c_i, so each unit goes to the segment whose increment raises it most, i.e.
    the bottleneck (tf.data's HillClimb over its model). Stops at the CPU budget or when every
    segment is at its parameter's max (a tf.data parameter carries its own max: the cap)."""
    n = len(costs)
    w = [1] * n
    order: list[int] = []
    while sum(w) < cpu_budget:
        open_ = [i for i in range(n) if caps[i] is None or w[i] < (caps[i] or 0)]
        if not open_:
            break
        i = min(open_, key=lambda j: (w[j] / costs[j], -costs[j]))
        w[i] += 1
        order.append(i)
    return order


def placed(units: list[int], threads: tuple[int, ...] | None) -> tuple[int, ...]:
    """Workers that run ``units`` of parallelism per segment in workers of ``threads`` each
    (a consumer thread is one unit; None: one unit per worker)."""
    if threads is None:
        return tuple(units)
    return tuple(max(1, -(-u // max(1, t))) for u, t in zip(units, threads, strict=True))


@TUNERS.register("autotune")
class Autotune:
    """Static fusion, then model-based hill climbing within the cores; blind to per-worker
    memory, so proposals may be refused by a memory-bound target, after which it backs off
    unit by unit."""

    name: str = "autotune"
    Config = AutotuneConfig

    def __init__(self, config: AutotuneConfig | None = None) -> None:
        self.config = config or AutotuneConfig()

    def _propose(
        self,
        log: TuneLog,
        cuts: tuple[int, ...],
        caps: tuple[int | None, ...],
        costs: list[float],
        ram_bytes: float,
        shape: Allocation | None = None,
    ) -> Allocation | None:
        """Hill-climb, then apply it; on a refusal drop the last added unit and try again."""
        target = log.target
        order = hill_climb(costs, caps, target.cores)
        # RAM rule: buffer memory (what tf.data models) must stay within ram_fraction of the
        # budget; the buffers do not depend on parallelism, so this only checks the pipeline.
        if ram_bytes > self.config.ram_fraction * target.memory_budget_bytes:
            order = []
        w = [1] * len(costs)
        for i in order:
            w[i] += 1
        while True:
            threads = None if shape is None else shape.threads
            alloc = Allocation(workers=placed(w, threads), cuts=cuts, threads=threads,
                               inflight=0 if shape is None else shape.inflight)  # fmt: skip
            if log.measure(alloc) is not None:
                return alloc
            if not log.can_measure() or not order:
                return None
            w[order.pop()] -= 1

    def tune(self, target: Target, budget_s: float, seed: int = 0) -> TuneResult:
        log = TuneLog(target, budget_s, self.config.window_s)
        cuts = static_cuts(target.max_workers, target.cores)
        ones = Allocation(workers=(1,) * (len(cuts) + 1), cuts=cuts)
        first = log.measure(ones)
        if first is None:
            return log.result(self.name)
        segs = ones.segments(log.n_stages)
        caps = segment_caps(target.max_workers, segs)
        # tf.data's view of memory: the buffers seen at parallelism 1, assumed fixed.
        ram = first.memory_bytes
        current: Allocation | None = first.allocation
        shape: Allocation | None = None  # the thread shape and in-flight requests, once climbed
        while log.can_measure() and current is not None:
            recent = log.measurements[-self.config.reoptimize_every :]
            stage = measured_costs(recent)
            handoff = measured_handoff(recent)
            costs = [sum(stage[a:b]) + handoff for a, b in segs]
            current = self._propose(log, cuts, caps, costs, ram, shape) or current
            if shape is None and current != first.allocation:
                current = shape = pick_inflight(log, climb_threads(log, current))
            since = 1
            while since < self.config.reoptimize_every and log.measure(current) is not None:
                since += 1
        return log.result(self.name)
