"""The L2 model's part of the embedding section, and its figure (also written by ``recperf embed
predict``): per kernel variant the predicted L2 hit rate, DRAM bytes and time bound on a GPU spec
for the paper configuration and the bundled trace, the hit rate against the L2 size with every
bundled device's L2 marked, and, where a GPU run is bundled, its measured times beside the
predicted bounds. All of it is labelled as a model."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from recperf.core.errors import RecperfError
from recperf.embed import gpus, l2model
from recperf.embed.bench import bench_trace
from recperf.embed.model import config
from recperf.report.section import LAYOUT, color_of, figure_html, fmt_num, plot_title, table_html

KEY = "embed-l2model"
REPORT_GPU = "h200"
"""The spec the section predicts for when no GPU run is bundled (the lent device)."""
REPORT_CONFIG = "paper"
REPORT_TRACE = "reuse-medium-500k"
SAMPLE = 0.02
"""Share of the lines the report replays (spatially sampled, see ``stackdist.sampled``) to stay
within a few seconds; ``recperf embed predict`` replays all of them by default."""
QUICK_SAMPLE = 0.01
SWEEP = (0.25,)
"""A smaller carve-out the section also models hot-l2 with (a share of the persisting maximum;
the full one is in the main table): does a smaller pinned region pay where the largest does
not?"""
MIB = 1 << 20


def run_model(
    gpu: str = REPORT_GPU,
    cfg_name: str = REPORT_CONFIG,
    trace: str = REPORT_TRACE,
    sample: float = SAMPLE,
    sweep: tuple[float, ...] = (),
    run: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The model's JSON for every modelled variant at the report's sample rate, with hot-l2 at
    the ``sweep`` carve-outs under ``carve_out_sweep``; with a GPU ``run``, at its batch size
    and weight dtype."""
    batch = None if run is None else run.get("batch_size")
    cfg = config(cfg_name, batch_size=None if batch is None else int(batch))
    half = run is not None and run.get("dtype") == "float16"
    options = l2model.PredictConfig(sample=sample, dtype="fp16" if half else "fp32")
    spec, loaded = gpus.load(gpu), bench_trace(cfg, trace)
    out = l2model.predict(spec, cfg, loaded, list(l2model.VARIANTS), options).to_json()
    swept = l2model.sweep_carve_out(spec, cfg, loaded, sweep, options) if sweep else ()
    return out | {"carve_out_sweep": [l2model.variant_json(v) for v in swept]}


def model_for_report(quick: bool, gpu_run: Mapping[str, Any] | None) -> dict[str, Any]:
    """The model's JSON for the section: on the bundled GPU run's device and traces where there
    is one (matched to a bundled spec by name), else on ``REPORT_GPU`` and the bundled trace;
    ``{"error": why}`` when the model cannot run."""
    sample = QUICK_SAMPLE if quick else SAMPLE
    try:
        spec = gpus.for_device(str(gpu_run.get("device", ""))) if gpu_run else None
        runs = [r for r in (gpu_run or {}).get("runs", []) if r.get("variants")]
        if spec is None or not runs or gpu_run is None:
            return {"predictions": [run_model(sample=sample, sweep=SWEEP)], "measured": None}
        cfg_name = str(gpu_run.get("config", REPORT_CONFIG))
        preds = [run_model(spec.name, cfg_name, str(r["trace"]), sample, run=r) for r in runs]
        return {"predictions": preds, "measured": gpu_run}
    except RecperfError as exc:
        return {"error": str(exc)}


