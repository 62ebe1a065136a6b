"""The ingestion section's Ray Data comparison: Ray Data's own autoscaling against each recperf
tuner and the LP bound on spec pipelines at cluster scale, and the real one-node run, as
``benchmarks/ingest_ray.py`` measured them (bundled as ``recperf/data/ingest/bench_ray.json``;
the report never starts Ray).

Spec, tuner, operator and mode names come from the file and are escaped as in the rest of the
section: ``html.escape`` for hand-built HTML and for plotly labels."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from recperf.report.ingest_live import KEY
from recperf.report.section import LAYOUT, color_of, figure_html, fmt_num, plot_title, table_html

BUNDLED = "data/ingest/bench_ray.json"
HEADLINE_SPEC = "ray-65540"
RAY_DEFAULT = "ray-default"
BOUND_TARGET = 0.9
DEFAULT_TARGET = 1.3
"""The issue's targets, as ``benchmarks/ingest_ray.py`` judges them (the words say them)."""
COMMAND = (
    "python benchmarks/ingest_ray.py scale, then real, then package (which writes "
    f"src/recperf/{BUNDLED})"
)
REAL_LABELS = {
    "ray-default": "Ray Data default",
    "ray-tuned": "Ray Data, recperf-tuned",
    "native": "recperf native",
    "torchdata_nodes": "torchdata.nodes",
}
FORMATS = {"tsv": "TSV", "parquet": "Parquet"}
_RUN_KEYS = (
    "spec", "nodes", "cpus_per_node", "chosen_by", "operators", "throughput_rows_per_s",
    "throughput_ci_rows_per_s", "samples", "lp_bound_rows_per_s", "fraction_of_bound",
    "logical_cpus", "idle_logical_cpus", "ray_overhead_ms_per_task", "time_to_first_block_s",
    "tuning_s",
)  # fmt: skip
"""What the report keeps of each scale run (not the tuning history or stage costs)."""


def bundled_file() -> Traversable:
    """Where the package keeps the benchmark's result (tests point this elsewhere)."""
    return resources.files("recperf").joinpath(BUNDLED)


def load_bundled() -> dict[str, Any] | None:
    """The bundled ``{"scale": ..., "real": ...}``, or None where none is bundled."""
    ref = bundled_file()
    if not ref.is_file():
        return None
    data: dict[str, Any] = json.loads(ref.read_text(encoding="utf-8"))
    return data


