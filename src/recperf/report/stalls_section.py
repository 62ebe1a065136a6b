"""The report's distributed-training stall section: profile an embedded default (differential runs
on this machine), then show the per-run and differential breakdowns, the all-reduce model against
its measurements (held and unmeasured terms named), and the cloud advisor's time-cost frontier
with each setup's interval and verdict against the budget.

Run names, methods and skip reasons are escaped as in the other sections: ``html.escape`` for
hand-built HTML and for plotly labels (which plotly renders as a small HTML subset).
"""

from __future__ import annotations

import html
import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from recperf.core.progress import ProgressFn
from recperf.core.results import dumps_json
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
from recperf.report.stalls_figures import pareto_figure
from recperf.stalls.cost.advisor import Advice
from recperf.stalls.model.comm import LEVEL, PARAMS, CommModel
from recperf.stalls.result import STALLS, StallSummary
from recperf.stalls.run import netem
from recperf.stalls.run.profile import ProfileConfig
from recperf.stalls.study import Study, TracedFigures, conclude, study

KEY = "stalls"
TITLE = "Distributed-training stalls"
TORCH_TRACE_ITERS = 3
"""Timed iterations of each run also captured with torch.profiler, for ``stalls analyze``."""
FIT_BANDWIDTHS = ("2gbit",)
"""The all-reduce microbenchmark's second bandwidth (the profile's is 500mbit): the model's
per-byte and bandwidth terms cannot be told apart from one (about the cost of the 3 timed
iterations per run that the default gave up for it)."""
PROFILE_SHARE = 0.9
"""Share of the section's progress given to the profile (the rest fits, advises and plots)."""
FIGURES = ("iteration_s", "compute_s", *STALLS, "contention_s", "unexplained_s")
"""The breakdown rows, in table order."""
SCALARS = (
    *FIGURES,
    *(k.removesuffix("_s") + "_frac" for k in ("compute_s", *STALLS)),
    "backward_s",
    "grad_bytes",
    "num_layers",
    "flops_per_iter",
    "param_bytes",
)
SETUP = ("workload", "ranks", "nodes", "bandwidth", "iters", "batch_size", "device", "device_name")
_EXTRA_METHOD = {
    "contention_s": "part of compute: run 'control' - run 'compute' (CPU shared between ranks)",
    "unexplained_s": "iteration - compute - the four stalls",
}
_PARAM_MEANING = {
    "alpha_s": "seconds per ring step (latency)",
    "bucket_s": "seconds per all-reduce call",
    "beta_intra_s_per_byte": "seconds per byte inside one machine",
    "net_efficiency": "network per-byte time in units of 1/bandwidth",
    "beta_net_s_per_byte": "network seconds per byte beyond the bandwidth term",
}


def default_config(quick: bool) -> ProfileConfig:
    """The embedded default: DLRM on two emulated machines when namespaces can be made here
    (about a minute), or a tiny MLP on one (``quick``, for tests and previews)."""
    if quick:
        return ProfileConfig(
            workload="mlp",
            workload_options={"features": 64, "hidden": (128,)},
            ranks=2,
            nodes=1,
            iters=3,
            warmup=1,
            real_data=False,
            torch_trace_iters=2,
        )
    nodes = 2 if netem.available() is None else 1
    return ProfileConfig(
        workload="dlrm", ranks=2, nodes=nodes, bandwidth="500mbit", iters=12, warmup=3,
        torch_trace_iters=TORCH_TRACE_ITERS, fit_bandwidths=FIT_BANDWIDTHS if nodes > 1 else (),
    )  # fmt: skip


def stalls_section(*, quick: bool = False, progress: ProgressFn | None = None) -> Section:
    """Study the embedded default in a temporary directory and build the section."""
    report = MonotoneProgress(progress)
    with tempfile.TemporaryDirectory(prefix="recperf-stalls-") as tmp:
        found = study(
            default_config(quick), Path(tmp), progress=lambda f, _m: report(PROFILE_SHARE * f)
        )
    section = section_from_study(found)
    report(1.0)
    return section


# -- model and advice -------------------------------------------------------------------------


def _predicted(model: CommModel, s: Mapping[str, Any]) -> float:
    return model.predict(
        s["grad_bytes"], s["buckets"], s["ranks"], s["nodes"], s["bandwidth_bytes_per_s"]
    )


def _jsonable(data: Mapping[str, Any]) -> dict[str, Any]:
    """The same values as report.json will hold them (NaN and inf as null)."""
    out: dict[str, Any] = json.loads(dumps_json(data))
    return out


# -- the section ------------------------------------------------------------------------------


