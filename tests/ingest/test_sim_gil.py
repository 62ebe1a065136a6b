"""The GIL in the ingestion model: processes of T threads share one GIL each, threads of the
consumer's process share one across segments, no copy between consumer threads, thread memory,
the LP bound and the exact oracle over cuts x thread shapes, and the simulated target's GIL
readings."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, cut_patterns
from recperf.ingest.sim.model import PipelineSpec, StageSpec, load_spec
from recperf.ingest.sim.solve import (
    lp_bound,
    oracle,
    pattern_bound,
    segment_limits,
    segments_of,
    shapes,
)
from recperf.ingest.sim.target import SimTarget

OPTIONS = (0, 1, 2, 4, 8)


def one(gil: float, cores: int = 8, **kw: object) -> PipelineSpec:
    stage = StageSpec(name="decode", cost_us_per_row=10.0, gil_frac=gil)
    return PipelineSpec(cores=cores, memory_budget_gib=4.0, stages=(stage,),
                        thread_options=OPTIONS, **kw)  # type: ignore[arg-type]  # fmt: skip


def fused(threads: int, workers: int = 1) -> Allocation:
    return Allocation(workers=(workers,), cuts=(), threads=(threads,))


def test_a_stage_that_releases_the_gil_scales_with_threads() -> None:
    spec = one(0.1)
    # one process: T threads on T cores, until its GIL (1 us of every 10) allows no more
    got = [spec.throughput(fused(t)) for t in (1, 2, 4, 8)]
    assert got == pytest.approx([1e5, 2e5, 4e5, 8e5])
    assert one(0.1, cores=16).throughput(fused(16 // 2, 2)) == pytest.approx(16e5)
    # 16 threads on 8 cores: at most 10 run (the others wait for the GIL, using no core), so
    # the 8 cores are the limit (8e5) and the GIL, busy 0.8 of the time, is not
    assert spec.with_(thread_options=(1, 16)).throughput(fused(16)) == pytest.approx(8e5)
    # a GIL-bound process on too few cores: 1 us of every 2 holds the GIL, 2 cores run 2
    half = one(0.5, cores=2).with_(thread_options=(1, 2, 4))
    assert half.throughput(fused(4)) == pytest.approx(half.throughput(fused(2)))


def test_a_pure_python_stage_does_not_scale_with_threads() -> None:
    spec = one(1.0)
    assert [spec.throughput(fused(t)) for t in (1, 2, 4, 8)] == pytest.approx([1e5] * 4)
    assert spec.throughput(fused(1, 4)) == pytest.approx(4e5)  # processes do
    assert spec.throughput(fused(0, 4)) == pytest.approx(1e5)  # the consumer's one GIL


def two(gil: float = 0.5, **kw: object) -> PipelineSpec:
    stages = tuple(StageSpec(name=n, cost_us_per_row=4.0, gil_frac=gil) for n in "ab")
    return PipelineSpec(cores=16, memory_budget_gib=4.0, stages=stages,
                        transfer_us_per_row=1.0, thread_options=OPTIONS, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_consumer_threads_share_one_gil_across_segments_and_the_consumer() -> None:
    spec = two()
    both = Allocation(workers=(4, 4), threads=(0, 0))
    # CPU allows 1e6 rows/s a segment; the one GIL 1e6 / (2 + 2)
    assert spec.capacities(both) == pytest.approx((1e6, 1e6))
    assert spec.throughput(both) == pytest.approx(2.5e5)
    assert spec.bottleneck(both) == "consumer"
    # a process segment has a GIL of its own: only b's 2 us (no copy to the consumer) is joint
    assert spec.throughput(Allocation(workers=(4, 4), threads=(1, 0))) == pytest.approx(5e5)
    # the consumer's own work joins the joint GIL, and its thread caps the rate
    busy = spec.with_(consumer_us_per_row=1.0, consumer_gil_frac=1.0)
    assert busy.throughput(both) == pytest.approx(2e5)
    assert busy.with_(consumer_us_per_row=20.0).throughput(fused_two()) == pytest.approx(5e4)


def fused_two() -> Allocation:
    return Allocation(workers=(2,), cuts=(), threads=(1,))


def test_only_consumer_threads_handing_on_in_their_process_skip_the_copy() -> None:
    spec = two()
    segs = segments_of(2, None)
    assert spec.segment_costs_us(segs, (0, 0)) == (4.0, 4.0)
    assert spec.segment_costs_us(segs, (0, 1)) == (5.0, 5.0)  # into a process: a copy
    assert spec.segment_costs_us(segs, (1, 0)) == (5.0, 4.0)
    assert spec.segment_costs_us(segs, (2, 2)) == (5.0, 5.0)
    assert spec.segment_gil_us(segs, (0, 1)) == (3.0, 3.0)  # the copy holds the GIL


def test_thread_memory_and_tasks() -> None:
    stages = (StageSpec(name="a", cost_us_per_row=1.0, memory_mib_per_worker=100.0),
              StageSpec(name="b", cost_us_per_row=1.0, memory_mib_per_worker=50.0))  # fmt: skip
    spec = PipelineSpec(cores=4, memory_budget_gib=1.0, stages=stages, memory_mib_per_batch=8.0,
                        queue_batches=1, thread_options=OPTIONS)  # fmt: skip
    mib = 2**20
    # processes: their stages' memory plus 2 batches per extra thread; consumer threads 2 batches
    assert (
        spec.memory_bytes(Allocation(workers=(2, 1), threads=(4, 0)))
        == (2 * (100 + 3 * 16) + 16 + 8) * mib
    )
    assert spec.with_(memory_mib_per_thread=1.0).memory_bytes(fused(0, 3)) == 3 * mib
    # the stages hold the GIL all the time (gil_frac 1): one of a process's 4 threads runs,
    # and one of the consumer's 3
    assert spec.tasks(Allocation(workers=(2, 3), threads=(4, 0))) == 3
    assert spec.contention(Allocation(workers=(2, 3), threads=(4, 0))) == 1.0
    # holding it a quarter of the time, all 4 can run: 2 x 4 + 3
    quarter = spec.with_(stages=tuple(replace(s, gil_frac=0.25) for s in stages))
    assert quarter.tasks(Allocation(workers=(2, 3), threads=(4, 0))) == 11
    assert quarter.contention(Allocation(workers=(2, 3), threads=(4, 0))) == pytest.approx(4 / 11)
    assert not spec.fits(Allocation(workers=(1, 1), threads=(4, 1)))


@pytest.mark.parametrize(
    ("alloc", "match"),
    [
        (Allocation(workers=(1,), cuts=(), threads=(3,)), "3 threads per worker; the pipeline"),
        (Allocation(workers=(2,), cuts=(), threads=(2,)), "2 workers x 2 threads, over its max"),
    ],
)
def test_bad_thread_allocations_are_refused(alloc: Allocation, match: str) -> None:
    spec = one(0.5).with_(stages=(StageSpec(name="d", cost_us_per_row=1.0, max_workers=3),))
    with pytest.raises(ConfigError, match=match):
        spec.check_allocation(alloc)
    with pytest.raises(ConfigError, match=match):
        SimTarget(spec).measure(alloc)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ("gil_frac = 1.5", "gil_frac"),
        ('gil_frac = "x"', "gil_frac"),
        ("thread_options = [1, 1]", "thread_options"),
        ("thread_options = [65]", "thread_options"),
        ("consumer_gil_frac = -1", "consumer_gil_frac"),
        ("consumer_us_per_row = -2", "consumer_us_per_row"),
    ],
)
def test_spec_errors_name_the_field(tmp_path: Path, edit: str, field: str) -> None:
    top, stage = ("", edit) if edit.startswith("gil_frac") else (edit, "")
    text = f'{top}\ncores = 2\nmemory_budget_gib = 1.0\n[[stage]]\nname = "a"\n'
    text += f"cost_us_per_row = 1.0\n{stage}\n"
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=field) as err:
        load_spec(path)
    assert "\n" not in str(err.value)


@st.composite
def gil_specs(draw: st.DrawFn) -> PipelineSpec:
    n = draw(st.integers(1, 3))
    stages = tuple(
        StageSpec(
            name=f"s{i}",
            cost_us_per_row=draw(st.floats(0.5, 20.0)),
            max_workers=draw(st.one_of(st.none(), st.integers(1, 6))),
            memory_mib_per_worker=draw(st.floats(0.0, 300.0)),
            gil_frac=draw(st.floats(0.0, 1.0)),
        )
        for i in range(n)
    )
    return PipelineSpec(
        cores=draw(st.integers(1, 6)),
        memory_budget_gib=draw(st.floats(0.3, 2.0)),
        stages=stages,
        transfer_us_per_row=draw(st.floats(0.0, 2.0)),
        memory_mib_per_batch=draw(st.floats(0.0, 20.0)),
        consumer_us_per_row=draw(st.sampled_from((0.0, 0.5, 3.0))),
        consumer_gil_frac=draw(st.floats(0.0, 1.0)),
        thread_options=(0, 1, 2, 4),
    )


def brute(spec: PipelineSpec, limit: int) -> float:
    """The best throughput of every allocation within ``limit`` workers a segment; the LP
    bound of each pattern and shape checked against each on the way."""
    best = 0.0
    for cuts in cut_patterns(spec.n_stages):
        segs = segments_of(spec.n_stages, cuts)
        for t in shapes(spec, len(segs)):
            bound = pattern_bound(spec, cuts, t).throughput_rows_per_s
            lims = segment_limits(spec, segs, limit, t)
            for w in itertools.product(*(range(1, x + 1) for x in lims)):
                alloc = Allocation(workers=w, cuts=cuts, threads=t)
                if spec.memory_bytes(alloc) > spec.memory_budget_gib * 2**30 * (1 + 1e-12):
                    continue
                thr = spec.throughput(alloc)
                assert thr <= bound * (1 + 1e-9)
                best = max(best, thr)
    return best


@settings(max_examples=25, deadline=None)
@given(gil_specs())
def test_the_bound_holds_and_the_oracle_is_exact_over_shapes(spec: PipelineSpec) -> None:
    limit = 3
    top = brute(spec, limit)
    assert top <= lp_bound(spec).throughput_rows_per_s * (1 + 1e-9)
    try:
        best = oracle(spec, worker_limit=limit)
    except ConfigError:
        assert top == 0.0
        return
    spec.check_allocation(best)
    assert spec.throughput(best) == pytest.approx(top, rel=1e-9)
    # shapes only add allocations: never worse than worker processes alone
    plain = spec.with_(thread_options=(1,))
    try:
        alone = plain.throughput(oracle(plain, worker_limit=limit))
    except ConfigError:
        return
    assert spec.throughput(best) >= alone * (1 - 1e-9)


def test_threads_2_wins_with_consumer_threads() -> None:
    spec = load_spec("threads-2")
    best = oracle(spec)
    assert best == Allocation(workers=(2,), cuts=(), threads=(0,))
    plain = spec.with_(thread_options=(1,))
    assert spec.throughput(best) / plain.throughput(oracle(plain)) == pytest.approx(8.46 / 7.46)
    assert lp_bound(spec).threads == (0,)


def test_the_target_reads_the_gil_only_of_multi_threaded_workers() -> None:
    spec = load_spec("threads-2")
    target = SimTarget(spec, seed=3, noise=0.0)
    assert target.thread_options == (0, 1, 2, 4)
    m = target.measure(Allocation(workers=(1, 1), cuts=(2,), threads=(2, 1)), 1.0)
    assert m.gil_frac[:2] == pytest.approx((0.15, 0.1)) and all(map(math.isnan, m.gil_frac[2:]))
    assert m.consumer_us_per_row == pytest.approx(0.3)
    # CPU is the rows' cost (no CPU while waiting for a GIL; the hand-offs' apart), wall the
    # tasks' busy time
    rows = m.throughput_rows_per_s
    assert sum(m.cpu_s) == pytest.approx(rows * 7.46 / 1e6)
    assert len(m.stage_wall_s) == 5 and sum(m.stage_wall_s) >= sum(m.cpu_s) * (1 - 1e-9)
    plain = target.measure(Allocation(workers=(2,), cuts=()), 1.0)
    assert all(map(math.isnan, plain.gil_frac))


def test_a_spec_without_threads_draws_the_same_noise() -> None:
    base = load_spec("live-2")
    allocs = [Allocation(workers=(2,), cuts=()), Allocation(workers=(1, 1, 1, 1, 1))]
    a, b = SimTarget(base, seed=5), SimTarget(base.with_(thread_options=(0, 1, 2)), seed=5)
    for alloc in allocs * 2:
        ma, mb = a.measure(alloc), b.measure(alloc)
        assert ma.throughput_rows_per_s == mb.throughput_rows_per_s
        assert ma.cost_us_per_row == mb.cost_us_per_row


def test_calibrate_reads_gil_consumer_and_hand_off_and_spec_toml_round_trips() -> None:
    from types import SimpleNamespace

    from recperf.ingest.live.target import calibrate, spec_toml
    from recperf.ingest.sim.model import spec_from_mapping

    spec = load_spec("threads-2")
    sim = SimTarget(spec, seed=1, noise=0.0)
    allocs = [Allocation(workers=(2,), cuts=(), threads=(0,)),  # GIL, no copy
              Allocation(workers=(1, 1), cuts=(3,), threads=(0, 1)),  # GIL, two copies
              Allocation(workers=(1, 1, 1, 1, 1))]  # five copies, no GIL  # fmt: skip
    config = SimpleNamespace(memory_budget_gib=4.0, batch_size=4096, queue_batches=4)
    pipeline = SimpleNamespace(stage_names=spec.stage_names, cores=2, config=config,
                               worker_memory_mib=lambda: (1.0,) * 5)  # fmt: skip
    # the live target's hand-off is the window's, over every copying segment: 0, 2 and 5 us
    ms = [dataclasses.replace(sim.measure(a), handoff_us_per_row=k * 1.0)
          for a, k in zip(allocs, (0, 2, 5), strict=True)]  # fmt: skip
    live = SimpleNamespace(measurements=ms, pipeline=pipeline, max_workers=(None,) * 5,
                           thread_options=(0, 1, 2, 4))  # fmt: skip
    got = calibrate(live)  # type: ignore[arg-type]
    assert [s.gil_frac for s in got.stages] == pytest.approx([s.gil_frac for s in spec.stages])
    assert [s.cost_us_per_row for s in got.stages] == pytest.approx(
        [s.cost_us_per_row for s in spec.stages]
    )
    assert got.transfer_us_per_row == pytest.approx(1.0)  # per copying segment
    assert got.consumer_us_per_row == pytest.approx(0.3)
    assert got.thread_options == (0, 1, 2, 4)
    import tomllib

    again = spec_from_mapping(tomllib.loads(spec_toml(got)), source="calibrated")
    assert again == got.with_(name="custom")


def test_process_cost_factor_scales_worker_processes_only() -> None:
    spec = one(0.1).with_(process_cost_factor=1.25)
    # a process's stages cost 12.5 us a row, a consumer thread's 10
    assert spec.throughput(fused(1)) == pytest.approx(1e6 / 12.5)
    assert spec.throughput(fused(0)) == pytest.approx(1e5)
    assert one(0.1).throughput(fused(1)) == pytest.approx(1e5)
    with pytest.raises(ConfigError, match="process_cost_factor"):
        one(0.1).with_(process_cost_factor=0.0)
