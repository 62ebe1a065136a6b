"""The multi-node placement bound and ``place`` (recperf.ingest.sim.placement)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, AllocationRefused
from recperf.ingest.data.limits import BUNDLED_SPECS
from recperf.ingest.sim.model import PipelineSpec, StageSpec, load_spec
from recperf.ingest.sim.placement import (
    Network,
    place,
    placement_bound,
    placement_json,
    placement_lp_bound,
    worker_slots,
)
from recperf.ingest.sim.solve import lp_bound, segments_of

FREE = Network()


def chain(*stages: tuple[str, float, float], **kw: float) -> PipelineSpec:
    """A spec of (name, µs per row, bytes per row handed on) stages, no hand-off cost."""
    return PipelineSpec(
        cores=1,
        memory_budget_gib=1.0,
        stages=tuple(
            StageSpec(name=n, cost_us_per_row=c, out_bytes_per_row=b) for n, c, b in stages
        ),
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("name", BUNDLED_SPECS)
@pytest.mark.parametrize(
    ("nodes", "network"),
    [((None,), FREE), ((None,), Network(link_bytes_per_s=1.0)), ((3, 5, 8), FREE)],
)
def test_one_node_or_free_links_is_the_single_pool_bound(
    name: str, nodes: tuple[int | None, ...], network: Network
) -> None:
    spec = load_spec(name)
    cpus = tuple(spec.cores if c is None else c for c in nodes)
    ref = lp_bound(spec.with_(cores=sum(cpus), thread_options=(1,)))
    got = placement_lp_bound(spec, cpus, network)
    assert got.throughput_rows_per_s == pytest.approx(ref.throughput_rows_per_s, rel=1e-6)
    assert got.cuts == ref.cuts
    want = ref.binding + (f" {ref.binding_stage}" if ref.binding_stage else "")
    assert got.binding == want
    if len(cpus) == 1 or not any(st.out_bytes_per_row for st in spec.stages):
        # nothing crosses a link (ray-65540's rows made on other nodes cross into the
        # consumer's: free links carry them)
        assert sum(got.link_out_bytes_per_s) == pytest.approx(0.0, abs=1e-6)
    for m, c in enumerate(cpus):
        assert sum(row[m] for row in got.workers) <= c * (1 + 1e-9)
    # the busy cores are what the rows cost, segment by segment
    cost = spec.segment_costs_us(segments_of(spec.n_stages, got.cuts))
    for row, c in zip(got.workers, cost, strict=True):
        assert sum(row) == pytest.approx(got.throughput_rows_per_s * c / 1e6, rel=1e-6)


def test_a_small_link_into_the_consumer_binds() -> None:
    # one fused stage, 1 µs and 100 bytes per row, consumer on node 0. Node 0 (1 CPU) serves
    # 1e6 rows/s; nodes 1 and 2 (3 CPUs each) could add 6e6, but every row they make crosses
    # into node 0: its NIC takes 4e8 B/s / 100 B = 4e6 rows/s. T = 1e6 + 4e6 = 5e6 rows/s, and
    # neither sender's own NIC (at most 3e6 rows/s = 3e8 B/s each) is full.
    spec = chain(("a", 1.0, 100.0))
    got = placement_bound(spec, (1, 3, 3), Network(link_bytes_per_s=4e8))
    assert got.throughput_rows_per_s == pytest.approx(5e6, rel=1e-9)
    assert got.binding == "link n0 in"
    assert got.link_in_bytes_per_s[0] == pytest.approx(4e8, rel=1e-9)
    assert got.link_in_bytes_per_s[1:] == pytest.approx((0.0, 0.0), abs=1e-3)
    assert got.workers[0][0] == pytest.approx(1.0, rel=1e-9)
    assert sum(got.workers[0][1:]) == pytest.approx(4.0, rel=1e-9)
    # without the link limit every CPU works: 7 cores / 1 µs
    assert placement_bound(spec, (1, 3, 3), FREE).throughput_rows_per_s == pytest.approx(7e6)
    assert placement_bound(spec, (1, 3, 3), FREE).binding == "cores"


def test_a_sending_link_binds_and_the_bound_keeps_the_chain_local() -> None:
    # a (1 µs, 0 B) | b (1 µs, 100 B) on two nodes of 2 CPUs, consumer on node 0: 4 cores /
    # 2 µs = 2e6 rows/s. At that rate the fewest bytes cross with all of b on node 0 and all
    # of a on node 1: only a's output crosses, and it is 0 bytes.
    spec = chain(("a", 1.0, 0.0), ("b", 1.0, 100.0))
    got = placement_bound(spec, (2, 2), Network(link_bytes_per_s=5e7), cuts=(1,))
    assert got.throughput_rows_per_s == pytest.approx(2e6, rel=1e-9)
    assert got.binding == "cores"
    assert [*got.workers[0], *got.workers[1]] == pytest.approx([0.0, 2.0, 2.0, 0.0], abs=1e-6)
    assert sum(got.link_out_bytes_per_s) == pytest.approx(0.0, abs=1e-3)
    # nodes of 1 and 8 CPUs, NICs of 1e8 B/s: b-rows made on node 1 cross to the consumer at
    # 100 B, at most 1e8 / 100 = 1e6 rows/s; node 0's 1 CPU makes the other b-rows, at most
    # 1e6 rows/s at 1 µs, and leaves no room for a, which runs on node 1 (its output is 0 B).
    # T = 2e6 (with 9 cores and 2 µs per row it would be 4.5e6); node 0's CPUs and the link
    # (node 1 out, the same row as node 0 in) hold half of it each.
    tight = placement_bound(spec, (1, 8), Network(link_bytes_per_s=1e8), cuts=(1,))
    assert tight.throughput_rows_per_s == pytest.approx(2e6, rel=1e-9)
    assert tight.link_out_bytes_per_s[1] == pytest.approx(1e8, rel=1e-9)
    assert tight.binding in ("node n0 cpus", "link n1 out", "link n0 in")


def test_binding_names_the_cap_and_memory() -> None:
    capped = PipelineSpec(
        cores=1,
        memory_budget_gib=1.0,
        stages=(StageSpec(name="udf", cost_us_per_row=10.0, max_workers=2),),
    )
    got = placement_bound(capped, (4, 4), FREE)
    assert got.binding == "max_workers udf"
    assert got.throughput_rows_per_s == pytest.approx(2e5)
    # 1 GiB for workers of 512 MiB at 1 µs per row: 2 workers, 2e6 rows/s, on 8 CPUs
    heavy = PipelineSpec(
        cores=1,
        memory_budget_gib=1.0,
        stages=(StageSpec(name="a", cost_us_per_row=1.0, memory_mib_per_worker=512.0),),
    )
    got = placement_bound(heavy, (4, 4), FREE)
    assert (got.binding, got.throughput_rows_per_s) == ("memory", pytest.approx(2e6))
    # the consumer's own thread at 0.25 µs per row: 4e6 rows/s, under the 8e6 of the CPUs
    fast = chain(("a", 1.0, 0.0), consumer_us_per_row=0.25)
    got = placement_bound(fast, (4, 4), FREE)
    assert (got.binding, got.throughput_rows_per_s) == ("consumer", pytest.approx(4e6))


@pytest.mark.parametrize(
    ("workers", "nodes"),
    [
        ((3, 2, 5, 1, 2, 3), (4, 4, 4, 4)),
        ((1, 1, 1, 1, 1, 1), (2, 5)),
        ((5, 1, 7, 1, 1, 1), (9, 9)),
    ],
)
@pytest.mark.parametrize("link", [math.inf, 1e9])
def test_place_keeps_totals_and_node_capacity(
    workers: tuple[int, ...], nodes: tuple[int, ...], link: float
) -> None:
    spec = load_spec("criteo-16")
    stages = tuple(dataclasses.replace(s, out_bytes_per_row=500.0) for s in spec.stages)
    spec = spec.with_(stages=stages)
    alloc = Allocation(workers=workers)
    got = place(spec, alloc, nodes, Network(link_bytes_per_s=link))
    assert tuple(sum(row) for row in got) == workers
    assert all(v >= 0 for row in got for v in row)
    for m, cpus in enumerate(nodes):
        assert sum(row[m] for row in got) <= cpus
    assert place(spec, alloc, nodes, Network(link_bytes_per_s=link)) == got  # deterministic


def test_place_refuses_more_workers_than_cpus() -> None:
    spec = load_spec("criteo-16")
    with pytest.raises(AllocationRefused, match=r"17 workers .* 16 CPUs") as info:
        place(spec, Allocation(workers=(3, 3, 3, 3, 3, 2)), (8, 8), FREE)
    assert "\n" not in str(info.value)
    with pytest.raises(AllocationRefused, match="single-threaded"):
        place(spec, Allocation(workers=(1, 1, 1, 1, 1, 1), threads=(1, 2, 1, 1, 1, 1)), (8,), FREE)


def test_workers_past_the_cpus_have_slots_on_every_node() -> None:
    """The Ray engine's oversubscribed allocations (workers sharing the CPUs) are placed on
    slots in proportion to each node's CPUs, rounded up: 17 workers on 2 x 8 CPUs fit."""
    assert worker_slots((8, 8), 16) == (8, 8)
    assert worker_slots((8, 8), 17) == (9, 9)
    assert worker_slots((8, 4), 24) == (16, 8)
    spec = load_spec("criteo-16")
    alloc = Allocation(workers=(3, 3, 3, 3, 3, 2))
    got = place(spec, alloc, worker_slots((8, 8), alloc.total), FREE)
    assert tuple(sum(row) for row in got) == alloc.workers
    assert sorted(sum(row[m] for row in got) for m in range(2)) == [8, 9]


