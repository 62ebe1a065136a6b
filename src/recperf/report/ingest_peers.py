"""The ingestion section's side-by-side bars: recperf's live pipeline against the DataLoader,
torchdata.nodes, tf.data and SPDL, as ``benchmarks/ingest_live.py`` measured them in one sitting
(bundled as ``recperf/data/ingest/bench_live.json``; too long to rerun inside the report)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

import plotly.graph_objects as go

from recperf.report.ingest_live import KEY
from recperf.report.section import LAYOUT, color_of, figure_html, plot_title

BUNDLED = "data/ingest/bench_live.json"
ORDER = ("recperf", "recperf_fixed", "recperf_fused", "recperf_even", "dataloader",
         "torchdata_nodes", "tfdata", "spdl")  # fmt: skip
LABELS = {
    "recperf": "recperf (tuned, --alloc auto)",
    "recperf_fixed": "recperf, best fixed allocation",
    "recperf_fused": "recperf fused",
    "recperf_even": "recperf even split",
    "dataloader": "PyTorch DataLoader",
    "torchdata_nodes": "torchdata.nodes",
    "tfdata": "tf.data AUTOTUNE",
    "spdl": "SPDL",
}


def load_bundled() -> dict[str, Any] | None:
    ref = resources.files("recperf").joinpath(BUNDLED)
    if not ref.is_file():
        return None
    data: dict[str, Any] = json.loads(ref.read_text(encoding="utf-8"))
    return data


def peers_html(bench: Mapping[str, Any] | None) -> str:
    """The bars and a one-line provenance, or nothing when no benchmark is bundled."""
    if not bench:
        return ""
    settings = list(bench["settings"])
    fig = go.Figure()
    present = [p for p in ORDER if any(p in bench["settings"][s] for s in settings)]
    for i, peer in enumerate(present):
        rows = [bench["settings"][s].get(peer, {}) for s in settings]
        ys = [r.get("rows_per_s", 0.0) / 1e3 for r in rows]
        text = [
            f"{r['variant'] or '-'} / {r['workers']}" if "rows_per_s" in r else "" for r in rows
        ]
        fig.add_trace(
            go.Bar(
                x=[html.escape(s) for s in settings],
                y=ys,
                name=html.escape(LABELS.get(peer, peer)),
                marker={"color": color_of(i)},
                hovertext=[html.escape(t) for t in text],
            )
        )
    fig.update_layout(
        **LAYOUT,
        barmode="group",
        title=plot_title("Live ingestion against the peers (one sitting)"),
        yaxis={"title": "k rows/s (median)", "rangemode": "tozero"},
    )
    note = (
        f"Measured {bench['date']} on {bench['machine'].get('cpus', '?')} cores by "
        f"`{bench['command']}`: 1M generated rows, each peer's best configuration (hover: "
        f"variant / workers), medians of {bench['reps']} interleaved runs of "
        f"{bench['seconds']:g} s, each in a fresh process. Bundled with the package, not rerun "
        "by the report."
    )
    return f'<h3 id="{KEY}-peers">Against the peers</h3>' + figure_html(f"{KEY}-peers", fig, note)
