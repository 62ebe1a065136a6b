"""Clusters as trees of switch tiers: host lists (Lingjun), uneven fan-out, deeper placement
levels, uplinks shared tier by tier, and the schedulers on them."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from recperf.cluster import api
from recperf.cluster.base import PLACEMENTS, Allocation
from recperf.cluster.checks import check_result
from recperf.cluster.engine import Simulator
from recperf.cluster.jobs import JobTable
from recperf.cluster.network import JobComm, allreduce_s
from recperf.cluster.outcome import EngineConfig
from recperf.cluster.schedulers.fifo import Fifo
from recperf.cluster.schedulers.netsens import NetSens, NetSensConfig
from recperf.cluster.sensitivity import Sensitivity
from recperf.cluster.topology import Cluster, load_cluster
from recperf.cluster.tree import from_paths, uniform
from recperf.core.errors import ConfigError, TraceFormatError

# 2 pods; pod A has ToRs a1 (2 hosts) and a2 (1 host), pod B has ToR "a1" again (3 hosts): the
# name repeats under another pod, so it is another switch. Hosts are listed out of order.
HOSTS = """host,tor,pod
h0,a1,A
h1,a1,B
h2,a2,A
h3,a1,A
h4,a1,B
h5,a1,B
"""


def _cluster(tmp_path: Path, **fields: object) -> Cluster:
    path = tmp_path / "hosts.csv"
    path.write_text(HOSTS)
    base = {"topology": str(path), "tiers": ("tor", "pod"), "gpus_per_machine": 2}
    return Cluster(**{**base, **fields})  # type: ignore[arg-type]


def test_host_list_becomes_a_tree_with_consecutive_machines(tmp_path: Path) -> None:
    c = _cluster(tmp_path)
    t = c.tree
    assert (t.machines, t.tiers, c.top, c.gpus) == (6, 2, 4, 12)
    assert c.level_names == ("gpu", "machine", "tor", "pod", "cluster")
    # Pod A first (it appears first), its ToR a1 before a2; then pod B's a1.
    assert t.node[0].tolist() == [0, 0, 1, 2, 2, 2]
    assert t.node[1].tolist() == [0, 0, 0, 1, 1, 1]
    assert t.size[0].tolist() == [2, 1, 3] and t.size[1].tolist() == [3, 3]
    _, order = from_paths(("tor", "pod"), [("a1", "A"), ("a1", "B"), ("a2", "A")], 2)
    assert order == [0, 2, 1]
    assert [t.capacity(lv) for lv in c.levels] == [1, 2, 6, 6, 12]


def test_uniform_tree_matches_racks_x_machines() -> None:
    c = Cluster(racks=3, machines_per_rack=4, gpus_per_machine=2)
    free = np.arange(12, dtype=np.int64) % 3
    assert c.rack_free(free).tolist() == free.reshape(3, 4).sum(axis=1).tolist()
    assert c.level_caps(free).tolist() == [free.sum(), 2, free.reshape(3, 4).sum(1).max(), 12]
    assert uniform(3, 4, 2).node[0].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert c.top == 3 and c.level_names == ("gpu", "machine", "rack", "cluster")


def test_levels_and_uplinks_of_placements(tmp_path: Path) -> None:
    c = _cluster(tmp_path)
    assert Allocation.of([0], [1], c).level == 0
    assert Allocation.of([0], [2], c).level == 1
    one_tor = Allocation.of([0, 1], [1, 1], c)
    assert one_tor.level == 2 and one_tor.uplinks(c) == ()
    one_pod = Allocation.of([1, 2], [1, 1], c)  # ToRs 0 and 1 of pod A
    assert one_pod.level == 3 and one_pod.uplinks(c) == (0, 1)
    across = Allocation.of([0, 2, 5], [1, 1, 1], c)  # ToRs 0, 1 and 2; pods A and B
    assert across.level == 4 and across.uplinks(c) == (0, 1, 2, 3, 4)


def test_min_levels_and_caps_on_an_uneven_tree(tmp_path: Path) -> None:
    c = _cluster(tmp_path)
    gpus = np.asarray([1, 2, 3, 6, 7, 12], dtype=np.int64)
    assert c.min_levels(gpus).tolist() == [0, 1, 2, 2, 4, 4]  # the 3-host ToR takes 6 GPUs
    free = np.asarray([2, 0, 1, 1, 1, 0], dtype=np.int64)
    assert c.level_caps(free).tolist() == [5, 2, 2, 3, 5]


def _brute_fits(c: Cluster, gpus: int, free: np.ndarray, level: int) -> bool:
    if level >= c.top:
        return int(free.sum()) >= gpus
    if level <= 1:
        return bool((free >= gpus).any()) and (level == 1 or gpus == 1)
    return bool((c.group_free(free, level) >= gpus).any())


@pytest.mark.parametrize("name", ["best-fit", "first-fit", "random"])
def test_placements_respect_the_tree(tmp_path: Path, name: str) -> None:
    c = _cluster(tmp_path)
    policy = PLACEMENTS.build(name)
    rng = np.random.default_rng(5)
    for _ in range(400):
        free = rng.integers(0, 3, size=c.machines).astype(np.int64)
        gpus, level = int(rng.integers(1, 13)), int(rng.integers(0, c.top + 1))
        alloc = policy.place(gpus, free, c, level, rng)
        if alloc is None:
            assert not _brute_fits(c, gpus, free, level), (gpus, free, level)
            continue
        assert alloc.gpus == gpus and alloc.level <= level
        assert all(k <= free[m] for m, k in zip(alloc.machines, alloc.counts, strict=True))


def test_best_fit_takes_the_tightest_tier_then_the_fullest_switch(tmp_path: Path) -> None:
    c = _cluster(tmp_path)
    place = PLACEMENTS.build("best-fit").place
    rng = np.random.default_rng(0)
    free = np.asarray([1, 1, 2, 2, 2, 2], dtype=np.int64)
    # 4 GPUs: no ToR of pod A holds 4 (2 and 2), pod B's ToR has 6: one ToR wins over one pod.
    got = place(4, free, c, c.top, rng)
    assert got is not None and got.level == 2 and set(got.machines) <= {3, 4, 5}
    free = np.asarray([1, 1, 2, 1, 0, 0], dtype=np.int64)
    got = place(4, free, c, c.top, rng)  # only pod A holds 4: its ToRs (2 free each) in order
    assert got == Allocation((0, 1, 2), (1, 1, 2), 3)
    assert place(4, free, c, 2, rng) is None  # not within one ToR


GRAD, COMPUTE, ITERS = 1e9, 0.1, 1000.0


def _jobs(arrivals: list[float], gpus: list[int]) -> JobTable:
    n = len(arrivals)
    return JobTable.build(
        name=[f"j{i}" for i in range(n)], model=["m"] * n, arrival_s=arrivals, gpus=gpus,
        total_iters=[ITERS] * n, compute_s=[COMPUTE] * n, grad_bytes=[GRAD] * n,
    )  # fmt: skip


class Fixed:
    """Places job k on the machines given for it."""

    name: ClassVar[str] = "fixed"

    def __init__(self, machines: list[list[int]]) -> None:
        self.machines, self.k = machines, 0

    def place(
        self, gpus: int, free: np.ndarray, cluster: Cluster, max_level: int, rng: object
    ) -> Allocation | None:
        ms = self.machines[self.k]
        self.k += 1
        return Allocation.of(ms, [gpus // len(ms)] * len(ms), cluster)


def test_uplinks_are_shared_tier_by_tier(tmp_path: Path) -> None:
    # Host links 100, ToR uplinks 40, pod uplinks 30 Gbit/s. Job 0 spans pods A (ToR 0) and B;
    # job 1 spans ToRs 0 and 1 inside pod A: they share ToR 0's uplink (40 / 2 = 20), not the
    # pod uplinks, so job 0 runs at 20 and job 1 at 20 too; alone job 0 would get 30.
    c = _cluster(tmp_path, rack_gbps=100.0, uplink_gbps=(40.0, 30.0), latency_us=(0.0, 0.0, 0.0))
    jobs = _jobs([0.0, 0.0], [2, 2])
    res = Simulator(jobs, c, Fifo(), Fixed([[0, 3], [1, 2]]), EngineConfig()).run()  # type: ignore[arg-type]
    shared = COMPUTE + float(allreduce_s(2, GRAD, 20.0, 0.0))
    assert res.progress_s.tolist() == pytest.approx([ITERS * shared] * 2, rel=1e-9)
    assert res.widest_level.tolist() == [4, 3]
    alone = Simulator(_jobs([0.0], [2]), c, Fifo(), Fixed([[0, 3]]), EngineConfig()).run()  # type: ignore[arg-type]
    assert alone.progress_s[0] == pytest.approx(
        ITERS * (COMPUTE + float(allreduce_s(2, GRAD, 30.0, 0.0))), rel=1e-9
    )
    # Oversubscription and congestion divide every tier's uplinks.
    c2 = c.with_(uplink_oversubscription=(1.0, 3.0))
    slow = Simulator(
        _jobs([0.0], [2]),
        c2,
        Fifo(),
        Fixed([[0, 3]]),
        EngineConfig(congestion=2.0),  # type: ignore[arg-type]
    ).run()
    assert slow.progress_s[0] == pytest.approx(
        ITERS * (COMPUTE + float(allreduce_s(2, GRAD, 5.0, 0.0))), rel=1e-9
    )


def test_sensitivity_grows_level_by_level(tmp_path: Path) -> None:
    c = _cluster(tmp_path, uplink_gbps=(40.0, 30.0))
    jobs = _jobs([0.0, 0.0, 0.0], [1, 2, 4])
    sens = Sensitivity.of(jobs, c, JobComm.of(c, jobs))
    assert sens.by_level.shape == (5, 3)
    assert np.all(np.diff(sens.by_level, axis=0) >= 0)
    assert sens.by_level[:, 0].tolist() == [1.0] * 5  # one GPU: no communication
    assert sens.at(2)[1] > 1.0 and sens.at(4)[1] > sens.at(3)[1] > sens.at(2)[1]
    assert sens.at(2)[2] == 1.0  # a 4-GPU job needs a ToR at least


def test_lingjun_preset() -> None:
    c = load_cluster("lingjun")
    t = c.tree
    assert (t.machines, t.switches(1), t.switches(2), c.gpus) == (847, 119, 3, 6776)
    assert sorted(t.size[1].tolist()) == [179, 306, 362]
    assert sorted(set(t.size[0].tolist())) == [2, 3, 4, 5, 6, 7, 8]
    assert c.level_names == ("gpu", "machine", "asw", "psw", "cluster")
    assert c.shape == "847 hosts / 119 asw / 3 psw x 8 = 6,776 GPUs"


@pytest.mark.parametrize("scheduler", ["fifo", "tiresias", "consolidate", "netsens"])
def test_schedulers_run_on_a_deep_tree(tmp_path: Path, scheduler: str) -> None:
    c = _cluster(tmp_path, gpus_per_machine=4, uplink_gbps=(40.0, 30.0))
    rng = np.random.default_rng(1)
    n = 40
    jobs = JobTable.build(
        name=[f"j{i}" for i in range(n)], model=["m"] * n,
        arrival_s=np.sort(rng.uniform(0, 2000, n)), gpus=rng.choice([1, 2, 4, 8, 12], n),
        total_iters=rng.uniform(500, 5000, n), compute_s=[0.2] * n,
        grad_bytes=rng.choice([0.0, 1e8, 1e9], n),
    )  # fmt: skip
    sched = api.build_scheduler(scheduler)
    cfg = EngineConfig(record_segments=True, checkpoint_s=5.0, restore_s=5.0, round_s=60.0)
    res = Simulator(jobs, c, sched, PLACEMENTS.build("best-fit"), cfg).run()
    check_result(res)
    if scheduler == "consolidate":
        assert res.widest_level.tolist() == c.min_levels(jobs.gpus).tolist()


def test_netsens_learns_one_timer_per_level(tmp_path: Path) -> None:
    c = _cluster(tmp_path, gpus_per_machine=4)
    sched = NetSens(NetSensConfig())
    sched.reset(_jobs([0.0], [4]), c)
    assert len(sched.tuner.timers(0)) == 3
    sched.tuner.record(2, 3, 50.0)  # a wait that ended at pod level informs the 2nd timer
    assert sched.tuner.steps == 3


def test_cluster_toml_with_a_host_list_beside_it(tmp_path: Path) -> None:
    (tmp_path / "hosts.csv").write_text(HOSTS)
    toml = tmp_path / "mine.toml"
    toml.write_text(
        '[cluster]\ntopology = "hosts.csv"\ntiers = ["tor", "pod"]\ngpus_per_machine = 4\n'
        "uplink_gbps = [400, 800]\nuplink_oversubscription = [1, 2]\n"
        "latency_us = [10, 20, 40]\n"
    )
    c = load_cluster(str(toml))
    assert (c.name, c.gpus, c.uplink_share_gbps()) == ("mine", 24, (400.0, 400.0))
    assert [c.level_latency_us(lv) for lv in c.levels] == [5.0, 5.0, 10.0, 20.0, 40.0]
    toml.write_text('[cluster]\ntopology = "hosts.csv"\ntiers = ["tor", "pod"]\nlatency_us = [1]\n')
    with pytest.raises(ConfigError, match=r"latency_us has 1 values; this cluster needs 3"):
        load_cluster(str(toml))


def test_helios_clusters_sized_from_the_vc_files() -> None:
    venus = load_cluster("helios-venus")
    assert (venus.gpus, venus.machines, venus.tree.switches(1)) == (968, 121, 16)
    assert load_cluster("helios-earth").gpus == 784
    late = Cluster(topology="helios-venus@2020-09-28", machines_per_rack=8)
    assert late.gpus == 1080
    with pytest.raises(ConfigError, match=r"no day '2021-01-01'; the file covers 2020-04-01"):
        Cluster(topology="helios-venus@2021-01-01")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("host,tor,pod\nh0,a,A\nh1,b,B\nh0,c,A\n", r"hosts.csv:4: field 'host' host 'h0' is "
         r"listed again \(first on line 2\)"),
        ("host,tor\nh0,a\n", r"hosts.csv:1: field 'pod' no such column; the header has host, "
         r"tor"),
        ("host,tor,pod\nh0,,A\n", r"hosts.csv:2: field 'tor' is empty"),
        ("host,tor,pod\nh0,a\n", r"hosts.csv:2: expected 3 fields, got 2"),
        ("host,tor,pod\n", r"hosts.csv: lists no hosts"),
        ("", r"hosts.csv:1: is empty"),
    ],
)  # fmt: skip
def test_bad_host_lists_are_one_line(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "hosts.csv"
    path.write_text(text)
    with pytest.raises((TraceFormatError, ConfigError), match=match):
        Cluster(topology=str(path), tiers=("tor", "pod"))


def test_bad_cluster_fields(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"topology 'nowhere.csv' is neither a bundled"):
        Cluster(topology="nowhere.csv", tiers=("a",))
    with pytest.raises(ConfigError, match=r"tiers needs a topology"):
        Cluster(tiers=("tor",))
    with pytest.raises(ConfigError, match=r"uplink_gbps has 2 values; this cluster needs 1"):
        Cluster(uplink_gbps=(1.0, 2.0))
    with pytest.raises(ConfigError, match=r"uplink_oversubscription\[0\]"):
        Cluster(uplink_oversubscription=(0.5,))


def test_every_pair_of_hosts_gets_the_level_of_their_lowest_common_switch(
    tmp_path: Path,
) -> None:
    c = _cluster(tmp_path)
    t = c.tree
    for a, b in itertools.combinations(range(c.machines), 2):
        common = next((lv for lv in (2, 3) if t.node[lv - 2][a] == t.node[lv - 2][b]), c.top)
        assert t.level_of([a, b], 2) == common
