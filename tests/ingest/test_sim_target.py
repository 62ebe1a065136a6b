"""SimTarget: the analytic model behind the Target protocol, with noise and a clock."""

from __future__ import annotations

import math

import pytest

from recperf.ingest.base import Allocation, AllocationRefused, Target
from recperf.ingest.sim.model import PipelineSpec, StageSpec, load_spec
from recperf.ingest.sim.target import QUEUE_FULL, SimTarget


def chain(cores: int = 4, budget: float = 1.0) -> PipelineSpec:
    stages = tuple(
        StageSpec(name=n, cost_us_per_row=c, max_workers=cap, memory_mib_per_worker=100.0)
        for n, c, cap in (("a", 1.0, None), ("b", 4.0, 3), ("c", 2.0, None))
    )
    return PipelineSpec(cores=cores, memory_budget_gib=budget, stages=stages)


def test_is_a_target_and_measures_the_model_without_noise() -> None:
    t = SimTarget(chain(), noise=0.0)
    assert isinstance(t, Target)
    m = t.measure(Allocation(workers=(1, 2, 1)), 2.0)
    # capacities 1e6, 0.5e6, 0.5e6: throughput 0.5e6 (b is the first bottleneck)
    assert m.throughput_rows_per_s == pytest.approx(0.5e6)
    assert m.busy_frac == pytest.approx((0.5, 1.0, 1.0))
    # b and c tie; the first slowest stage, b, counts as the bottleneck: b's input queue is
    # full and c's, after it, is starved (half c's busy share)
    assert m.queue_fill == pytest.approx((0.0, QUEUE_FULL, 0.5))
    assert m.cpu_s == pytest.approx((1.0, 4.0, 2.0))  # busy * workers * window
    assert m.cost_us_per_row == pytest.approx((1.0, 4.0, 2.0))
    assert m.memory_bytes == 400 * 2**20
    assert t.elapsed_s() == 2.0
    assert t.peak_memory_bytes == 400 * 2**20


def test_upstream_bottleneck_starves_later_queues() -> None:
    t = SimTarget(chain(), noise=0.0)
    m = t.measure(Allocation(workers=(1, 3, 4)), 1.0)  # oversubscribed: 8 workers on 4 cores
    # capacities scaled by 4/8: a 0.5e6, b 0.375e6, c 1e6 -> b binds
    assert m.throughput_rows_per_s == pytest.approx(0.375e6)
    assert m.queue_fill[1] == QUEUE_FULL
    assert m.queue_fill[2] == pytest.approx(0.5 * 0.375)


@pytest.mark.parametrize("workers", [(0, 1, 1), (1, 4, 1), (5, 3, 3)])
def test_refusals_change_nothing(workers: tuple[int, int, int]) -> None:
    t = SimTarget(chain(), noise=0.0)
    with pytest.raises(AllocationRefused):
        t.measure(Allocation(workers=workers), 1.0)
    assert (t.elapsed_s(), t.measurements, t.peak_memory_bytes) == (0.0, 0, 0.0)


def test_noise_is_seeded_and_multiplicative() -> None:
    spec = load_spec("criteo-16")
    alloc = Allocation(workers=(4, 2, 6, 1, 1, 2))
    a = [SimTarget(spec, seed=3).measure(alloc, 1.0).throughput_rows_per_s for _ in range(2)]
    assert a[0] == a[1]
    t = SimTarget(spec, seed=3)
    xs = [t.measure(alloc, 1.0).throughput_rows_per_s for _ in range(200)]
    true = spec.throughput(alloc)
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x / true - 1) ** 2 for x in xs) / len(xs))
    assert mean == pytest.approx(true, rel=0.01)
    assert 0.01 < sd < 0.03
