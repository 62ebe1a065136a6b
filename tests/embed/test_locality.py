"""Locality statistics and hot rows, on hand-made traces with exact answers and on the presets."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recperf.core.errors import ConfigError
from recperf.embed.locality import hot_rows, stats
from recperf.embed.traces import Trace, resolve


def _trace(*streams: list[int], rows: int = 5) -> Trace:
    ids = tuple(torch.tensor(s, dtype=torch.int64) for s in streams)
    return Trace(name="tiny", ids=ids, rows=(rows,) * len(streams))


def test_stats_on_tiny_trace_exact() -> None:
    s = stats(_trace([1, 2, 1, 1, 3, 2], [0, 0, 4]), batch_lookups=4, top_k=1)
    assert (s.tables, s.accesses, s.unique_rows, s.cold_accesses) == (2, 9, 5, 5)
    assert s.top_k_coverage == pytest.approx(5 / 9)  # rows 1 (3 uses) and 0 (2 uses)
    # Batches: [1,2,1,1] -> 2/4, [3,2,1,2] (wrapped) -> 3/4, table 1 [0,0,4,0] -> 2/4.
    assert s.unique_frac_per_batch == pytest.approx((0.5 + 0.75 + 0.5) / 3)
    # Accesses between reuses: row 1: 1, 0; row 2: 3; row 0: 0.
    assert s.reuse_distance_hist == (2, 1, 1)
    assert s.reuse_distance_bins == ("0", "1", "2-3")


def test_stats_top_k_beyond_touched_rows_covers_everything() -> None:
    s = stats(_trace([1, 2, 1]), batch_lookups=10, top_k=100)
    assert s.top_k_coverage == 1.0
    assert s.unique_frac_per_batch == pytest.approx(0.2)  # 10 wrapped ids, 2 distinct


def test_stats_to_json_keys_and_histogram_order() -> None:
    data = stats(_trace([1, 2, 1, 1, 3, 2]), batch_lookups=4, top_k=2).to_json()
    assert set(data) == {
        "name", "tables", "accesses", "unique_rows", "top_k", "top_k_coverage", "batch_lookups",
        "unique_frac_per_batch", "reuse_distance", "reuse_distance_hist",
    }  # fmt: skip
    assert data["reuse_distance"] == "accesses_between"
    assert data["reuse_distance_hist"] == [
        {"bin": "cold", "count": 3}, {"bin": "0", "count": 1}, {"bin": "1", "count": 1},
        {"bin": "2-3", "count": 1},
    ]  # fmt: skip
    assert data["top_k_coverage"] == pytest.approx(5 / 6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=200), st.integers(1, 50))
def test_stats_histogram_accounts_for_every_access(ids: list[int], batch: int) -> None:
    s = stats(_trace(ids, rows=31), batch_lookups=batch, top_k=3)
    assert s.cold_accesses + sum(s.reuse_distance_hist) == len(ids)
    assert s.unique_rows == len(set(ids))
    assert 0.0 < s.unique_frac_per_batch <= 1.0
    assert 0.0 < s.top_k_coverage <= 1.0


def test_stats_rejects_bad_sizes() -> None:
    with pytest.raises(ConfigError, match="batch_lookups"):
        stats(_trace([1]), batch_lookups=0)


def test_bundled_trace_locality() -> None:
    s = stats(resolve("reuse-medium-500k"), batch_lookups=307_200, top_k=60_000)
    assert (s.accesses, s.unique_rows) == (429_951, 102_524)
    assert s.top_k_coverage == pytest.approx(0.88, abs=0.03)  # measured 0.877
    assert s.unique_frac_per_batch == pytest.approx(0.26, abs=0.03)  # measured 0.262


@pytest.mark.parametrize(
    ("name", "coverage"), [("reuse-high", 0.95), ("reuse-medium", 0.88), ("reuse-low", 0.60)]
)
def test_presets_hit_their_calibrated_coverage(name: str, coverage: float) -> None:
    s = stats(resolve(name, seed=3), top_k=60_000)
    assert s.accesses == 1_000_000
    assert s.top_k_coverage == pytest.approx(coverage, abs=0.01)


def test_hot_rows_most_frequent_first_ties_by_id() -> None:
    hot = hot_rows(_trace([5, 3, 5, 3, 2, 7, 7, 7], [0, 0, 4], rows=8), k=3)
    assert [h.tolist() for h in hot] == [[7, 3, 5], [0, 4, 1]]
    assert hot[0].dtype == torch.int64
    assert hot_rows(_trace([1], rows=2), k=5)[0].tolist() == [1, 0]
    with pytest.raises(ConfigError, match="k must be"):
        hot_rows(_trace([1]), k=0)
