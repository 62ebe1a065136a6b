"""What a report section is, and the escaping-safe HTML helpers every section module shares."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import plotly.io as pio

from recperf.core.progress import ProgressFn

FIGURE_CLASS = "rp-figure"
"""CSS class of every figure div; the page's script plots each one and counts them."""


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


def figure_html(fig_id: str, fig: Any, note: str) -> str:
    """A figure div, its plotly JSON in an inert ``application/json`` script, and a note."""
    fid = html.escape(fig_id)
    spec = script_safe_json(pio.to_json(fig, validate=True, pretty=False))
    return (
        f'<figure class="rp-figure-box">'
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
