"""The L2 model's part of the embedding section, and its figure (also written by ``recperf embed
predict``): per kernel variant the predicted L2 hit rate, DRAM bytes and time bound on a GPU spec
for the paper configuration and the bundled trace, the hit rate against the L2 size with every
bundled device's L2 marked, and, where a GPU run is bundled, its measured times beside the
predicted bounds, and the pinning variant's hit rate against the persisting carve-out per row
format (fp32 to int4: does pinning pay with int8 rows?). All of it is labelled as a model."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from recperf.core.errors import RecperfError
from recperf.embed import gpus, l2model, l2sweep
from recperf.embed.bench import bench_trace
from recperf.embed.kernels.formats import ROW_FORMATS
from recperf.embed.l2layout import default_variants, variant_traits
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
FORMATS = ("fp32", "fp16", "int8", "int4")
"""Row formats of the carve-out figure (those the pinning variant reads)."""
SHARES = (0.0, 0.25, 0.5, 1.0)
"""Carve-outs of the figure, as shares of the persisting-L2 maximum (0: nothing pinned); each
format costs a line stream and a replay per carve-out (about 1 s a format here, 2 cores)."""
QUICK_SHARES = (0.0, 1.0)
TORCH_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
"""A GPU run's torch dtype names, as row formats."""
MIB = 1 << 20


