"""The report's cluster section: five schedulers compared on bundled traces, as figures and tables.

Every string that comes from a trace (job, model, scheduler and trace names) is escaped here:
with ``html.escape`` in hand-built HTML, and also in plotly labels, which plotly renders as a
small HTML subset and whose entities it decodes for display.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from recperf.cluster.api import RunSpec, compare, dropping_invalid
from recperf.cluster.metrics import summarize, utilization_series
from recperf.cluster.outcome import SimResult
from recperf.cluster.traces.synthetic import SyntheticConfig
from recperf.core.progress import ProgressFn
from recperf.report.section import (
    LAYOUT,
    JctCurve,
    Section,
    color_of,
    figure_html,
    fmt_num,
    jct_cdf_figure,
    plot_title,
    table_html,
)

KEY = "cluster"
TITLE = "GPU-cluster scheduling"
SCHEDULERS = ("fifo", "sjf", "srtf", "tiresias", "consolidate")
REAL_TOPOLOGY = RunSpec(
    trace="synthetic",
    cluster="lingjun",
    synthetic=SyntheticConfig(
        jobs=3_000, load=1.0, gpus_per_job="1:0.4,8:0.3,16:0.15,64:0.1,128:0.04,512:0.01"
    ),
)
"""Lingjun's real switch tree (847 hosts, 119 ToRs, 3 aggregation switches). Its job file could
not be obtained, so Poisson arrivals at offered load 1.0 with a mix of large jobs drive it."""
TRACES = (
    dropping_invalid(RunSpec(trace="tiresias-480")),
    dropping_invalid(RunSpec(trace="helios-500")),
    REAL_TOPOLOGY,
)
"""The first two each on its own default cluster (tiresias-n32g4, helios), with the rows that
cannot be simulated dropped and counted (none are); all in seconds."""
QUICK_TRACES = TRACES[:1]
LONGEST_JOBS = 5


@dataclass(frozen=True, slots=True)
class ClusterRun:
    """One trace simulated under several schedulers (``results`` in display order)."""

    trace: str
    results: Mapping[str, SimResult]
    seconds: float


def run_trace(
    spec: RunSpec, schedulers: Sequence[str] = SCHEDULERS, progress: ProgressFn | None = None
) -> ClusterRun:
    """Simulate ``spec``'s trace on its cluster under each scheduler; ``progress`` gets 0..1."""
    done = 0

    def on_done(_name: str, _res: SimResult) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done / len(schedulers))

    start = time.perf_counter()
    results = compare(spec, list(schedulers), on_done=on_done)
    label = spec.trace if spec.cluster is None else f"{spec.trace} on {spec.cluster}"
    return ClusterRun(trace=label, results=results, seconds=time.perf_counter() - start)


def cluster_section(*, quick: bool = False, progress: ProgressFn | None = None) -> Section:
    """Run the embedded default (``quick``: one trace) and build the section."""
    traces = QUICK_TRACES if quick else TRACES
    runs = []
    for i, spec in enumerate(traces):

        def sub(frac: float, i: int = i) -> None:
            if progress is not None:
                progress((i + frac) / len(traces))

        runs.append(run_trace(spec, SCHEDULERS, sub))
    return section_from_runs(runs)


def section_from_runs(runs: Sequence[ClusterRun]) -> Section:
    """The section for already simulated runs: one block of figures and tables per trace."""
    intro = (
        "<p>Each trace is replayed by the event-driven simulator on its default cluster under "
        "each scheduler, with the same placement policy; JCT is job completion time (finish "
        "minus arrival).</p>"
    )
    blocks = [_run_html(i, run) for i, run in enumerate(runs)]
    data = {
        "schedulers": list(runs[0].results) if runs else [],
        "traces": {run.trace: _run_data(run) for run in runs},
    }
    return Section(title=TITLE, key=KEY, html=intro + "".join(blocks), data=data)


