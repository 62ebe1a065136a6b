"""The report's embedding section: a quick run, its locality table and data equal to the
library's statistics, the CPU benchmark's variants and figures, the CPU-only note, a bundled
GPU result shown (escaped) beside them, and monotone progress."""

from __future__ import annotations

import copy
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import torch

from recperf.core.results import dumps_json
from recperf.embed import locality, traces
from recperf.report import embed_compiled as ec
from recperf.report import embed_section as es
from recperf.report.builder import SECTIONS
from recperf.report.section import FIGURE_CLASS, Section
from recperf.report.stalls_section import stalls_section

from .conftest import QuickSections

EVIL = "<script>alert(1)</script>"
EVIL_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
FIGURE_DIV = f'<div class="{FIGURE_CLASS}" id="'
CPU_FIGURES = [
    "embed-reuse",
    "embed-coverage",
    "embed-cpu-ms",
    "embed-cpu-gbps",
    "embed-cpu-stages",
]
Quick = tuple[Section, list[float], tuple[Any, ...]]


@pytest.fixture(scope="module")
def quick(quick_sections: QuickSections) -> Quick:
    """The quick section, its progress fractions and the arguments it was built from."""
    built = quick_sections.get(es.embed_section)
    return built.section, built.fractions, built.captured


def _figure_ids(page: str) -> list[str]:
    return re.findall(rf'{re.escape(FIGURE_DIV)}([^"]+)"', page)


def _spec(page: str, fig_id: str) -> dict[str, Any]:
    found = re.search(rf'<script type="application/json" id="{fig_id}-spec">(.*?)</script>', page)
    assert found is not None, fig_id
    spec: dict[str, Any] = json.loads(found.group(1))
    return spec


def _jsonable(data: Any) -> Any:
    return json.loads(dumps_json({"x": data}))["x"]


def test_section_is_last_after_stalls() -> None:
    assert SECTIONS[SECTIONS.index(stalls_section) + 1] is es.embed_section
    assert SECTIONS[-1] is es.embed_section


def test_quick_section_has_its_figures(quick: Quick) -> None:
    section, _, _ = quick
    assert (section.title, section.key) == ("Embedding stage (DLRM inference)", "embed")
    assert section.html.count(f'class="{FIGURE_CLASS}"') == 7  # and the L2 model's two
    assert _figure_ids(section.html) == [*CPU_FIGURES, "embed-l2model", "embed-l2model-formats"]


def test_locality_table_equals_the_library_stats(quick: Quick) -> None:
    section, _, _ = quick
    stats = locality.stats(traces.resolve("reuse-medium-500k"), batch_lookups=307_200, top_k=60_000)
    assert (stats.accesses, round(stats.top_k_coverage, 3)) == (429_951, 0.877)
    row = (
        f'<tr><td class="rp-l">reuse-medium-500k</td><td>{stats.accesses:,}</td>'
        f"<td>{stats.unique_rows:,}</td><td>{100 * stats.top_k_coverage:.1f}%</td>"
        f"<td>{stats.unique_frac_per_batch:.3f}</td></tr>"
    )
    assert row in section.html
    data = section.data["locality"]
    assert [d["name"] for d in data] == ["reuse-medium-500k", "reuse-high", "reuse-low", "uniform"]
    assert {k: v for k, v in data[0].items() if k != "coverage"} == _jsonable(stats.to_json())
    assert [d["accesses"] for d in data[1:]] == [200_000] * 3  # quick: fewer generated ids
    json.dumps(section.data, allow_nan=False)


def test_coverage_curve_agrees_with_top_k(quick: Quick) -> None:
    section, _, _ = quick
    for entry in section.data["locality"]:
        ks, shares = entry["coverage"]["k"], entry["coverage"]["share"]
        assert ks == sorted(ks) and ks[0] == 1 and ks[-1] == 500_000 and 60_000 in ks
        assert shares == sorted(shares) and shares[-1] == pytest.approx(1.0, abs=1e-12)
        assert shares[ks.index(60_000)] == pytest.approx(entry["top_k_coverage"], abs=1e-12)
    spec = _spec(section.html, "embed-coverage")
    assert spec["layout"]["xaxis"]["type"] == "log"
    assert spec["data"][0]["y"] == section.data["locality"][0]["coverage"]["share"]


