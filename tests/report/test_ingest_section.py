"""The report's ingestion section: quick build, its numbers equal to the benchmark's judgement
and to each other, the paragraph computed from them, escaping, and its place in the report."""

from __future__ import annotations

import html
import json
import math
import re
from typing import Any

import pytest

from recperf.ingest.base import Allocation
from recperf.ingest.sim import model as sim
from recperf.ingest.sim import solve
from recperf.ingest.tuning import simulate
from recperf.report import ingest_ray
from recperf.report import ingest_section as ing
from recperf.report.builder import SECTIONS
from recperf.report.cluster_section import cluster_section
from recperf.report.ingest_peers import load_bundled, peers_html
from recperf.report.netsens_section import netsens_section
from recperf.report.section import Section

from .conftest import QuickSections

EVIL = "<script>alert(1)</script>"
EVIL_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
QUICK_FIGURES = ("sim-0-criteo-16", "sim-split", "live-throughput", "live-split")
# the side-by-side bars against the peers, when a benchmark result is bundled
BENCH = load_bundled()
if BENCH is not None:
    QUICK_FIGURES = (*QUICK_FIGURES, "peers")
# and one Ray Data figure per part of the bundled Ray benchmark
RAY_PARTS = ingest_ray.parts(ingest_ray.load_bundled())
QUICK_FIGURES = (*QUICK_FIGURES, *(f"ray-{p}" for p in RAY_PARTS))


@pytest.fixture(scope="module")
def quick(quick_sections: QuickSections) -> tuple[Section, list[float]]:
    built = quick_sections.get(ing.ingest_section)
    return built.section, built.fractions


def _specs(page: str) -> list[dict[str, Any]]:
    found = re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', page, re.S)
    return [json.loads(spec) for spec in found]


def test_quick_simulated_runs_match_the_benchmark(quick: tuple[Section, list[float]]) -> None:
    data = quick[0].data
    assert data["tuners"] == list(ing.TUNER_NAMES)
    (spec_data,) = data["simulated"]
    assert spec_data["spec"] == "criteo-16"
    assert [r["tuner"] for r in spec_data["runs"]] == list(ing.TUNER_NAMES)
    assert [r["status"] for r in spec_data["runs"]] == ["ok"] * len(ing.TUNER_NAMES)
    spec = sim.load_spec("criteo-16")
    bound = solve.lp_bound(spec)
    assert spec_data["lp_bound_rows_per_s"] == bound.throughput_rows_per_s
    assert spec_data["stages"] == [s.name for s in spec.stages]
    assert sum(spec_data["lp_workers"].values()) == pytest.approx(spec.cores)  # cores bind
    for run in spec_data["runs"]:
        expected = simulate("criteo-16", run["tuner"], budget_s=ing.QUICK_SIM_BUDGET_S)
        segs = expected["allocation"]["segments"]
        assert run["allocation"] == {"+".join(g["stages"]): g["workers"] for g in segs}
        for key in ("throughput_rows_per_s", "fraction_of_bound", "fraction_of_oracle"):
            assert run[key] == pytest.approx(expected[key], rel=1e-12), key
        for key in ("tuning_steps", "refused", "peak_memory_bytes", "found_at_s", "history"):
            assert run[key] == expected[key], key
        chosen = Allocation(workers=tuple(expected["workers"]), cuts=tuple(expected["cuts"]))
        thr = spec.throughput(chosen)
        assert run["fraction_of_bound"] == pytest.approx(thr / bound.throughput_rows_per_s)
        times = [h["elapsed_s"] for h in run["history"]]
        assert len(times) == run["tuning_steps"] and times == sorted(times)
        assert times[-1] <= ing.QUICK_SIM_BUDGET_S + 1e-9
        assert run["found_at_s"] in times
        assert run["peak_memory_bytes"] <= spec_data["memory_budget_bytes"]


def test_quick_live_run_is_consistent(quick: tuple[Section, list[float]]) -> None:
    live = quick[0].data["live"]
    assert (live["rows"], live["batch_size"]) == (ing.QUICK_LIVE.rows, ing.QUICK_LIVE.batch_size)
    assert [r["tuner"] for r in live["runs"]] == list(ing.QUICK_LIVE.tuners)
    (run,) = live["runs"]
    assert run["status"] == "ok"
    joined = [st for seg in run["allocation"] for st in seg.split("+")]
    assert joined == run["stages"] == list(run["stage_cost_us_per_row"])
    assert all(w >= 1 for w in run["allocation"].values())
    assert run["fraction_of_bound"] == pytest.approx(
        run["throughput_rows_per_s"] / run["bound_rows_per_s"], rel=1e-12
    )
    assert run["throughput_rows_per_s"] > 0 and run["fraction_of_bound"] > 0
    if run["bound_binding"] == "cores":
        assert sum(run["bound_workers"].values()) == pytest.approx(run["cores"])
    times = [h["elapsed_s"] for h in run["history"]]
    assert len(times) == run["tuning_steps"] >= 1 and times == sorted(times)
    lo, hi = run["throughput_ci_rows_per_s"]
    assert lo <= run["throughput_rows_per_s"] <= hi and run["samples"] >= 3
    assert run["other_load_cores"] >= 0


