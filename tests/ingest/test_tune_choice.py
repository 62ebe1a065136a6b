"""TuneLog's final choice: by the highest mean without intervals (the simulator), and moving
off the incumbent only on an interval above its mean when measurements state one (live)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest

from recperf.ingest.base import Allocation, Measurement
from recperf.ingest.tuners.base import TuneLog

A = Allocation(workers=(2,), cuts=())
B = Allocation(workers=(1, 1))
C = Allocation(workers=(1,), cuts=())
NAN2 = (math.nan, math.nan)


class Scripted:
    """A two-stage target whose measurements are scripted per allocation (1 s each)."""

    stage_names = ("read", "collate")
    cores = 2
    max_workers = (None, None)
    memory_budget_bytes = 1e12
    thread_options = (1,)
    inflight_options = (0,)

    def __init__(self, script: Mapping[Allocation, list[tuple[float, tuple[float, float], int]]]):
        self.script = {k: list(v) for k, v in script.items()}
        self.t = 0.0

    def memory_bytes(self, alloc: Allocation) -> float:
        return 1.0

    def elapsed_s(self) -> float:
        return self.t

    def measure(self, alloc: Allocation, window_s: float) -> Measurement:
        thr, ci, samples = self.script[alloc].pop(0)
        self.t += window_s
        return Measurement(
            allocation=alloc, throughput_rows_per_s=thr, stage_rows_per_s=(thr, thr),
            busy_frac=(1, 1), queue_fill=(0, 0), cpu_s=(1, 1), cost_us_per_row=(1, 1),
            memory_bytes=1.0, window_s=window_s, throughput_ci=ci, samples=samples,
        )  # fmt: skip


def run(script: Mapping[Allocation, list[tuple[float, tuple[float, float], int]]],
        order: list[Allocation]) -> TuneLog:  # fmt: skip
    log = TuneLog(Scripted(script), budget_s=100.0, window_s=1.0)
    for a in order:
        assert log.measure(a) is not None
    return log


def test_without_intervals_the_highest_mean_wins_ties_to_fewer_workers() -> None:
    log = run({A: [(100.0, NAN2, 1)], B: [(101.0, NAN2, 1)], C: [(101.0, NAN2, 1)]}, [A, B, C])
    assert log.best() == C
    assert log.interval(A) is None
    assert [s.throughput_ci for s in log.history] == [None, None, None]
    assert log.result("t").history[1].samples == 1


def test_a_higher_mean_inside_the_noise_does_not_replace_the_incumbent() -> None:
    log = run({A: [(100.0, (95.0, 105.0), 4)], B: [(104.0, (90.0, 118.0), 4)]}, [A, B])
    assert log.best() == A
    assert log.history[1].throughput_ci == (90.0, 118.0) and log.history[1].samples == 4


def test_an_interval_above_the_incumbents_mean_replaces_it() -> None:
    log = run({A: [(100.0, (60.0, 140.0), 4)], B: [(110.0, (101.0, 119.0), 4)]}, [A, B])
    assert log.best() == B
    log = run({A: [(100.0, (99.0, 101.0), 4)], B: [(104.0, (99.5, 108.5), 4)],
               C: [(130.0, (125.0, 135.0), 4)]}, [A, B, C])  # fmt: skip
    assert log.best() == C


def test_the_interval_of_repeated_windows_takes_their_spread() -> None:
    # each window is tight (+-1) but they disagree: the spread sets the interval
    log = run({A: [(100.0, (99.0, 101.0), 4), (140.0, (139.0, 141.0), 4)]}, [A, A])
    lo, hi = log.interval(A) or NAN2
    assert (lo + hi) / 2 == pytest.approx(120.0)
    assert (hi - lo) / 2 == pytest.approx(6.314 * 28.284 / 1.4142, rel=1e-3)
    # one window: its own interval
    log = run({A: [(100.0, (98.0, 102.0), 5)]}, [A])
    assert log.interval(A) == pytest.approx((98.0, 102.0))


def test_settle_measures_an_unresolved_challenger_again_until_it_clears() -> None:
    """Issue 26 (live-2 on Ray): B measured 1.15M rows/s against A's 0.74M, but B's one-window
    interval reached below A's mean, so A stayed chosen; settling measures both again, and B's
    two windows (interval from their spread) clear A."""
    script = {
        A: [(0.74e6, (0.70e6, 0.78e6), 4), (0.75e6, (0.71e6, 0.79e6), 4)],
        B: [(1.15e6, (0.60e6, 1.70e6), 4), (1.14e6, (0.80e6, 1.48e6), 4)],
    }
    log = run(script, [A, B])
    assert log.best() == A
    log.settle()
    assert log.best() == B and log.count(A) == log.count(B) == 2


def test_settle_stops_at_the_budget_and_measures_nothing_without_intervals() -> None:
    log = run({A: [(100.0, NAN2, 1)], B: [(101.0, NAN2, 1)]}, [A, B])
    log.settle()
    assert log.count(A) == log.count(B) == 1  # the simulator's choice, unchanged
    script = {A: [(0.74e6, (0.70e6, 0.78e6), 4)], B: [(1.15e6, (0.60e6, 1.70e6), 4)]}
    tight = TuneLog(Scripted(script), budget_s=2.0, window_s=1.0)
    assert tight.measure(A) is not None and tight.measure(B) is not None
    tight.settle()  # no budget left: nothing measured, the incumbent stays
    assert tight.best() == A and tight.count(B) == 1
