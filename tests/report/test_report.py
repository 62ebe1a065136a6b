"""The HTML report: figures present, report.json equal to the metrics, trace strings escaped,
and (with chromium) every figure really drawn in a headless browser."""

from __future__ import annotations

import html
import itertools
import json
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import pyarrow as pa
import pytest

import recperf
from recperf.cluster.api import RunSpec, build_scheduler, compare, run_summary, simulate
from recperf.cluster.base import PLACEMENTS
from recperf.cluster.engine import Simulator
from recperf.cluster.jobs import JobTable
from recperf.cluster.metrics import job_columns, summarize
from recperf.cluster.outcome import EngineConfig
from recperf.cluster.sweep import Sweep, SweepResult
from recperf.cluster.topology import PRESETS
from recperf.core.results import dumps_json
from recperf.report import browser, build_report, builder, ingest_ray
from recperf.report import netsens_section as ns
from recperf.report.builder import plotly_js, render_page, report_data, run_sections
from recperf.report.cluster_section import (
    SCHEDULERS,
    ClusterRun,
    cluster_section,
    section_from_runs,
)
from recperf.report.ingest_peers import load_bundled
from recperf.report.netsens_section import netsens_section
from recperf.report.section import figure_html

from .conftest import QuickSections

EVIL = "<script>alert(1)</script>"
EVIL_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
# Marks the DOM if it ever runs, so the browser test can tell.
EVIL_DOM = "<script>document.body.dataset.pwned='yes'</script>"
FIGURE_PARTS = ("jct-cdf", "util", "makespan", "jct-mean")
NETSENS_PARTS = ("jct-cdf", "makespan", "jct-mean", "comm")
# The ingestion section's figures: one line per simulated spec, one split, two live, and the
# side-by-side bars against the peers when a benchmark result is bundled, and one Ray Data
# figure per part (scale, real) of the bundled Ray benchmark.
PEER_BARS = 1 if load_bundled() is not None else 0
RAY_FIGURES = len(ingest_ray.parts(ingest_ray.load_bundled()))
INGEST_QUICK_FIGURES = 4 + PEER_BARS + RAY_FIGURES
# The stall section's figures: the breakdown, the all-reduce model and the advisor's frontier.
STALLS_FIGURES = 3
# The embedding section's figures: reuse distance, coverage, the CPU benchmark's ms, GB/s and
# stages (no GPU results are bundled yet), and the L2 model's hit rate against L2 size.
EMBED_FIGURES = 7
QUICK_SECTION_FIGURES = {
    "cluster": len(FIGURE_PARTS),
    "netsens": len(NETSENS_PARTS),
    "ingest": INGEST_QUICK_FIGURES,
    "stalls": STALLS_FIGURES,
    "embed": EMBED_FIGURES,
}
"""Every section of the quick report, by key, and how many figures it draws."""
CELLS = list(itertools.product(ns.SCHEDULERS, ns.CONGESTION))