def parts(doc: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Which of ``scale`` and ``real`` the file has results for (each draws one figure)."""
    if not doc:
        return ()
    has = {"scale": bool(doc.get("scale", {}).get("runs")),
           "real": bool(doc.get("real", {}).get("medians"))}  # fmt: skip
    return tuple(k for k, v in has.items() if v)


def summary(doc: Mapping[str, Any] | None) -> dict[str, Any]:
    """The part of the file the report keeps in report.json: provenance, compact scale runs and
    targets, the real run's medians."""
    out: dict[str, Any] = {}
    for part in parts(doc):
        assert doc is not None
        d = doc[part]
        kept = {k: d.get(k) for k in ("date", "machine", "command")}
        if part == "scale":
            kept["runs"] = [{k: r.get(k) for k in _RUN_KEYS} for r in d["runs"]]
            kept["targets"] = d.get("targets", [])
        else:
            kept["medians"] = d["medians"]
        out[part] = kept
    return out


# -- words --------------------------------------------------------------------------------------


def _by_spec(runs: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for r in runs:
        out.setdefault(r["spec"], []).append(r)
    return out


def headline_spec(runs: Sequence[Mapping[str, Any]]) -> str:
    names = [r["spec"] for r in runs]
    return HEADLINE_SPEC if HEADLINE_SPEC in names else names[0]


def _idle(r: Mapping[str, Any]) -> str:
    if r.get("idle_logical_cpus") is None:
        return ""
    if r["idle_logical_cpus"] < 0.05:
        return ", which left no logical CPU idle"
    return f", which left {r['idle_logical_cpus']:.1f} of {r['logical_cpus']} logical CPUs idle"


def scale_text(scale: Mapping[str, Any]) -> str:
    """The headline spec's outcome and the targets, in words (plain text)."""
    spec = headline_spec(scale["runs"])
    runs = _by_spec(scale["runs"])[spec]
    default = next((r for r in runs if r["chosen_by"] == RAY_DEFAULT), None)
    tuned = [r for r in runs if r["chosen_by"] != RAY_DEFAULT]
    first = runs[0]
    head = f"On {spec} ({first['nodes']} nodes, {first['logical_cpus']} logical CPUs), "
    d_text = ""
    if default is not None:
        d_text = (
            f"Ray Data's default ({fmt_num(default['throughput_rows_per_s'], 0)} rows/s, "
            f"{default['fraction_of_bound']:.2f} of the bound){_idle(default)}"
        )
    if not tuned:
        said = head + (d_text or "nothing was measured") + "."
    else:
        best = max(tuned, key=lambda r: float(r["throughput_rows_per_s"]))
        said = (
            f"{head}recperf's {best['chosen_by']} reached {best['fraction_of_bound']:.2f} of the "
            f"LP bound ({fmt_num(best['throughput_rows_per_s'], 0)} of "
            f"{fmt_num(best['lp_bound_rows_per_s'], 0)} rows/s)"
        )
        if default is not None:
            ratio = best["throughput_rows_per_s"] / default["throughput_rows_per_s"]
            said += f", {ratio:.1f}x {d_text}"
        said += "."
    return f"{said} {targets_text(scale.get('targets', []))}".strip()


def targets_text(targets: Sequence[Mapping[str, Any]]) -> str:
    """Which runs met the issue's two targets, and plainly which did not."""
    if not targets:
        return ""
    low = [f"{t['spec']} {t['tuner']} {t['fraction_of_bound']:.2f}"
           for t in targets if not t["bound_target_met"]]  # fmt: skip
    slow = [f"{t['spec']} {t['tuner']} {t['vs_default']:.2f}x"
            for t in targets if t["default_target_met"] is False]  # fmt: skip
    idle = [t for t in targets if t["default_target_met"] is not None]
    specs = len({t["spec"] for t in targets})
    said = [
        f"Of {_n(len(targets), 'tuned run')} on {_n(specs, 'spec')}, "
        f"{len(targets) - len(low)} reached "
        f"{BOUND_TARGET:g} of the LP bound (the target)"
        + (f"; below it: {', '.join(low)}" if low else "")
    ]
    if idle:
        said.append(
            f"where Ray Data's default left CPUs idle ({_n(len(idle), 'run')}), "
            f"{len(idle) - len(slow)} beat it by {DEFAULT_TARGET:g}x or more"
            + (f"; short of that: {', '.join(slow)}" if slow else "")
        )
    return "; ".join(said) + "."


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}" if k == 1 else f"{k} {noun}s"


def _mode_range(m: Mapping[str, Any]) -> str:
    runs = m["runs"]
    return f"{fmt_num(min(runs), 0)}-{fmt_num(max(runs), 0)}"


def real_text(real: Mapping[str, Any]) -> str:
    """Per format: tuned against default Ray Data (and whether the gap beats the run-to-run
    noise: every tuned run above every default run), and Ray's overhead against native."""
    said = []
    for fmt, modes in real["medians"].items():
        name = FORMATS.get(fmt, fmt)
        bits = []
        tuned, default, native = (modes.get(k) for k in ("ray-tuned", "ray-default", "native"))
        if tuned and default:
            ratio = tuned["throughput_rows_per_s"] / default["throughput_rows_per_s"]
            beyond = min(tuned["runs"]) > max(default["runs"])
            bits.append(
                f"recperf-tuned Ray Data delivered {fmt_num(tuned['throughput_rows_per_s'], 0)} "
                f"rows/s, {ratio:.2f}x Ray Data's default "
                f"({fmt_num(default['throughput_rows_per_s'], 0)}), "
                + ("beyond" if beyond else "not beyond")
                + f" the run-to-run noise (runs {_mode_range(tuned)} against "
                f"{_mode_range(default)})"
            )
        ray = tuned or default
        if ray and native:
            who = "recperf-tuned Ray Data" if tuned else "Ray Data's default"
            bits.append(
                f"against recperf native, {who} ran at "
                f"{ray['throughput_rows_per_s'] / native['throughput_rows_per_s']:.2f}x its "
                f"rows/s ({fmt_num(native['throughput_rows_per_s'], 0)}), on "
                f"{ray['cores_used']:.2f} cores against {native['cores_used']:.2f}, "
                f"{fmt_num(ray['peak_pss_mib'], 0)} MiB peak PSS against "
                f"{fmt_num(native['peak_pss_mib'], 0)}, {ray['startup_s']:.1f} s to the first "
                f"batch against {native['startup_s']:.1f}"
            )
        if "torchdata_nodes" in modes:
            tn = modes["torchdata_nodes"]["throughput_rows_per_s"]
            bits.append(f"torchdata.nodes {fmt_num(tn, 0)} rows/s")
        if bits:
            said.append(f"{name}: {'; '.join(bits)}.")
    return ("Real data on one node (medians). " + " ".join(said)) if said else ""


# -- HTML ---------------------------------------------------------------------------------------


def ray_html(doc: Mapping[str, Any] | None) -> str:
    """The subsection: the words, one figure per part the file has, the allocations table; or
    one sentence saying how to measure it."""
    head = f'<h3 id="{KEY}-ray">Against Ray Data\'s own autoscaling</h3>'
    have = parts(doc)
    if not have:
        return head + (
            f"<p>{html.escape(f'The Ray Data comparison has not been measured: {COMMAND}.')}</p>"
        )
    assert doc is not None
    body = []
    if "scale" in have:
        body += [f"<p>{html.escape(scale_text(doc['scale']))}</p>", _scale_figure(doc["scale"]),
                 _scale_table(doc["scale"]["runs"])]  # fmt: skip
    if "real" in have:
        body += [f"<p>{html.escape(real_text(doc['real']))}</p>", _real_figure(doc["real"])]
    return head + "".join(body)


def _provenance(d: Mapping[str, Any]) -> str:
    return (
        f"Measured {d.get('date', '?')} on {d.get('machine', '?')} by `{d.get('command', '?')}`; "
        "bundled with the package, not rerun by the report."
    )


def _label(how: str) -> str:
    return "Ray Data default" if how == RAY_DEFAULT else f"recperf {how}"


def _scale_figure(scale: Mapping[str, Any]) -> str:
    spec = headline_spec(scale["runs"])
    runs = _by_spec(scale["runs"])[spec]
    labels = [html.escape(_label(r["chosen_by"])) for r in runs]
    ys = [r["throughput_rows_per_s"] / 1e3 for r in runs]
    ci = [r.get("throughput_ci_rows_per_s") or [r["throughput_rows_per_s"]] * 2 for r in runs]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=labels,
            y=ys,
            name="throughput",
            marker={"color": [color_of(i) for i in range(len(runs))]},
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [hi / 1e3 - y for (_, hi), y in zip(ci, ys, strict=True)],
                "arrayminus": [y - lo / 1e3 for (lo, _), y in zip(ci, ys, strict=True)],
            },
            hovertext=[html.escape(_ops(r)) for r in runs],
        )
    )
    fig.add_trace(
        go.Scatter(
            x=labels,
            y=[r["lp_bound_rows_per_s"] / 1e3 for r in runs],
            mode="lines+markers",
            line={"dash": "dash", "color": "#444"},
            name="LP bound",
        )
    )
    first = runs[0]
    fig.update_layout(
        **LAYOUT,
        title=plot_title(
            f"Ray Data on {spec}: {first['nodes']} nodes, {first['logical_cpus']} logical CPUs"
        ),
        yaxis={"title": "k rows/s", "rangemode": "tozero"},
    )
    note = (
        f"Throughput of each allocation over its measured window, error bars its 90% interval "
        f"over sub-windows (hover: the final allocation); dashed: the LP bound (on more than "
        f"one node, with a CPU row per node). {_provenance(scale)}"
    )
    return figure_html(f"{KEY}-ray-scale", fig, note)