def test_quick_html_shows_tables_figures_and_the_paragraph(
    quick: tuple[Section, list[float]],
) -> None:
    section, _ = quick
    assert (section.key, section.title) == (ing.KEY, ing.TITLE)
    page = section.html
    for part in QUICK_FIGURES:
        assert f'<div class="rp-figure" id="ingest-{part}"' in page
    assert page.count('class="rp-figure"') == len(QUICK_FIGURES)
    # simulated and live (nothing failed), and the Ray allocations where a scale run is bundled
    assert page.count('<table class="rp-table">') == 2 + ("scale" in RAY_PARTS)
    assert html.escape(ing.outcome_text(section.data["outcome"])) in page
    for run in section.data["simulated"][0]["runs"]:
        shown = f"{100 * run['fraction_of_bound']:,.1f}"
        assert re.search(rf'<td class="rp-l">{run["tuner"]}</td><td>(<strong>)?{shown}<', page)
    live = section.data["live"]["runs"][0]
    assert f"<td>{100 * live['fraction_of_bound']:,.1f}</td>" in page
    assert f"this machine ({live['cores']} cores" in page
    lo, hi = live["throughput_ci_rows_per_s"]
    assert f"<td>± {(hi - lo) / 2:,.0f} ({live['samples']})</td>" in page
    assert f"<td>{live['other_load_cores']:,.2f}</td>" in page
    figures = _specs(page)
    live_line = next(f for f in figures if "Live: measured" in json.dumps(f["layout"]["title"]))
    bars = live_line["data"][0]["error_y"]
    steps = live["history"]
    assert bars["arrayminus"][0] == pytest.approx(
        steps[0]["throughput_rows_per_s"] - steps[0]["throughput_ci_rows_per_s"][0]
    )
    line = figures[0]  # the simulated line figure: one trace per tuner, history as points
    assert [t["name"] for t in line["data"]] == list(ing.TUNER_NAMES)
    static = section.data["simulated"][0]["runs"][0]
    assert line["data"][0]["x"] == [h["elapsed_s"] for h in static["history"]]


def test_progress_rises_to_one(quick: tuple[Section, list[float]]) -> None:
    _, fractions = quick
    assert len(fractions) >= 3
    assert fractions == sorted(fractions)
    assert fractions[-1] == 1.0 and fractions[0] > 0


def _ok_run(tuner: str, fraction: float, refused: int = 0) -> dict[str, Any]:
    return {
        "tuner": tuner,
        "status": "ok",
        "fraction_of_bound": fraction,
        "fraction_of_oracle": fraction / 0.5,
        "refused": refused,
    }


def test_outcome_names_best_worst_refusals_and_failures() -> None:
    simulated = [
        {
            "spec": "a-4",
            "cores": 4,
            "lp_binding": "memory",
            "runs": [
                _ok_run("static", 0.2),
                _ok_run("plumber", 0.5, refused=3),
                _ok_run("oracle", 0.5),
                {"tuner": "intune", "status": "failed", "error": "boom"},
            ],
        },
        {"spec": "b-8", "cores": 8, "lp_binding": "cores", "runs": []},
    ]
    live = {
        "machine_cores": 2,
        "runs": [
            {"tuner": "static", "status": "ok", "cores": 2, "throughput_rows_per_s": 1000.0,
             "fraction_of_bound": 0.25},
            {"tuner": "plumber", "status": "ok", "cores": 2, "throughput_rows_per_s": 3000.0,
             "fraction_of_bound": 0.75},
        ],
    }  # fmt: skip
    outcome = ing.measured_outcome(simulated, live)
    assert outcome["simulated"][0]["best"] == ["plumber", "oracle"]
    assert outcome["live"]["best"] == ["plumber"]
    assert ing.outcome_text(outcome) == (
        "Simulated (final allocations judged by the noise-free model): on a-4 (4 cores, LP "
        "bound set by memory) plumber and oracle reached 50.0% of the LP bound (100.0% of the "
        "oracle), static the least at 20.0%; the target refused 3 of plumber's proposals; "
        "intune failed; on b-8 (8 cores, LP bound set by cores) no tuner finished. Live on "
        "this machine (2 cores): plumber measured the most, 3,000 rows/s, 75.0% of the bound "
        "from its measured stage costs; static 25.0%."
    )
    assert math.isnan(outcome["simulated"][1]["best_fraction_of_oracle"])