def section_from_summary(
    summary: Mapping[str, Any], traced: TracedFigures | None = None, traced_note: str = ""
) -> Section:
    """The section for a finished profile's summary.json object, and ``traced_figures``'
    comparison when the runs captured torch.profiler traces."""
    return section_from_study(conclude(StallSummary.from_json(summary), traced, traced_note))


def section_from_study(found: Study) -> Section:
    """The section drawing a study's results."""
    summary, traced = found.summary.to_json(), found.traced
    model, advice = found.model, found.advice
    data = {
        "setup": {k: summary.get(k) for k in SETUP},
        "figures": {k: summary[k] for k in SCALARS},
        "method": dict(summary["method"]),
        "cross_check": dict(summary["cross_check"]),
        "skipped": dict(summary["skipped"]),
        "runs": list(summary["runs"]),
        "comm_samples": list(summary["comm_samples"]),
        "comm_model": None if model is None else {p: getattr(model, p) for p in PARAMS},
        "comm_model_samples": 0 if model is None else model.samples,
        "comm_model_rel_rmse": None if model is None else model.rel_rmse,
        "comm_model_fit": None if model is None else model.to_json(),
        "advice": None if advice is None else advice.to_json(),
        "torch_trace_analysis": None if traced is None else traced.to_json(),
    }
    figs = [figure_html(f"{KEY}-breakdown", _breakdown_figure(summary), _BREAKDOWN_NOTE)]
    if model is not None:
        figs.append(_comm_figure(summary["comm_samples"], model))
    if advice is not None:
        figs.append(_pareto_html(advice))
    notes = [_skipped_text(summary["skipped"]), found.model_note, found.advice_note,
             found.traced_note]  # fmt: skip
    body = (
        f"<p>{html.escape(_setup_text(summary))}</p>"
        + "".join(f"<p><strong>Note:</strong> {html.escape(n)}</p>" for n in notes if n)
        + _breakdown_table(summary)
        + _cross_check_table(summary["cross_check"])
        + ("" if traced is None else _traced_table(traced))
        + f'<div class="rp-grid">{"".join(figs)}</div>'
        + ("" if model is None else _model_table(model))
        + ("" if advice is None else _advice_html(advice))
    )
    return Section(title=TITLE, key=KEY, html=body, data=_jsonable(data))


def _setup_text(summary: Mapping[str, Any]) -> str:
    nodes = int(summary["nodes"])
    where = f"{nodes} emulated machines at {summary['bandwidth']}" if nodes > 1 else "one machine"
    return (
        f"Workload {summary['workload']}, {summary['ranks']} data-parallel ranks on {where}, "
        f"batch {summary['batch_size']} per rank, {summary['iters']} timed iterations per run on "
        f"{summary['device']} ({summary['device_name']}). Each run adds one source of stall to "
        f"the one before (compute alone, N ranks without communication, with all-reduce, across "
        f"the emulated network, with real data warm and cold in the page cache); a stall is the "
        f"difference of consecutive runs' iteration times, cross-checked against the same stall "
        f"read directly from the rank traces. Runs here: "
        f"{', '.join(str(r['name']) for r in summary['runs'])}."
    )


def _skipped_text(skipped: Mapping[str, str]) -> str:
    if not skipped:
        return ""
    runs = "; ".join(f"run '{run}': {why}" for run, why in skipped.items())
    return f"Runs skipped, so their stalls read 0 (not measured): {runs}."


# -- tables -----------------------------------------------------------------------------------


def _ms(seconds: Any) -> str:
    return "—" if seconds is None else fmt_num(1e3 * float(seconds), 3)


def _pct(frac: Any) -> str:
    value = math.nan if frac is None else float(frac)
    return "—" if math.isnan(value) else f"{100 * value:.1f}%"


def resolved(value: float, half: float | None) -> str:
    """``± h`` ms of a figure's 95% interval, and ``(not told from 0)`` where it reaches 0."""
    if half is None:
        return "—"
    text = f"± {fmt_num(1e3 * half, 3)}"
    return text + " (not told from 0)" if value - half <= 0 < value + half else text


def _breakdown_table(summary: Mapping[str, Any]) -> str:
    iteration = float(summary["iteration_s"])
    half = summary.get("half_width_s") or {}
    rows = []
    for key in ("iteration_s", *FIGURES):
        value = float(summary[key])
        frac = value / iteration if iteration > 0 else math.nan
        method = summary["method"].get(key, _EXTRA_METHOD.get(key, ""))
        h = half.get(key)
        rows.append([key.removesuffix("_s"), method, _ms(value),
                     resolved(value, None if h is None else float(h)), _pct(frac)])  # fmt: skip
    loads = summary.get("host_load_1min") or {}
    load = [f"{name} {float(v):.1f}" for name, v in loads.items()]
    caption = (
        "Per-iteration breakdown by the differential method (ms per iteration, the half-width "
        "of its 95% interval from the runs' per-iteration spread, and its share of the "
        "iteration); 'method' names the runs each figure came from. A stall whose interval "
        "reaches 0 is not told apart from none."
        + (
            f" The machine's 1-min load at each run's end: {', '.join(load)} "
            f"(on {summary.get('host_cores', '?')} cores)."
            if load
            else ""
        )
    )
    header = ["figure", "method", "ms per iteration", "95% (ms)", "of iteration"]
    return table_html(header, rows, caption=caption, left_cols=2)