def test_coverage_curve_of_a_small_trace() -> None:
    ids = torch.tensor([0, 0, 0, 1, 1, 2], dtype=torch.int64)
    trace = traces.Trace(name="t", ids=(ids,), rows=(4,))
    ks, shares = es.coverage_curve(trace)
    assert ks == (1, 2, 3, 4)
    assert shares == pytest.approx((3 / 6, 5 / 6, 1.0, 1.0))


def test_reuse_figure_shows_the_histogram(quick: Quick) -> None:
    section, _, _ = quick
    spec = _spec(section.html, "embed-reuse")
    first = section.data["locality"][0]
    hist = first["reuse_distance_hist"]
    (line,) = [t for t in spec["data"] if t["name"] == "reuse-medium-500k"]
    assert line["x"] == [h["bin"] for h in hist] and line["x"][0] == "cold"
    assert line["y"] == pytest.approx([h["count"] / first["accesses"] for h in hist], rel=1e-12)
    assert sum(line["y"]) == pytest.approx(1.0, rel=1e-12)  # every access is in one bin


def test_cpu_bench_data_and_figures(quick: Quick) -> None:
    section, _, _ = quick
    cpu = section.data["cpu"]
    assert cpu["device"] == "cpu"
    assert [r["trace"] for r in cpu["runs"]] == ["reuse-medium-500k", "uniform"]
    for run in cpu["runs"]:
        assert (run["config"], run["batch_size"], run["device"]) == ("small", 64, "cpu")
        assert [v["variant"] for v in run["variants"]] == ["torch", "torch-hot"]
        assert run["variants"][0]["speedup_vs_torch"] == 1.0
        assert all(v["max_abs_err"] < 1e-4 and v["ms_per_batch"] > 0 for v in run["variants"])
        assert sorted(run["stages_ms"]) == sorted(es.STAGES)
        assert "locality" not in run
    bars = {t["name"]: t for t in _spec(section.html, "embed-cpu-ms")["data"]}
    assert list(bars) == ["torch", "torch-hot"]
    assert bars["torch-hot"]["x"] == ["reuse-medium-500k", "uniform"]
    assert bars["torch-hot"]["y"] == [r["variants"][1]["ms_per_batch"] for r in cpu["runs"]]
    gbps = {t["name"]: t for t in _spec(section.html, "embed-cpu-gbps")["data"]}
    assert gbps["torch"]["y"] == [r["variants"][0]["gb_per_s"] for r in cpu["runs"]]
    stages = _spec(section.html, "embed-cpu-stages")
    assert stages["layout"]["barmode"] == "stack"
    embedding = next(t for t in stages["data"] if t["name"] == "embedding")
    assert embedding["y"] == [r["stages_ms"]["embedding"] for r in cpu["runs"]]


def test_cpu_only_note_when_no_gpu_file_is_bundled(quick: Quick) -> None:
    section, _, args = quick
    bundled = resources.files("recperf").joinpath(es.GPU_RESULTS)
    assert not bundled.is_file() and es.load_gpu_results() is None
    assert args[2] is None and section.data["gpu"] is None
    note = "CPU figures: no GPU run recorded yet; the GPU benchmark is benchmarks/embed_gpu.py."
    assert note in section.html
    assert f"run live on cpu, {args[3]}" in section.html
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", args[3])
    title = _spec(section.html, "embed-cpu-ms")["layout"]["title"]["text"]
    assert title == f"ms per batch — cpu, {args[3]}"
    assert section.html.count(f"{note}</figcaption>") == 3  # on each CPU benchmark figure


def test_progress_is_monotone_and_reaches_one(quick: Quick) -> None:
    _, fractions, _ = quick
    assert len(fractions) >= 6  # four traces' locality, two benchmarks
    assert fractions == sorted(fractions)
    assert fractions[0] >= 0.0 and fractions[-1] == 1.0
    assert max(f for f in fractions if f <= es.LOCALITY_SHARE) == pytest.approx(es.LOCALITY_SHARE)