@pytest.fixture(scope="module")
def quick_report(
    tmp_path_factory: pytest.TempPathFactory, quick_sections: QuickSections
) -> Iterator[tuple[Path, list[float]]]:
    """The quick report, its sections shared with the sections' own tests (each built once)."""
    fractions: list[float] = []
    shared = tuple(quick_sections.replay(b) for b in builder.SECTIONS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(builder, "SECTIONS", shared)
        out = build_report(tmp_path_factory.mktemp("report"), quick=True, progress=fractions.append)
    yield out, fractions


def evil_jobs(payload: str) -> JobTable:
    return JobTable.build(
        name=[payload, "ok-1", f"x{payload}y", "ok-3"],
        model=["resnet50", payload, "vgg16", payload],
        arrival_s=[0.0, 10.0, 20.0, 30.0],
        gpus=[4, 8, 1, 16],
        total_iters=[1000.0, 2000.0, 500.0, 800.0],
        compute_s=[0.1, 0.2, 0.05, 0.3],
        grad_bytes=[1e8, 2e8, 0.0, 4e8],
    )


def evil_netsens(payload: str) -> SweepResult:
    """A netsens-section sweep whose job, model, scheduler and trace names are ``payload``;
    one of its four cells failed, with the payload in its error."""
    jobs, cluster = evil_jobs(payload), PRESETS["helios"]
    sweep = Sweep(traces=(f"trace-{payload}",), schedulers=(payload, "sjf"), congestion=(1.0, 4.0))
    rows: list[dict[str, Any]] = []
    tables = []
    for name, c in itertools.product(sweep.schedulers, sweep.congestion):
        keys = {"trace": sweep.traces[0], "cluster": "helios", "scheduler": name, "congestion": c}
        if (name, c) == ("sjf", 4.0):
            rows.append({**keys, "seed": 0, "status": "failed", "error": f"Boom: {payload}"})
            continue
        policy = build_scheduler("fifo" if name == payload else name)
        engine = EngineConfig(congestion=c)
        res = Simulator(jobs, cluster, policy, PLACEMENTS.build("best-fit"), engine).run()
        rows.append({**summarize(res), **keys, "seed": 0, "status": "ok", "error": ""})
        n = len(jobs)
        tags = {"scheduler": [name] * n, "congestion": np.full(n, c)}
        tables.append(pa.table({**tags, **job_columns(res)}))
    columns = list(dict.fromkeys(k for row in rows for k in row))  # as run_sweep: same columns
    rows = [{k: row.get(k) for k in columns} for row in rows]
    return SweepResult(sweep, rows, pa.concat_tables(tables, promote_options="default"))


def evil_page(payload: str) -> str:
    """A report page (both cluster sections) from runs whose job, model, scheduler and trace
    names are ``payload``."""
    jobs = evil_jobs(payload)
    cluster = PRESETS["tiresias-n32g4"]
    results = {
        name: Simulator(jobs, cluster, build_scheduler(name), PLACEMENTS.build("best-fit")).run()
        for name in ("fifo", "sjf")
    }
    # Scheduler names are trace-like strings too: key one run by the payload.
    results = {payload: results["fifo"], "sjf": results["sjf"]}
    run = ClusterRun(trace=f"trace-{payload}", results=results, seconds=0.1)
    sections = [section_from_runs([run]), ns.section_from_sweep(evil_netsens(payload), 0.1)]
    return render_page(sections, datetime(2024, 1, 2, 3, 4, tzinfo=UTC))


def test_report_has_every_figure_and_inline_plotly(
    quick_report: tuple[Path, list[float]],
) -> None:
    out, _ = quick_report
    assert out.name == "report.html"
    page = out.read_text(encoding="utf-8")
    for part in FIGURE_PARTS:
        assert f'<div class="rp-figure" id="cluster-0-tiresias-480-{part}"' in page
    for part in NETSENS_PARTS:
        assert f'<div class="rp-figure" id="netsens-{part}"' in page
    assert page.count('class="rp-figure"') == sum(QUICK_SECTION_FIGURES.values())
    assert page.count("plotly.js (basic - minified) v") == 1  # the library itself, inline, once
    assert not re.search(r"<script[^>]+src=", page)  # nothing fetched from the network
    sections = json.loads((out.parent / "report.json").read_text(encoding="utf-8"))["sections"]
    assert sorted(sections) == sorted(QUICK_SECTION_FIGURES)
    assert sections["cluster"]["title"] == "GPU-cluster scheduling"
    assert sections["netsens"]["title"] == ns.TITLE
    for key, figures in QUICK_SECTION_FIGURES.items():  # each once, linked, with its figures
        assert page.count(f'<section id="{key}">') == 1, key
        assert f'<a href="#{key}">{html.escape(sections[key]["title"])}</a>' in page, key
        assert _section_html(page, key).count('class="rp-figure"') == figures, key
    assert f"recperf {recperf.__version__}" in page
    for name in SCHEDULERS:
        assert f'<td class="rp-l">{name}</td>' in page


def test_report_json_equals_summarize(quick_report: tuple[Path, list[float]]) -> None:
    out, _ = quick_report
    report = json.loads((out.parent / "report.json").read_text(encoding="utf-8"))
    assert report["quick"] is True
    assert report["recperf_version"] == recperf.__version__
    data = report["sections"]["cluster"]["data"]
    assert data["schedulers"] == list(SCHEDULERS)  # display order; JSON keys are sorted
    traces = data["traces"]
    assert list(traces) == ["tiresias-480"]
    run = traces["tiresias-480"]
    assert (run["cluster"], run["cluster_gpus"], run["jobs"]) == ("tiresias-n32g4", 128, 480)
    expected = compare(RunSpec(trace="tiresias-480"), list(SCHEDULERS))
    assert sorted(run["schedulers"]) == sorted(SCHEDULERS)
    for name, res in expected.items():
        assert run["schedulers"][name] == json.loads(dumps_json(summarize(res)))
    # The table shows the same numbers (mean JCT, rounded to whole seconds).
    page = out.read_text(encoding="utf-8")
    for summary in run["schedulers"].values():
        assert f"{summary['jct_mean_s']:,.0f}" in page


def _section_html(page: str, key: str) -> str:
    """The HTML of the page's section ``key``, as rendered (escaped)."""
    return page.split(f'<section id="{key}">', 1)[1].split("</section>", 1)[0]


def _netsens(out: Path) -> tuple[str, dict[str, Any]]:
    """The netsens section's HTML (unescaped) and its report.json data."""
    part = _section_html(out.read_text(encoding="utf-8"), "netsens")
    report = json.loads((out.parent / "report.json").read_text(encoding="utf-8"))
    return html.unescape(part), report["sections"]["netsens"]["data"]


def _cells(data: dict[str, Any]) -> dict[tuple[str, float], dict[str, Any]]:
    return {(r["scheduler"], r["congestion"]): r for r in data["runs"]}


def test_netsens_section_has_one_row_per_scheduler_and_congestion(
    quick_report: tuple[Path, list[float]],
) -> None:
    part, data = _netsens(quick_report[0])
    assert (data["trace"], data["cluster"]) == (ns.QUICK_TRACE, "helios")
    assert (data["schedulers"], data["congestion"]) == (list(ns.SCHEDULERS), list(ns.CONGESTION))
    # Rows in table order: by congestion, then scheduler.
    order = sorted(CELLS, key=lambda sc: (sc[1], ns.SCHEDULERS.index(sc[0])))
    assert [(r["scheduler"], r["congestion"]) for r in data["runs"]] == order
    assert {(r["status"], r["jobs_total"]) for r in data["runs"]} == {("ok", 100)}
    table = part.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    shown = re.findall(r'<tr><td class="rp-l">([^<]+)</td><td>([\d.]+)×</td>', table)
    assert [(s, float(c)) for s, c in shown] == order
    for part_id in NETSENS_PARTS:
        assert f'<div class="rp-figure" id="netsens-{part_id}"' in part


def test_netsens_numbers_equal_a_direct_simulation(
    quick_report: tuple[Path, list[float]],
) -> None:
    part, data = _netsens(quick_report[0])
    spec = RunSpec(
        trace="synthetic",
        cluster="helios",
        scheduler="netsens",
        seed=0,
        synthetic=ns.QUICK_SYNTHETIC,
        engine=EngineConfig(congestion=4.0),
    )
    expected = json.loads(dumps_json(run_summary(spec, simulate(spec))))
    row = _cells(data)[("netsens", 4.0)]
    assert row["trace"] == "synthetic@helios"  # the sweep's entry; the rest is the summary's
    assert {k: row[k] for k in expected if k != "trace"} == {
        k: v for k, v in expected.items() if k != "trace"
    }
    assert expected["preemptions"] > 0 and expected["comm_overhead_frac"] > 0
    row_html = re.search(r'<tr><td class="rp-l">netsens</td><td>4×</td>.*?</tr>', part)
    assert row_html is not None
    cells = re.findall(r"<td>(?:<strong>)?([^<]*)", row_html.group(0))
    assert cells[1:] == [
        f"{expected['makespan_s'] / 3600:,.2f}",
        f"{expected['jct_mean_s']:,.0f}",
        f"{expected['jct_p95_s']:,.0f}",
        f"{100 * expected['comm_overhead_frac']:,.1f}",
        f"{expected['preemptions']:,}",
        f"{100 * expected['locality_wait_share']:,.1f}",
        f"{expected['locality_wait_mean_s']:,.0f}",
    ]


def test_netsens_paragraph_states_what_the_numbers_show(
    quick_report: tuple[Path, list[float]],
) -> None:
    part, data = _netsens(quick_report[0])
    cells, outcome = _cells(data), data["outcome"]
    for entry in outcome["lowest_jct_mean"]:
        c = entry["congestion"]
        ranked = sorted(ns.SCHEDULERS, key=lambda s: cells[(s, c)]["jct_mean_s"])
        assert (entry["scheduler"], entry["next_scheduler"]) == tuple(ranked[:2])
        assert entry["jct_mean_s"] == cells[(ranked[0], c)]["jct_mean_s"]
        assert f"at {c:g}× {ranked[0]} ({cells[(ranked[0], c)]['jct_mean_s']:,.0f} s;" in part
    for entry in outcome["netsens_comm_vs_tiresias"]:
        c = entry["congestion"]
        ratio = (
            cells[("netsens", c)]["comm_overhead_frac"]
            / cells[("tiresias", c)]["comm_overhead_frac"]
        )
        assert entry["ratio"] == pytest.approx(ratio, rel=1e-12)
        assert f"{100 * ratio:.1f}% at {c:g}×" in part
    assert "netsens' communication overhead as a share of tiresias'" in part
    growth = cells[("fifo", 4.0)]["jct_mean_s"] / cells[("fifo", 1.0)]["jct_mean_s"] - 1
    assert f"{100 * growth:+.1f}% under fifo" in part


def _fake_row(jct: float | None, comm: float | None = 0.1, share: float = 0.0) -> dict[str, Any]:
    ok = jct is not None
    return {
        "status": "ok" if ok else "failed",
        "jct_mean_s": jct,
        "comm_overhead_frac": comm if ok else None,
        "locality_wait_share": share if ok else None,
        "locality_wait_mean_s": 50.0 if ok else None,
        "preemptions": 3 if ok else None,
    }


def test_outcome_leaves_out_failed_runs() -> None:
    cells = {
        ("netsens", 1.0): _fake_row(100.0, 0.02),
        ("tiresias", 1.0): _fake_row(120.0, 0.08),
        ("fifo", 1.0): _fake_row(150.0),
        ("netsens", 4.0): _fake_row(110.0, 0.03, share=0.25),
        ("tiresias", 4.0): _fake_row(None),
        ("fifo", 4.0): _fake_row(90.0, 0.3),
    }
    outcome = ns.measured_outcome(cells, ["netsens", "tiresias", "fifo"], [1.0, 4.0])
    comm = outcome["netsens_comm_vs_tiresias"]
    assert comm[0]["ratio"] == pytest.approx(0.25) and math.isnan(comm[1]["ratio"])
    assert math.isnan(outcome["jct_mean_change"]["tiresias"])
    assert ns.outcome_text(outcome) == (
        "Lowest mean JCT of the schedulers swept here (netsens, tiresias, fifo): at 1× netsens "
        "(100 s; next tiresias, 20.0% higher) and at 4× fifo "
        "(90 s; next netsens, 22.2% higher). netsens' communication overhead as a share of "
        "tiresias': 25.0% at 1× (2.0% vs 8.0% of job time). From 1× to 4× congestion, mean "
        "JCT changes by +10.0% under netsens and -40.0% under fifo. At 4×, netsens held 25.0% "
        "of the finished jobs back for locality, for 50 s on average, and preempted 3 times."
    )
    none = ns.measured_outcome({}, ["netsens"], [2.0])
    assert ns.outcome_text(none) == (
        "Lowest mean JCT of the schedulers swept here (netsens): at 2× no run finished."
    )


def test_full_cluster_sections_cover_the_traces_a_real_topology_and_the_congestion_grid(
    tmp_path: Path,
) -> None:
    """The full report's cluster and netsens sections (the whole report, every section at its
    full default, is ``benchmarks/report_full.py``: about two minutes, over the suite's budget)."""
    sections = run_sections((cluster_section, netsens_section), quick=False)
    data = report_data(sections, datetime.now(UTC), quick=False)
    page = render_page(sections, datetime.now(UTC))
    traces = data["sections"]["cluster"]["data"]["traces"]
    assert data["quick"] is False
    assert {t: (r["cluster"], r["jobs"]) for t, r in traces.items()} == {
        "tiresias-480": ("tiresias-n32g4", 480),
        "helios-500": ("helios", 500),
        "synthetic on lingjun": ("lingjun", 3000),
    }
    assert traces["synthetic on lingjun"]["cluster_shape"].startswith("847 hosts / 119 asw")
    slugs = ("tiresias-480", "helios-500", "synthetic-on-lingjun")
    for index, trace in enumerate(slugs):  # page order
        for part in FIGURE_PARTS:
            assert f'id="cluster-{index}-{trace}-{part}"' in page
    assert "within psw" in page and "across psws" in page  # the tree's levels as columns
    assert page.count('class="rp-figure"') == 3 * len(FIGURE_PARTS) + len(NETSENS_PARTS)
    # the heaviest part of the page (3,000-job CDFs) stays well inside its 1.5 MB besides plotly.js
    rest = len(page.encode("utf-8")) - len(plotly_js().encode("utf-8"))
    assert rest < 1.0e6, f"{rest / 1e6:.2f} MB besides plotly.js"
    if browser.find_chromium() is not None:  # the full cluster sections lay out
        out = tmp_path / "report.html"
        out.write_text(page, encoding="utf-8")
        check_layout(out, tmp_path, 1400)
    grid = data["sections"]["netsens"]["data"]
    assert (grid["trace"], grid["cluster"]) == ("helios-500", "helios")
    assert sorted((r["scheduler"], r["congestion"]) for r in grid["runs"]) == sorted(CELLS)
    assert {(r["status"], r["jobs_total"], r["seed"]) for r in grid["runs"]} == {("ok", 500, 0)}


def test_progress_rises_to_one(quick_report: tuple[Path, list[float]]) -> None:
    _, fractions = quick_report
    assert len(fractions) >= len(SCHEDULERS)
    assert fractions == sorted(fractions)
    assert fractions[-1] == 1.0


def test_trace_strings_are_escaped() -> None:
    page = evil_page(EVIL)
    assert EVIL not in page
    assert EVIL_ESCAPED in page  # tables and headings show it, as text
    specs = re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', page, re.S)
    assert len(specs) == len(FIGURE_PARTS) + len(NETSENS_PARTS)
    figures = [json.loads(spec) for spec in specs]  # each spec ends where it should
    labels = json.dumps(figures)
    assert EVIL_ESCAPED in labels and "<script" not in labels
    grid = page.split('<section id="netsens">', 1)[1]
    assert f'<td class="rp-l">Boom: {EVIL_ESCAPED}</td>' in grid  # the failed run's error
    setup, said = (p.split("</p>", 1)[0] for p in grid.split("<p>")[1:3])
    assert setup.startswith(f"Trace trace-{EVIL_ESCAPED} on cluster helios")
    assert f"under {EVIL_ESCAPED}" in said  # the payload-named scheduler, in the outcome
    cdf = json.loads(grid.split('id="netsens-jct-cdf-spec">', 1)[1].split("</script>", 1)[0])
    assert len(cdf["data"]) == 3  # the failed cell has no curve
    hover = json.dumps([t["text"] for t in cdf["data"]])
    assert f"{EVIL_ESCAPED} (resnet50)" in hover and f"ok-1 ({EVIL_ESCAPED})" in hover


def test_figure_json_cannot_close_its_script() -> None:
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name="</script><b>x</b>"))
    block = figure_html("f", fig, "note </script>")
    assert block.count("</script>") == 1
    spec = block.split('id="f-spec">', 1)[1].split("</script>", 1)[0]
    assert json.loads(spec)["data"][0]["name"] == "</script><b>x</b>"


