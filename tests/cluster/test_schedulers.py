"""Scheduler outcomes on the bundled traces, consolidation, and the cost of preemption."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pyarrow.parquet as pq
import pytest

from recperf.cluster import api
from recperf.cluster.base import Decision, SchedulerView
from recperf.cluster.engine import Simulator
from recperf.cluster.jobs import JobTable
from recperf.cluster.metrics import summarize
from recperf.cluster.outcome import EngineConfig
from recperf.cluster.placement import BestFit
from recperf.cluster.topology import Cluster


def _mean_jct(results: dict[str, object]) -> dict[str, float]:
    return {name: summarize(res)["jct_mean_s"] for name, res in results.items()}  # type: ignore[arg-type]


def test_schedulers_on_the_tiresias_480_trace() -> None:
    jct = _mean_jct(
        api.compare(api.RunSpec(trace="tiresias-480"), ["fifo", "tiresias", "srtf", "sjf"])
    )
    assert jct["tiresias"] < jct["fifo"]
    assert jct["srtf"] <= jct["fifo"]
    assert jct["sjf"] <= jct["fifo"]


def test_tiresias_beats_fifo_on_philly_at_a_third_of_its_cluster() -> None:
    # The whole 15,264-job trace; about 45 s on 2 cores, most of it Tiresias.
    results = api.compare(api.RunSpec(trace="philly", cluster="philly-third"), ["fifo", "tiresias"])
    summaries = {name: summarize(res) for name, res in results.items()}
    for s in summaries.values():
        assert s["jobs_finished"] == 15_264
        assert s["cluster_gpus"] == 960
    # Head-of-line blocking by large jobs makes FIFO's queues an order of magnitude longer.
    assert summaries["tiresias"]["jct_mean_s"] * 5 < summaries["fifo"]["jct_mean_s"]
    assert summaries["tiresias"]["preemptions"] > 0 and summaries["fifo"]["preemptions"] == 0


# ---------------------------------------------------------------- consolidation

LEVEL_KEYS = ("jobs_single_gpu", "jobs_within_machine", "jobs_within_rack", "jobs_across_racks")


@pytest.mark.parametrize("placement", ["best-fit", "first-fit"])
@pytest.mark.parametrize(
    ("trace", "cluster", "levels"),
    [
        # helios: 8-GPU machines, 32-GPU racks; jobs of 40, 48 and 56 GPUs must cross racks.
        ("helios-500", "helios", (270, 13 + 52 + 109, 42 + 11, 3)),
        # Every job fits a 256-GPU rack: none may cross racks.
        ("tiresias-480", "tiresias-n256g8", (244, 42 + 80 + 85, 24 + 5, 0)),
    ],
)
def test_consolidate_never_places_wider_than_the_tightest_level(
    tmp_path: Path, trace: str, cluster: str, placement: str, levels: tuple[int, ...]
) -> None:
    spec = api.RunSpec(trace=trace, cluster=cluster, scheduler="consolidate", placement=placement)
    res = api.simulate(spec)
    summary = api.write_run(tmp_path, spec, res)
    assert tuple(summary[k] for k in LEVEL_KEYS) == levels
    widest = pq.read_table(tmp_path / "jobs.parquet").column("widest_level").to_pylist()
    tightest = [res.cluster.level_names[int(v)] for v in res.cluster.min_levels(res.jobs.gpus)]
    assert widest == tightest


@pytest.mark.parametrize(
    ("trace", "cluster"), [("helios-500", "helios"), ("tiresias-480", "tiresias-n256g8")]
)
def test_fifo_with_random_placement_does_spread(trace: str, cluster: str) -> None:
    # The counterpart of the test above: without consolidation, jobs do cross racks.
    res = api.simulate(api.RunSpec(trace=trace, cluster=cluster, placement="random"))
    assert summarize(res)["jobs_across_racks"] > 100


# ---------------------------------------------------------------- preemption costs

ONE_GPU = Cluster(racks=1, machines_per_rack=1, gpus_per_machine=1)


def _long_then_short() -> JobTable:
    # A (1,000 s) runs alone until B (50 s) arrives at t = 100 and preempts it.
    return JobTable.build(
        name=["long", "short"], model=["m", "m"], arrival_s=[0.0, 100.0], gpus=[1, 1],
        total_iters=[1000.0, 50.0], compute_s=[1.0, 1.0], grad_bytes=[0.0, 0.0],
    )  # fmt: skip


@pytest.mark.parametrize("restore_s", [0.0, 100.0])
@pytest.mark.parametrize(
    ("scheduler", "options"),
    [
        ("srtf", {}),
        ("tiresias", {"thresholds_gpu_s": "50", "min_run_s": "0", "promote_factor": "0"}),
    ],
)
def test_preemption_charges_checkpoint_and_restore(
    scheduler: str, options: dict[str, str], restore_s: float
) -> None:
    ckpt = 10.0
    engine = EngineConfig(checkpoint_s=ckpt, restore_s=restore_s, round_s=0.0)
    sched = api.build_scheduler(scheduler, options)
    res = Simulator(_long_then_short(), ONE_GPU, sched, BestFit(), engine).run()
    assert res.preemptions.tolist() == [1, 0]
    # B waits for A's checkpoint, runs 50 s; A then restores and runs its remaining 900 s.
    assert res.first_start_s.tolist() == [0.0, 100.0 + ckpt]
    assert res.finish_s.tolist() == pytest.approx([160.0 + restore_s + 900.0, 160.0])
    assert res.progress_s.tolist() == pytest.approx([1000.0, 50.0])
    assert res.run_s.tolist() == pytest.approx([1000.0 + ckpt + restore_s, 50.0])


def test_restore_cost_raises_total_run_time_for_the_same_preemptions() -> None:
    def run(restore_s: float) -> dict[str, float]:
        engine = EngineConfig(checkpoint_s=10.0, restore_s=restore_s, round_s=0.0)
        res = Simulator(
            _long_then_short(), ONE_GPU, api.build_scheduler("srtf"), BestFit(), engine
        ).run()
        return {"run_s": float(res.run_s.sum()), "preemptions": int(res.preemptions.sum())}

    free, costly = run(0.0), run(100.0)
    assert free["preemptions"] == costly["preemptions"] == 1
    assert costly["run_s"] == pytest.approx(free["run_s"] + 100.0)


class _Counted:
    """SRTF that refuses to be consulted more than ``limit`` times (a livelock guard)."""

    name: ClassVar[str] = "srtf"
    preemptive: ClassVar[bool] = True

    def __init__(self, limit: int) -> None:
        self.inner = api.build_scheduler("srtf")
        self.calls, self.limit = 0, limit

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        self.inner.reset(jobs, cluster)

    def schedule(self, view: SchedulerView) -> Decision:
        self.calls += 1
        assert self.calls <= self.limit, "the engine keeps deciding at one instant"
        return self.inner.schedule(view)


def test_a_round_that_preempts_keeps_the_freed_gpus_for_the_admitted_job() -> None:
    # Two 1-GPU machines. R and Y run; X waits; when Y finishes at t = 10, W (2 GPUs, the
    # shortest) arrives and preempts R. X must not take Y's free GPU meanwhile: with free
    # checkpoints that made X and R take turns on it, preempting each other, forever at t = 10.
    jobs = JobTable.build(
        name=["R", "Y", "X", "W"], model=["m"] * 4, arrival_s=[0, 0, 5, 10], gpus=[1, 1, 1, 2],
        total_iters=[500, 10, 1000, 100], compute_s=[1.0] * 4, grad_bytes=[0.0] * 4,
    )  # fmt: skip
    two = Cluster(racks=1, machines_per_rack=2, gpus_per_machine=1)
    sched = _Counted(limit=20)
    engine = EngineConfig(checkpoint_s=0.0, restore_s=0.0, round_s=0.0)
    res = Simulator(jobs, two, sched, BestFit(), engine).run()
    assert res.preemptions.tolist() == [1, 0, 0, 0]
    assert res.first_start_s.tolist() == pytest.approx([0.0, 0.0, 110.0, 10.0], abs=0.01)
    assert res.finish_s.tolist() == pytest.approx([600.0, 10.0, 1110.0, 110.0], abs=0.01)
