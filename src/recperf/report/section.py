"""What a report section is, and what every section module shares: the escaping-safe HTML
helpers, the plot layout, palette and titles, and the JCT-CDF figure of both cluster sections."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import plotly.graph_objects as go
import plotly.io as pio

from recperf.core.progress import ProgressFn

FIGURE_CLASS = "rp-figure"
"""CSS class of every figure div; the page's script plots each one and counts them."""
# Figures carry plain lists, not plotly's base64 arrays, so the page's own check can count the
# points of every trace and report.json stays readable.
LAYOUT: dict[str, Any] = {
    "template": "plotly_white",
    "height": 380,
    "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
    "legend": {"orientation": "h", "y": -0.2},
}
"""Plot layout shared by every section's figures."""
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#9d755d")
WIDE_PALETTE = (
    *PALETTE, "#eeca3b", "#ff9da6", "#1b9e77", "#7570b3", "#a6761d", "#666666", "#17becf",
    "#bcbd22", "#8c564b", "#e377c2", "#393b79", "#637939", "#843c39", "#7b4173", "#3182bd",
    "#e6550d", "#31a354", "#756bb1", "#636363",
)  # fmt: skip
"""26 distinct colours, for figures that tell many things apart (pipeline segments)."""


@dataclass(frozen=True, slots=True)
class Section:
    """One capability's part of the report: ``html`` is already escaped, ``data`` goes to JSON."""

    title: str
    key: str
    """Anchor id and report.json key (snake-case, no spaces)."""
    html: str
    data: dict[str, Any] = field(default_factory=dict)


class SectionBuilder(Protocol):
    """A section module's entry point; ``quick`` trades coverage for a run of a few seconds."""

    def __call__(self, *, quick: bool, progress: ProgressFn) -> Section: ...


def script_safe_json(text: str) -> str:
    """JSON that cannot end its ``<script>`` early: ``<`` only occurs inside JSON strings,
    where ``\\u003c`` means the same (plotly's to_json already does this; we do not rely on it)."""
    return text.replace("<", "\\u003c")


BUNDLED_TRACES = frozenset({"scatter", "bar", "pie"})
"""The trace types of the plotly.js bundle the page inlines (``builder.PLOTLY_JS``)."""


def figure_html(fig_id: str, fig: Any, note: str, *, wide: bool = False) -> str:
    """A figure div, its plotly JSON in an inert ``application/json`` script, and a note;
    ``wide`` spans every column of the grid it sits in. A trace type the page's plotly.js
    bundle cannot draw is refused here, not left blank."""
    for trace in fig.data:
        if trace.type not in BUNDLED_TRACES:
            raise ValueError(
                f"figure {fig_id}: trace type {trace.type!r} is not in the report's plotly.js "
                f"bundle ({', '.join(sorted(BUNDLED_TRACES))})"
            )
    fid = html.escape(fig_id)
    spec = script_safe_json(pio.to_json(fig, validate=True, pretty=False))
    return (
        f'<figure class="rp-figure-box{" rp-wide" if wide else ""}">'
        f'<div class="{FIGURE_CLASS}" id="{fid}" data-spec="{fid}-spec"></div>'
        f'<script type="application/json" id="{fid}-spec">{spec}</script>'
        f"<figcaption>{html.escape(note)}</figcaption></figure>"
    )


