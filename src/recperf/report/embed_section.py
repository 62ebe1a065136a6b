"""The report's embedding-stage section (DLRM inference): the locality of the bundled real trace
and of generated ones, a live CPU benchmark of the kernels that run without a GPU, and the GPU
benchmark's figures where a run of ``benchmarks/embed_gpu.py`` is bundled with the package.

Trace, variant and device names are escaped: ``html.escape`` for hand-built HTML and for plotly
labels (which plotly renders as a small HTML subset); tables escape their own cells.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import numpy as np
import plotly.graph_objects as go
import torch

from recperf.core.progress import ProgressFn
from recperf.core.results import dumps_json
from recperf.embed import locality, traces
from recperf.embed.bench import bench
from recperf.embed.model import config
from recperf.report.embed_compiled import compile_for_gpu, compiled_html
from recperf.report.embed_l2 import l2_html, model_for_report
from recperf.report.embed_peers import load_bundled as load_cpu_peers
from recperf.report.embed_peers import peers_html
from recperf.report.section import (
    LAYOUT,
    MonotoneProgress,
    Section,
    color_of,
    figure_html,
    fmt_num,
    plot_title,
    table_html,
)
from recperf.report.summary import verdict_of

KEY = "embed"
TITLE = "Embedding stage (DLRM inference)"
BUNDLED_TRACE = "reuse-medium-500k"
LOCALITY_TRACES = (BUNDLED_TRACE, "reuse-high", "reuse-low", "uniform")
ROWS = 500_000
"""Rows of the generated traces' table (the bundled trace's table has as many)."""
QUICK_LOOKUPS = 200_000
"""Ids per generated trace in the quick section (the full one uses the generator's default)."""
BATCH_LOOKUPS = 307_200
TOP_K = 60_000
COVERAGE_POINTS = 40
"""Points of the log-spaced k grid of the coverage curve (TOP_K is always one of them)."""
BENCH_TRACES = (BUNDLED_TRACE, "uniform")
VARIANTS = ("torch", "torch-hot")
"""The kernels that run on a CPU without the Triton interpreter."""
GPU_RESULTS = "data/embedding/gpu_results.json"
"""A bundled run of benchmarks/embed_gpu.py, inside the recperf package, if there is one."""
STAGES = ("bottom_mlp", "embedding", "interaction", "top_mlp")
LOCALITY_SHARE = 0.3
"""Share of the section's progress given to the locality statistics (the rest benchmarks)."""
CPU_ONLY_NOTE = (
    "CPU figures: no GPU run recorded yet; the GPU benchmark is benchmarks/embed_gpu.py."
)


@dataclass(frozen=True, slots=True)
class TraceLocality:
    """One trace's locality statistics and its cumulative coverage curve."""

    stats: locality.LocalityStats
    coverage_k: tuple[int, ...]
    """Hot rows counted, on a log grid."""
    coverage: tuple[float, ...]
    """Share of all accesses that hit the coverage_k most frequent rows."""

    def to_json(self) -> dict[str, Any]:
        return self.stats.to_json() | {
            "coverage": {"k": list(self.coverage_k), "share": list(self.coverage)}
        }


def embed_section(*, quick: bool = False, progress: ProgressFn | None = None) -> Section:
    """Measure the traces' locality, benchmark the CPU kernels and build the section."""
    report = MonotoneProgress(progress)
    localities = measure_locality(quick, lambda f: report(LOCALITY_SHARE * f))
    rest = 1.0 - LOCALITY_SHARE
    cpu = run_cpu_bench(quick, lambda f: report(LOCALITY_SHARE + rest * f))
    compiled = compile_for_gpu(quick)
    gpu = load_gpu_results()
    model = model_for_report(quick, gpu)
    peers = load_cpu_peers()
    section = section_from_results(
        localities, cpu, gpu, date.today().isoformat(), compiled, model, peers
    )
    report(1.0)
    return section


# -- measuring --------------------------------------------------------------------------------


def coverage_curve(trace: traces.Trace) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Share of the accesses covered by the k most frequent rows (over all tables), for k on a
    log grid from 1 to the rows of all tables, TOP_K included."""
    counts = torch.cat(
        [
            torch.bincount(ids, minlength=rows)
            for ids, rows in zip(trace.ids, trace.rows, strict=True)
        ]
    )
    cumulative = torch.sort(counts, descending=True).values.cumsum(0).double()
    total = max(float(cumulative[-1]), 1.0)
    grid = np.geomspace(1, counts.numel(), COVERAGE_POINTS).round().astype(np.int64).tolist()
    ks = sorted({*grid, min(TOP_K, counts.numel())})
    return tuple(ks), tuple(float(cumulative[k - 1]) / total for k in ks)


def measure_locality(quick: bool, progress: ProgressFn) -> list[TraceLocality]:
    """Locality of the bundled trace and of the generated ones (``ROWS`` rows)."""
    lookups = QUICK_LOOKUPS if quick else None
    out = []
    for i, name in enumerate(LOCALITY_TRACES):
        generated = name != BUNDLED_TRACE
        trace = traces.resolve(
            name, rows=ROWS if generated else None, lookups=lookups if generated else None
        )
        stats = locality.stats(trace, batch_lookups=BATCH_LOOKUPS, top_k=TOP_K)
        out.append(TraceLocality(stats, *coverage_curve(trace)))
        progress((i + 1) / len(LOCALITY_TRACES))
    return out


def run_cpu_bench(quick: bool, progress: ProgressFn) -> list[dict[str, Any]]:
    """The CPU kernels on the small configuration, per benchmark trace, as ``BenchResult``
    JSON without its locality (the bench's generated traces have the small tables' rows, not
    the locality figures' 500,000)."""
    cfg = config("small", batch_size=64 if quick else 256)
    runs = []
    for i, name in enumerate(BENCH_TRACES):

        def sub(frac: float, i: int = i) -> None:
            progress((i + frac) / len(BENCH_TRACES))

        result = bench(cfg, name, list(VARIANTS), reps=5 if quick else 30, progress=sub)
        runs.append({k: v for k, v in result.to_json().items() if k != "locality"})
        sub(1.0)
    return runs


def load_gpu_results(resource: Traversable | None = None) -> dict[str, Any] | None:
    """The bundled GPU benchmark's JSON (``GPU_RESULTS`` in the package), or None if absent."""
    path = resource or resources.files("recperf").joinpath(GPU_RESULTS)
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


# -- the section ------------------------------------------------------------------------------


def section_from_results(
    localities: Sequence[TraceLocality],
    cpu_runs: Sequence[Mapping[str, Any]],
    gpu: Mapping[str, Any] | None,
    today: str,
    compiled: Mapping[str, Any] | None = None,
    model: Mapping[str, Any] | None = None,
    peers: Mapping[str, Any] | None = None,
) -> Section:
    """The section for measured localities, CPU bench results (``BenchResult`` JSON), the GPU
    benchmark's JSON (or None), the date of the CPU run, ``recperf embed compile``'s JSON (or
    ``{"error": ...}``, or None to leave it out), the L2 model's (``embed_l2``; None: out) and the
    bundled CPU peers benchmark's (``embed_peers``; None: out)."""
    device = str(cpu_runs[0]["device"]) if cpu_runs else "cpu"
    cpu_label = f"{device}, {today}"
    data = {
        "locality": [loc.to_json() for loc in localities],
        "cpu": {"date": today, "device": device, "runs": [dict(r) for r in cpu_runs]},
        "gpu": None if gpu is None else dict(gpu),
        "compiled": None if compiled is None else dict(compiled),
        "l2model": None if model is None else dict(model),
        "cpu_peers": None if peers is None else dict(peers),
    }
    body = (
        f"<p>{html.escape(_intro_text())}</p>"
        + _locality_table(localities)
        + '<div class="rp-grid">'
        + figure_html(f"{KEY}-reuse", _reuse_figure(localities), _REUSE_NOTE)
        + figure_html(f"{KEY}-coverage", _coverage_figure(localities), _COVERAGE_NOTE)
        + "</div>"
        + f"<p>{html.escape(_cpu_text(cpu_label, gpu is None))}</p>"
        + _bench_html(f"{KEY}-cpu", cpu_runs, cpu_label, _cpu_note(gpu is None))
        + peers_html(peers)
        + ("" if gpu is None else _gpu_html(gpu))
        + ("" if model is None else l2_html(model))
        + ("" if compiled is None else compiled_html(compiled))
    )
    jsonable: dict[str, Any] = json.loads(dumps_json(data))  # NaN and inf as null
    return Section(title=TITLE, key=KEY, html=body, data=jsonable)


def _intro_text() -> str:
    return (
        f"Embedding look-ups dominate DLRM inference when their rows miss in cache, so the "
        f"stage's speed depends on the access trace's locality. Traces: {BUNDLED_TRACE} (an "
        f"extract of Meta's public embedding-access traces, one table of {ROWS:,} rows) and "
        f"generated ones over {ROWS:,} rows (Zipf presets reuse-high/low and uniform). Coverage "
        f"is the share of accesses that hit the {TOP_K:,} most frequent rows; the unique "
        f"fraction is distinct rows per batch of {BATCH_LOOKUPS:,} ids."
    )


def _cpu_text(label: str, cpu_only: bool) -> str:
    kernels = ", ".join(VARIANTS)
    text = (
        f"Kernel benchmark run live on {label}: the small DLRM configuration, kernels "
        f"{kernels} (the Triton kernels need a GPU), median time per batch."
    )
    return f"{text} {CPU_ONLY_NOTE}" if cpu_only else text


def _cpu_note(cpu_only: bool) -> str:
    return CPU_ONLY_NOTE if cpu_only else "CPU figures, measured live while building the report."


def _pct(frac: float) -> str:
    return fmt_num(100.0 * frac, 1) + "%"


def _locality_table(localities: Sequence[TraceLocality]) -> str:
    rows = [
        [
            s.name,
            f"{s.accesses:,}",
            f"{s.unique_rows:,}",
            _pct(s.top_k_coverage),
            fmt_num(s.unique_frac_per_batch, 3),
        ]
        for s in (loc.stats for loc in localities)
    ]
    header = [
        "trace",
        "accesses",
        "unique rows",
        f"top-{TOP_K // 1000}k coverage",
        f"unique fraction per {BATCH_LOOKUPS:,}-id batch",
    ]
    return table_html(header, rows, caption="Locality of each access trace.")


def _ms_spread(v: Mapping[str, Any]) -> str:
    """``q1–q3`` of a variant's timed calls (a bundled run from before the quartiles: —)."""
    if v.get("ms_q1") is None or v.get("ms_q3") is None:
        return "—"
    return f"{fmt_num(float(v['ms_q1']), 3)}–{fmt_num(float(v['ms_q3']), 3)}"


def spread_verdicts(run: Mapping[str, Any]) -> dict[str, str]:
    """Per variant against ``torch`` in one run: ``faster`` or ``slower`` when the quartile
    ranges do not overlap, else ``within noise`` (the speedup is then not a ranking)."""
    base = next((v for v in run["variants"] if v["variant"] == "torch"), None)
    out = {}
    for v in run["variants"]:
        if base is None or v is base or v.get("ms_q1") is None or base.get("ms_q1") is None:
            out[v["variant"]] = ""
            continue
        # the summary's rule on the speedup's spread: torch's quartiles over this variant's
        verdict = verdict_of(float(base["ms_q1"]) / float(v["ms_q3"]),
                             float(base["ms_q3"]) / float(v["ms_q1"]), measured=True)  # fmt: skip
        out[v["variant"]] = {"ahead": "faster", "behind": "slower"}.get(verdict, verdict)
    return out


def _load(run: Mapping[str, Any]) -> str:
    load = run.get("other_load_cores")
    return "—" if load is None else fmt_num(float(load), 2)


def _bench_table(runs: Sequence[Mapping[str, Any]], label: str) -> str:
    rows = []
    for run in runs:
        verdicts = spread_verdicts(run)
        for v in run["variants"]:
            rows.append([
                run["trace"],
                v["variant"],
                fmt_num(float(v["ms_per_batch"]), 3),
                _ms_spread(v),
                fmt_num(float(v["gb_per_s"]), 2),
                fmt_num(float(v["pct_of_copy_bw"]), 1),
                f"{fmt_num(float(v['speedup_vs_torch']), 2)}×",
                verdicts[v["variant"]] or "—",
                _load(run),
            ])  # fmt: skip
    header = ["trace", "variant", "ms per batch", "q1–q3 (ms)", "GB/s", "% of copy bandwidth",
              "speedup", "vs torch", "other load (cores)"]  # fmt: skip
    over = [f"{r['trace']} {v['variant']}" for r in runs for v in r["variants"]
            if float(v["pct_of_copy_bw"]) > 100]  # fmt: skip
    why_over = (
        f" Above 100% of the copy bandwidth ({', '.join(over)}): the rows a batch touches "
        "fit in the CPU's caches, which the 128 MiB copy does not, so the copy is no bound "
        "for them."
        if over
        else ""
    )
    caption = (
        f"Kernels on {label}: median ms per batch with the quartiles of the timed calls, "
        f"achieved GB/s (bytes the batch must move), its share of the measured copy bandwidth, "
        f"speedup over torch, and against torch: faster or slower only where the quartile "
        f"ranges do not overlap, else within noise; the machine's other load while timed."
        + why_over
    )
    return table_html(header, rows, caption=caption, left_cols=2)


def _bench_html(prefix: str, runs: Sequence[Mapping[str, Any]], label: str, note: str) -> str:
    if not runs:
        return f"<p>{html.escape(f'No benchmark run on {label}.')}</p>"
    ms = _variant_bars(runs, "ms_per_batch", f"ms per batch — {label}", "ms per batch")
    gbps = _variant_bars(runs, "gb_per_s", f"Achieved bandwidth — {label}", "GB/s")
    figs = (
        figure_html(f"{prefix}-ms", ms, note)
        + figure_html(f"{prefix}-gbps", gbps, note)
        + figure_html(f"{prefix}-stages", _stages_figure(runs, label), f"{_STAGES_NOTE} {note}")
    )
    return _bench_table(runs, label) + f'<div class="rp-grid">{figs}</div>'


def _gpu_html(gpu: Mapping[str, Any]) -> str:
    label = f"{gpu.get('device', 'unknown GPU')}, {gpu.get('date', 'undated')}"
    runs = [r for r in gpu.get("runs", []) if r.get("variants")]
    skipped = [f"{r.get('trace')}: {r['skipped']}" for r in gpu.get("runs", []) if "skipped" in r]
    text = (
        f"GPU benchmark (benchmarks/embed_gpu.py, configuration {gpu.get('config', '?')}) "
        f"recorded on {label}, bundled with recperf."
    )
    if skipped:
        text += f" Traces skipped: {'; '.join(skipped)}."
    note = f"GPU figures recorded on {label} by benchmarks/embed_gpu.py."
    return f"<p>{html.escape(text)}</p>" + _bench_html(f"{KEY}-gpu", runs, label, note)


# -- figures ----------------------------------------------------------------------------------

_REUSE_NOTE = (
    "Share of each trace's accesses by reuse distance (accesses between two uses of a row, in "
    "power-of-two bins); 'cold' is a row's first access. Short distances hit in cache."
)
_COVERAGE_NOTE = (
    f"Share of the accesses that hit the k most frequent rows, by k (log scale): a steep curve "
    f"means a few hot rows serve most look-ups. The dashed line marks k = {TOP_K:,}."
)
_STAGES_NOTE = (
    "Median ms per batch of each stage of the whole inference model, with the fastest kernel "
    "(named after the trace) as its embedding stage."
)


def _reuse_figure(localities: Sequence[TraceLocality]) -> go.Figure:
    fig = go.Figure()
    longest: list[str] = []
    for i, loc in enumerate(localities):
        hist = loc.stats.to_json()["reuse_distance_hist"]
        labels = [str(h["bin"]) for h in hist]
        longest = labels if len(labels) > len(longest) else longest
        total = max(loc.stats.accesses, 1)
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=[int(h["count"]) / total for h in hist],
                mode="lines+markers",
                name=html.escape(loc.stats.name),
                line={"color": color_of(i)},
                hovertemplate="distance %{x}: %{y:.2%}",
            )
        )
    fig.update_layout(
        **LAYOUT,
        title=plot_title("Reuse distance per trace"),
        xaxis={
            "title": "accesses between uses (log2 bins)",
            "type": "category",
            "categoryorder": "array",
            "categoryarray": longest,
        },
        yaxis={"title": "share of accesses", "tickformat": ".0%", "rangemode": "tozero"},
    )
    return fig


