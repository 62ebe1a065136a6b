"""Cluster shape helpers: the per-level capacity caps the engine and netsens share."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recperf.cluster.placement import BestFit
from recperf.cluster.topology import Cluster, Level

TOP = 3  # the widest level of a racks x machines cluster: across racks

# 2 racks x 3 machines x 4 GPUs.
SMALL = Cluster(racks=2, machines_per_rack=3, gpus_per_machine=4)


@pytest.mark.parametrize(
    ("free", "caps"),
    [
        ([1, 4, 0, 2, 2, 3], [12, 4, 7, 12]),  # racks hold 5 and 7
        ([4, 4, 4, 4, 4, 4], [24, 4, 12, 24]),  # all free
        ([0, 0, 0, 0, 0, 0], [0, 0, 0, 0]),  # all busy
        ([0, 0, 0, 0, 1, 0], [1, 1, 1, 1]),  # one GPU left
        ([3, 3, 3, 0, 0, 1], [10, 3, 9, 10]),  # the roomiest rack lacks the roomiest machine
    ],
)
def test_level_caps(free: list[int], caps: list[int]) -> None:
    got = SMALL.level_caps(np.asarray(free, dtype=np.int64))
    assert got.dtype == np.int64
    assert got.tolist() == caps
    assert got[Level.MACHINE] == caps[1] and got[TOP] == caps[3]


def test_level_caps_indexed_by_an_array_of_levels() -> None:
    caps = SMALL.level_caps(np.asarray([1, 4, 0, 2, 2, 3], dtype=np.int64))
    levels = np.asarray([Level.RACK, Level.MACHINE, TOP, Level.MACHINE])
    assert caps[levels].tolist() == [7, 4, 12, 4]


@settings(max_examples=200, deadline=None)
@given(
    free=st.lists(st.integers(0, 4), min_size=6, max_size=6),
    gpus=st.integers(1, 24),
    level=st.sampled_from([Level.MACHINE, Level.RACK, TOP]),
)
def test_level_caps_say_exactly_when_best_fit_places(
    free: list[int], gpus: int, level: Level
) -> None:
    if level < SMALL.min_level(gpus):
        return  # a level tighter than the job can ever be placed at: caps make no claim
    arr = np.asarray(free, dtype=np.int64)
    placed = BestFit().place(gpus, arr, SMALL, level, np.random.default_rng(0))
    assert (placed is not None) == (gpus <= SMALL.level_caps(arr)[level])