def _chromium() -> str:
    binary = browser.find_chromium()
    if binary is None:
        pytest.skip("chromium not installed: no chromium or chromium-browser on PATH")
    return binary


def _dump_dom(page: Path, profile: Path, width: int = 1400) -> str:
    """The page's DOM after its scripts ran, checking that nothing reached the JS console."""
    got = browser.dump_dom(_chromium(), page, profile, width)
    assert not got.console, "\n".join(got.console)[-2000:]
    return got.dom


def _body_data(dom: str, name: str) -> str:
    value = browser.PageDom(dom, ()).body_data(name)
    assert value is not None, f"the page never recorded data-{name}"
    return value


def check_layout(page: Path, tmp_path: Path, width: int) -> None:
    """At ``width`` px: every figure drew, nothing overflows its box, no two titles overlap
    (the page's own check from the DOM's boxes), the summary ends within the first 900 px
    (at 1400), and a screenshot is taken for a human to look at (kept in ``tmp_path``)."""
    dom = _dump_dom(page, tmp_path / f"profile-{width}", width)
    drawn, total = _figures_drawn(dom)
    assert drawn == total
    assert _body_data(dom, "layout") == "ok"
    if width >= 1400:
        assert int(_body_data(dom, "summary-bottom")) <= 900
    shot = tmp_path / f"report-{width}.png"
    assert browser.screenshot(_chromium(), page, tmp_path / f"shot-{width}", width, shot) > 10_000