def test_place_keeps_the_heavy_boundary_on_one_node() -> None:
    # a hands on 1 MB per row, b 10 B: each node runs one a and one b, so a's output never
    # crosses (2e6 rows/s); a on one node and b on the other would send 1e12 B/s across
    spec = chain(("a", 1.0, 1e6), ("b", 1.0, 10.0))
    alloc = Allocation(workers=(2, 2))
    for link in (1e8, math.inf):
        assert place(spec, alloc, (2, 2), Network(link_bytes_per_s=link)) == ((1, 1), (1, 1))
    # the bound agrees: every node's a-rows are its b-rows
    got = placement_bound(spec, (2, 2), Network(link_bytes_per_s=1e8), cuts=(1,))
    assert got.throughput_rows_per_s == pytest.approx(2e6, rel=1e-9)
    assert got.workers[0] == pytest.approx(got.workers[1], abs=1e-6)
    # only b's 10 B per row from node 1 reach the consumer across the link
    assert got.link_out_bytes_per_s == pytest.approx((0.0, 1e7), abs=1e-3)


def test_place_follows_the_heavy_boundary_when_it_must_split() -> None:
    # 3 a-workers and 1 b-worker on nodes of 3 and 1 CPUs; each worker takes an equal share of
    # its segment's rows. b on node 0 (beside two a's): the a on node 1 sends its third of the
    # rows across, 1e6 / 3 B per row. b on node 1: every a-row crosses (1e6 B) and b's 10 B
    # come back to the consumer. The first wins.
    spec = chain(("a", 1.0, 1e6), ("b", 1.0, 10.0))
    for link in (1e9, math.inf):
        got = place(spec, Allocation(workers=(3, 1)), (3, 1), Network(link_bytes_per_s=link))
        assert got == ((2, 1), (1, 0))


