"""The stall capability's figures: the advisor's time-cost Pareto plot (every setup with its
interval, the frontier, the budget, the recommendation), for the report and for ``stalls advise``'s
``pareto.html``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recperf.core.results import atomic_path
from recperf.stalls.cost.advisor import Advice, Candidate
from recperf.stalls.model.comm import LEVEL


def pareto_figure(advice: Advice) -> Any:
    """A plotly Figure: all setups (hours vs dollars), the Pareto frontier, the budget and the
    recommendation."""
    import plotly.graph_objects as go

    def label(c: Candidate) -> str:
        return f"{c.instance} x {c.count} ({c.gpus_total} GPUs)"

    fig = go.Figure()
    cands, front = advice.candidates, advice.pareto
    fig.add_trace(go.Scatter(
        x=[c.total_h for c in cands], y=[c.cost_usd for c in cands], mode="markers",
        name=f"setups ({LEVEL:.0%} interval of hours)",
        text=[f"{label(c)}: {c.verdict}" for c in cands], hoverinfo="text+x+y", opacity=0.5,
        error_x={"type": "data", "array": [c.total_high_h - c.total_h for c in cands],
                 "arrayminus": [c.total_h - c.total_low_h for c in cands]},
    ))  # fmt: skip
    fig.add_trace(go.Scatter(
        x=[c.total_h for c in front], y=[c.cost_usd for c in front], mode="lines+markers",
        name="Pareto frontier", text=[label(c) for c in front], hoverinfo="text+x+y",
    ))  # fmt: skip
    rec = advice.recommendation
    if rec is not None:
        fig.add_trace(go.Scatter(
            x=[rec.total_h], y=[rec.cost_usd], mode="markers", name=f"recommended: {label(rec)}",
            text=[label(rec)], hoverinfo="text+x+y",
            marker={"symbol": "star", "size": 16, "color": "crimson"},
        ))  # fmt: skip
    fig.add_vline(x=advice.config.budget_h, line_dash="dash",
                  annotation_text=f"budget {advice.config.budget_h:g} h")  # fmt: skip
    fig.update_layout(title="Training time vs cost per setup", xaxis_title="total hours",
                      yaxis_title="cost (USD)", xaxis_type="log", yaxis_type="log")  # fmt: skip
    return fig


def write_pareto_html(advice: Advice, path: Path | str) -> Path:
    """Write the Pareto figure as standalone HTML (plotly.js inlined), atomically."""
    final = Path(path)
    figure = pareto_figure(advice)
    with atomic_path(final) as tmp:
        figure.write_html(str(tmp), include_plotlyjs=True)
    return final