def side_by_side(pred: Mapping[str, Any], run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows of measured ms per batch beside the predicted lower bound, per variant both have."""
    predicted = {v["variant"]: v for v in pred["variants"]}
    rows = []
    for v in run.get("variants", []):
        p = predicted.get(str(v["variant"]))
        if p is None:
            continue
        ms, bound = float(v["ms_per_batch"]), float(p["time_lower_bound_ms"])
        rows.append({"variant": v["variant"], "measured_ms": ms, "bound_ms": bound,
                     "measured_over_bound": ms / bound if bound > 0 else float("nan"),
                     "hit_rate": p["hit_rate"]})  # fmt: skip
    return rows


def l2_html(data: Mapping[str, Any]) -> str:
    """The model's paragraph, table(s), figure and side-by-side times (escaped)."""
    if "error" in data:
        return f"<p>{html.escape('L2 model not run: ' + str(data['error']))}</p>"
    preds = data["predictions"]
    first = preds[0]
    out = f"<p>{html.escape(_intro(first))}</p>"
    for pred in preds:
        out += model_table(pred) + sweep_table(pred)
    out += figure_html(KEY, hit_rate_figure(first), _figure_note(first))
    measured = data.get("measured")
    if measured:
        for pred, run in zip(
            preds, [r for r in measured["runs"] if r.get("variants")], strict=True
        ):
            out += _side_by_side_table(pred, run, str(measured.get("device", "")))
    return out


def _intro(pred: Mapping[str, Any]) -> str:
    gpu = pred["gpu"]
    return (
        f"{l2model.MODEL_NOTE} The trace-driven L2 model (recperf embed predict) replays the "
        f"lines each kernel variant touches for the {pred['config']} configuration "
        f"({pred['dtype']}, batch {pred['batch_size']:,}) on {gpu['device']} ({gpu['name']}: "
        f"{gpu['l2_bytes'] / MIB:.1f} MiB L2, up to {gpu['persisting_l2_max_bytes'] / MIB:.1f} "
        f"MiB persisting, {gpu['dram_gb_per_s']:,.0f} GB/s DRAM): an LRU L2 from exact stack "
        f"distances of a {100 * pred['sample']:g}% hash sample of the lines (the rest scaled "
        f"from it), {pred['warmup_batches']} batch to warm the cache and "
        f"{pred['batches'] - pred['warmup_batches']} counted. The hot-row variants pin their "
        f"hot region (the carve-out) and leave the rest to the LRU. Times are lower bounds from "
        f"peak bandwidths. {l2model.LEAVES_OUT}"
    )


def model_table(pred: Mapping[str, Any]) -> str:
    """One prediction as a table: a row per variant."""
    rows = [
        [
            v["variant"],
            f"{fmt_num(100 * float(v['hit_rate']), 1)}%",
            f"{fmt_num(100 * float(v['pinned_share']), 1)}%",
            fmt_num(v["carve_out_bytes"] / MIB, 1),
            fmt_num(v["dram_bytes_per_batch"] / 1e6, 1),
            fmt_num(v["l2_bytes_per_batch"] / 1e6, 1),
            fmt_num(float(v["time_lower_bound_ms"]), 3),
            v["bound"],
        ]
        for v in pred["variants"]
    ]
    header = ["variant", "L2 hit rate", "to pinned lines", "carve-out MiB", "DRAM MB per batch",
              "L2 MB per batch", "time bound ms", "bound by"]  # fmt: skip
    caption = (
        f"Model (not measured): {pred['config']} / {pred['trace']} on {pred['gpu']['name']}, "
        f"per batch."
    )
    return table_html(header, rows, caption=caption)


def sweep_table(pred: Mapping[str, Any]) -> str:
    """hot-l2 at each swept carve-out beside triton (no pinning): will pinning pay? ("" when
    nothing was swept)."""
    by_name = {v["variant"]: v for v in pred["variants"]}
    swept = [*pred.get("carve_out_sweep", []), by_name.get("hot-l2")]
    if not pred.get("carve_out_sweep") or None in swept or "triton" not in by_name:
        return ""
    base = by_name["triton"]
    rows = [
        [
            "triton (no pinning)" if v is base else "hot-l2",
            fmt_num(v["carve_out_bytes"] / MIB, 1),
            f"{fmt_num(100 * float(v['hit_rate']), 1)}%",
            fmt_num(v["dram_bytes_per_batch"] / 1e6, 1),
            fmt_num(float(v["time_lower_bound_ms"]), 3),
        ]
        for v in [base, *swept]
    ]
    header = ["variant", "carve-out MiB", "L2 hit rate", "DRAM MB per batch", "time bound ms"]
    caption = (
        f"Model (not measured): will pinning pay on {pred['gpu']['name']}? hot-l2 with its hot "
        f"region sized to shares of the persisting-L2 maximum, beside no pinning."
    )
    return table_html(header, rows, caption=caption)


def _side_by_side_table(pred: Mapping[str, Any], run: Mapping[str, Any], device: str) -> str:
    rows = [
        [r["variant"], fmt_num(r["measured_ms"], 3), fmt_num(r["bound_ms"], 3),
         f"{fmt_num(r['measured_over_bound'], 2)}×", f"{fmt_num(100 * float(r['hit_rate']), 1)}%"]
        for r in side_by_side(pred, run)
    ]  # fmt: skip
    header = ["variant", "measured ms", "model bound ms", "measured / bound", "model hit rate"]
    caption = (
        f"Measured on {device} (benchmarks/embed_gpu.py) beside the model's lower bound, "
        f"{pred['trace']}."
    )
    return table_html(header, rows, caption=caption)


def _figure_note(pred: Mapping[str, Any]) -> str:
    return (
        f"Model, not measurement: predicted L2 hit rate of the row accesses against the L2 size "
        f"({pred['config']} / {pred['trace']}); pinned variants keep their "
        f"{pred['gpu']['name']} carve-out and the LRU gets the rest. Dashed lines: the bundled "
        f"devices' L2."
    )


def hit_rate_figure(
    pred: Mapping[str, Any], specs: Sequence[gpus.GpuSpec] | None = None
) -> go.Figure:
    """Hit rate against L2 size (log MiB), a curve per distinct prediction (variants with equal
    curves share one), and a dashed line at each device's L2."""
    curves: dict[tuple[float | None, ...], list[str]] = {}
    sizes: list[int] = []
    for v in pred["variants"]:
        ys = tuple(None if y is None or y != y else float(y) for y in v["curve_hit_rate"])
        curves.setdefault(ys, []).append(str(v["variant"]))
        sizes = list(v["curve_l2_bytes"])
    fig = go.Figure()
    for i, (ys, names) in enumerate(curves.items()):
        fig.add_trace(
            go.Scatter(
                x=[s / MIB for s in sizes],
                y=list(ys),
                mode="lines",
                name=html.escape(", ".join(names)),
                line={"color": color_of(i)},
                hovertemplate="%{x:.1f} MiB: %{y:.1%}",
            )
        )
    # the devices as a dashed-line trace (shapes and annotations take log coordinates on a log
    # axis, traces take data): one segment per device, its name at the top
    devices = list(specs) if specs is not None else gpus.bundled()
    xs = [x for d in devices for x in (d.l2_bytes / MIB, d.l2_bytes / MIB, None)]
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=[y for _ in devices for y in (0.0, 1.0, None)],
            mode="lines",
            name="devices' L2",
            line={"color": "#888", "dash": "dash", "width": 1},
            hoverinfo="skip",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[d.l2_bytes / MIB for d in devices],
            y=[1.0 - 0.06 * (i % 3) for i in range(len(devices))],
            mode="text",
            text=[html.escape(d.name) for d in devices],
            textposition="middle left",
            showlegend=False,
            hovertemplate="%{text}: %{x:.1f} MiB L2<extra></extra>",
        )
    )
    fig.update_layout(
        **LAYOUT,
        title=plot_title(
            f"Model: L2 hit rate against L2 size — {pred['config']} / {pred['trace']}"
        ),
        xaxis={"title": "L2 size, MiB (log scale)", "type": "log"},
        yaxis={"title": "predicted hit rate", "tickformat": ".0%", "range": [0, 1.02]},
    )
    return fig
