"""The HTML report: figures present, report.json equal to the metrics, trace strings escaped,
and (with chromium) every figure really drawn in a headless browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import plotly.graph_objects as go
import pytest

import recperf
from recperf.cluster.api import RunSpec, build_scheduler, compare
from recperf.cluster.base import PLACEMENTS
from recperf.cluster.engine import Simulator
from recperf.cluster.jobs import JobTable
from recperf.cluster.metrics import summarize
from recperf.cluster.topology import PRESETS
from recperf.core.results import dumps_json
from recperf.report import build_report
from recperf.report.builder import render_page
from recperf.report.cluster_section import SCHEDULERS, ClusterRun, section_from_runs
from recperf.report.section import figure_html

EVIL = "<script>alert(1)</script>"
EVIL_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
# Marks the DOM if it ever runs, so the browser test can tell.
EVIL_DOM = "<script>document.body.dataset.pwned='yes'</script>"
FIGURE_PARTS = ("jct-cdf", "util", "makespan", "jct-mean")


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[float]]:
    fractions: list[float] = []
    out = build_report(tmp_path_factory.mktemp("report"), quick=True, progress=fractions.append)
    return out, fractions


def evil_page(payload: str) -> str:
    """A report page from a run whose job, model, scheduler and trace names are ``payload``."""
    jobs = JobTable.build(
        name=[payload, "ok-1", f"x{payload}y", "ok-3"],
        model=["resnet50", payload, "vgg16", payload],
        arrival_s=[0.0, 10.0, 20.0, 30.0],
        gpus=[4, 8, 1, 16],
        total_iters=[1000.0, 2000.0, 500.0, 800.0],
        compute_s=[0.1, 0.2, 0.05, 0.3],
        grad_bytes=[1e8, 2e8, 0.0, 4e8],
    )
    cluster = PRESETS["tiresias-n32g4"]
    results = {
        name: Simulator(jobs, cluster, build_scheduler(name), PLACEMENTS.create("best-fit")).run()
        for name in ("fifo", "sjf")
    }
    # Scheduler names are trace-like strings too: key one run by the payload.
    results = {payload: results["fifo"], "sjf": results["sjf"]}
    run = ClusterRun(trace=f"trace-{payload}", results=results, seconds=0.1)
    section = section_from_runs([run])
    return render_page([section], datetime(2024, 1, 2, 3, 4, tzinfo=UTC))


def test_report_has_every_figure_and_inline_plotly(
    quick_report: tuple[Path, list[float]],
) -> None:
    out, _ = quick_report
    assert out.name == "report.html"
    page = out.read_text(encoding="utf-8")
    for part in FIGURE_PARTS:
        assert f'<div class="rp-figure" id="cluster-0-tiresias-480-{part}"' in page
    assert page.count('class="rp-figure"') == len(FIGURE_PARTS)
    assert "plotly.js v" in page  # the library itself, inline
    assert not re.search(r"<script[^>]+src=", page)  # nothing fetched from the network
    assert '<a href="#cluster">GPU-cluster scheduling</a>' in page
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


def test_full_report_covers_both_traces(tmp_path: Path) -> None:
    out = build_report(tmp_path)
    page = out.read_text(encoding="utf-8")
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    traces = report["sections"]["cluster"]["data"]["traces"]
    assert report["quick"] is False
    assert {t: (r["cluster"], r["jobs"]) for t, r in traces.items()} == {
        "tiresias-480": ("tiresias-n32g4", 480),
        "helios-500": ("helios", 500),
    }
    for index, trace in enumerate(("tiresias-480", "helios-500")):  # page order
        for part in FIGURE_PARTS:
            assert f'id="cluster-{index}-{trace}-{part}"' in page
    assert page.count('class="rp-figure"') == 2 * len(FIGURE_PARTS)


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
    assert len(specs) == len(FIGURE_PARTS)
    figures = [json.loads(spec) for spec in specs]  # each spec ends where it should
    labels = json.dumps(figures)
    assert EVIL_ESCAPED in labels and "<script" not in labels


def test_figure_json_cannot_close_its_script() -> None:
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name="</script><b>x</b>"))
    block = figure_html("f", fig, "note </script>")
    assert block.count("</script>") == 1
    spec = block.split('id="f-spec">', 1)[1].split("</script>", 1)[0]
    assert json.loads(spec)["data"][0]["name"] == "</script><b>x</b>"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("chromium not installed: no chromium or chromium-browser on PATH")


def _dump_dom(page: Path, profile: Path) -> str:
    cmd = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        page.resolve().as_uri(),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _figures_drawn(dom: str) -> tuple[int, int]:
    body = re.search(r"<body[^>]*>", dom)
    assert body is not None
    marker = re.search(r'data-figures="(\d+)/(\d+)"', body.group(0))
    assert marker is not None, f"the page never recorded its figures: {body.group(0)}"
    return int(marker.group(1)), int(marker.group(2))


@pytest.mark.browser
def test_every_figure_draws_in_chromium(
    quick_report: tuple[Path, list[float]], tmp_path: Path
) -> None:
    dom = _dump_dom(quick_report[0], tmp_path / "profile")
    drawn, total = _figures_drawn(dom)
    assert drawn == total
    assert total >= len(FIGURE_PARTS)
    assert dom.count('class="main-svg"') >= total


@pytest.mark.browser
def test_injected_script_never_runs_in_chromium(tmp_path: Path) -> None:
    page = tmp_path / "evil.html"
    page.write_text(evil_page(EVIL_DOM), encoding="utf-8")
    dom = _dump_dom(page, tmp_path / "profile")
    drawn, total = _figures_drawn(dom)
    assert drawn == total == len(FIGURE_PARTS)
    assert "data-pwned" not in dom