def run_model(
    gpu: str = REPORT_GPU,
    cfg_name: str = REPORT_CONFIG,
    trace: str = REPORT_TRACE,
    sample: float = SAMPLE,
    run: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The model's JSON for recperf's own kernels that read the rows (``default_variants``)
    at the report's sample rate; with a GPU ``run``, at its batch size and row format."""
    batch = None if run is None else run.get("batch_size")
    cfg = config(cfg_name, batch_size=None if batch is None else int(batch))
    fmt = row_format_of(run)
    options = l2model.PredictConfig(sample=sample, dtype=fmt)  # type: ignore[arg-type]
    spec, loaded = gpus.load(gpu), bench_trace(cfg, trace)
    return l2model.predict(spec, cfg, loaded, default_variants(fmt), options).to_json()


def row_format_of(run: Mapping[str, Any] | None) -> str:
    """A GPU run's row format (its ``dtype``: a torch name or a row format), fp32 without."""
    dtype = str((run or {}).get("dtype", "fp32"))
    fmt = TORCH_DTYPES.get(dtype, dtype)
    return fmt if fmt in ROW_FORMATS else "fp32"


def run_formats(
    gpu: str = REPORT_GPU,
    sample: float = SAMPLE,
    shares: Sequence[float] = SHARES,
    formats: Sequence[str] = FORMATS,
    run: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The pinning variant's hit rate against the carve-out for each of ``formats`` it reads
    (``l2sweep.sweep_formats``) on ``gpu`` for the report's configuration and trace (a GPU
    ``run``'s: its configuration, first trace and batch size); ``{"error": why}`` when no
    registered kernel pins."""
    try:
        variant = l2sweep.pinning_variant(formats[0])
    except RecperfError as exc:
        return {"error": str(exc)}
    reads = variant_traits(variant).formats
    runs = [r for r in (run or {}).get("runs", []) if r.get("variants")]
    first: Mapping[str, Any] = runs[0] if runs else {}
    cfg_name = str((run or {}).get("config", REPORT_CONFIG))
    trace = str(first.get("trace", REPORT_TRACE))
    batch = first.get("batch_size")
    cfg = config(cfg_name, batch_size=None if batch is None else int(batch))
    spec = gpus.load(gpu)
    options = l2model.PredictConfig(sample=sample)
    fmts = [f for f in formats if f in reads]
    swept = l2sweep.sweep_formats(spec, cfg, bench_trace(cfg, trace), fmts, shares, options,
                                  variant)  # fmt: skip
    return {
        "gpu": spec.to_json(),
        "config": cfg_name,
        "trace": trace,
        "sample": sample,
        "variant": variant,
        "unread": [f for f in formats if f not in reads],
        "formats": [f.to_json() for f in swept],
    }


def model_for_report(quick: bool, gpu_run: Mapping[str, Any] | None) -> dict[str, Any]:
    """The model's JSON for the section: on the bundled GPU run's device and traces where there
    is one (matched to a bundled spec by name), else on ``REPORT_GPU`` and the bundled trace,
    and the carve-out by row format on that device; ``{"error": why}`` when the model cannot
    run."""
    sample = QUICK_SAMPLE if quick else SAMPLE
    shares, formats = (QUICK_SHARES, FORMATS[::2]) if quick else (SHARES, FORMATS)
    try:
        spec = gpus.for_device(str(gpu_run.get("device", ""))) if gpu_run else None
        runs = [r for r in (gpu_run or {}).get("runs", []) if r.get("variants")]
        if spec is None or not runs or gpu_run is None:
            preds = [run_model(sample=sample)]
            by_format = run_formats(REPORT_GPU, sample, shares, formats)
            return {"predictions": preds, "measured": None, "by_format": by_format}
        by_format = run_formats(spec.name, sample, shares, formats, gpu_run)
        cfg_name = str(gpu_run.get("config", REPORT_CONFIG))
        preds = [run_model(spec.name, cfg_name, str(r["trace"]), sample, run=r) for r in runs]
        return {"predictions": preds, "measured": gpu_run, "by_format": by_format}
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
        out += model_table(pred)
    out += figure_html(KEY, hit_rate_figure(first), _figure_note(first))
    out += formats_html(data.get("by_format"))
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


# -- the carve-out by row format ---------------------------------------------------------------


def formats_html(data: Mapping[str, Any] | None) -> str:
    """The carve-out by row format: its table and figure ("" when not run, a line when it
    could not run)."""
    if not data:
        return ""
    if "error" in data:
        return (
            f"<p>{html.escape('Carve-out by row format not modelled: ' + str(data['error']))}</p>"
        )
    return formats_table(data) + figure_html(
        f"{KEY}-formats", carve_out_figure(data), _formats_note(data)
    )


def formats_table(data: Mapping[str, Any]) -> str:
    """A row per row format: its hit rate at each carve-out, and DRAM bytes and the time bound
    without pinning and at the largest carve-out."""
    curves = data["formats"]
    carves = curves[0]["carve_out_bytes"] if curves else []
    rows = [
        [
            c["row_format"],
            str(c["row_bytes"]),
            *(f"{fmt_num(100 * float(h), 1)}%" for h in c["hit_rate"]),
            f"{fmt_num(c['dram_bytes_per_batch'][0] / 1e6, 1)} → "
            f"{fmt_num(c['dram_bytes_per_batch'][-1] / 1e6, 1)}",
            f"{fmt_num(float(c['time_lower_bound_ms'][0]), 3)} → "
            f"{fmt_num(float(c['time_lower_bound_ms'][-1]), 3)}",
        ]
        for c in curves
    ]
    header = ["row format", "row bytes", *(f"hit rate, {fmt_num(b / MIB, 1)} MiB" for b in carves),
              "DRAM MB per batch", "time bound ms"]  # fmt: skip
    missing = ", ".join(data["unread"])
    unread = f" ({data['variant']} does not read {missing})" if missing else ""
    caption = (
        f"Model (not measured): will pinning pay by row format? {data['variant']} on "
        f"{data['gpu']['name']}, {data['config']} / {data['trace']}, with the first carve-out "
        f"bytes of its hot rows pinned (0: none); DRAM and time without pinning → at the "
        f"largest carve-out{unread}."
    )
    return table_html(header, rows, caption=caption, left_cols=2)


def _formats_note(data: Mapping[str, Any]) -> str:
    return (
        f"Model, not measurement: predicted L2 hit rate of {data['variant']}'s row accesses "
        f"against the persisting-L2 carve-out on {data['gpu']['name']} "
        f"({data['gpu']['l2_bytes'] / MIB:.1f} MiB L2), one line per row format (rows at their "
        f"real size, int8/int4 with their 4 bytes of scale and bias): the hot rows are laid "
        f"out first, the carve-out pins the first of them and the LRU holds the rest of the L2. "
        f"A {100 * data['sample']:g}% hash sample of the lines."
    )


def carve_out_figure(data: Mapping[str, Any]) -> go.Figure:
    """Hit rate against the carve-out (MiB), a line per row format."""
    fig = go.Figure()
    top = max((b / MIB for c in data["formats"] for b in c["carve_out_bytes"]), default=1.0)
    for i, c in enumerate(data["formats"]):
        fig.add_trace(
            go.Scatter(
                x=[b / MIB for b in c["carve_out_bytes"]],
                y=[float(h) for h in c["hit_rate"]],
                mode="lines+markers",
                name=html.escape(f"{c['row_format']} ({c['row_bytes']} B rows)"),
                line={"color": color_of(i)},
                hovertemplate="%{x:.1f} MiB pinned: %{y:.1%}<extra></extra>",
            )
        )
    fig.update_layout(
        **LAYOUT,
        title=plot_title(
            f"Model: L2 hit rate against carve-out by row format — {data['gpu']['name']}"
        ),
        xaxis={
            "title": "persisting-L2 carve-out, MiB (0: no pinning)",
            "range": [-0.03 * top, 1.03 * top],
        },
        yaxis={"title": "predicted hit rate", "tickformat": ".0%"},
    )
    return fig