def _run_data(run: ClusterRun) -> dict[str, Any]:
    first = next(iter(run.results.values()))
    return {
        "cluster": first.cluster.name,
        "cluster_gpus": first.cluster.gpus,
        "cluster_shape": first.cluster.shape,
        "placement": first.placement,
        "jobs": len(first.jobs),
        "dropped_invalid": _dropped(first),
        "simulated_in_s": run.seconds,
        "schedulers": {name: summarize(res) for name, res in run.results.items()},
    }


def _dropped(res: SimResult) -> int | None:
    """The trace rows dropped as invalid (None for generated jobs)."""
    by_reason = res.jobs.dropped_invalid
    return None if by_reason is None else sum(by_reason.values())


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "trace"


def _run_html(index: int, run: ClusterRun) -> str:
    first = next(iter(run.results.values()))
    where = (
        f"trace {run.trace}, cluster {first.cluster.name} ({first.cluster.shape}), "
        f"{len(first.jobs)} jobs, {first.placement} placement"
    )
    dropped = _dropped(first)
    if dropped is not None:
        where += f", {dropped} trace rows dropped as invalid"
    fid = f"cluster-{index}-{_slug(run.trace)}"
    summaries = {name: summarize(res) for name, res in run.results.items()}
    figures = [
        figure_html(f"{fid}-jct-cdf", _jct_cdf(run), f"JCT CDF per scheduler; {where}."),
        figure_html(f"{fid}-util", _utilization(run), f"GPUs held over time; {where}."),
        figure_html(
            f"{fid}-makespan",
            _bars(run, summaries, "makespan_s", 1 / 3600, "Makespan (h)", 1),
            f"Makespan: first arrival to last finish; {where}.",
        ),
        figure_html(
            f"{fid}-jct-mean",
            _bars(run, summaries, "jct_mean_s", 1.0, "Mean JCT (s)", 0),
            f"Mean job completion time; {where}.",
        ),
    ]
    return (
        f'<h3 id="{fid}">Trace {html.escape(run.trace)}</h3>'
        f"<p>{html.escape(where[0].upper() + where[1:])}; all {len(run.results)} schedulers "
        f"simulated in {run.seconds:.1f} s.</p>"
        + _summary_table(summaries)
        + f'<div class="rp-grid">{"".join(figures)}</div>'
        + _longest_jobs_table(run, summaries)
    )


def _jct_cdf(run: ClusterRun) -> go.Figure:
    curves = [
        JctCurve(
            name=name,
            jct_s=res.finish_s - res.jobs.arrival_s,
            labels=[f"{n} ({m})" for n, m in zip(res.jobs.name, res.jobs.model, strict=True)],
        )
        for name, res in run.results.items()
    ]
    return jct_cdf_figure(curves, f"JCT CDF — {run.trace}")


def _utilization(run: ClusterRun) -> go.Figure:
    fig = go.Figure()
    t0 = min(float(res.jobs.arrival_s.min()) for res in run.results.values())
    for name, res in run.results.items():
        start, frac = utilization_series(res)
        fig.add_trace(
            go.Scatter(
                x=((start - t0) / 3600.0).tolist(),
                y=(frac * 100.0).tolist(),
                mode="lines",
                name=html.escape(name),
            )
        )
    fig.update_layout(
        **LAYOUT,
        title=plot_title(f"GPU utilisation over time — {run.trace}"),
        xaxis={"title": "hours since first arrival"},
        yaxis={"title": "GPUs held (%)", "range": [0, 102]},
    )
    return fig


def _bars(
    run: ClusterRun,
    summaries: Mapping[str, dict[str, Any]],
    key: str,
    scale: float,
    label: str,
    digits: int,
) -> go.Figure:
    names = list(summaries)
    values = [float(summaries[n][key]) * scale for n in names]
    fig = go.Figure(
        go.Bar(
            x=[html.escape(n) for n in names],
            y=values,
            text=[fmt_num(v, digits) for v in values],
            textposition="outside",
            marker={"color": color_of(0)},
        )
    )
    fig.update_layout(
        **{**LAYOUT, "showlegend": False},
        title=plot_title(f"{label} — {run.trace}"),
        yaxis={"title": label, "rangemode": "tozero"},
    )
    return fig


