"""SimTarget: the analytic model behind the Target protocol, with cuts, noise and a clock."""

from __future__ import annotations

import math

import pytest

from recperf.ingest.base import Allocation, AllocationRefused, Target
from recperf.ingest.sim.model import PipelineSpec, StageSpec, load_spec
from recperf.ingest.sim.target import QUEUE_FULL, SimTarget


def chain(cores: int = 4, budget: float = 1.0, transfer: float = 0.0) -> PipelineSpec:
    stages = tuple(
        StageSpec(name=n, cost_us_per_row=c, max_workers=cap, memory_mib_per_worker=100.0)
        for n, c, cap in (("a", 1.0, None), ("b", 4.0, 3), ("c", 2.0, None))
    )
    return PipelineSpec(
        cores=cores, memory_budget_gib=budget, stages=stages, transfer_us_per_row=transfer
    )


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
    assert m.handoff_us_per_row == 0.0
    assert m.memory_bytes == 400 * 2**20
    assert t.elapsed_s() == 2.0
    assert t.peak_memory_bytes == 400 * 2**20


def test_a_fused_segment_reports_its_stages() -> None:
    t = SimTarget(chain(transfer=0.5), noise=0.0)
    m = t.measure(Allocation(workers=(2, 1), cuts=(2,)), 1.0)  # a+b x2 | c x1
    # a+b: 2 workers (under b's cap of 3) at 1 + 4 + 0.5 us/row; c: 1 worker at 2 + 0.5
    thr = 2e6 / 5.5
    assert m.throughput_rows_per_s == pytest.approx(thr)
    busy_c = thr / 0.4e6
    assert m.busy_frac == pytest.approx((1.0, 1.0, busy_c))  # a and b share their segment's
    assert m.queue_fill == pytest.approx((0.0, 0.0, 0.5 * busy_c))  # b has no queue of its own
    # each stage's own cost, without the hand-off, which is reported apart
    assert m.cost_us_per_row == pytest.approx((1.0, 4.0, 2.0))
    assert m.handoff_us_per_row == 0.5
    # CPU per stage = rows x its cost: what the live pipeline's fused worker reports
    rows = m.throughput_rows_per_s * m.window_s
    assert [c / rows * 1e6 for c in m.cpu_s] == pytest.approx((1.0, 4.0, 2.0))
    assert m.memory_bytes == (2 * 200 + 100) * 2**20  # a fused worker holds a's and b's memory


def test_upstream_bottleneck_starves_later_queues() -> None:
    t = SimTarget(chain(), noise=0.0)
    m = t.measure(Allocation(workers=(1, 3, 4)), 1.0)  # oversubscribed: 8 workers on 4 cores
    # capacities scaled by 4/8: a 0.5e6, b 0.375e6, c 1e6 -> b binds
    assert m.throughput_rows_per_s == pytest.approx(0.375e6)
    assert m.queue_fill[1] == QUEUE_FULL
    assert m.queue_fill[2] == pytest.approx(0.5 * 0.375)


@pytest.mark.parametrize(
    "alloc",
    [
        Allocation(workers=(0, 1, 1)),
        Allocation(workers=(1, 4, 1)),
        Allocation(workers=(5, 3, 3)),  # 1.1 GiB
        Allocation(workers=(4, 1), cuts=(2,)),  # a+b inherits b's cap of 3
        Allocation(workers=(1, 1), cuts=(3,)),  # no stage 3
        Allocation(workers=(1, 1)),  # two counts for three stages
    ],
)
def test_refusals_change_nothing(alloc: Allocation) -> None:
    t = SimTarget(chain(), noise=0.0)
    with pytest.raises(AllocationRefused):
        t.measure(alloc, 1.0)
    assert (t.elapsed_s(), t.measurements, t.peak_memory_bytes) == (0.0, 0, 0.0)


def test_noise_is_seeded_and_multiplicative() -> None:
    spec = load_spec("criteo-16")
    alloc = Allocation(workers=(12, 4), cuts=(3,))
    a = [SimTarget(spec, seed=3).measure(alloc, 1.0).throughput_rows_per_s for _ in range(2)]
    assert a[0] == a[1]
    t = SimTarget(spec, seed=3)
    ms = [t.measure(alloc, 1.0) for _ in range(200)]
    true = spec.throughput(alloc)
    for xs, mean_of in (
        ([m.throughput_rows_per_s for m in ms], true),
        ([m.handoff_us_per_row for m in ms], spec.transfer_us_per_row),
        ([m.cost_us_per_row[2] for m in ms], spec.stages[2].cost_us_per_row),
    ):
        mean = sum(xs) / len(xs)
        sd = math.sqrt(sum((x / mean_of - 1) ** 2 for x in xs) / len(xs))
        assert mean == pytest.approx(mean_of, rel=0.01)
        assert 0.01 < sd < 0.03
