"""The Ray engine's spec pipelines and RayTarget on a two-node local cluster: an allocation
runs as pools of the sizes given, placed on the nodes the placement names, at the throughput
the model predicts; allocations over the logical CPUs are refused before Ray is touched; Ray
Data's default is measured with the workers it chose; plumber drives it to the bound."""

from __future__ import annotations

import pytest

from recperf.ingest.base import Allocation, AllocationRefused
from recperf.ingest.raydata import api
from recperf.ingest.raydata.runtime import RayRuntime
from recperf.ingest.raydata.spec import SpecPipeline, block_rows
from recperf.ingest.raydata.target import RayTarget
from recperf.ingest.sim.model import PipelineSpec, StageSpec
from recperf.ingest.sim.placement import Network, place

pytest.importorskip("ray.data")

# two stages of 0.1 s and 0.2 s per 1,000-row block: fused x2 reaches the bound, 6,667 rows/s
SPEC = PipelineSpec(
    name="tiny",
    cores=2,
    memory_budget_gib=4.0,
    batch_rows=1000,
    stages=(
        StageSpec(name="a", cost_us_per_row=100.0, gil_frac=0.0, out_bytes_per_row=64.0),
        StageSpec(name="b", cost_us_per_row=200.0, gil_frac=0.0),
    ),
)


def test_blocks_are_long_enough_for_ray() -> None:
    assert block_rows(SPEC) == 1000  # 0.1 s already
    fast = SPEC.with_(stages=(StageSpec(name="x", cost_us_per_row=0.5),))
    assert block_rows(fast) * 0.5 / 1e6 >= 0.05
    assert block_rows(fast) % 1000 == 0


def test_an_allocation_runs_as_placed_at_the_models_rate(ray_runtime: RayRuntime) -> None:
    pipe = SpecPipeline(SPEC, ray_runtime.cpus)
    alloc = Allocation(workers=(1, 1))
    cpus = ray_runtime.node_cpus
    placement = place(pipe.spec, alloc, cpus, Network(link_bytes_per_s=float("inf")))
    with RayTarget(
        ray_runtime,
        pipe,
        placer=lambda a: place(pipe.spec, a, cpus, Network(link_bytes_per_s=1e12)),
    ) as t:
        m = t.measure(alloc, 3.0)
        w = t.windows[-1]
        nodes = {r.op: {r.node} for r in t._records}
    model = pipe.spec.throughput(alloc)  # the slower stage alone: 1 / 0.2 ms = 5,000 rows/s
    assert 0.6 * model <= m.throughput_rows_per_s <= 1.1 * model
    assert w.workers_seen == (1, 1)
    assert w.idle_cpus == 0
    # each operator's one worker ran on the node the placement named
    for j, per_node in enumerate(placement):
        (node,) = [i for i, k in enumerate(per_node) if k]
        assert nodes[j] == {ray_runtime.node_ids[node]}
    assert m.cost_us_per_row[0] == pytest.approx(100.0, rel=0.2)
    assert m.cost_us_per_row[1] == pytest.approx(200.0, rel=0.2)


def test_over_the_cpus_is_refused_before_ray_runs(ray_runtime: RayRuntime) -> None:
    with RayTarget(ray_runtime, SpecPipeline(SPEC, ray_runtime.cpus)) as t:
        with pytest.raises(AllocationRefused, match="3 workers on 2 logical CPUs"):
            t.measure(Allocation(workers=(2, 1)), 1.0)
        assert t._stream is None and not t.measurements


def test_plumber_fuses_and_ray_default_is_measured(ray_runtime: RayRuntime) -> None:
    tuned = api.spec_run(SPEC, ray_runtime, "plumber", seconds=3.0, budget_s=30.0,
                         options={"window_s": 2.0})  # fmt: skip
    # measured costs solve to one fused operator of both CPUs: the bound, 6,667 rows/s
    assert tuned["allocation"]["workers"] == [2] and tuned["allocation"]["cuts"] == []
    assert tuned["fraction_of_bound"] >= 0.75
    assert tuned["lp_bound_rows_per_s"] == pytest.approx(2e6 / 300, rel=1e-6)
    default = api.spec_run(SPEC, ray_runtime, api.RAY_DEFAULT, seconds=3.0, warmup_s=2.0)
    assert default["allocation"] == api.RAY_DEFAULT
    assert [o["operator"] for o in default["operators"]] == ["a", "b"]
    assert all(o["workers"] >= 1 for o in default["operators"])
    assert default["throughput_rows_per_s"] > 0