def _figures_drawn(dom: str) -> tuple[int, int]:
    figures = browser.PageDom(dom, ()).figures()
    assert figures is not None, "the page never recorded its figures"
    return figures


@pytest.mark.browser
def test_every_figure_draws_in_chromium(
    quick_report: tuple[Path, list[float]], tmp_path: Path
) -> None:
    dom = _dump_dom(quick_report[0], tmp_path / "profile")
    drawn, total = _figures_drawn(dom)
    expected = (
        len(FIGURE_PARTS)
        + len(NETSENS_PARTS)
        + INGEST_QUICK_FIGURES
        + STALLS_FIGURES
        + EMBED_FIGURES
    )
    assert drawn == total == expected
    assert dom.count('class="main-svg"') >= total
    for part in NETSENS_PARTS:  # each new figure drew its own svg
        div = re.search(rf'<div class="rp-figure[^"]*" id="netsens-{part}".*?</svg>', dom, re.S)
        assert div is not None and 'class="main-svg"' in div.group(0), part
    ingest = ("sim-0-criteo-16", "sim-split", "live-throughput", "live-split")
    for part in ingest:
        div = re.search(rf'<div class="rp-figure[^"]*" id="ingest-{part}".*?</svg>', dom, re.S)
        assert div is not None and 'class="main-svg"' in div.group(0), part


@pytest.mark.browser
@pytest.mark.parametrize("width", [1400, 1000])
def test_the_page_lays_out_at_two_widths(
    quick_report: tuple[Path, list[float]], tmp_path: Path, width: int
) -> None:
    check_layout(quick_report[0], tmp_path, width)


@pytest.mark.browser
def test_injected_script_never_runs_in_chromium(tmp_path: Path) -> None:
    page = tmp_path / "evil.html"
    page.write_text(evil_page(EVIL_DOM), encoding="utf-8")
    dom = _dump_dom(page, tmp_path / "profile")
    drawn, total = _figures_drawn(dom)
    assert drawn == total == len(FIGURE_PARTS) + len(NETSENS_PARTS)
    assert "data-pwned" not in dom


def test_a_trace_type_the_bundle_cannot_draw_is_refused() -> None:
    fig = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]]))
    with pytest.raises(ValueError, match=r"'heatmap' is not in the report's plotly\.js bundle"):
        figure_html("f", fig, "a note")
    assert "plotly.js (basic - minified) v4.1.1" in plotly_js()[:200]
