"""The network model in the engine: shared rack uplinks slow cross-rack jobs; machines don't."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from recperf.cluster.base import Allocation
from recperf.cluster.engine import Simulator
from recperf.cluster.jobs import JobTable
from recperf.cluster.network import allreduce_s, comm_s
from recperf.cluster.outcome import EngineConfig, SimResult
from recperf.cluster.placement import BestFit
from recperf.cluster.schedulers.fifo import Fifo
from recperf.cluster.topology import Cluster, Level

TOP = 3  # the widest level of a racks x machines cluster: across racks

GRAD = 1e9  # bytes all-reduced per iteration
COMPUTE = 0.1
ITERS = 1000.0


class AcrossRacks:
    """Forces spreading: one GPU at a time from the first free machine of each rack in turn."""

    name: ClassVar[str] = "across-racks"

    def place(
        self,
        gpus: int,
        free: np.ndarray,
        cluster: Cluster,
        max_level: Level,
        rng: np.random.Generator,
    ) -> Allocation | None:
        left = free.copy()
        taken: dict[int, int] = {}
        need = gpus
        while need:
            progress = False
            for r in range(cluster.racks):
                machines = range(r * cluster.machines_per_rack, (r + 1) * cluster.machines_per_rack)
                m = next((m for m in machines if left[m] > 0), None)
                if m is not None and need:
                    left[m] -= 1
                    taken[m] = taken.get(m, 0) + 1
                    need -= 1
                    progress = True
            if not progress:
                return None
        alloc = Allocation.of(list(taken), list(taken.values()), cluster)
        return alloc if alloc.level <= max_level else None


def _jobs(arrivals: list[float], gpus: list[int]) -> JobTable:
    n = len(arrivals)
    return JobTable.build(
        name=[f"j{i}" for i in range(n)], model=["m"] * n, arrival_s=arrivals, gpus=gpus,
        total_iters=[ITERS] * n, compute_s=[COMPUTE] * n, grad_bytes=[GRAD] * n,
    )  # fmt: skip


def _run(jobs: JobTable, cluster: Cluster, placement: object, **engine: float) -> SimResult:
    cfg = EngineConfig(record_segments=True, **engine)  # type: ignore[arg-type]
    return Simulator(jobs, cluster, Fifo(), placement, cfg).run()  # type: ignore[arg-type]


def _cross_rack_iter_s(
    cluster: Cluster, sharers: int, gpus: int = 2, congestion: float = 1.0
) -> float:
    uplink = cluster.core_gbps / (cluster.oversubscription * congestion) / sharers
    bw = min(cluster.rack_gbps, uplink)
    return COMPUTE + float(allreduce_s(gpus, GRAD, bw, cluster.core_latency_us * 1e-6))


# Two racks of one 2-GPU machine: two 2-GPU jobs spread one GPU per rack share both uplinks.
SHARED = Cluster(racks=2, machines_per_rack=1, gpus_per_machine=2, rack_gbps=100.0, core_gbps=100.0)
# Four racks of one 1-GPU machine: the same two jobs use disjoint uplinks.
DISJOINT = Cluster(
    racks=4, machines_per_rack=1, gpus_per_machine=1, rack_gbps=100.0, core_gbps=100.0
)


def test_cross_rack_jobs_sharing_an_uplink_both_slow_down() -> None:
    alone = _run(_jobs([0.0, 1e6], [2, 2]), SHARED, AcrossRacks())
    together = _run(_jobs([0.0, 0.0], [2, 2]), SHARED, AcrossRacks())
    assert alone.widest_level.tolist() == together.widest_level.tolist() == [int(TOP)] * 2
    t_alone, t_shared = _cross_rack_iter_s(SHARED, 1), _cross_rack_iter_s(SHARED, 2)
    assert t_shared > t_alone
    assert alone.progress_s.tolist() == pytest.approx([ITERS * t_alone] * 2, rel=1e-9)
    assert together.progress_s.tolist() == pytest.approx([ITERS * t_shared] * 2, rel=1e-9)
    assert together.comm_s.tolist() == pytest.approx([ITERS * (t_shared - COMPUTE)] * 2, rel=1e-9)
    assert np.all(together.progress_s > alone.progress_s)


def test_disjoint_uplinks_do_not_interfere() -> None:
    res = _run(_jobs([0.0, 0.0], [2, 2]), DISJOINT, AcrossRacks())
    racks = {s.job: s.alloc.uplinks(DISJOINT) for s in res.segments if s.alloc is not None}
    assert racks == {0: (0, 1), 1: (2, 3)}
    assert res.progress_s.tolist() == pytest.approx(
        [ITERS * _cross_rack_iter_s(DISJOINT, 1)] * 2, rel=1e-9
    )


def test_rates_are_recomputed_when_a_sharer_arrives_and_leaves() -> None:
    # A runs alone for 50 s, shares the uplinks with B until A finishes, then B runs alone.
    res = _run(_jobs([0.0, 50.0], [2, 2]), SHARED, AcrossRacks())
    ta, ts = _cross_rack_iter_s(SHARED, 1), _cross_rack_iter_s(SHARED, 2)
    finish_a = 50.0 + (ITERS - 50.0 / ta) * ts
    finish_b = finish_a + (ITERS - (finish_a - 50.0) / ts) * ta
    assert res.finish_s.tolist() == pytest.approx([finish_a, finish_b], rel=1e-12)
    assert finish_b - 50.0 == pytest.approx(finish_a, rel=1e-9)  # symmetric: equal JCTs


@pytest.mark.parametrize(("oversubscription", "congestion"), [(2.0, 1.0), (1.0, 2.0), (2.0, 2.0)])
def test_oversubscription_and_congestion_narrow_the_uplink(
    oversubscription: float, congestion: float
) -> None:
    cluster = SHARED.with_(oversubscription=oversubscription)
    res = _run(_jobs([0.0], [2]), cluster, AcrossRacks(), congestion=congestion)
    expected = _cross_rack_iter_s(cluster, 1, congestion=congestion)
    assert res.progress_s[0] == pytest.approx(ITERS * expected, rel=1e-9)
    assert expected > _cross_rack_iter_s(SHARED, 1)


def test_job_within_one_machine_has_no_rack_level_communication() -> None:
    # Two racks of one 4-GPU machine. W (2 GPUs) fits machine 0; X (6 GPUs) must cross racks.
    cluster = Cluster(
        racks=2, machines_per_rack=1, gpus_per_machine=4, rack_gbps=100.0, core_gbps=100.0
    )
    both = _run(_jobs([0.0, 0.0], [2, 6]), cluster, BestFit())
    only_x = _run(_jobs([0.0], [6]), cluster, BestFit())
    assert both.widest_level.tolist() == [int(Level.MACHINE), int(TOP)]
    machine_comm = float(comm_s(cluster, Level.MACHINE, 2, GRAD))
    rack_comm = float(comm_s(cluster, Level.RACK, 2, GRAD))
    assert machine_comm < rack_comm
    assert both.comm_s[0] == pytest.approx(ITERS * machine_comm, rel=1e-9)
    # W does not use an uplink, so X runs exactly as fast as it does alone.
    assert both.finish_s[1] == only_x.finish_s[0]
    assert both.progress_s[1] == pytest.approx(
        ITERS * _cross_rack_iter_s(cluster, 1, gpus=6), rel=1e-9
    )


def test_single_gpu_job_has_no_communication() -> None:
    res = _run(_jobs([0.0], [1]), SHARED, BestFit())
    assert res.widest_level.tolist() == [int(Level.GPU)]
    assert res.comm_s.tolist() == [0.0]
    assert res.finish_s[0] == pytest.approx(ITERS * COMPUTE, rel=1e-12)


def test_rack_level_job_uses_the_rack_link() -> None:
    cluster = Cluster(racks=1, machines_per_rack=2, gpus_per_machine=2, rack_gbps=100.0)
    res = _run(_jobs([0.0], [4]), cluster, BestFit())
    assert res.widest_level.tolist() == [int(Level.RACK)]
    assert res.comm_s[0] == pytest.approx(
        ITERS * float(comm_s(cluster, Level.RACK, 4, GRAD)), rel=1e-9
    )
