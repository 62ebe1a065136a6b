"""The typed results (issue 28, item 1): summary.json documents users already have read back
with the same keys and values, the one builder reproduces an old profile summary from the same
measurements, and each per-iteration object and comm sample round-trips through JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from recperf.core.errors import ConfigError
from recperf.stalls.model.comm import CommSample
from recperf.stalls.result import FIGURES, StallBreakdown, StallSummary
from recperf.stalls.run.differential import RunStats
from recperf.stalls.run.profile import ProfileConfig, _summary

OLD = Path(__file__).resolve().parents[1] / "data" / "stalls" / "old_summary.json"
"""A profile's summary.json as the code before the typed results wrote it (mlp, 2 ranks, real
data, torch.profiler traces on: every kind of key a profile writes)."""


@pytest.fixture(scope="module")
def old() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(OLD.read_text())
    return data


def test_an_old_summary_reads_back_with_its_keys_and_values(old: dict[str, Any]) -> None:
    summary = StallSummary.from_json(old, str(OLD))
    assert summary.iteration_s == old["iteration_s"] and summary.source is None
    assert summary.to_json() == old
    assert set(summary.fractions()) == {k.removesuffix("_s") + "_frac" for k in FIGURES}


def test_the_builder_reproduces_an_old_profile_summary(old: dict[str, Any]) -> None:
    """The same runs' statistics and samples through today's builder give the old document."""
    config = ProfileConfig(
        workload=old["workload"], workload_options=old["workload_options"],
        ranks=old["ranks"], nodes=old["nodes"], iters=old["iters"],
        batch_size=old["batch_size"], threads=old["threads_per_rank"], device=old["device"],
        delay_ms=old["delay_ms"],
    )  # fmt: skip
    stats = {r["name"]: RunStats.from_json(r) for r in old["runs"]}
    samples = [CommSample.from_json(s) for s in old["comm_samples"]]
    new = _summary(config, stats, samples, dict(old["skipped"]), [1]).to_json()
    host = {"created_utc", "host_cores", "host_load_1min", "warnings", "torch_trace"}
    expected = {k: v for k, v in old.items() if k not in host}
    expected["method"] = {k: v for k, v in old["method"].items() if k != "torch_trace"}
    assert {k: v for k, v in new.items() if k != "created_utc"} == expected


def test_a_summary_without_a_figure_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"old\.json: network_stall_s: expected a number"):
        StallSummary.from_json({f: 1.0 for f in ("iteration_s", *FIGURES[:-1])}, "old.json")


def test_breakdown_and_sample_round_trip() -> None:
    b = StallBreakdown(rank=1, step=7, iteration_s=0.5, data_wait_s=0.1, compute_s=0.3,
                       exposed_comm_s=0.1, overlapped_comm_s=0.2, comm_busy_s=0.3, collectives=2,
                       allreduces=2, comm_bytes=None, allreduce_bytes=None, flops=None,
                       backward_s=0.2)  # fmt: skip
    data = b.to_json()
    assert "rank" not in data and "gpu_compute_s" not in data and data["backward_s"] == 0.2
    assert StallBreakdown.from_json(data, rank=1) == b
    with pytest.raises(ConfigError, match="unknown key 'bogus'"):
        StallBreakdown.from_json({**data, "bogus": 1}, rank=1)
    s = CommSample(grad_bytes=1e6, buckets=2, ranks=4, nodes=2, bandwidth_bytes_per_s=1e9,
                   seconds=0.01)  # fmt: skip
    assert CommSample.from_json(s.to_json()) == s


def test_per_rank_rows_and_the_slowest_rank_keep_their_json_keys() -> None:
    from recperf.stalls.result import RankMeans, SlowestRank
    from recperf.stalls.trace.breakdown import MEAN_KEYS, slowest_rank

    def row(rank: int, median_s: float) -> RankMeans:
        means = dict.fromkeys(MEAN_KEYS, 1.0)
        return RankMeans(rank=rank, source=f"r{rank}.json", host=None, iterations=3,
                         iteration_median_s=median_s, **means)  # fmt: skip

    rows = [row(0, 1.0), row(1, 3.0), row(2, 2.0)]
    assert list(rows[0].to_json()) == ["rank", "source", "host", "iterations",
                                       "iteration_median_s", *MEAN_KEYS]  # fmt: skip
    slow = slowest_rank(rows)
    assert isinstance(slow, SlowestRank)
    assert slow.to_json() == {"rank": 1, "iteration_median_s": 3.0, "others_median_s": 1.5,
                              "margin_s": 1.5, "margin_frac": 1.0}  # fmt: skip
    assert slowest_rank(rows[:1]) is None
