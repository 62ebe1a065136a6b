"""The live part of the report's ingestion section: tune the real pipeline on generated data
for a few seconds per tuner on this machine, and draw throughput over tuning time and the final
core split (shared helpers for both parts live here too)."""

from __future__ import annotations

import html
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from recperf.core.errors import RecperfError
from recperf.core.progress import ProgressFn
from recperf.ingest import api
from recperf.ingest.data.criteo import GenerateConfig, generate
from recperf.ingest.live.batch import PipelineConfig
from recperf.report.section import (
    LAYOUT,
    WIDE_PALETTE,
    color_of,
    figure_html,
    fmt_num,
    plot_title,
    table_html,
)

SEED = 0
KEY = "ingest"


def failed_run(tuner: str, exc: Exception) -> dict[str, Any]:
    return {"tuner": tuner, "status": "failed", "error": str(exc)}


def ok_runs(runs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in runs if r["status"] == "ok"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveSetup:
    """The live part's embedded default: generated data, tuners and their time budgets."""

    rows: int
    shards: int
    batch_size: int
    tuners: tuple[str, ...]
    budget_s: float
    warmup_s: float
    final_s: float
    settle_s: float


LIVE = LiveSetup(
    rows=300_000,
    shards=2,
    batch_size=4096,
    tuners=("static", "plumber", "intune"),
    budget_s=10.0,
    warmup_s=1.0,
    final_s=2.0,
    settle_s=0.3,
)


QUICK_LIVE = LiveSetup(
    rows=20_000,
    shards=1,
    batch_size=1000,
    tuners=("static",),
    budget_s=1.5,
    warmup_s=0.3,
    final_s=0.5,
    settle_s=0.1,
)


_LIVE_KEYS = (
    "tuner",
    "cores",
    "stages",
    "allocation",
    "throughput_rows_per_s",
    "bound_rows_per_s",
    "bound_binding",
    "fraction_of_bound",
    "tuning_s",
    "budget_s",
    "tuning_steps",
    "refused",
    "peak_memory_bytes",
    "memory_budget_bytes",
    "stage_cost_us_per_row",
    "history",
)
_SPREAD_KEYS = ("throughput_ci_rows_per_s", "samples", "other_load_cores",
                "tuning_other_load_cores", "rel_tol", "max_extend")  # fmt: skip
"""How sure the final measurement is, and the other load on the machine (None if unknown)."""


def run_live(setup: LiveSetup, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Generate the data into a temporary directory and tune the live pipeline with each tuner."""
    runs = []
    per_run_s = setup.warmup_s + setup.budget_s + setup.final_s
    with tempfile.TemporaryDirectory(prefix="recperf-report-ingest-") as tmp:
        data = Path(tmp) / "data"
        generate(GenerateConfig(rows=setup.rows, shards=setup.shards, seed=SEED), data)
        config = PipelineConfig(batch_size=setup.batch_size, seed=SEED)
        for i, tuner in enumerate(setup.tuners):
            start = time.monotonic()

            def tick(_m: object, i: int = i, start: float = start) -> None:
                if progress is not None:
                    part = min(0.95, (time.monotonic() - start) / per_run_s)
                    progress((i + part) / len(setup.tuners))

            try:
                summary = api.tune(
                    data, tuner, setup.budget_s, config, Path(tmp) / f"out-{i}", seed=SEED,
                    warmup_s=setup.warmup_s, final_s=setup.final_s, settle_s=setup.settle_s,
                    on_measure=tick,
                )  # fmt: skip
            except RecperfError as exc:
                runs.append(failed_run(tuner, exc))
            else:
                runs.append(_live_run(summary))
            if progress is not None:
                progress((i + 1) / len(setup.tuners))
    return {
        "machine_cores": os.cpu_count() or 1,
        "rows": setup.rows,
        "shards": setup.shards,
        "batch_size": setup.batch_size,
        "budget_s": setup.budget_s,
        "seed": SEED,
        "runs": runs,
    }


def _live_run(summary: Mapping[str, Any]) -> dict[str, Any]:
    run = {k: summary[k] for k in _LIVE_KEYS}
    run |= {k: summary.get(k) for k in _SPREAD_KEYS}
    run["allocation"] = segment_workers(summary["allocation"])
    run["bound_workers"] = summary["bound_workers"]
    return {"status": "ok", **run}


def segment_workers(allocation: Mapping[str, Any]) -> dict[str, int]:
    """Workers per segment of an ``allocation_summary``, keyed by the segment's stages joined
    with ``+`` (one key per stage when every stage is its own segment)."""
    return {"+".join(g["stages"]): g["workers"] for g in allocation["segments"]}


# -- the measured outcome ---------------------------------------------------------------------


def failures_html(rows: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    failed = [[where, r["tuner"], r["error"]] for where, r in rows if r["status"] != "ok"]
    if not failed:
        return ""
    return table_html(["where", "tuner", "error"], failed, caption="Runs that failed.", left_cols=3)


def bar_keys(bars: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Every segment label of the bars, first seen first."""
    return list(dict.fromkeys(k for b in bars.values() for k in b))


def stage_colors(stage_lists: Sequence[Sequence[str]]) -> dict[str, str]:
    """One colour per stage name across every subplot (first seen, first colour), from a
    palette wide enough that no two segments of one figure share one (up to 26)."""
    order = list(dict.fromkeys(st for stages in stage_lists for st in stages))
    return {st: WIDE_PALETTE[i % len(WIDE_PALETTE)] for i, st in enumerate(order)}


def stacked_bars(
    fig: go.Figure,
    bars: Mapping[str, Mapping[str, float]],
    stages: Sequence[str],
    colors: Mapping[str, str],
    **where: Any,
) -> None:
    """One stacked bar per entry of ``bars`` (label -> segment -> workers), a trace per
    segment label in ``stages`` (0 where a bar has no such segment)."""
    shown = {t.legendgroup for t in fig.data}
    for stage in stages:
        group = html.escape(stage)
        values = [float(b.get(stage, 0.0)) for b in bars.values()]
        fig.add_trace(
            go.Bar(
                x=[html.escape(label) for label in bars],
                y=values,
                name=group,
                legendgroup=group,
                showlegend=group not in shown,
                marker={"color": colors[stage]},
                text=[fmt_num(v, 0 if v == int(v) else 1) for v in values],
                textposition="inside",
            ),
            **where,
        )


def live_html(live: Mapping[str, Any]) -> str:
    ok = ok_runs(live["runs"])
    cores = ok[0]["cores"] if ok else live["machine_cores"]
    setup = (
        f"Live on this machine ({cores} cores available to the pipeline, "
        f"{live['machine_cores']} reported by the OS): {live['rows']:,} generated Criteo-format "
        f"rows in {live['shards']} shard(s), batches of {live['batch_size']:,}, each tuner with "
        f"a {live['budget_s']:g}-s tuning budget, then its choice measured once more. The bound "
        f"is the LP bound of a model calibrated from the stage costs measured in that run. Live "
        f"figures are noisy (short windows on a shared machine): each is stated with its 90% "
        f"interval over its sub-windows{_growth(ok)}, beside the other load on the machine "
        f"(busy cores outside the pipeline) while it ran."
    )
    return (
        f'<h3 id="{KEY}-live">Live pipeline</h3><p>{html.escape(setup)}</p>'
        + _live_table(live)
        + failures_html([("live", r) for r in live["runs"]])
        + f'<div class="rp-grid">{_live_line(live)}{_live_split(live)}</div>'
    )


def _live_table(live: Mapping[str, Any]) -> str:
    ok = ok_runs(live["runs"])
    rows: list[list[object]] = [
        [
            r["tuner"],
            " | ".join(f"{k} x{v}" for k, v in r["allocation"].items()),
            fmt_num(r["throughput_rows_per_s"], 0),
            half_width_text(r.get("throughput_ci_rows_per_s"), r.get("samples")),
            _num(r.get("other_load_cores"), 2),
            fmt_num(r["bound_rows_per_s"], 0),
            fmt_num(100 * r["fraction_of_bound"]),
            r["bound_binding"],
            r["tuning_steps"],
            fmt_num(r["tuning_s"]),
            r["refused"],
            fmt_num(r["peak_memory_bytes"] / 2**20, 0),
        ]
        for r in ok
    ]
    stages = " / ".join(ok[0]["stages"]) if ok else "stages"
    header = [
        "tuner", f"workers ({stages})", "rows/s", "± 90% (windows)", "other load (cores)",
        "bound rows/s", "of bound (%)", "bound by", "steps", "tuning (s)", "refused",
        "peak memory (MiB)",
    ]  # fmt: skip
    caption = (
        "Live runs: the final allocation's measured throughput, the half-width of its 90% "
        "interval over that many sub-windows and the machine's other load while it was "
        "measured, against the bound." + over_bound_note(ok)
    )
    return table_html(header, rows, caption=caption, left_cols=2)


def over_bound_note(runs: Sequence[Mapping[str, Any]]) -> str:
    """Why a run is above its bound, when one is: the bound is computed from the per-row stage
    costs measured while tuning, so a final window that ran on a quieter machine (or whose
    costs fell) can pass it; said with the runs and by how much, else nothing."""
    over = [r for r in runs if float(r.get("fraction_of_bound", 0.0)) > 1.0]
    if not over:
        return ""
    said = ", ".join(f"{r['tuner']} {100 * float(r['fraction_of_bound']):.0f}%" for r in over)
    return (
        f" Above 100% ({said}): the bound comes from the stage costs measured while tuning, "
        "and the final window ran faster than those costs say (less other load, warmer "
        "caches), so it is a bound on the model, not on the machine; within the interval "
        "it is noise."
    )


def _growth(ok: Sequence[Mapping[str, Any]]) -> str:
    """How the runs' windows grew, as the first run states it."""
    if not ok or ok[0].get("rel_tol") is None:
        return ""
    r = ok[0]
    return (
        f" (a window grows until the interval is within {100 * r['rel_tol']:g}% of the "
        f"throughput or it is {r['max_extend']:g} times as long)"
    )


def half_width_text(ci: Sequence[float] | None, samples: int | None) -> str:
    """``± h (n)`` of an interval over ``n`` sub-windows; an em dash without one."""
    if not ci:
        return "—"
    return f"± {fmt_num((ci[1] - ci[0]) / 2, 0)} ({samples})"


def _num(x: float | None, digits: int) -> str:
    return "—" if x is None else fmt_num(x, digits)


def _error_bars(hist: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Plotly error bars from each step's interval (none if no step has one)."""
    cis = [h.get("throughput_ci_rows_per_s") for h in hist]
    if not any(cis):
        return None
    ys = [h["throughput_rows_per_s"] for h in hist]
    return {
        "type": "data", "symmetric": False,
        "array": [ci[1] - y if ci else 0.0 for ci, y in zip(cis, ys, strict=True)],
        "arrayminus": [y - ci[0] if ci else 0.0 for ci, y in zip(cis, ys, strict=True)],
    }  # fmt: skip


def _live_line(live: Mapping[str, Any]) -> str:
    fig = go.Figure()
    for i, r in enumerate(live["runs"]):
        if r["status"] != "ok":
            continue
        hist, name = r["history"], html.escape(r["tuner"])
        fig.add_trace(
            go.Scatter(
                x=[h["elapsed_s"] for h in hist],
                y=[h["throughput_rows_per_s"] for h in hist],
                mode="lines+markers",
                line={"color": color_of(i)},
                error_y=_error_bars(hist),
                name=name,
                legendgroup=name,
                text=[html.escape(str(h["allocation"])) for h in hist],
                hovertemplate="%{text}<br>%{x:.1f} s: %{y:,.0f} rows/s",
            )
        )
        end = max([float(r["tuning_s"]), *(h["elapsed_s"] for h in hist)])
        fig.add_trace(
            go.Scatter(
                x=[0.0, end],
                y=[r["bound_rows_per_s"]] * 2,
                mode="lines",
                line={"color": color_of(i), "dash": "dash"},
                name=html.escape(f"{r['tuner']} bound"),
                legendgroup=name,
            )
        )
    fig.update_layout(
        **LAYOUT,
        title=plot_title("Live: measured throughput while tuning"),
        xaxis={"title": "tuning time (s)", "rangemode": "tozero"},
        yaxis={"title": "measured rows/s", "rangemode": "tozero"},
    )
    note = (
        "Throughput each live measurement window saw (not best-so-far), with its 90% interval "
        "over the window's sub-windows as error bars, over wall-clock tuning time; dashed: "
        "each run's bound from its measured stage costs."
    )
    return figure_html(f"{KEY}-live-throughput", fig, note)


def _live_split(live: Mapping[str, Any]) -> str:
    ok = ok_runs(live["runs"])
    fig = go.Figure()
    if ok:
        bars = {r["tuner"]: r["allocation"] for r in ok}
        keys = bar_keys(bars)
        stacked_bars(fig, bars, keys, stage_colors([keys]))
    fig.update_layout(
        **LAYOUT,
        barmode="stack",
        title=plot_title("Live: final workers per segment"),
        yaxis={"title": "workers", "rangemode": "tozero"},
    )
    note = (
        "Each live tuner's final allocation, workers per segment (stages joined with +), stacked."
    )
    return figure_html(f"{KEY}-live-split", fig, note)
