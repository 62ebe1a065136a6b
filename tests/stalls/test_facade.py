"""``StallAnalysis`` (issue 28, item 3): loaded once from the bundled Kineto traces, its
DataFrames agree with the summary ``stalls analyze`` writes from the same traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from recperf.core.errors import ConfigError
from recperf.stalls import StallAnalysis
from recperf.stalls.trace.kineto import analyze_paths, find_traces

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"


@pytest.fixture(scope="module")
def sampled() -> StallAnalysis:
    return StallAnalysis(DATA / "hta_sampled_128gpu")


def test_the_summary_is_analyzes(sampled: StallAnalysis) -> None:
    ours = sampled.summary().to_json()
    theirs = analyze_paths(find_traces([DATA / "hta_sampled_128gpu"])).to_json()
    ours.pop("created_utc"), theirs.pop("created_utc")
    assert ours == theirs


def test_breakdown_rows_are_the_summarys_iterations(sampled: StallAnalysis) -> None:
    frame = sampled.breakdown()
    summary = sampled.summary().to_json()
    assert len(frame) == sum(len(its) for its in summary["iterations"].values())
    for row in summary["per_rank"]:
        mine = frame[frame["rank"] == row["rank"]]
        assert len(mine) == row["iterations"]
        for key in ("iteration_s", "data_wait_s", "compute_s", "exposed_comm_s"):
            assert mine[key].mean() == pytest.approx(row[key], rel=1e-12), key
    comm = sampled.comm()
    assert list(comm["comm_busy_s"]) == list(frame["comm_busy_s"])
    assert "data_wait_s" not in comm.columns


def test_slowest_ranks_match_the_summary(sampled: StallAnalysis) -> None:
    slow = sampled.summary().to_json()["slowest_rank"]
    first = sampled.slowest_ranks(1).iloc[0]
    assert int(first["rank"]) == slow["rank"]
    assert first["margin_s"] == pytest.approx(slow["margin_s"], rel=1e-12)
    assert first["margin_frac"] == pytest.approx(slow["margin_frac"], rel=1e-12)
    assert len(sampled.slowest_ranks()) == len(sampled.traces)


def test_data_wait_timeline_adds_up_to_the_waits(sampled: StallAnalysis) -> None:
    timeline = sampled.data_wait_timeline()
    frame = sampled.breakdown().set_index(["rank", "step"])
    assert (timeline["end_s"] >= timeline["start_s"]).all() and (timeline["start_s"] >= 0).all()
    per = timeline.groupby(["rank", "step"])["data_wait_s"].sum()
    for key, total in per.items():
        assert total == pytest.approx(frame.loc[key, "data_wait_s"], rel=1e-9, abs=1e-12)


def test_skip_steps_and_bad_input(sampled: StallAnalysis) -> None:
    fewer = StallAnalysis([DATA / "hta_sampled_128gpu"], skip_steps=1)
    assert len(fewer.breakdown()) == len(sampled.breakdown()) - len(sampled.traces)
    with pytest.raises(ConfigError, match="skip_steps"):
        StallAnalysis(DATA / "hta_sampled_128gpu", skip_steps=-1)


def test_breakdown_figure_stacks_the_means(sampled: StallAnalysis) -> None:
    fig = sampled.breakdown_figure()
    frame = sampled.breakdown()
    assert [t.name for t in fig.data] == ["compute", "data wait", "exposed communication"]
    compute = frame.groupby("rank")["compute_s"].mean() * 1e3
    assert list(fig.data[0].y) == pytest.approx(list(compute))
