"""netsens: timers and config, sensitivity, delay scheduling, the timer tuner, reclaim,
migration, no starvation, and its placements under congestion."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recperf.cluster import api
from recperf.cluster.base import Decision, SchedulerView
from recperf.cluster.checks import check_result
from recperf.cluster.engine import Simulator
from recperf.cluster.jobs import JobTable
from recperf.cluster.metrics import job_columns, summarize
from recperf.cluster.network import JobComm
from recperf.cluster.outcome import EngineConfig, SimResult
from recperf.cluster.placement import BestFit
from recperf.cluster.schedulers.netsens import (
    NetSens,
    NetSensConfig,
    TimerTuner,
    demand_class,
    parse_timers,
)
from recperf.cluster.sensitivity import Sensitivity
from recperf.cluster.topology import Cluster, Level, load_cluster
from recperf.core.errors import ConfigError

GPU, MACHINE, RACK, CLUSTER = 0, 1, 2, 3  # the levels of a racks x machines cluster
NO_LATENCY = {"machine_latency_us": 0.0, "rack_latency_us": 0.0, "core_latency_us": 0.0}
# One iteration: 0.01 s of compute and a 1 GB all-reduce: about 5x slower spread than on one
# machine. Insensitive jobs all-reduce nothing.
SENSITIVE = {"compute_s": 0.01, "grad_bytes": 1e9}
INSENSITIVE = {"compute_s": 1.0, "grad_bytes": 0.0}


def _jobs(*rows: tuple[str, float, int, float, dict[str, float]]) -> JobTable:
    """Rows of (name, arrival_s, gpus, iterations, SENSITIVE or INSENSITIVE)."""
    return JobTable.build(
        name=[r[0] for r in rows],
        model=["m"] * len(rows),
        arrival_s=[r[1] for r in rows],
        gpus=[r[2] for r in rows],
        total_iters=[r[3] for r in rows],
        compute_s=[r[4]["compute_s"] for r in rows],
        grad_bytes=[r[4]["grad_bytes"] for r in rows],
    )


class _Guarded(NetSens):
    """NetSens that fails, rather than hangs, if the engine keeps deciding at one instant."""

    def schedule(self, view: SchedulerView) -> Decision:
        same = getattr(self, "_same", (None, 0))
        self._same = (view.now, same[1] + 1 if same[0] == view.now else 1)
        assert self._same[1] <= 1000, f"1000 decisions at t = {view.now}"
        return super().schedule(view)


def _run(
    jobs: JobTable, cluster: Cluster, engine: EngineConfig | None = None, /, **options: object
) -> tuple[SimResult, NetSens]:
    built = api.build_scheduler("netsens", options)
    assert isinstance(built, NetSens)
    sched = _Guarded(built.config)
    engine = engine or EngineConfig(record_segments=True)
    res = Simulator(jobs, cluster, sched, BestFit(), engine).run()
    check_result(res)
    return res, sched


def _holds(res: SimResult, job: int) -> list[tuple[float, tuple[int, ...], Level]]:
    """(start, machines, level) of each GPU-holding interval of ``job``, in time order."""
    return [
        (s.start_s, s.alloc.machines, s.alloc.level)
        for s in res.segments
        if s.job == job and s.alloc is not None
    ]


# ---------------------------------------------------------------- timers and config


def test_parse_timers() -> None:
    assert parse_timers("auto") is None
    assert parse_timers(" AUTO ") is None
    assert parse_timers("600,3600") == (600.0, 3600.0)
    assert parse_timers("0, 0") == (0.0, 0.0)
    assert parse_timers("60,600,3600") == (60.0, 600.0, 3600.0)  # a deeper tree: one per level


def test_fixed_timers_must_match_the_tree() -> None:
    jobs = _jobs(("a", 0, 4, 10, SENSITIVE))
    with pytest.raises(ConfigError, match=r"netsens.timers has 3 values; this cluster needs 2"):
        NetSens(NetSensConfig(timers="1,2,3")).reset(jobs, SMALL)
    lingjun = load_cluster("lingjun")
    with pytest.raises(ConfigError, match=r"needs 3, one per level .*\(asw, psw, cluster\)"):
        NetSens(NetSensConfig(timers="1,2")).reset(jobs, lingjun)
    NetSens(NetSensConfig(timers="1,2,3")).reset(jobs, lingjun)


@pytest.mark.parametrize(
    "text", ["soon", "600", "1,3,2", "600,abc", "", "3600,600", "-1,5", "0,inf", "nan,5"]
)
def test_parse_timers_rejects_bad_text(text: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"timers = {text!r}")):
        parse_timers(text)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"timers": "5,1"}, "timers"),
        ({"order": "lifo"}, "order"),
        ({"auto_stat": "median"}, "auto_stat"),
        ({"thresholds_gpu_s": (100.0, 50.0)}, "thresholds_gpu_s"),
        ({"thresholds_gpu_s": ()}, "thresholds_gpu_s"),
        ({"auto_initial_s": (600.0, 60.0)}, "auto_initial_s"),
        ({"auto_initial_s": (-1.0, 60.0)}, "auto_initial_s"),
        ({"sensitivity_ref": 0.0}, "sensitivity_ref"),
        ({"lease_s": -1.0}, "lease_s"),
        ({"auto_window": 0}, "auto_window"),
        ({"auto_min_samples": 0}, "auto_min_samples"),
    ],
)
def test_config_rejects_bad_values(options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(field)):
        NetSensConfig(**options)  # type: ignore[arg-type]


def test_options_from_strings_build_the_config() -> None:
    sched = api.build_scheduler(
        "netsens",
        {
            "timers": "0,0",
            "order": "las",
            "reclaim": "false",
            "lease_s": "60",
            "thresholds_gpu_s": "100,200",
            "auto_initial_s": "10,20",
            "auto_window": "3",
        },
    )
    assert isinstance(sched, NetSens)
    cfg = sched.config
    assert (cfg.timers, cfg.order, cfg.reclaim, cfg.migrate) == ("0,0", "las", False, True)
    assert (cfg.lease_s, cfg.thresholds_gpu_s) == (60.0, (100.0, 200.0))
    assert (cfg.auto_initial_s, cfg.auto_window) == ((10.0, 20.0), 3)
    with pytest.raises(ConfigError, match="'lifo' is not one of"):
        api.build_scheduler("netsens", {"order": "lifo"})
    with pytest.raises(ConfigError, match=re.escape("timers = '9,1'")):
        api.build_scheduler("netsens", {"timers": "9,1"})
    with pytest.raises(ConfigError, match="unknown key 'timer'"):
        api.build_scheduler("netsens", {"timer": "auto"})


# ---------------------------------------------------------------- sensitivity

# 2 racks x 2 machines x 4 GPUs. Uplinks: 200 / 2 = 100 Gbit/s alone, the rack links' speed,
# so crossing racks costs only latency at congestion 1 and halves the bandwidth at 2.
SMALL = Cluster(
    racks=2, machines_per_rack=2, gpus_per_machine=4, core_gbps=200.0, oversubscription=2.0
)


def test_a_job_that_all_reduces_nothing_is_insensitive() -> None:
    jobs = _jobs(("a", 0, 4, 10, INSENSITIVE), ("b", 0, 2, 10, INSENSITIVE))
    flat = SMALL.with_(**NO_LATENCY)
    for congestion in (1.0, 4.0):
        sens = Sensitivity.of(jobs, flat, JobComm.of(flat, jobs, congestion))
        for lv in flat.levels:
            assert sens.at(lv).tolist() == [1.0, 1.0]
    # With latency, spreading costs the latency terms only: 2(n-1) messages per iteration.
    sens = Sensitivity.of(jobs, SMALL, JobComm.of(SMALL, jobs, 4.0))
    steps = np.array([6.0, 2.0])
    machine = 1.0 + steps * 5e-6
    assert sens.rack == pytest.approx((1.0 + steps * 10e-6) / machine, rel=1e-12)
    assert sens.cluster == pytest.approx((1.0 + steps * 30e-6) / machine, rel=1e-12)


def test_cross_rack_slowdown_grows_with_congestion() -> None:
    jobs = _jobs(("heavy", 0, 4, 10, SENSITIVE))
    bits = 2 * 3 / 4 * 1e9 * 8
    ref = 0.01 + 6 * 5e-6 + bits / 1200e9
    rack = (0.01 + 6 * 10e-6 + bits / 100e9) / ref
    cross = []
    for congestion in (1.0, 2.0, 4.0):
        sens = Sensitivity.of(jobs, SMALL, JobComm.of(SMALL, jobs, congestion))
        uplink = 100e9 / congestion
        expected = (0.01 + 6 * 30e-6 + bits / uplink) / ref
        assert sens.rack[0] == pytest.approx(rack, rel=1e-12)  # one rack: no uplink
        assert sens.cluster[0] == pytest.approx(expected, rel=1e-12)
        assert not sens.measured[0]
        cross.append(float(sens.cluster[0]))
    assert rack > 5.0
    assert rack < cross[0] < cross[1] < cross[2]


def test_a_measured_slowdown_is_used_at_rack_level() -> None:
    jobs = JobTable.build(
        name=["measured", "modelled", "too-big"], model=["m"] * 3, arrival_s=[0, 0, 0],
        gpus=[4, 4, 6], total_iters=[10] * 3, compute_s=[0.01] * 3, grad_bytes=[1e9] * 3,
        measured_slowdown=[1.3, np.nan, 2.0],
    )  # fmt: skip
    sens = Sensitivity.of(jobs, SMALL, JobComm.of(SMALL, jobs, 1.0))
    assert sens.measured.tolist() == [True, False, False]
    assert sens.rack[0] == 1.3
    bits = 2 * 3 / 4 * 1e9 * 8
    model = (0.01 + 6 * 10e-6 + bits / 100e9) / (0.01 + 6 * 5e-6 + bits / 1200e9)
    assert sens.rack[1] == pytest.approx(model, rel=1e-12)
    # The cross-rack figure stays the model's (at least the measured one).
    assert sens.cluster[0] == sens.cluster[1] > 5.0
    # A job larger than a machine runs at rack level at best: nothing to lose there.
    assert sens.rack[2] == 1.0
    assert sens.cluster[2] > 1.0


def test_a_job_that_cannot_fit_a_machine_loses_nothing_at_rack_level() -> None:
    jobs = _jobs(("six", 0, 6, 10, SENSITIVE), ("whole", 0, 16, 10, SENSITIVE))
    sens = Sensitivity.of(jobs, SMALL, JobComm.of(SMALL, jobs, 4.0))
    assert sens.rack.tolist() == [1.0, 1.0]
    assert sens.rack_loss.tolist() == [0.0, 0.0]
    assert sens.cluster[0] > 2.0  # across racks: the congested uplink
    assert sens.cluster[1] == 1.0  # the whole cluster is its tightest placement


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    congestion=st.sampled_from([1.0, 2.0, 8.0]),
    oversubscription=st.sampled_from([1.0, 4.0]),
)
def test_crossing_racks_is_never_faster_than_one_rack(
    seed: int, congestion: float, oversubscription: float
) -> None:
    rng = np.random.default_rng(seed)
    n = 20
    cluster = SMALL.with_(oversubscription=oversubscription, rack_gbps=float(rng.choice([50, 400])))
    measured = np.where(rng.random(n) < 0.3, rng.uniform(1.0, 3.0, n), np.nan)
    jobs = JobTable.build(
        name=[f"j{i}" for i in range(n)], model=["m"] * n, arrival_s=np.zeros(n),
        gpus=rng.integers(1, cluster.gpus + 1, n), total_iters=np.ones(n),
        compute_s=rng.uniform(0.001, 1.0, n), grad_bytes=rng.choice([0.0, 1e6, 1e9], n),
        measured_slowdown=measured,
    )  # fmt: skip
    sens = Sensitivity.of(jobs, cluster, JobComm.of(cluster, jobs, congestion))
    assert np.all(sens.rack >= 1.0)
    assert np.all(sens.cluster >= sens.rack)
    single = jobs.gpus == 1
    assert np.all(sens.rack[single] == 1.0) and np.all(sens.cluster[single] == 1.0)


# ---------------------------------------------------------------- delay scheduling

# One rack of two 4-GPU machines; two 3-GPU jobs leave one GPU free on each machine, so a
# 2-GPU job fits only spread over the rack.
PAIR = Cluster(racks=1, machines_per_rack=2, gpus_per_machine=4).with_(**NO_LATENCY)
FIXED = {"timers": "1000,5000", "sensitivity_ref": 0.5, "reclaim": False, "migrate": False}


def _blockers(short_s: float = 10_000.0) -> list[tuple[str, float, int, float, dict[str, float]]]:
    return [("b0", 0, 3, 10_000, INSENSITIVE), ("b1", 0, 3, short_s, INSENSITIVE)]


def test_an_insensitive_job_spreads_at_once() -> None:
    res, _ = _run(_jobs(*_blockers(), ("job", 10, 2, 100, INSENSITIVE)), PAIR, **FIXED)
    assert res.first_start_s[2] == 10.0
    assert res.widest_level[2] == RACK
    assert res.locality_wait_s[2] == 0.0


def test_a_sensitive_job_waits_for_its_rack_timer() -> None:
    res, sched = _run(_jobs(*_blockers(), ("job", 10, 2, 1000, SENSITIVE)), PAIR, **FIXED)
    assert res.first_start_s[2] == pytest.approx(1010.0)
    assert res.widest_level[2] == RACK
    assert res.locality_wait_s[2] == pytest.approx(1000.0)
    assert res.locality_wait_s[:2].tolist() == [0.0, 0.0]
    t_rack, t_net = sched.job_timers(np.arange(3))
    assert t_rack.tolist() == [0.0, 0.0, 1000.0]
    assert t_net.tolist() == [0.0, 0.0, 5000.0]
    summary = summarize(res)
    assert summary["locality_wait_share"] == pytest.approx(1 / 3)
    assert summary["locality_wait_mean_s"] == pytest.approx(1000.0)
    assert job_columns(res)["locality_wait_s"][2] == pytest.approx(1000.0)


def test_a_sensitive_job_takes_a_machine_that_frees_before_its_timer() -> None:
    res, _ = _run(_jobs(*_blockers(short_s=500), ("job", 10, 2, 1000, SENSITIVE)), PAIR, **FIXED)
    assert res.finish_s[1] == 500.0
    assert res.first_start_s[2] == 500.0
    assert res.widest_level[2] == MACHINE
    assert res.locality_wait_s[2] == pytest.approx(490.0)


def test_a_mildly_sensitive_job_waits_in_proportion() -> None:
    # Measured 1.25x slower spread, against sensitivity_ref 0.5: half the timer.
    jobs = JobTable.build(
        name=["b0", "b1", "job"], model=["m"] * 3, arrival_s=[0, 0, 10], gpus=[3, 3, 2],
        total_iters=[10_000, 10_000, 100], compute_s=[1.0] * 3, grad_bytes=[0.0] * 3,
        measured_slowdown=[np.nan, np.nan, 1.25],
    )  # fmt: skip
    res, sched = _run(jobs, PAIR, **FIXED)
    assert res.first_start_s[2] == pytest.approx(510.0)
    t_rack, t_net = sched.job_timers(np.array([2]))
    assert (float(t_rack[0]), float(t_net[0])) == pytest.approx((500.0, 2500.0))


# 2 racks x 2 machines x 4 GPUs with uplinks 8x oversubscribed: crossing racks is slow.
RACKS = Cluster(racks=2, machines_per_rack=2, gpus_per_machine=4, oversubscription=8.0).with_(
    **NO_LATENCY
)


def test_a_job_larger_than_a_machine_starts_at_rack_level_at_once() -> None:
    res, _ = _run(
        _jobs(("b0", 0, 3, 10_000, INSENSITIVE), ("big", 10, 6, 1000, SENSITIVE)), RACKS, **FIXED
    )
    assert res.first_start_s[1] == 10.0
    assert res.widest_level[1] == RACK
    assert _holds(res, 1)[0][1] == (2, 3)  # the empty rack
    assert res.locality_wait_s[1] == 0.0


@pytest.mark.parametrize(("kind", "start"), [(SENSITIVE, 5010.0), (INSENSITIVE, 10.0)])
def test_crossing_racks_waits_for_the_network_timer(kind: dict[str, float], start: float) -> None:
    # Free after the blockers: [1, 1 | 0, 4]: six GPUs, but no rack holds six.
    blockers = [("b0", 0, 3, 10_000, INSENSITIVE), ("b1", 0, 3, 10_000, INSENSITIVE)]
    jobs = _jobs(*blockers, ("b2", 0, 4, 10_000, INSENSITIVE), ("big", 10, 6, 1000, kind))
    res, _ = _run(jobs, RACKS, **FIXED)
    assert res.first_start_s[3] == pytest.approx(start)
    assert res.widest_level[3] == CLUSTER
    assert res.locality_wait_s[3] == pytest.approx(start - 10.0)


@pytest.mark.parametrize("timers", ["auto", "0,0", "100,100", "1000,5000"])
def test_the_network_timer_is_never_shorter_than_the_rack_timer(timers: str) -> None:
    rng = np.random.default_rng(4)
    n = 40
    jobs = JobTable.build(
        name=[f"j{i}" for i in range(n)], model=["m"] * n,
        arrival_s=np.sort(rng.uniform(0, 3000, n)), gpus=rng.choice([1, 2, 3, 4, 6, 8], n),
        total_iters=rng.uniform(100, 2000, n), compute_s=rng.choice([0.01, 0.1, 1.0], n),
        grad_bytes=rng.choice([0.0, 1e7, 1e8, 1e9], n),
        measured_slowdown=np.where(rng.random(n) < 0.3, rng.uniform(1.0, 1.5, n), np.nan),
    )  # fmt: skip
    res, sched = _run(jobs, RACKS, timers=timers, auto_min_samples=2, auto_initial_s=(60, 60))
    t_rack, t_net = sched.job_timers(np.arange(n))
    assert np.all(t_rack >= 0) and np.all(t_net >= t_rack)
    if timers != "0,0":
        assert (t_net > t_rack).any()
    assert not np.isnan(res.finish_s).any()


# ---------------------------------------------------------------- the timer tuner


def test_demand_classes() -> None:
    got = {g: demand_class(g) for g in (1, 2, 3, 4, 5, 8, 9, 16, 17, 64)}
    assert got == {1: 0, 2: 1, 3: 2, 4: 2, 5: 3, 8: 3, 9: 4, 16: 4, 17: 5, 64: 6}


def _tuner(**changes: object) -> TimerTuner:
    options: dict[str, object] = {
        "auto_initial_s": (100.0, 400.0),
        "auto_min_samples": 3,
        "auto_window": 4,
        "auto_max_s": 1000.0,
    }
    options.update(changes)
    return TimerTuner(NetSensConfig(**options))  # type: ignore[arg-type]


def _mean_2std(xs: list[float]) -> float:
    return float(np.mean(xs) + 2 * np.std(xs))


def test_tuner_uses_initial_timers_until_enough_waits() -> None:
    tuner = _tuner()
    assert tuner.timers(1) == (100.0, 400.0)
    tuner.record(1, MACHINE, 0.0)  # placed at once: not a wait
    tuner.record(1, CLUSTER, 50.0)  # only machine and rack placements end a locality wait
    tuner.record(1, GPU, 50.0)
    tuner.record(1, MACHINE, 10.0)
    tuner.record(1, MACHINE, 20.0)
    assert tuner.timers(1) == (100.0, 400.0)
    tuner.record(1, MACHINE, 30.0)
    assert tuner.timers(1) == pytest.approx((_mean_2std([10, 20, 30]), 400.0))
    assert tuner.snapshot() == {1: tuner.timers(1)}


def test_tuner_keeps_only_the_last_window_and_caps() -> None:
    tuner = _tuner(auto_initial_s=(0.0, 400.0))  # rack timer 0: the network one is its own
    for w in (900.0, 10.0, 20.0, 30.0, 40.0):
        tuner.record(2, RACK, w)
    assert tuner.timers(2)[1] == pytest.approx(_mean_2std([10, 20, 30, 40]))
    for w in (900.0, 950.0, 990.0):
        tuner.record(2, RACK, w)
    assert tuner.timers(2)[1] == 1000.0  # mean + 2 std of [40, 900, 950, 990] > auto_max_s


def test_tuner_pools_classes_until_a_class_has_its_own_waits() -> None:
    tuner = _tuner()
    for w in (10.0, 20.0, 30.0):
        tuner.record(1, MACHINE, w)
    pooled = _mean_2std([10, 20, 30])
    assert tuner.timers(3)[0] == pytest.approx(pooled)  # class 3 has none: all classes'
    for w in (200.0, 200.0):
        tuner.record(3, MACHINE, w)
    assert tuner.timers(3)[0] == pytest.approx(_mean_2std([10, 20, 30, 200, 200]))
    tuner.record(3, MACHINE, 200.0)
    assert tuner.timers(3)[0] == pytest.approx(200.0)  # its own three
    assert tuner.timers(1)[0] == pytest.approx(pooled)


def test_tuner_network_timer_is_at_least_the_rack_timer() -> None:
    tuner = _tuner()
    for w in (500.0, 600.0, 700.0):
        tuner.record(0, MACHINE, w)
        tuner.record(0, RACK, 5.0)
    rack, net = tuner.timers(0)
    assert rack == pytest.approx(_mean_2std([500, 600, 700]))
    assert net == rack


@pytest.mark.parametrize(("stat", "expected"), [("max", 40.0), ("p90", 37.0)])
def test_tuner_statistics(stat: str, expected: float) -> None:
    tuner = _tuner(auto_stat=stat)
    for w in (10.0, 20.0, 30.0, 40.0):
        tuner.record(1, MACHINE, w)
    assert tuner.timers(1)[0] == pytest.approx(expected)


# ---------------------------------------------------------------- reclaim

# One rack of two 8-GPU machines. At t = 0, A and B (4 GPUs, 100 s) and eight 1-GPU jobs
# fill both machines, four small jobs on each; A and B finish at t = 100, leaving 4 + 4 free.
# S (8 GPUs, sensitive) arrives at t = 200: it fits only spread.
DUO = Cluster(racks=1, machines_per_rack=2, gpus_per_machine=8)
SMALLS_A = [(f"a{i}", 0.0, 1, 3000.0, INSENSITIVE) for i in range(4)]
SMALLS_B = [(f"b{i}", 0.0, 1, 3000.0, INSENSITIVE) for i in range(4)]
RECLAIM_JOBS = _jobs(
    ("A", 0, 4, 100, INSENSITIVE), *SMALLS_A, ("B", 0, 4, 100, INSENSITIVE), *SMALLS_B,
    ("S", 200, 8, 20_000, SENSITIVE),
)  # fmt: skip
S = 10
CKPT = EngineConfig(record_segments=True, round_s=50.0, checkpoint_s=5.0, restore_s=5.0)
RECLAIM = {
    "timers": "1000,5000",
    "sensitivity_ref": 0.5,
    "lease_s": 60.0,
    "reclaim_after_s": 100.0,
    "migrate": False,
}


def test_a_held_job_reclaims_a_machine_from_less_sensitive_jobs() -> None:
    on, sched = _run(RECLAIM_JOBS, DUO, CKPT, reclaim=True, **RECLAIM)
    off, _ = _run(RECLAIM_JOBS, DUO, CKPT, reclaim=False, **RECLAIM)
    assert sched.moves == {"migrate": 0, "reclaim": 1, "las": 0}
    # Held from 200; after reclaim_after_s the small jobs on machine 0 checkpoint (5 s) and S
    # takes the machine alone; the small jobs restart at once on machine 1's free GPUs.
    assert on.first_start_s[S] == pytest.approx(305.0)
    assert _holds(on, S) == [(305.0, (0,), Level.MACHINE)]
    assert on.widest_level[S] == MACHINE
    assert on.preemptions.tolist() == [0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    for j in range(1, 5):
        assert [h[:2] for h in _holds(on, j)] == [(0.0, (0,)), (305.0, (1,))]
    assert on.finish_s[1:5] == pytest.approx([3010.0] * 4)  # + checkpoint + restore
    assert on.locality_wait_s[S] == pytest.approx(105.0)
    # Without reclaim S waits out its rack timer and runs spread, about 5x slower.
    assert off.first_start_s[S] == pytest.approx(1200.0)
    assert off.widest_level[S] == RACK
    assert off.preemptions.sum() == 0
    assert off.locality_wait_s[S] == pytest.approx(1000.0)
    assert on.finish_s[S] * 3 < off.finish_s[S]


def test_a_reclaim_due_with_the_rack_timer_still_consolidates() -> None:
    # Held for reclaim_after_s exactly when the rack timer lets S spread: it must wait for
    # the machine it reclaims, not start spread and leave the small jobs preempted for nothing.
    res, sched = _run(RECLAIM_JOBS, DUO, CKPT, **{**RECLAIM, "reclaim_after_s": 1000.0})
    assert sched.moves["reclaim"] == 1
    assert _holds(res, S) == [(1205.0, (0,), Level.MACHINE)]
    assert res.preemptions[1:5].tolist() == [1, 1, 1, 1]


def test_no_reclaim_when_the_move_costs_more_than_it_saves() -> None:
    res, sched = _run(RECLAIM_JOBS, DUO, CKPT, **{**RECLAIM, "migrate_cost_s": 1e6})
    assert sched.moves["reclaim"] == 0
    assert res.preemptions.sum() == 0
    assert _holds(res, S) == [(1200.0, (0, 1), Level.RACK)]


def test_jobs_nearly_as_sensitive_as_the_held_one_are_not_displaced() -> None:
    # As above, but the machine-mates are sensitive 2-GPU jobs: spread, each would lose more
    # than half as much as S (4.4 against 5.9), so none is displaced and S waits its timer.
    sensitive_pairs = [(f"p{i}", 0.0, 2, 200_000.0, SENSITIVE) for i in range(4)]
    jobs = _jobs(
        ("A", 0, 4, 100, INSENSITIVE), *sensitive_pairs[:2], ("B", 0, 4, 100, INSENSITIVE),
        *sensitive_pairs[2:], ("S", 200, 8, 20_000, SENSITIVE),
    )  # fmt: skip
    res, sched = _run(jobs, DUO, CKPT, **RECLAIM)
    assert sched.moves["reclaim"] == 0
    assert res.preemptions.sum() == 0
    assert _holds(res, 6) == [(1200.0, (0, 1), Level.RACK)]


# ---------------------------------------------------------------- migration

# One rack of three 8-GPU machines. At t = 0: C (8 GPUs, insensitive) fills machine 0; A, B
# and eight 1-GPU jobs fill machines 1 and 2. A and B finish at t = 100. S (8 GPUs, sensitive)
# arrives at t = 200 and, with timers 0,0, starts at once spread over machines 1 and 2. W (16
# GPUs) arrives at 250 and waits, so the cluster keeps deciding.
TRIO = Cluster(racks=1, machines_per_rack=3, gpus_per_machine=8)
MIGRATE_JOBS = _jobs(
    ("C", 0, 8, 3000, INSENSITIVE), ("A", 0, 4, 100, INSENSITIVE), *SMALLS_A,
    ("B", 0, 4, 100, INSENSITIVE), *SMALLS_B, ("S", 200, 8, 20_000, SENSITIVE),
    ("W", 250, 16, 100, INSENSITIVE),
)  # fmt: skip
MIGRATE = {"timers": "0,0", "lease_s": 300.0, "reclaim": False}


def test_a_spread_sensitive_job_migrates_to_a_machine() -> None:
    on, sched = _run(MIGRATE_JOBS, TRIO, CKPT, migrate=True, **MIGRATE)
    off, _ = _run(MIGRATE_JOBS, TRIO, CKPT, migrate=False, **MIGRATE)
    s, c = 11, 0
    assert sched.moves == {"migrate": 1, "reclaim": 0, "las": 0}
    # At S's lease expiry (500) S and C checkpoint; S restarts alone on C's machine, C spread.
    assert _holds(on, s) == [(200.0, (1, 2), Level.RACK), (505.0, (0,), Level.MACHINE)]
    assert _holds(on, c) == [(0.0, (0,), Level.MACHINE), (505.0, (1, 2), Level.RACK)]
    assert on.preemptions[s] == on.preemptions[c] == 1
    assert on.preemptions.sum() == 2
    assert on.widest_level[s] == RACK  # the widest placement it ever had
    assert on.widest_level[c] == RACK
    assert _holds(off, s) == [(200.0, (1, 2), Level.RACK)]
    assert off.preemptions.sum() == 0
    assert on.finish_s[s] * 2 < off.finish_s[s]
    assert not np.isnan(on.finish_s).any()


def test_no_migration_below_the_least_loss() -> None:
    res, sched = _run(MIGRATE_JOBS, TRIO, CKPT, migrate_min_loss=100.0, **MIGRATE)
    assert sched.moves["migrate"] == 0
    assert res.preemptions.sum() == 0


# ---------------------------------------------------------------- no starvation, determinism


@dataclass(frozen=True)
class Case:
    cluster: Cluster
    jobs: JobTable
    options: dict[str, object]
    engine: EngineConfig


@st.composite
def cases(draw: st.DrawFn) -> Case:
    cluster = Cluster(
        racks=draw(st.integers(1, 2)),
        machines_per_rack=draw(st.integers(1, 3)),
        gpus_per_machine=draw(st.sampled_from([2, 4])),
        oversubscription=draw(st.sampled_from([1.0, 4.0])),
    )
    n = draw(st.integers(1, 12))
    sizes = [g for g in (1, 2, 3, 4, 6, 8) if g <= cluster.gpus]
    measured = st.one_of(st.just(float("nan")), st.floats(1.0, 3.0))
    jobs = JobTable.build(
        name=[f"j{i}" for i in range(n)],
        model=["m"] * n,
        arrival_s=draw(st.lists(st.integers(0, 2000).map(float), min_size=n, max_size=n)),
        gpus=draw(st.lists(st.sampled_from(sizes), min_size=n, max_size=n)),
        total_iters=draw(st.lists(st.integers(10, 500).map(float), min_size=n, max_size=n)),
        compute_s=draw(st.lists(st.sampled_from([0.05, 1.0]), min_size=n, max_size=n)),
        grad_bytes=draw(st.lists(st.sampled_from([0.0, 1e8, 1e9]), min_size=n, max_size=n)),
        measured_slowdown=draw(st.lists(measured, min_size=n, max_size=n)),
    )
    options = {
        "lease_s": draw(st.sampled_from([0.0, 60.0, 600.0])),
        "reclaim": draw(st.booleans()),
        "reclaim_after_s": draw(st.sampled_from([0.0, 100.0])),
        "migrate": draw(st.booleans()),
        "migrate_cost_s": draw(st.sampled_from([0.0, 30.0])),
        "thresholds_gpu_s": (100.0, 1000.0),
        "auto_initial_s": (300.0, 900.0),
        "auto_min_samples": 2,
    }
    engine = EngineConfig(
        record_segments=True,
        checkpoint_s=draw(st.sampled_from([0.0, 5.0])),
        restore_s=draw(st.sampled_from([0.0, 5.0])),
        round_s=draw(st.sampled_from([0.0, 60.0])),
    )
    return Case(cluster, jobs, options, engine)


@pytest.mark.parametrize("order", ["fifo", "las"])
@pytest.mark.parametrize("timers", ["auto", "0,0", "200,600"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_every_job_finishes(timers: str, order: str, case: Case) -> None:
    res, _ = _run(
        case.jobs, case.cluster, case.engine, timers=timers, order=order, **case.options
    )  # check_result: no GPU double-booked, every iteration done, nothing before arrival
    n = len(case.jobs)
    assert not np.isnan(res.finish_s).any()
    assert res.events == 2 * n + int(res.preemptions.sum())
    assert np.all(res.widest_level >= case.cluster.min_levels(case.jobs.gpus))
    assert np.all(res.locality_wait_s >= 0)
    # Locality waits are part of the time spent waiting (not holding GPUs).
    waiting = res.finish_s - case.jobs.arrival_s - res.run_s
    assert np.all(res.locality_wait_s <= waiting + 1e-6)


def test_same_spec_gives_the_same_summary() -> None:
    spec = api.RunSpec(
        trace="tiresias-60", scheduler="netsens", seed=3, jitter_s=600.0,
        scheduler_options={"timers": "auto", "order": "las", "lease_s": "300"},
        engine=EngineConfig(congestion=2.0),
    )  # fmt: skip
    a, b = api.simulate(spec), api.simulate(spec)
    assert api.run_summary(spec, a) == api.run_summary(spec, b)
    cols_a, cols_b = job_columns(a), job_columns(b)
    for key, col in cols_a.items():
        np.testing.assert_array_equal(col, cols_b[key], err_msg=key)
    # Reusing one scheduler object: reset() forgets the previous run.
    jobs, cluster = api.load_jobs(spec)
    sched = api.build_scheduler("netsens", spec.scheduler_options)
    first = Simulator(jobs, cluster, sched, BestFit(), spec.engine).run()
    again = Simulator(jobs, cluster, sched, BestFit(), spec.engine).run()
    assert np.array_equal(first.finish_s, again.finish_s)
    assert np.array_equal(first.finish_s, a.finish_s)


# ---------------------------------------------------------------- under congestion

# Four racks of two 8-GPU machines: jobs of more than 16 GPUs must cross racks, over uplinks
# of 200 / 2 Gbit/s, shared by every job that crosses.
FOUR_RACKS = Cluster(
    name="four-racks", racks=4, machines_per_rack=2, gpus_per_machine=8, core_gbps=200.0,
    oversubscription=2.0,
)  # fmt: skip


@pytest.fixture(scope="module")
def helios_48() -> JobTable:
    jobs, _ = api.load_jobs(api.RunSpec(trace="helios-500"))
    return jobs.subset(np.arange(48))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_netsens_crosses_racks_less_than_tiresias(helios_48: JobTable, seed: int) -> None:
    jobs = api.jitter_arrivals(helios_48, 3600.0, seed) if seed else helios_48
    assert int(jobs.gpus.max()) > FOUR_RACKS.gpus_per_rack

    def summary(scheduler: str, congestion: float) -> dict[str, object]:
        spec = api.RunSpec(scheduler=scheduler, engine=EngineConfig(congestion=congestion))
        return summarize(api.simulate(spec, loaded=(jobs, FOUR_RACKS)))

    for congestion in (1.0, 4.0):
        ns, tir = summary("netsens", congestion), summary("tiresias", congestion)
        assert ns["jobs_finished"] == tir["jobs_finished"] == 48
        assert ns["jobs_across_racks"] <= tir["jobs_across_racks"]  # type: ignore[operator]
        if congestion == 4.0:
            assert ns["comm_overhead_frac"] < tir["comm_overhead_frac"]  # type: ignore[operator]