def _ops(r: Mapping[str, Any]) -> str:
    return ", ".join(f"{o['operator']} x{o['workers']}" for o in r["operators"])


def _scale_table(runs: Sequence[Mapping[str, Any]]) -> str:
    rows: list[list[object]] = []
    for spec, spec_runs in _by_spec(runs).items():
        d = next((r for r in spec_runs if r["chosen_by"] == RAY_DEFAULT), None)
        for r in spec_runs:
            if r["chosen_by"] == RAY_DEFAULT:
                continue
            if d is None:
                pairs = [("—", _ops(r)), ("—", _idle_cell(r)), ("—", _frac(r))]
                ratio = float("nan")
            else:
                pairs = [(_ops(d), _ops(r)), (_idle_cell(d), _idle_cell(r)), (_frac(d), _frac(r))]
                ratio = r["throughput_rows_per_s"] / d["throughput_rows_per_s"]
            rows.append([spec, r["chosen_by"], *(c for p in pairs for c in p), fmt_num(ratio, 2)])
    header = ["spec", "recperf tuner", "workers: Ray default", "workers: recperf",
              "idle CPUs: default", "idle CPUs: recperf", "of LP bound: default",
              "of LP bound: recperf", "recperf / default"]  # fmt: skip
    caption = (
        "Final allocations side by side: operator x workers, logical CPUs left idle of the "
        "cluster's, throughput as a fraction of the LP bound, and the tuned throughput over "
        "Ray Data's default."
    )
    return table_html(header, rows, caption=caption, left_cols=4)


