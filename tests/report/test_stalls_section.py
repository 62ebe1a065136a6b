"""The report's stall section: a quick profile, its numbers equal to the profile's summary, the
fitted model's and the advisor's, the figures drawn from them, escaping, and the skip paths."""

from __future__ import annotations

import copy
import html
import json
import math
import re
from typing import Any

import pytest

from recperf.core.results import dumps_json
from recperf.report import stalls_section as st
from recperf.report.builder import SECTIONS
from recperf.report.ingest_section import ingest_section
from recperf.report.section import FIGURE_CLASS, Section
from recperf.stalls.cost.advisor import AdvisorConfig, ProfileSummary, advise
from recperf.stalls.model.comm import PARAMS, CommSample
from recperf.stalls.model.fit import fit
from recperf.stalls.result import STALLS
from recperf.stalls.run import netem
from recperf.stalls.study import LATENCY_HOLD

from .conftest import QuickSections

EVIL = "<script>alert(1)</script>"
EVIL_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
FIGURE_DIV = f'<div class="{FIGURE_CLASS}" id="'


@pytest.fixture(scope="module")
def quick(quick_sections: QuickSections) -> tuple[Section, list[float], dict[str, Any]]:
    """The quick section, its progress fractions and the summary its profile returned."""
    built = quick_sections.get(st.stalls_section)
    return built.section, built.fractions, built.captured


def _jsonable(data: Any) -> Any:
    return json.loads(dumps_json({"x": data}))["x"]


def _spec(page: str, fig_id: str) -> dict[str, Any]:
    found = re.search(rf'<script type="application/json" id="{fig_id}-spec">(.*?)</script>', page)
    assert found is not None, fig_id
    spec: dict[str, Any] = json.loads(found.group(1))
    return spec


def test_section_follows_ingest_in_the_report() -> None:
    assert SECTIONS[SECTIONS.index(ingest_section) + 1] is st.stalls_section


def test_default_configs() -> None:
    q, full = st.default_config(True), st.default_config(False)
    assert (q.workload, q.ranks, q.nodes, q.iters, q.warmup, q.real_data) == (
        "mlp", 2, 1, 3, 1, False,
    )  # fmt: skip
    assert (full.workload, full.ranks, full.bandwidth, full.iters, full.warmup) == (
        "dlrm", 2, "500mbit", 12, 3,
    )  # fmt: skip
    assert full.nodes == (2 if netem.available() is None else 1)
    assert full.fit_bandwidths == (("2gbit",) if full.nodes > 1 else ())


def test_quick_section_has_three_figures(
    quick: tuple[Section, list[float], dict[str, Any]],
) -> None:
    section, _, summary = quick
    assert (section.title, section.key) == ("Distributed-training stalls", "stalls")
    assert len(summary["comm_samples"]) == 6  # the intra run's microbenchmark sizes
    ids = re.findall(rf'{re.escape(FIGURE_DIV)}([^"]+)"', section.html)
    assert ids == ["stalls-breakdown", "stalls-comm-model", "stalls-pareto"]
    assert "<strong>Note:</strong>" not in section.html  # nothing skipped in the quick run


def test_data_equals_the_summary(quick: tuple[Section, list[float], dict[str, Any]]) -> None:
    section, _, summary = quick
    data = section.data
    assert data["figures"] == _jsonable({k: summary[k] for k in st.SCALARS})
    assert data["cross_check"] == _jsonable(summary["cross_check"])
    assert list(data["cross_check"]) == ["interconnect_stall_s"]
    assert data["method"] == summary["method"]
    assert data["runs"] == _jsonable(summary["runs"])
    assert [r["name"] for r in data["runs"]] == ["compute", "control", "intra"]
    figs = data["figures"]
    parts = figs["compute_s"] + sum(figs[k] for k in STALLS) + figs["unexplained_s"]
    assert parts == pytest.approx(figs["iteration_s"], rel=1e-9)
    assert figs["interconnect_stall_frac"] == pytest.approx(
        figs["interconnect_stall_s"] / figs["iteration_s"], rel=1e-12
    )
    json.dumps(data, allow_nan=False)  # report.json-ready as it stands


