"""The GIL-fraction estimate of a measurement window, on synthetic counters."""

from __future__ import annotations

import math

import pytest

from recperf.ingest.live.gil import gil_fractions


def test_a_contended_segment_shares_its_gil_time_by_stage_waits() -> None:
    # one process of 4 threads, all busy for the 1 s window: N_busy = 4; cpu 2 s over wall 4 s
    # gives g = 4 / (4 * 2) = 0.5, i.e. 1 s of GIL time, shared 0.9 / 0.1 by the stages'
    # waits (1.8 s and 0.2 s); the single-threaded segment after it measured nothing
    got = gil_fractions(
        segments=[(0, 2), (2, 3)], workers=[1, 2], threads=[4, 1],
        cpu_s=[1.2, 0.8, 0.5], wall_s=[3.0, 1.0, 0.6], busy_s=[4.0, 4.0, 1.2], window_s=1.0,
    )  # fmt: skip
    assert got[0] == pytest.approx(0.75)
    assert got[1] == pytest.approx(0.125)
    assert math.isnan(got[2])


def test_consumer_threads_count_as_one_process_and_estimates_are_clipped() -> None:
    # W = 3 threads of the consumer's process, 2.5 busy on average; cpu/wall = 0.2: the model
    # says g = 1 / (2.5 * 0.2) = 2, clipped to 1; without waits the stages share by CPU
    got = gil_fractions(
        segments=[(0, 2)], workers=[3], threads=[0],
        cpu_s=[0.5, 0.5], wall_s=[2.5, 2.5], busy_s=[5.0, 5.0], window_s=2.0,
    )  # fmt: skip
    assert got == (1.0, 1.0)
    free = gil_fractions(
        segments=[(0, 1)], workers=[2], threads=[0],
        cpu_s=[3.6], wall_s=[3.6], busy_s=[3.6], window_s=2.0,
    )  # fmt: skip
    assert free[0] == pytest.approx(1 / 1.8)


@pytest.mark.parametrize(("threads", "busy"), [(1, 8.0), (4, 0.9), (0, 0.5)])
def test_no_estimate_without_more_than_one_busy_thread(threads: int, busy: float) -> None:
    got = gil_fractions(
        segments=[(0, 1)], workers=[1], threads=[threads],
        cpu_s=[1.0], wall_s=[2.0], busy_s=[busy], window_s=1.0,
    )  # fmt: skip
    assert math.isnan(got[0])