def test_buffers_over_the_budget_leave_nothing() -> None:
    # a cut queues 2 batches of 600 MiB: 1200 MiB > 1 GiB before any worker; fused, no queue
    spec = chain(("a", 1.0, 0.0), ("b", 1.0, 0.0), memory_mib_per_batch=600.0, queue_batches=2)
    cut = placement_bound(spec, (2, 2), FREE, cuts=(1,))
    assert (cut.throughput_rows_per_s, cut.binding) == (pytest.approx(0.0, abs=1e-6), "memory")
    best = placement_lp_bound(spec, (2, 2), FREE)
    assert (best.cuts, best.throughput_rows_per_s) == ((), pytest.approx(2e6))


def test_network_and_nodes_are_checked() -> None:
    spec = chain(("a", 1.0, 0.0))
    for bad in (0.0, -1.0, math.nan, -math.inf):
        with pytest.raises(ConfigError, match="link_bytes_per_s"):
            Network(link_bytes_per_s=bad)
    with pytest.raises(ConfigError, match="node_cpus"):
        placement_bound(spec, (), FREE)
    with pytest.raises(ConfigError, match=r"node_cpus\[1\]"):
        placement_bound(spec, (2, 0), FREE)


def test_placement_json() -> None:
    spec = chain(("a", 1.0, 0.0), ("b", 1.0, 0.0), ("c", 1.0, 0.0))
    rows = placement_json(spec, (2,), ((3, 2), (0, 1)))
    assert rows == [
        {"segment": "a+b", "nodes": {"n0": 3, "n1": 2}},
        {"segment": "c", "nodes": {"n0": 0, "n1": 1}},
    ]
    with pytest.raises(ConfigError, match="2 segments"):
        placement_json(spec, (2,), ((3, 2),))