def _cross_check_table(cross: Mapping[str, Mapping[str, float]]) -> str:
    if not cross:
        return "<p>No stall was measured by both methods, so there is no cross-check.</p>"
    rows = [
        [key.removesuffix("_s"), _ms(c["differential_s"]), _ms(c["direct_s"]), _pct(c["rel_diff"])]
        for key, c in cross.items()
    ]
    caption = (
        "Cross-check: each stall by the differential method against the same stall read from "
        "the traces (exposed all-reduce time, data wait), and their relative difference."
    )
    header = ["stall", "differential (ms)", "direct (ms)", "relative difference"]
    return table_html(header, rows, caption=caption)


def _traced_table(traced: TracedFigures) -> str:
    rows = [
        [key.removesuffix("_s"), _ms(f.analyze_s), _ms(f.direct_s),
         _ms(f.analyze_s - f.direct_s), _pct(f.diff_of_iteration)]
        for key, f in traced.figures.items()
    ]  # fmt: skip
    caption = (
        f"recperf stalls analyze on the torch.profiler traces of run '{traced.run}' "
        f"({traced.iterations} iterations per rank) against the direct instrumentation of "
        f"the same iterations (ms per iteration; the difference also as a share of the "
        f"iteration). Exposed communication from the trace: {traced.exposed_method}; the "
        f"direct figure counts from the last bucket's launch, so time the thread spends inside "
        f"earlier buckets' launch calls is compute there and communication here."
    )
    header = ["figure", "torch.profiler trace (ms)", "direct (ms)", "difference (ms)",
              "of iteration"]  # fmt: skip
    return table_html(header, rows, caption=caption)


def _model_table(model: CommModel) -> str:
    def how(p: str) -> str:
        held = "held (not identifiable from one world size)" if p in model.held else ""
        return "not measured" if p in model.unmeasured else held or "fitted"

    rows = [[p, _PARAM_MEANING[p], how(p), f"{getattr(model, p):.3g}"] for p in PARAMS]
    rows.append(["relative RMSE", f"over {model.samples} samples", "", _pct(model.rel_rmse)])
    rows.append(["residual spread", "1.4826 x median |relative residual|", "",
                 _pct(model.rel_scale)])  # fmt: skip
    caption = (
        f"The all-reduce model's parameters, fitted by non-negative least squares on relative "
        f"error; predictions carry a {LEVEL:.0%} interval from the residual spread and the "
        f"parameters' covariance."
    )
    header = ["parameter", "meaning", "how", "value"]
    return table_html(header, rows, caption=caption, left_cols=3)


def _sig(x: float) -> str:
    """Three significant figures, whole numbers from 100 up."""
    return fmt_num(x, 0) if abs(x) >= 100 else f"{x:.3g}"


def _advice_html(advice: Advice) -> str:
    rec = advice.recommendation
    budget = advice.config.budget_h
    if rec is None:
        fast = advice.fastest
        text = (
            f"No setup meets the {budget:g} h budget; the fastest, {fast.count} x "
            f"{fast.instance}, would take {fast.total_h:.3g} h for ${fast.cost_usd:,.2f}."
        )
        return f"<p>{html.escape(text)}</p>"
    rows = [[rec.instance, rec.count, rec.gpus_total, _sig(rec.total_h),
             f"{_sig(rec.total_low_h)}–{_sig(rec.total_high_h)}", rec.verdict,
             _sig(rec.cost_usd)]]  # fmt: skip
    unsure = sum(c.verdict == "may miss" for c in advice.candidates)
    caption = (
        f"Recommendation: the cheapest setup whose {LEVEL:.0%} interval trains one epoch of "
        f"{advice.config.epoch_samples:,} samples within {budget:g} h (else the cheapest whose "
        f"point prediction does, marked 'may miss'); {unsure} of {len(advice.candidates)} "
        f"setups straddle the budget. Comm model: {advice.model_source}. Data stall: "
        f"{advice.data_stall_method}."
    )
    header = ["instance", "count", "GPUs", "total (h)", f"{LEVEL:.0%} interval (h)", "verdict",
              "cost (USD)"]  # fmt: skip
    return table_html(header, rows, caption=caption)