def test_the_torch_trace_comparison_keeps_its_keys(
    quick: tuple[Section, list[float], dict[str, Any]],
) -> None:
    section, _, summary = quick
    traced = section.data["torch_trace_analysis"]
    assert set(traced) == {"run", "iterations", "figures", "exposed_method"}
    assert traced["run"] == summary["runs"][-1]["name"] and traced["iterations"] == 2
    figs = traced["figures"]
    assert set(figs) == {"iteration_s", "data_wait_s", "compute_s", "exposed_comm_s",
                         "overlapped_comm_s"}  # fmt: skip
    scale = figs["iteration_s"]["direct"]
    for f in figs.values():
        assert set(f) == {"analyze", "direct", "diff_of_iteration"}
        assert f["diff_of_iteration"] == pytest.approx((f["analyze"] - f["direct"]) / scale)


def test_model_and_advice_equal_a_direct_fit(
    quick: tuple[Section, list[float], dict[str, Any]],
) -> None:
    section, _, summary = quick
    model = fit([CommSample(**s) for s in summary["comm_samples"]], hold=LATENCY_HOLD)
    assert section.data["comm_model"] == {p: getattr(model, p) for p in PARAMS}
    assert section.data["comm_model_fit"] == _jsonable(model.to_json())
    assert model.held == ("alpha_s",)  # every sample has 2 ranks
    assert model.unmeasured == ("net_efficiency", "beta_net_s_per_byte")  # one machine
    assert section.data["comm_model_rel_rmse"] == model.rel_rmse
    assert section.data["comm_model_samples"] == 6
    advice = advise(
        ProfileSummary.from_mapping(summary),
        AdvisorConfig(budget_h=2.0, epoch_samples=1_000_000),
        model=model,
    )
    expected = _jsonable(advice.to_json())
    assert section.data["advice"] == expected
    rec = expected["recommendation"]
    assert rec is not None and rec["meets_budget"] is True and rec["verdict"] == "meets"
    row = f'<tr><td class="rp-l">{html.escape(rec["instance"])}</td><td>{rec["count"]}</td>'
    assert row in section.html
    assert "<td>meets</td>" in section.html
    assert (
        "not measured, at the default: net_efficiency"
        in expected["assumptions"]["comm_model_source"]
    )


def test_figures_show_the_numbers(quick: tuple[Section, list[float], dict[str, Any]]) -> None:
    section, _, summary = quick
    bars = {t["name"]: t for t in _spec(section.html, "stalls-breakdown")["data"]}
    names = [r["name"] for r in summary["runs"]]
    assert bars["compute"]["x"] == [*names, "breakdown (differential)"]
    expected = [1e3 * r["compute_s"] for r in summary["runs"]] + [1e3 * summary["compute_s"]]
    assert bars["compute"]["y"] == pytest.approx(expected, rel=1e-12)
    assert bars["exposed communication"]["y"][:-1] == pytest.approx(
        [1e3 * r["exposed_comm_s"] for r in summary["runs"]], rel=1e-12
    )
    assert bars["interconnect stall"]["y"][-1] == pytest.approx(
        1e3 * summary["interconnect_stall_s"], rel=1e-12
    )
    comm = _spec(section.html, "stalls-comm-model")
    model = fit([CommSample(**s) for s in summary["comm_samples"]], hold=LATENCY_HOLD)
    (points,) = [t for t in comm["data"] if t["name"] == "1 node(s)"]
    samples = summary["comm_samples"]
    assert points["x"] == pytest.approx([1e3 * s["seconds"] for s in samples], rel=1e-12)
    predicted = [1e3 * model.predict(s["grad_bytes"], s["buckets"], 2) for s in samples]
    assert points["y"] == pytest.approx(predicted, rel=1e-12)
    assert comm["layout"]["xaxis"]["type"] == comm["layout"]["yaxis"]["type"] == "log"
    pareto = _spec(section.html, "stalls-pareto")
    assert len(pareto["data"][0]["x"]) == section.data["advice"]["candidates_evaluated"]