def _fake_gpu(cpu_runs: list[dict[str, Any]]) -> dict[str, Any]:
    run = copy.deepcopy(cpu_runs[0])
    run["trace"] = f"trace {EVIL}"
    run["variants"][1]["variant"] = f"combined {EVIL}"
    run["device"] = EVIL
    return {
        "date": f"2026-12-01 {EVIL}",
        "device": f"NVIDIA H200 {EVIL}",
        "config": "paper",
        "runs": [run, {"trace": "zipf:1.05", "skipped": "time budget"}],
    }


def test_gpu_results_are_shown_escaped(quick: Quick) -> None:
    _, _, (localities, cpu_runs, _, today, *_) = quick
    gpu = _fake_gpu(cpu_runs)
    section = es.section_from_results(localities, cpu_runs, gpu, today)
    gpu_ids = ["embed-gpu-ms", "embed-gpu-gbps", "embed-gpu-stages"]
    assert _figure_ids(section.html) == CPU_FIGURES + gpu_ids
    assert EVIL not in section.html
    label = f"NVIDIA H200 {EVIL_ESCAPED}, 2026-12-01 {EVIL_ESCAPED}"
    assert f"recorded on {label}, bundled with recperf." in section.html
    assert "Traces skipped: zipf:1.05: time budget." in section.html
    assert "no GPU run recorded yet" not in section.html
    row = f'<tr><td class="rp-l">trace {EVIL_ESCAPED}</td><td class="rp-l">combined {EVIL_ESCAPED}'
    assert row in section.html
    ms = _spec(section.html, "embed-gpu-ms")
    assert ms["layout"]["title"]["text"] == f"ms per batch — {label}"
    assert [t["name"] for t in ms["data"]] == ["torch", f"combined {EVIL_ESCAPED}"]
    assert ms["data"][1]["y"] == [gpu["runs"][0]["variants"][1]["ms_per_batch"]]
    assert "<script" not in json.dumps(ms)
    assert section.data["gpu"] == _jsonable(gpu)


def test_load_gpu_results_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "gpu_results.json"
    assert es.load_gpu_results(path) is None
    path.write_text(json.dumps({"device": "H200", "date": "2026-12-01", "runs": []}))
    assert es.load_gpu_results(path) == {"device": "H200", "date": "2026-12-01", "runs": []}


def _skip_unless_compiled(compiled: dict[str, Any]) -> None:
    """Skip where nothing can compile in this process, as the compile tests skip."""
    why = str(compiled.get("error", ""))
    if "TRITON_INTERPRET" in why:  # tests/conftest.py sets it for the whole suite
        pytest.skip("Triton was interpreted when the kernels were imported in this process")
    if "ptxas is not available" in why or "No module named 'triton'" in why:
        pytest.skip(f"nothing compiles for a GPU here: {why}")


def test_kernel_compiled_for_hopper_is_shown(quick: Quick) -> None:
    section, _, args = quick
    compiled = args[4]
    _skip_unless_compiled(compiled)
    assert compiled["arch"] == 90 and "error" not in compiled, compiled
    shapes = compiled["shapes"]
    assert [(s["block_n"], s["prefetch"]) for s in shapes] == [(16, 0), (16, 2)]
    assert all(s["registers"] > 0 and s["loop_barriers"] == 0 for s in shapes)
    assert section.data["compiled"] == compiled
    assert "compiled for sm_90 (H100, H200) on this machine, no GPU needed" in section.html
    cells = f"<td>16</td><td>4</td><td>2</td><td>{shapes[1]['registers']}</td>"
    assert cells in section.html


def test_an_interpreted_process_compiles_nothing_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiled = pytest.importorskip("recperf.embed.kernels.compiled")
    # As if TRITON_INTERPRET=1 had been set when the kernels were imported.
    monkeypatch.setattr(compiled, "_JIT_INTERPRETED", True)
    result = ec.compile_for_gpu(quick=True)
    assert list(result) == ["error"]
    assert "TRITON_INTERPRET=1 was set when the kernels were imported" in result["error"]


def test_compile_failure_is_one_escaped_line(quick: Quick) -> None:
    _, _, (localities, cpu_runs, _, today, *_) = quick
    section = es.section_from_results(localities, cpu_runs, None, today, {"error": EVIL})
    assert f"could not be compiled for sm_90: {EVIL_ESCAPED}" in section.html
    assert EVIL not in section.html
