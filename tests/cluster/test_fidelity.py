"""Gavel's assumptions as engine modes: ``network="off"`` (consolidated rates) and ``rounds_s``."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.cluster.api import RunSpec, build_placement, load_jobs, simulate
from recperf.cluster.base import Decision, SchedulerView
from recperf.cluster.engine import Simulator
from recperf.cluster.jobs import JobTable
from recperf.cluster.outcome import EngineConfig, SimResult
from recperf.cluster.schedulers.fifo import Fifo
from recperf.cluster.schedulers.tiresias import Tiresias, TiresiasConfig
from recperf.cluster.topology import Cluster, Level, load_cluster
from recperf.core.errors import ConfigError

# 2 racks x 2 machines x 2 GPUs: a 6-GPU job spans both racks wherever it is placed.
SPLIT = Cluster(racks=2, machines_per_rack=2, gpus_per_machine=2, oversubscription=2.0)
GRAD_BYTES = 200e6
COMPUTE_S = 0.05


def table(arrival: list[float], gpus: list[int], iters: list[float], grad: float = 0.0) -> JobTable:
    n = len(arrival)
    return JobTable.build(
        name=[f"j{i}" for i in range(n)], model=["m"] * n, arrival_s=arrival, gpus=gpus,
        total_iters=iters, compute_s=[COMPUTE_S] * n, grad_bytes=[grad] * n,
    )  # fmt: skip


def machine_comm_s(cluster: Cluster, gpus: int, grad_bytes: float) -> float:
    """Ring all-reduce over the machine's own links (the model in network.py, written out)."""
    steps = 2.0 * (gpus - 1)
    return steps * cluster.machine_latency_us * 1e-6 + steps / gpus * grad_bytes * 8.0 / (
        cluster.machine_gbps * 1e9
    )


def run(
    jobs: JobTable,
    cluster: Cluster,
    engine: EngineConfig,
    placement: str = "best-fit",
    seed: int = 0,
) -> SimResult:
    return Simulator(jobs, cluster, Fifo(), build_placement(placement), engine, seed=seed).run()


# ---------------------------------------------------------------- network off
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_network_off_runs_a_spread_job_at_its_consolidated_rate(seed: int) -> None:
    jobs = table([0.0, 0.0], [6, 2], [2_000.0, 1_000.0], grad=GRAD_BYTES)
    off = run(jobs, SPLIT, EngineConfig(network="off"), "random", seed)
    assert off.widest_level[0] > Level.RACK  # across racks, yet charged as if on one machine
    for j in range(2):
        g = int(jobs.gpus[j])
        want = float(jobs.total_iters[j]) * (COMPUTE_S + machine_comm_s(SPLIT, g, GRAD_BYTES))
        assert off.run_s[j] == pytest.approx(want, rel=1e-9)
        assert off.finish_s[j] == pytest.approx(want, rel=1e-9)
    on = run(jobs, SPLIT, EngineConfig(), "random", seed)
    assert on.run_s[0] > 1.2 * off.run_s[0]  # the network model charges the spread


def test_network_off_ignores_congestion() -> None:
    jobs = table([0.0, 10.0, 20.0], [6, 2, 4], [2_000.0, 3_000.0, 1_500.0], grad=GRAD_BYTES)
    off = [run(jobs, SPLIT, EngineConfig(network="off", congestion=c), "random") for c in (1, 8)]
    np.testing.assert_array_equal(off[0].finish_s, off[1].finish_s)
    on = [run(jobs, SPLIT, EngineConfig(congestion=c), "random") for c in (1, 8)]
    assert on[1].finish_s[0] > on[0].finish_s[0]  # with the network on, congestion costs


# ---------------------------------------------------------------- rounds
ONE_GPU = Cluster(racks=1, machines_per_rack=1, gpus_per_machine=1)


def one_gpu_jobs() -> JobTable:
    """A runs 0-130; B arrives at 50; C arrives at 430; D arrives on a boundary (600)."""
    durations = [130.0, 100.0, 50.0, 10.0]
    return table([0.0, 50.0, 430.0, 600.0], [1] * 4, [d / COMPUTE_S for d in durations])


def test_rounds_defer_freed_gpus_and_arrivals_to_the_next_boundary() -> None:
    jobs = one_gpu_jobs()
    res = run(jobs, ONE_GPU, EngineConfig(network="off", rounds_s=100.0))
    np.testing.assert_allclose(res.first_start_s, [0.0, 200.0, 500.0, 600.0])
    np.testing.assert_allclose(res.finish_s, [130.0, 300.0, 550.0, 610.0])
    cont = run(jobs, ONE_GPU, EngineConfig(network="off"))
    np.testing.assert_allclose(cont.first_start_s, [0.0, 130.0, 430.0, 600.0])


def test_rounds_start_jobs_only_on_boundaries() -> None:
    rng = np.random.default_rng(5)
    n = 60
    arrival = np.sort(rng.uniform(0, 5_000, n)).tolist()
    gpus = rng.choice([1, 2, 4], n).tolist()
    iters = (rng.uniform(50, 900, n) / COMPUTE_S).tolist()
    cluster = Cluster(racks=1, machines_per_rack=2, gpus_per_machine=4)
    res = run(table(arrival, gpus, iters), cluster, EngineConfig(network="off", rounds_s=100.0))
    starts = res.first_start_s
    assert np.all(np.isfinite(starts))
    np.testing.assert_allclose(starts, np.round(starts / 100.0) * 100.0, atol=1e-6)
    assert np.mean(starts > np.asarray(arrival) + 1e-6) > 0.9  # most had to wait for one