def test_progress_is_monotone_and_reaches_one(
    quick: tuple[Section, list[float], dict[str, Any]],
) -> None:
    _, fractions, _ = quick
    assert len(fractions) >= 5  # three runs, the analysis, the end
    assert fractions == sorted(fractions)
    assert fractions[0] >= 0.0 and fractions[-1] == 1.0
    assert max(f for f in fractions if f < 1.0) == pytest.approx(st.PROFILE_SHARE)


def test_methods_are_shown_escaped(quick: tuple[Section, list[float], dict[str, Any]]) -> None:
    section, _, summary = quick
    for key in ("iteration_s", "compute_s", *STALLS):
        method = summary["method"][key]
        assert "'" in method  # run names are quoted, so escaping shows
        assert f'<td class="rp-l">{html.escape(method)}</td>' in section.html


def _evil_summary(summary: dict[str, Any], samples: int) -> dict[str, Any]:
    evil = copy.deepcopy(summary)
    evil["comm_samples"] = evil["comm_samples"][:samples]
    evil["method"]["iteration_s"] = EVIL
    evil["skipped"] = {"network": f"no root {EVIL}"}
    evil["runs"][0]["name"] = EVIL
    evil["unexplained_s"] = math.nan
    return evil


def test_few_samples_skip_the_comm_figure_and_say_why(
    quick: tuple[Section, list[float], dict[str, Any]],
) -> None:
    section = st.section_from_summary(_evil_summary(quick[2], 2))
    ids = re.findall(rf'{re.escape(FIGURE_DIV)}([^"]+)"', section.html)
    assert ids == ["stalls-breakdown", "stalls-pareto"]
    assert "measured 2 all-reduce sample(s)" in section.html
    assert "fit: 2 samples; need at least 3" in section.html
    assert section.data["comm_model"] is None and section.data["comm_model_rel_rmse"] is None
    assert section.data["advice"]["assumptions"]["comm_model_source"].startswith("default")
    assert section.data["figures"]["unexplained_s"] is None
    json.dumps(section.data, allow_nan=False)


def test_names_and_reasons_are_escaped(
    quick: tuple[Section, list[float], dict[str, Any]],
) -> None:
    section = st.section_from_summary(_evil_summary(quick[2], 6))
    assert EVIL not in section.html
    assert f'<td class="rp-l">{EVIL_ESCAPED}</td>' in section.html  # the method cell
    assert f"run &#x27;network&#x27;: no root {EVIL_ESCAPED}" in section.html  # the skip note
    bars = _spec(section.html, "stalls-breakdown")["data"]
    assert bars[0]["x"][0] == EVIL_ESCAPED  # plotly renders labels as HTML
    assert "<script" not in json.dumps(bars)
    unexplained = re.search(r'<td class="rp-l">unexplained</td><td[^>]*>[^<]*</td>(.*?)</tr>',
                            section.html)  # fmt: skip
    assert unexplained is not None and unexplained.group(1) == "<td>—</td><td>—</td><td>—</td>"


def test_the_noisy_differential_data_stall_does_not_change_the_advice(
    quick: tuple[Section, list[float], dict[str, Any]],
) -> None:
    """Two identical profiles on a loaded host read differential data stalls of 54 ms and 0 ms;
    the advice rests on the loop's measured wait, so the section recommends the same setup."""
    noisy = copy.deepcopy(quick[2])
    noisy["data_fetch_stall_s"] = 0.054
    advice = [st.section_from_summary(s).data["advice"] for s in (quick[2], noisy)]
    assert advice[0]["recommendation"] == advice[1]["recommendation"]
    assert advice[0]["assumptions"]["data_stall"].startswith("direct: ")