def test_outcome_states_the_live_spread_and_other_load() -> None:
    run = {"tuner": "plumber", "status": "ok", "cores": 2, "throughput_rows_per_s": 3000.0,
           "fraction_of_bound": 0.75, "throughput_ci_rows_per_s": [2850.0, 3150.0],
           "samples": 6, "other_load_cores": 0.4}  # fmt: skip
    outcome = ing.measured_outcome([], {"machine_cores": 2, "runs": [run]})
    assert outcome["live"]["samples"] == 6
    assert ing.outcome_text(outcome).endswith(
        "Live on this machine (2 cores): plumber measured the most, 3,000 rows/s (± 150 at 90% "
        "over 6 sub-windows, with 0.40 cores of other load on the machine), 75.0% of the bound "
        "from its measured stage costs."
    )


def _evil_simulated(payload: str) -> dict[str, Any]:
    """criteo-16's quick simulation with its spec, a stage and a tuner renamed to ``payload``,
    and one failed run whose error carries it."""
    data = ing.simulate_spec("criteo-16", ("static", "plumber"), 5.0)
    stage = data["stages"][0]

    def rename(d: dict[str, Any]) -> dict[str, Any]:
        return {payload if k == stage else k: v for k, v in d.items()}

    data["spec"] = f"spec-{payload}"
    data["stages"] = [payload, *data["stages"][1:]]
    data["lp_workers"] = rename(data["lp_workers"])
    for run in data["runs"]:
        run["allocation"] = rename(run["allocation"])
    data["runs"][1]["tuner"] = payload
    data["runs"].append({"tuner": "intune", "status": "failed", "error": f"Boom: {payload}"})
    return data


def _evil_live(payload: str) -> dict[str, Any]:
    stages = [payload, "collate"]
    run = {
        "status": "ok", "tuner": payload, "cores": 2, "stages": stages,
        "allocation": {payload: 1, "collate": 1}, "throughput_rows_per_s": 10.0,
        "bound_rows_per_s": 20.0, "bound_binding": "cores", "fraction_of_bound": 0.5,
        "tuning_s": 1.0, "budget_s": 1.0, "tuning_steps": 1, "refused": 0,
        "peak_memory_bytes": 1.0, "memory_budget_bytes": 2.0,
        "stage_cost_us_per_row": {payload: 1.0, "collate": 1.0},
        "bound_workers": {payload: 1.0, "collate": 1.0},
        "history": [{"elapsed_s": 1.0, "allocation": [1, 1], "throughput_rows_per_s": 10.0}],
    }  # fmt: skip
    failed = {"tuner": "plumber", "status": "failed", "error": payload}
    return {"machine_cores": 2, "rows": 1, "shards": 1, "batch_size": 1, "budget_s": 1.0,
            "seed": 0, "runs": [run, failed]}  # fmt: skip


def test_names_and_errors_are_escaped() -> None:
    section = ing.section_from_runs([_evil_simulated(EVIL)], _evil_live(EVIL))
    page = section.html
    assert EVIL not in page
    assert f'<td class="rp-l">spec-{EVIL_ESCAPED}</td><td class="rp-l">{EVIL_ESCAPED}</td>' in page
    assert f'<td class="rp-l">Boom: {EVIL_ESCAPED}</td>' in page  # the failed run's error
    assert '<td class="rp-l">live</td><td class="rp-l">plumber</td>' in page
    assert f"on spec-{EVIL_ESCAPED} (16 cores" in page  # the paragraph
    figures = _specs(page)
    assert len(figures) == 4 + (BENCH is not None) + len(RAY_PARTS)  # each spec ends right
    labels = json.dumps(figures)
    assert EVIL_ESCAPED in labels and "<script" not in labels
    split = figures[1]
    assert EVIL_ESCAPED in [t["name"] for t in split["data"]]  # the renamed stage
    assert f"{EVIL_ESCAPED}" in split["data"][0]["x"]  # the renamed tuner's bar


def test_report_includes_the_section_after_the_cluster_ones() -> None:
    assert SECTIONS.count(ing.ingest_section) == 1
    after = SECTIONS.index(ing.ingest_section)
    assert SECTIONS.index(cluster_section) < after and SECTIONS.index(netsens_section) < after


def test_peer_bars_show_every_peer_of_the_bundled_benchmark() -> None:
    bench = {
        "date": "2026-12-01", "machine": {"cpus": 2}, "command": "python b.py", "reps": 3,
        "seconds": 6.0,
        "settings": {
            "tsv": {"recperf": {"rows_per_s": 9e5, "variant": "auto", "workers": 2},
                    "dataloader": {"rows_per_s": 6e5, "variant": "", "workers": 0}},
            "parquet": {"recperf": {"rows_per_s": 1.2e6, "variant": "auto", "workers": 2},
                        "spdl": {"error": "boom"}},
        },
    }  # fmt: skip
    page = peers_html(bench)
    (fig,) = _specs(page)
    bars = {t["name"]: t["y"] for t in fig["data"]}
    assert bars["recperf (tuned, --alloc auto)"] == [900.0, 1200.0]
    assert bars["PyTorch DataLoader"] == [600.0, 0.0]
    assert "SPDL" in bars and bars["SPDL"] == [0.0, 0.0]
    assert "python b.py" in page and peers_html(None) == ""