class Recording:
    """Tiresias, noting when the engine asks it."""

    name: ClassVar[str] = "tiresias"
    preemptive: ClassVar[bool] = True

    def __init__(self) -> None:
        self.inner = Tiresias(TiresiasConfig(thresholds_gpu_s=(200.0,), min_run_s=0.0))
        self.times: list[float] = []

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        self.inner.reset(jobs, cluster)

    def schedule(self, view: SchedulerView) -> Decision:
        self.times.append(view.now)
        return self.inner.schedule(view)


@pytest.mark.parametrize("rounds_s", [100.0, 0.0])
def test_a_preemptive_scheduler_decides_only_on_round_boundaries(rounds_s: float) -> None:
    jobs = table([0.0, 37.0, 251.0, 420.5, 777.0], [2, 2, 1, 2, 1],
                 [8_000.0, 3_000.0, 5_000.0, 2_000.0, 1_000.0])  # fmt: skip
    cluster = Cluster(racks=1, machines_per_rack=1, gpus_per_machine=2)
    sched = Recording()
    cfg = EngineConfig(network="off", rounds_s=rounds_s, round_s=0.0, record_segments=True)
    res = Simulator(jobs, cluster, sched, build_placement("best-fit"), cfg).run()
    assert res.preemptions.sum() > 0  # the scenario preempts, so the rule is exercised
    times = np.asarray(sched.times)

    def on_grid(t: np.ndarray) -> np.ndarray:
        # A boundary, or the end of a checkpoint that a boundary's preemption started (then
        # the freed GPUs go to the jobs admitted at that boundary).
        after = t - cfg.checkpoint_s
        return np.isclose(t, np.round(t / 100.0) * 100.0, atol=1e-6) | np.isclose(
            after, np.round(after / 100.0) * 100.0, atol=1e-6
        )

    if rounds_s == 0.0:
        assert not on_grid(times).all()  # continuous time decides at arrivals (37 s, ...)
        return
    assert on_grid(times).all()
    holds = np.asarray([s.start_s for s in res.segments if s.alloc is not None])
    assert on_grid(holds).all()
    # A run that ends without finishing the job was preempted, at a boundary.
    stops = [s.end_s for s in res.segments if s.alloc is None and s.end_s < res.finish_s[s.job]]
    assert stops
    np.testing.assert_allclose(stops, np.round(np.asarray(stops) / 100.0) * 100.0, atol=1e-6)


def test_a_job_admitted_by_a_preemption_starts_when_the_checkpoint_ends() -> None:
    # A holds the machine; B arrives at 37; Tiresias preempts A for B at the 100 s boundary.
    jobs = table([0.0, 37.0], [2, 2], [8_000.0, 1_000.0])
    cluster = Cluster(racks=1, machines_per_rack=1, gpus_per_machine=2)
    cfg = EngineConfig(network="off", rounds_s=100.0, round_s=0.0, checkpoint_s=10.0)
    res = Simulator(jobs, cluster, Recording(), build_placement("best-fit"), cfg).run()
    assert res.preemptions[0] == 1
    # As in continuous time (preempted at 300 s, B starts at 310 s), B should take the GPUs
    # when A's checkpoint ends (110 s), not at the next boundary (200 s).
    assert res.first_start_s[1] == pytest.approx(110.0)


# ---------------------------------------------------------------- bad values
@pytest.mark.parametrize(
    ("field", "value"), [("network", "maybe"), ("rounds_s", -1.0), ("rounds_s", float("nan"))]
)
def test_bad_engine_values_are_one_line_config_errors(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as exc:
        EngineConfig(**{field: value})  # type: ignore[arg-type]
    msg = str(exc.value)
    assert field in msg and "\n" not in msg


@pytest.mark.parametrize(("flag", "value"), [("--network", "maybe"), ("--rounds", "-1")])
def test_bad_engine_flags_exit_2_with_one_line(tmp_path: Path, flag: str, value: str) -> None:
    res = CliRunner().invoke(
        app, ["cluster", "simulate", "--trace", "tiresias-60", "--scheduler", "fifo", flag, value,
              "--out", str(tmp_path / "x")],
    )  # fmt: skip
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and ("network" in lines[0] or "rounds" in lines[0])
    assert not (tmp_path / "x" / "summary.json").exists()


# ---------------------------------------------------------------- against Gavel
GAVEL_0E4A51_256_JCT_S = 157_308.2  # Gavel c4fa400 FIFO, 360 s rounds (issue 16)


def test_fifo_on_vc_0e4a51_is_within_3_percent_of_gavel() -> None:
    trace = Path(__file__).resolve().parents[2] / "src/recperf/data/cluster/philly/0e4a51.trace"
    spec = RunSpec(
        trace=str(trace), format="philly", scheduler="fifo",
        engine=EngineConfig(network="off", rounds_s=360.0),
    )  # fmt: skip
    jobs, _ = load_jobs(spec)
    base = load_cluster("philly")
    cluster = base.with_(racks=256 // base.gpus_per_rack)
    res = simulate(spec, loaded=(jobs, cluster))
    jct = float(np.mean(res.finish_s - jobs.arrival_s))
    assert jct == pytest.approx(GAVEL_0E4A51_256_JCT_S, rel=0.03)
    assert jct < GAVEL_0E4A51_256_JCT_S  # Gavel's 1,920 s allocation interval adds waits
