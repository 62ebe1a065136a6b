"""The report's summary: each row computed from the numbers its section carries, with a verdict
from the spread, and the same rows in report.json."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest

from recperf.report.section import JctCurve, Section, cdf_ranks, jct_cdf_figure
from recperf.report.summary import Headline, headlines, summary_html, verdict_of


def _peer(peer: str, rows: float, lo: float, hi: float) -> dict[str, Any]:
    return {"peer": peer, "variant": "thread", "runs": 3, "rows_per_s": rows,
            "rows_per_s_min": lo, "rows_per_s_max": hi}  # fmt: skip


def _ingest(ours: tuple[float, float, float]) -> Section:
    settings = {
        "tsv": {"recperf": _peer("recperf", *ours), "nodes": _peer("nodes", 100.0, 95.0, 105.0)},
        "parquet": {"recperf": _peer("recperf", 50.0, 45.0, 55.0),
                    "spdl": _peer("spdl", 100.0, 90.0, 110.0)},
    }  # fmt: skip
    return Section("Ingest", "ingest", "", {"peers": {"date": "2026-12-01", "settings": settings}})


def _cluster(srtf_jct: float) -> Section:
    def run(jct: dict[str, float]) -> dict[str, Any]:
        return {"schedulers": {n: {"jct_mean_s": v} for n, v in jct.items()}}

    traces = {"helios-500": run({"fifo": 400.0, "srtf": srtf_jct, "sjf": 150.0})}
    return Section("Cluster", "cluster", "", {"traces": traces})


def _netsens(netsens_jct: float) -> Section:
    runs = [
        {"status": "ok", "congestion": c, "scheduler": n, "jct_mean_s": v}
        for c in (1.0, 2.0)
        for n, v in (("netsens", netsens_jct), ("tiresias", 300.0), ("fifo", 400.0))
    ]
    return Section("Netsens", "netsens", "", {"trace": "helios-500", "runs": runs})


@pytest.mark.parametrize(
    ("low", "high", "measured", "verdict"),
    [(1.1, 1.3, True, "ahead"), (0.5, 0.9, True, "behind"), (0.9, 1.1, True, "within noise"),
     (1.1, 1.3, False, "model only"), (math.nan, math.nan, True, "not run")],
)  # fmt: skip
def test_the_verdict_follows_the_spread(
    low: float, high: float, measured: bool, verdict: str
) -> None:
    assert verdict_of(low, high, measured=measured) == verdict


def test_the_ingest_row_changes_with_its_numbers() -> None:
    (row,) = headlines([_ingest((130.0, 120.0, 140.0))])
    assert row.verdict == "ahead" and row.ratio == pytest.approx(1.3)
    assert (row.ratio_low, row.ratio_high) == pytest.approx((120 / 105, 140 / 95))
    assert "tsv" in row.figure and "nodes" in row.against
    assert "On parquet: 0.50x" in row.note and "(behind)" in row.note
    (slower,) = headlines([_ingest((98.0, 90.0, 104.0))])
    assert slower.verdict == "within noise" and slower.ratio == pytest.approx(0.98)
    (behind,) = headlines([_ingest((60.0, 55.0, 65.0))])
    assert (behind.verdict == "behind" and "parquet" in behind.note) or "tsv" in behind.note


def test_the_netsens_row_compares_with_every_scheduler_that_ran_the_trace() -> None:
    """netsens beats its own grid but not SRTF of section 1: the row says SRTF is better."""
    cluster, netsens = _cluster(srtf_jct=120.0), _netsens(netsens_jct=130.0)
    row = next(h for h in headlines([cluster, netsens]) if h.section == "netsens")
    assert row.against.startswith("srtf") and row.ratio == pytest.approx(120 / 130)
    row = next(h for h in headlines([_cluster(srtf_jct=160.0), netsens]) if h.section == "netsens")
    assert row.against.startswith("sjf") and row.ratio == pytest.approx(150 / 130)
    alone = next(h for h in headlines([netsens]) if h.section == "netsens")
    assert alone.against.startswith("tiresias") and "this grid" in alone.against


def test_rows_round_trip_through_json_and_render_escaped() -> None:
    (row,) = headlines([_ingest((130.0, 120.0, 140.0))])
    assert Headline.from_json(copy.deepcopy(row.to_json())) == row
    evil = Headline(capability="<b>x</b>", section="ingest", figure="f", against="a",
                    ratio=math.nan, ratio_low=math.nan, ratio_high=math.nan,
                    verdict="not run", basis="b")  # fmt: skip
    page = summary_html([row, evil])
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert 'href="#ingest"' in page and "1.30x [1.14–1.47]" in page
    assert evil.to_json()["ratio"] is None


def test_a_long_cdf_is_drawn_at_a_few_hundred_ranks() -> None:
    ranks = cdf_ranks(3000)
    assert len(ranks) <= 400 and ranks[0] == 0 and ranks[-1] == 2999
    assert list(cdf_ranks(5)) == [0, 1, 2, 3, 4]
    jct = np.arange(1.0, 3001.0)
    jct[-10:] = np.nan  # ten jobs never finished: the curve ends below 1
    fig = jct_cdf_figure([JctCurve("a", jct, [str(i) for i in range(3000)])], "t")
    y = fig.data[0].y
    assert len(y) <= 400 and y[-1] == pytest.approx(2990 / 3000)
    assert list(y) == sorted(y)


def test_the_embed_table_ranks_only_where_the_quartiles_part() -> None:
    from recperf.report.embed_section import spread_verdicts

    def run(hot: tuple[float, float]) -> dict[str, Any]:
        return {"variants": [
            {"variant": "torch", "ms_q1": 1.0, "ms_q3": 1.2},
            {"variant": "torch-hot", "ms_q1": hot[0], "ms_q3": hot[1]},
        ]}  # fmt: skip

    assert spread_verdicts(run((0.7, 0.9)))["torch-hot"] == "faster"
    assert spread_verdicts(run((1.1, 1.4)))["torch-hot"] == "within noise"
    assert spread_verdicts(run((1.3, 1.5)))["torch-hot"] == "slower"
    assert spread_verdicts(
        {"variants": [{"variant": "torch-hot", "ms_q1": 1.0, "ms_q3": 2.0}]}
    ) == {"torch-hot": ""}


def test_the_embed_row_is_the_drop_in_on_its_worst_setting() -> None:
    def v(name: str, kind: str, ms: float) -> dict[str, Any]:
        return {"variant": name, "kind": kind, "ms_per_batch": ms, "ms_q1": 0.9 * ms,
                "ms_q3": 1.1 * ms}  # fmt: skip

    def setting(dtype: str, dropin_ms: float) -> dict[str, Any]:
        return {"config": "paper", "dtype": dtype, "trace": "t", "threads": 1, "variants": [
            v("torch", "recperf", 1.0), v("EmbeddingBags(auto)", "recperf", dropin_ms),
            v("nn.EmbeddingBag concat", "peer", 2.0)]}  # fmt: skip

    peers = {"date": "2026-12-02", "calls": 9,
             "settings": [setting("fp32", 1.0), setting("int8", 4.0)]}  # fmt: skip
    (row,) = headlines([Section("Embed", "embed", "", {"cpu_peers": peers})])
    assert row.figure.startswith("EmbeddingBags(auto): 4.00 ms") and "int8" in row.figure
    assert row.ratio == pytest.approx(0.5) and row.verdict == "behind"
    assert (row.ratio_low, row.ratio_high) == pytest.approx((1.8 / 4.4, 2.2 / 3.6))


def test_the_embed_row_compares_the_drop_in_given_the_fastest_peers_input() -> None:
    """Where the sitting says what each variant took, the drop-in given the input the fastest
    peer is given stands against it (here the TBE layout), not the one given per-bag inputs."""

    def v(name: str, kind: str, ms: float, takes: str) -> dict[str, Any]:
        return {"variant": name, "kind": kind, "ms_per_batch": ms, "ms_q1": 0.9 * ms,
                "ms_q3": 1.1 * ms, "takes": takes}  # fmt: skip

    setting = {"config": "mlperf", "dtype": "fp16", "trace": "t", "threads": 1, "variants": [
        v("EmbeddingBags(auto)", "recperf", 2.4, "per bag"),
        v("EmbeddingBags(auto), TBE-layout input", "recperf", 2.1, "TBE layout"),
        v("nn.EmbeddingBag x T", "peer", 2.6, "per bag"),
        v("nn.EmbeddingBag concat", "peer", 2.0, "TBE layout")]}  # fmt: skip
    peers = {"date": "2026-12-03", "calls": 9, "builds": 3, "settings": [setting]}
    (row,) = headlines([Section("Embed", "embed", "", {"cpu_peers": peers})])
    assert row.figure.startswith("EmbeddingBags(auto), TBE-layout input: 2.10 ms")
    assert row.ratio == pytest.approx(2.0 / 2.1) and "x 3 builds" in row.basis