# (summary key, column header, scale, decimals, better: -1 lower / +1 higher / 0 neither)
_COLUMNS: tuple[tuple[str, str, float, int, int], ...] = (
    ("jobs_finished", "jobs done", 1, 0, 0),
    ("makespan_s", "makespan (h)", 1 / 3600, 2, -1),
    ("jct_mean_s", "mean JCT (s)", 1, 0, -1),
    ("jct_p50_s", "p50 JCT (s)", 1, 0, -1),
    ("jct_p95_s", "p95 JCT (s)", 1, 0, -1),
    ("jct_p99_s", "p99 JCT (s)", 1, 0, -1),
    ("queue_mean_s", "mean queue (s)", 1, 0, -1),
    ("utilization", "GPU util (%)", 100, 1, +1),
    ("comm_overhead_frac", "comm overhead (%)", 100, 1, -1),
    ("preemptions", "preemptions", 1, 0, 0),
    ("jobs_single_gpu", "1-GPU jobs", 1, 0, 0),
    ("jobs_within_machine", "within machine", 1, 0, 0),
)


def _level_columns(summary: Mapping[str, Any]) -> list[tuple[str, str, float, int, int]]:
    """One column per switch level of the run's cluster (``jobs_within_rack``, ...)."""
    return [
        (key, key.removeprefix("jobs_").replace("_", " "), 1, 0, 0)
        for key in summary
        if key.startswith(("jobs_within_", "jobs_across_")) and key != "jobs_within_machine"
    ]


def _summary_table(summaries: Mapping[str, dict[str, Any]]) -> str:
    names = list(summaries)
    rows: list[list[object]] = [[n] for n in names]
    bold: list[tuple[int, int]] = []
    columns = [*_COLUMNS, *_level_columns(summaries[names[0]])]
    levels = len(columns) - len(_COLUMNS) + 2
    for col, (key, _hdr, scale, digits, better) in enumerate(columns, start=1):
        values = np.array([float(summaries[n][key]) * scale for n in names])
        for r, v in enumerate(values):
            rows[r].append(fmt_num(float(v), digits))
        if better and np.isfinite(values).any():
            best = np.nanmin(values) if better < 0 else np.nanmax(values)
            bold += [(r, col) for r in range(len(names)) if values[r] == best]
    header = ["scheduler", *(c[1] for c in columns)]
    caption = (
        f"Summary per scheduler; best value per column in bold. The last {levels} columns "
        "count jobs by the widest level their placement ever spanned."
    )
    return table_html(header, rows, caption=caption, bold=bold)


def _longest_jobs_table(run: ClusterRun, summaries: Mapping[str, dict[str, Any]]) -> str:
    best = min(summaries, key=lambda n: float(summaries[n]["jct_mean_s"]))
    res = run.results[best]
    jct = res.finish_s - res.jobs.arrival_s
    # Unfinished jobs (NaN JCT) sort first: they are the longest of all.
    order = np.argsort(-np.nan_to_num(jct, nan=np.inf), kind="stable")[:LONGEST_JOBS]
    rows = [
        [
            res.jobs.name[j],
            res.jobs.model[j],
            int(res.jobs.gpus[j]),
            fmt_num(float(res.first_start_s[j] - res.jobs.arrival_s[j]), 0),
            fmt_num(float(jct[j]), 0),
        ]
        for j in order
    ]
    caption = f"The {len(rows)} longest jobs under {best}, the scheduler with the lowest mean JCT."
    header = ["job", "model", "GPUs", "queued (s)", "JCT (s)"]
    return table_html(header, rows, caption=caption, left_cols=2)