def table_html(
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    caption: str = "",
    bold: Sequence[tuple[int, int]] = (),
    left_cols: int = 1,
) -> str:
    """A plain HTML table; every cell is escaped. Cells listed in ``bold`` as (row, col) are
    emphasised (e.g. the best value in a column); the first ``left_cols`` columns hold text and
    align left, the rest numbers and align right."""
    strong = set(bold)

    def cls(c: int) -> str:
        return ' class="rp-l"' if c < left_cols else ""

    head = "".join(f"<th{cls(c)}>{html.escape(str(h))}</th>" for c, h in enumerate(header))
    body = []
    for r, row in enumerate(rows):
        cells = []
        for c, cell in enumerate(row):
            text = html.escape(str(cell))
            inner = f"<strong>{text}</strong>" if (r, c) in strong else text
            cells.append(f"<td{cls(c)}>{inner}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (
        f'<div class="rp-table-wrap"><table class="rp-table">{cap}<thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def fmt_num(x: float, digits: int = 1) -> str:
    """Thousands-separated, fixed decimals; NaN as an em dash."""
    if x != x:  # NaN
        return "—"
    return f"{x:,.{digits}f}"


class MonotoneProgress:
    """Passes the section's progress on, clamped to 0..1 and never moving backwards."""

    def __init__(self, progress: ProgressFn | None) -> None:
        self.progress = progress
        self.last = 0.0

    def __call__(self, frac: float) -> None:
        self.last = max(self.last, min(max(frac, 0.0), 1.0))
        if self.progress is not None:
            self.progress(self.last)


# -- plotting ---------------------------------------------------------------------------------


def color_of(i: int) -> str:
    """The ``i``-th palette colour, cycling."""
    return PALETTE[i % len(PALETTE)]


def plot_title(text: str) -> dict[str, Any]:
    """A figure title, escaped: plotly renders titles as a small HTML subset."""
    return {"text": html.escape(text), "font": {"size": 15}}


@dataclass(frozen=True, slots=True)
class JctCurve:
    """One line of a JCT CDF; names and labels are plain text (``jct_cdf_figure`` escapes)."""

    name: str
    jct_s: npt.NDArray[np.float64]
    """Every job's completion time; NaN for a job that never finished."""
    labels: Sequence[str]
    """Hover label of each job, aligned with ``jct_s``."""
    line: Mapping[str, Any] = field(default_factory=dict)
    """Line style beyond the step shape (colour, dash)."""
    group: str | None = None
    """Legend group, e.g. the scheduler of curves drawn at several congestion levels."""


CDF_POINTS = 400
"""Most points a CDF line draws: evenly spaced ranks, the first and last kept. At a figure's
width the steps of 3,000 jobs are not told apart from those of 400, and every point costs the
page (the lingjun trace's six curves alone were 0.8 MB)."""


def cdf_ranks(n: int, points: int = CDF_POINTS) -> npt.NDArray[np.int64]:
    """Indices into ``n`` sorted values that a CDF line draws: all of them up to ``points``,
    else ``points`` evenly spaced ranks including the first and the last."""
    if n <= points:
        return np.arange(n, dtype=np.int64)
    return np.unique(np.round(np.linspace(0, n - 1, points)).astype(np.int64))


def jct_cdf_figure(curves: Sequence[JctCurve], title: str) -> go.Figure:
    """The fraction of all jobs finished by each JCT, a step line per curve on a log JCT axis;
    unfinished jobs count in the total, so a curve ends below 1 when some never finished.
    Long curves are drawn at ``CDF_POINTS`` ranks (``cdf_ranks``)."""
    fig = go.Figure()
    for c in curves:
        order = np.argsort(c.jct_s, kind="stable")
        order = order[~np.isnan(c.jct_s[order])]
        keep = cdf_ranks(order.size)
        order, ranks = order[keep], keep + 1
        fig.add_trace(
            go.Scatter(
                x=c.jct_s[order].tolist(),
                y=(ranks / c.jct_s.size).tolist(),
                mode="lines",
                line={"shape": "hv", **c.line},
                name=html.escape(c.name),
                legendgroup=None if c.group is None else html.escape(c.group),
                text=[html.escape(c.labels[j]) for j in order],
                hovertemplate="%{text}<br>JCT %{x:,.0f} s<br>%{y:.1%} of jobs",
            )
        )
    fig.update_layout(
        **LAYOUT,
        title=plot_title(title),
        xaxis={"type": "log", "title": "JCT (s, log scale)"},
        yaxis={"title": "fraction of jobs finished", "range": [0, 1.02]},
    )
    return fig
