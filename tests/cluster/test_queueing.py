"""FIFO on 1-GPU jobs with Poisson arrivals and exponential run times is an M/M/c queue.

The engine's waits are checked exactly against the multi-server FIFO recurrence on the same jobs,
and the mean wait of the generator's long trace against the Erlang-C formula.

Why not Erlang-C on the engine's own summary alone: waits in a queue are strongly correlated, so
the sample mean converges slowly. Measured over 40 seeds at c = 4, 20,000 jobs give a relative
standard deviation of the mean wait of 7.6% (rho 0.5), 8.1% (0.7) and 17% (0.9); a 5% test at three
standard errors needs ~0.4, 0.5 and 2 million jobs, minutes of engine time at ~0.2 ms per job.
FIFO waits of the first k jobs do not depend on later arrivals, so the engine runs the first
ENGINE_JOBS jobs of each long trace and must reproduce the recurrence there exactly; the recurrence
runs the whole trace (about 1 µs per job) for the Erlang-C comparison.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from recperf.cluster.engine import Simulator
from recperf.cluster.jobs import JobTable
from recperf.cluster.metrics import summarize
from recperf.cluster.outcome import EngineConfig
from recperf.cluster.placement import BestFit
from recperf.cluster.schedulers.fifo import Fifo
from recperf.cluster.topology import Cluster
from recperf.cluster.traces.synthetic import SyntheticConfig, SyntheticTrace

C = 4
CLUSTER = Cluster(racks=1, machines_per_rack=C, gpus_per_machine=1)
MEAN_S = 3600.0
ENGINE_JOBS = 8_000
WARMUP = 2_000  # the queue starts empty: drop the first jobs from the long-run mean


def erlang_c_wait_s(c: int, rho: float, mean_service_s: float) -> float:
    """Mean wait in queue of M/M/c: P(wait) (Erlang C) / (c mu - lambda)."""
    a = c * rho  # offered load in Erlangs
    b = 1.0  # Erlang B by its stable recursion
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    p_wait = b / (1.0 - rho * (1.0 - b))
    return p_wait * mean_service_s / (c * (1.0 - rho))


def test_erlang_c_formula() -> None:
    # M/M/1: Wq = rho / (mu - lambda); M/M/2 at rho 0.5: P(wait) = 1/3, Wq = 1/3 / (2 - 1).
    assert erlang_c_wait_s(1, 0.9, 1.0) == pytest.approx(9.0)
    assert erlang_c_wait_s(2, 0.5, 1.0) == pytest.approx(1.0 / 3.0)
    assert erlang_c_wait_s(4, 0.7, 1.0) == pytest.approx(0.357212, rel=1e-5)


def fifo_waits(jobs: JobTable, servers: int) -> np.ndarray:
    """Kiefer-Wolfowitz recurrence: each job starts when it arrives or the earliest server frees."""
    free = [0.0] * servers
    service = (jobs.total_iters * jobs.compute_s).tolist()
    waits = np.empty(len(jobs))
    for i, (arrive, run) in enumerate(zip(jobs.arrival_s.tolist(), service, strict=True)):
        start = max(arrive, free[0])
        heapq.heapreplace(free, start + run)
        waits[i] = start - arrive
    return waits


# Jobs per load: the relative standard error of the mean wait (measured as above) is then 1.7%,
# 1.6% and 1.7%, so the 5% tolerance is about three standard errors.
@pytest.mark.parametrize(("rho", "jobs"), [(0.5, 400_000), (0.7, 500_000), (0.9, 2_000_000)])
def test_fifo_mean_wait_matches_erlang_c(rho: float, jobs: int) -> None:
    cfg = SyntheticConfig(
        jobs=jobs, load=rho, gpus_per_job="1", duration_dist="exp", mean_duration_s=MEAN_S
    )
    table = SyntheticTrace(cfg).load(None, CLUSTER, np.random.default_rng(17))
    waits = fifo_waits(table, C)
    expected = erlang_c_wait_s(C, rho, MEAN_S)
    assert waits[WARMUP:].mean() == pytest.approx(expected, rel=0.05)

    head = table.subset(np.arange(ENGINE_JOBS))
    res = Simulator(head, CLUSTER, Fifo(), BestFit(), EngineConfig(), seed=0).run()
    np.testing.assert_allclose(
        res.first_start_s - head.arrival_s, waits[:ENGINE_JOBS], rtol=0, atol=1e-6
    )
    summary = summarize(res)
    assert summary["queue_mean_s"] == pytest.approx(waits[:ENGINE_JOBS].mean(), rel=1e-9)
    assert summary["preemptions"] == 0
    # Erlang C's other prediction: the fraction of jobs that wait at all (binomial-ish error on
    # correlated samples; 0.03 absolute is loose on purpose).
    p_wait = expected * C * (1.0 - rho) / MEAN_S
    assert np.mean(waits[WARMUP:] > 0) == pytest.approx(p_wait, abs=0.03)


@pytest.mark.parametrize("rho", [0.5, 0.9])
@pytest.mark.parametrize(
    "cluster", [CLUSTER, Cluster(racks=2, machines_per_rack=1, gpus_per_machine=3)]
)
def test_engine_fifo_is_the_multiserver_recurrence(rho: float, cluster: Cluster) -> None:
    # Checkpoint and restore costs never apply: FIFO does not preempt.
    cfg = SyntheticConfig(jobs=3_000, load=rho, gpus_per_job="1", duration_dist="lognormal")
    table = SyntheticTrace(cfg).load(None, cluster, np.random.default_rng(3))
    engine = EngineConfig(checkpoint_s=1_000.0, restore_s=1_000.0, round_s=0.0)
    res = Simulator(table, cluster, Fifo(), BestFit(), engine).run()
    waits = fifo_waits(table, cluster.gpus)
    np.testing.assert_allclose(res.first_start_s - table.arrival_s, waits, rtol=0, atol=1e-6)
    np.testing.assert_allclose(res.run_s, table.total_iters * table.compute_s, rtol=0, atol=1e-6)
    assert summarize(res)["queue_mean_s"] == pytest.approx(waits.mean(), rel=1e-9)