def _coverage_figure(localities: Sequence[TraceLocality]) -> go.Figure:
    fig = go.Figure()
    for i, loc in enumerate(localities):
        fig.add_trace(
            go.Scatter(
                x=list(loc.coverage_k),
                y=list(loc.coverage),
                mode="lines",
                name=html.escape(loc.stats.name),
                line={"color": color_of(i)},
                hovertemplate="top %{x:,} rows: %{y:.1%}",
            )
        )
    fig.add_vline(x=TOP_K, line_dash="dash", line_color="#888")
    fig.update_layout(
        **LAYOUT,
        title=plot_title("Cumulative coverage by the hottest rows"),
        xaxis={"title": "k most frequent rows (log scale)", "type": "log"},
        yaxis={"title": "share of accesses", "tickformat": ".0%", "range": [0, 1.02]},
    )
    return fig


def _variant_bars(
    runs: Sequence[Mapping[str, Any]], metric: str, title: str, axis: str
) -> go.Figure:
    names = list(dict.fromkeys(str(v["variant"]) for run in runs for v in run["variants"]))
    fig = go.Figure()
    for i, name in enumerate(names):
        pairs = [
            (html.escape(str(run["trace"])), v)
            for run in runs
            for v in run["variants"]
            if str(v["variant"]) == name
        ]
        fig.add_trace(
            go.Bar(
                x=[t for t, _ in pairs],
                y=[float(v[metric]) for _, v in pairs],
                name=html.escape(name),
                marker={"color": color_of(i)},
                text=[f"{float(v['pct_of_copy_bw']):.1f}% of copy bandwidth" for _, v in pairs],
                hovertemplate="%{x}: %{y:.3g} (%{text})",
                textposition="none",
            )
        )
    fig.update_layout(
        **LAYOUT,
        barmode="group",
        title=plot_title(title),
        yaxis={"title": axis, "rangemode": "tozero"},
    )
    return fig


def _stages_figure(runs: Sequence[Mapping[str, Any]], label: str) -> go.Figure:
    labels = [
        html.escape(f"{run['trace']} ({min(run['variants'], key=_ms)['variant']})") for run in runs
    ]
    fig = go.Figure()
    for i, stage in enumerate(STAGES):
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[float(run.get("stages_ms", {}).get(stage, 0.0)) for run in runs],
                name=stage.replace("_", " ").replace("mlp", "MLP"),
                marker={"color": color_of(i)},
                hovertemplate="%{x}: %{y:.3f} ms",
            )
        )
    fig.update_layout(
        **LAYOUT,
        barmode="stack",
        title=plot_title(f"Inference stages per batch — {label}"),
        yaxis={"title": "ms per batch", "rangemode": "tozero"},
    )
    return fig


def _ms(variant: Mapping[str, Any]) -> float:
    return float(variant["ms_per_batch"])