# -- figures ----------------------------------------------------------------------------------

_BREAKDOWN_NOTE = (
    "Per iteration, in ms. One bar per run, measured directly from its rank traces: data wait "
    "(waiting for the next batch), exposed communication (from the last gradient bucket's "
    "all-reduce launch to the last completion, which nothing overlaps) and compute (the step "
    "less the exposed communication). The last bar is the differential breakdown: compute from "
    "the control run and each stall as the difference of consecutive runs' iteration times."
)
_DIFF = "breakdown (differential)"


def _breakdown_figure(summary: Mapping[str, Any]) -> go.Figure:
    runs = summary["runs"]
    labels = [html.escape(str(r["name"])) for r in runs] + [_DIFF]
    pad = [None] * len(runs)
    series: list[tuple[str, list[Any]]] = [
        ("compute", [r["compute_s"] for r in runs] + [summary["compute_s"]]),
        ("data wait", [r["data_wait_s"] for r in runs] + [None]),
        ("exposed communication", [r["exposed_comm_s"] for r in runs] + [None]),
        *((k.removesuffix("_s").replace("_", " "), [*pad, summary[k]]) for k in STALLS),
    ]
    fig = go.Figure()
    for i, (name, values) in enumerate(series):
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[None if v is None else 1e3 * float(v) for v in values],
                name=name,
                marker={"color": color_of(i)},
                hovertemplate="%{x}: %{y:.3f} ms",
            )
        )
    fig.update_layout(
        **LAYOUT,
        barmode="stack",
        title=plot_title("Where an iteration's time goes, per run"),
        yaxis={"title": "ms per iteration", "rangemode": "tozero"},
    )
    return fig


def _comm_figure(samples: Sequence[Mapping[str, Any]], model: CommModel) -> str:
    fig = go.Figure()
    predicted = [_predicted(model, s) for s in samples]
    measured = [float(s["seconds"]) for s in samples]
    for i, nodes in enumerate(sorted({int(s["nodes"]) for s in samples})):
        pick = [k for k, s in enumerate(samples) if int(s["nodes"]) == nodes]
        fig.add_trace(
            go.Scatter(
                x=[1e3 * measured[k] for k in pick],
                y=[1e3 * predicted[k] for k in pick],
                mode="markers",
                name=f"{nodes} node(s)",
                marker={"color": color_of(i), "size": 8},
                text=[f"{samples[k]['grad_bytes']:,.0f} bytes" for k in pick],
                hovertemplate="%{text}: measured %{x:.3f} ms, predicted %{y:.3f} ms",
            )
        )
    positive = [1e3 * v for v in measured + predicted if v > 0]
    lo, hi = (min(positive), max(positive)) if positive else (1e-3, 1.0)
    fig.add_trace(
        go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line={"dash": "dash"})
    )
    fig.update_layout(
        **LAYOUT,
        title=plot_title("All-reduce time: measured vs model"),
        xaxis={"type": "log", "title": "measured (ms, log scale)"},
        yaxis={"type": "log", "title": "predicted (ms, log scale)"},
    )
    note = (
        f"Each point is one all-reduce size of the profile's microbenchmark (median per rank, "
        f"mean over ranks), against the ring alpha-beta model fitted to all {model.samples} "
        f"points by non-negative least squares on relative error (relative RMSE "
        f"{100 * model.rel_rmse:.1f}%). On the dashed line the model is exact."
    )
    return figure_html(f"{KEY}-comm-model", fig, note)


def _pareto_html(advice: Advice) -> str:
    fig = pareto_figure(advice)
    for trace in fig.data:  # catalog names become plotly labels, which plotly renders as HTML
        trace.name = html.escape(str(trace.name))
        if trace.text is not None:
            trace.text = [html.escape(str(t)) for t in trace.text]
    fig.update_layout(
        template=LAYOUT["template"],
        height=LAYOUT["height"],
        margin=LAYOUT["margin"],
        legend=LAYOUT["legend"],
        title=plot_title("Training time vs cost per cloud setup"),
    )
    methods = "; ".join(sorted({c.compute_method for c in advice.candidates}))
    note = (
        f"Every catalog instance type x 1..{advice.config.max_instances} instances: compute "
        f"predicted from the profile ({methods}), "
        f"the profile's directly measured data stall carried over, and all-reduce time from "
        f"the communication model ({advice.model_source}), of which only the part the backward "
        f"pass cannot hide counts; whiskers: the {LEVEL:.0%} interval of hours. The line joins "
        f"the setups no other beats on both time and cost; dashed: the "
        f"{advice.config.budget_h:g} h budget for one epoch of "
        f"{advice.config.epoch_samples:,} samples."
    )
    return figure_html(f"{KEY}-pareto", fig, note)
