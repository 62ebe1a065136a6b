"""The Ray engine's spec pipelines and RayTarget: an allocation runs as pools of the sizes
given at the throughput the model predicts, and plumber drives it to the bound; allocations over
the logical CPUs are refused before Ray is touched; Ray Data's default is measured with the
workers it chose; a placement's node affinity deals each node its share of new workers (the
placement on a real two-node cluster is checked by the CLI test of tests/ingest/test_ray_cli.py)."""

from __future__ import annotations

import pytest

from recperf.ingest.base import Allocation, AllocationRefused
from recperf.ingest.raydata import api
from recperf.ingest.raydata.engine import _remote_args_fn
from recperf.ingest.raydata.runtime import RayRuntime
from recperf.ingest.raydata.spec import SpecPipeline, block_rows
from recperf.ingest.raydata.target import RayTarget, actor_cpus
from recperf.ingest.sim.model import PipelineSpec, StageSpec

pytest.importorskip("ray.data")

# two stages of 0.05 s and 0.1 s per 500-row block: fused x2 reaches the bound, 6,667 rows/s
SPEC = PipelineSpec(
    name="tiny",
    cores=2,
    memory_budget_gib=4.0,
    batch_rows=500,
    stages=(
        StageSpec(name="a", cost_us_per_row=100.0, gil_frac=0.0, out_bytes_per_row=64.0),
        StageSpec(name="b", cost_us_per_row=200.0, gil_frac=0.0),
    ),
)


def test_blocks_are_long_enough_for_ray() -> None:
    assert block_rows(SPEC) == 500  # 0.05 s already
    fast = SPEC.with_(stages=(StageSpec(name="x", cost_us_per_row=0.5),))
    assert block_rows(fast) * 0.5 / 1e6 >= 0.05
    assert block_rows(fast) % 500 == 0


def test_over_the_cpus_is_refused_before_ray_runs(ray_runtime: RayRuntime) -> None:
    with RayTarget(ray_runtime, SpecPipeline(SPEC, ray_runtime.cpus)) as t:
        # up to 4 workers share a logical CPU; 9 on 2 is refused
        with pytest.raises(AllocationRefused, match="9 workers on 2 logical CPUs"):
            t.measure(Allocation(workers=(5, 4)), 1.0)
        assert t._stream is None and not t.measurements


def test_a_placement_refused_leaves_the_running_dataset_running(ray_runtime: RayRuntime) -> None:
    """A refusal while the next allocation's pools are planned (here the placer's, as a
    placement past the nodes' slots was before) comes before the running dataset stops, so
    measuring the running allocation again still delivers (it measured 0 rows/s before)."""

    def placer(a: Allocation) -> tuple[tuple[int, ...], ...] | None:
        if a.total > 2:
            raise AllocationRefused(f"{a.total} workers do not fit")
        return None

    with RayTarget(ray_runtime, SpecPipeline(SPEC, ray_runtime.cpus), placer=placer) as t:
        first = t.measure(Allocation(workers=(1, 1)), 1.0)
        with pytest.raises(AllocationRefused, match="3 workers do not fit"):
            t.measure(Allocation(workers=(2, 1)), 1.0)
        assert t._stream is not None and not t._stream.closed
        again = t.measure(Allocation(workers=(1, 1)), 1.0)
    assert first.throughput_rows_per_s > 0 and again.throughput_rows_per_s > 0


def test_workers_ask_ray_for_cpus_that_fit_every_node() -> None:
    # 17 workers sharing 16 CPUs: 16/17 rounded down to Ray's grain, so all 17 fit
    assert actor_cpus(16 / 17, (8, 8), None) == 0.9411 and 17 * 0.9411 <= 16
    assert actor_cpus(1.0, (8, 8), None) == 1.0
    # placed 9 on a node of 8: no more than 8/9 each there
    assert actor_cpus(16 / 17, (8, 8), ((5, 4), (4, 4))) == 0.8888


def test_plumber_drives_ray_to_the_bound_and_ray_default_is_measured(
    ray_runtime: RayRuntime,
) -> None:
    tuned = api.spec_run(SPEC, ray_runtime, "plumber", seconds=3.0, budget_s=30.0,
                         options={"window_s": 3.0})  # fmt: skip
    # plumber's first window, the even split a x1 | b x1, runs at the model's rate (the slower
    # stage alone: 1 / 0.2 ms = 5,000 rows/s) with the costs it measures from the records
    first = tuned["history"][0]
    assert first["allocation"] == "a x1 | b x1"
    # (0.59 of it once, with two other jobs on the 2 cores: Ray's gap between blocks grows)
    assert 0.5 * 5000 <= first["throughput_rows_per_s"] <= 1.1 * 5000
    # those costs solve to one fused operator of both CPUs: the bound, 6,667 rows/s
    assert tuned["allocation"]["workers"] == [2] and tuned["allocation"]["cuts"] == []
    assert [o["workers_seen"] for o in tuned["operators"]] == [2]
    assert tuned["idle_logical_cpus"] == 0
    assert tuned["lp_bound_rows_per_s"] == pytest.approx(2e6 / 300, rel=1e-6)
    assert tuned["fraction_of_bound"] >= 0.75
    assert tuned["stage_cost_us_per_row"]["a"] == pytest.approx(100.0, rel=0.2)
    assert tuned["stage_cost_us_per_row"]["b"] == pytest.approx(200.0, rel=0.2)
    default = api.spec_run(SPEC, ray_runtime, api.RAY_DEFAULT, seconds=2.0, warmup_s=2.0)
    assert default["allocation"] == api.RAY_DEFAULT
    assert [o["operator"] for o in default["operators"]] == ["a", "b"]
    assert all(o["workers"] >= 1 for o in default["operators"])
    assert default["throughput_rows_per_s"] > 0


def test_remote_args_place_workers_round_robin_by_the_placement() -> None:
    pytest.importorskip("ray.util.scheduling_strategies")
    a, b = "a1" * 28, "b2" * 28  # node ids are 28 hex bytes
    fn = _remote_args_fn((2, 1), (a, b))
    got = [fn()["scheduling_strategy"].node_id for _ in range(6)]
    assert got == [a, a, b] * 2
    assert _remote_args_fn(None, (a, b))() == {}
    assert _remote_args_fn((3,), (a,))() == {}