def _frac(r: Mapping[str, Any]) -> str:
    return f"{r['fraction_of_bound']:.2f}"


def _idle_cell(r: Mapping[str, Any]) -> str:
    idle = r.get("idle_logical_cpus")
    return "—" if idle is None else f"{idle:.1f} of {r['logical_cpus']}"


def _real_figure(real: Mapping[str, Any]) -> str:
    fmts = list(real["medians"])
    fig = make_subplots(rows=1, cols=len(fmts),
                        subplot_titles=[html.escape(FORMATS.get(f, f)) for f in fmts])  # fmt: skip
    for col, fmt in enumerate(fmts, start=1):
        modes = real["medians"][fmt]
        labels = [html.escape(REAL_LABELS.get(m, m)) for m in modes]
        fig.add_trace(
            go.Bar(x=labels, y=[modes[m]["throughput_rows_per_s"] / 1e3 for m in modes],
                   marker={"color": [_mode_color(m) for m in modes]},
                   name="median", legendgroup="median", showlegend=col == 1),
            row=1, col=col,
        )  # fmt: skip
        xs = [lab for lab, m in zip(labels, modes, strict=True) for _ in modes[m]["runs"]]
        fig.add_trace(
            go.Scatter(x=xs, y=[v / 1e3 for m in modes for v in modes[m]["runs"]],
                       mode="markers", marker={"color": "#222", "size": 7}, name="each run",
                       legendgroup="runs", showlegend=col == 1),
            row=1, col=col,
        )  # fmt: skip
    fig.update_layout(**LAYOUT, title=plot_title("Real data on one node (1M rows, one sitting)"))
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="k rows/s", col=1)
    note = (
        "Rows/s of each configuration: bars the median, points each interleaved run (each in "
        f"a fresh process). {_provenance(real)}"
    )
    return figure_html(f"{KEY}-ray-real", fig, note)


def _mode_color(mode: str) -> str:
    """One colour per configuration in both formats' panels, whichever ran."""
    order = list(REAL_LABELS)
    return color_of(order.index(mode) if mode in order else len(order))
