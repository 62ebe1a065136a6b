"""The report's network-sensitivity section: netsens against tiresias, consolidate and fifo as
rack-uplink congestion grows, as a table, grouped bars, JCT CDFs and a paragraph of the measured
outcome that is computed from the same numbers that report.json carries.

Job, model and scheduler names are escaped here as in the cluster section: ``html.escape`` for
hand-built HTML and for plotly labels (which plotly renders as a small HTML subset).
"""

from __future__ import annotations

import html
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from recperf.cluster.api import RunSpec
from recperf.cluster.sweep import Sweep, SweepResult, run_sweep
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

KEY = "netsens"
TITLE = "Network-sensitive scheduling under congestion"
SCHEDULERS = ("netsens", "tiresias", "consolidate", "fifo")
CONGESTION = (1.0, 2.0, 4.0)
SEED = 0
TRACE = "helios-500"
"""On its own cluster (helios: 4 racks, oversubscribed uplinks), where congestion matters."""
QUICK_TRACE = "synthetic@helios"
QUICK_SYNTHETIC = SyntheticConfig(
    jobs=100, load=1.2, gpus_per_job="1:0.3,4:0.2,8:0.3,16:0.2", mean_duration_s=1800.0
)
"""Small enough to run all twelve cells in about a second, busy enough that jobs spread."""
WORKERS = 2

# (summary key, column header, scale, decimals, lower is better)
_COLUMNS: tuple[tuple[str, str, float, int, bool], ...] = (
    ("makespan_s", "makespan (h)", 1 / 3600, 2, True),
    ("jct_mean_s", "mean JCT (s)", 1, 0, True),
    ("jct_p95_s", "p95 JCT (s)", 1, 0, True),
    ("comm_overhead_frac", "comm overhead (%)", 100, 1, True),
    ("preemptions", "preemptions", 1, 0, False),
    ("locality_wait_share", "waited for locality (%)", 100, 1, False),
    ("locality_wait_mean_s", "mean locality wait (s)", 1, 0, False),
)
# (figure id part, summary key, scale, axis label)
_BARS: tuple[tuple[str, str, float, str], ...] = (
    ("makespan", "makespan_s", 1 / 3600, "Makespan (h)"),
    ("jct-mean", "jct_mean_s", 1 / 3600, "Mean JCT (h)"),
    ("comm", "comm_overhead_frac", 100, "Comm overhead (% of job time)"),
)

Cells = Mapping[tuple[str, float], Mapping[str, Any]]


def netsens_sweep(quick: bool = False) -> Sweep:
    """The grid the section runs: every scheduler x congestion level, one seed."""
    base = RunSpec(seed=SEED, synthetic=QUICK_SYNTHETIC) if quick else RunSpec(seed=SEED)
    return Sweep(
        traces=(QUICK_TRACE if quick else TRACE,),
        schedulers=SCHEDULERS,
        congestion=CONGESTION,
        seeds=(SEED,),
        base=base,
    )


def netsens_section(*, quick: bool = False, progress: ProgressFn | None = None) -> Section:
    """Run the grid (``quick``: a 100-job synthetic trace, in process) and build the section.
    The full grid's twelve runs take ~0.1-4 s each, so they share a small process pool (a
    script calling this needs the usual ``if __name__ == "__main__"`` guard of multiprocessing)."""
    sweep = netsens_sweep(quick)
    start = time.perf_counter()
    workers = min(WORKERS, os.cpu_count() or 1)
    backend = "serial" if quick or workers == 1 else "local"
    result = run_sweep(sweep, backend=backend, workers=workers, keep_jobs=True, progress=progress)
    return section_from_sweep(result, time.perf_counter() - start)


def section_from_sweep(result: SweepResult, seconds: float) -> Section:
    """The section for an already run sweep of one trace and one seed."""
    sweep = result.sweep
    if len(sweep.traces) != 1 or len(sweep.seeds) != 1:
        raise ValueError("the netsens section shows one trace under one seed")
    schedulers, levels = list(sweep.schedulers), [float(c) for c in sweep.congestion]
    rows = sorted(result.rows, key=lambda r: (levels.index(r["congestion"]), _rank(sweep, r)))
    cells: Cells = {(r["scheduler"], float(r["congestion"])): r for r in rows}
    outcome = measured_outcome(cells, schedulers, levels)
    first = rows[0]
    data = {
        "trace": first["trace"],
        "cluster": first["cluster"],
        "schedulers": schedulers,
        "congestion": levels,
        "seeds": list(sweep.seeds),
        "sweep": sweep.definition(),
        "simulated_in_s": seconds,
        "runs": rows,
        "outcome": outcome,
    }
    setup = (
        f"Trace {first['trace']} on cluster {first['cluster']}, {sweep.base.placement} placement, "
        f"seed {sweep.seeds[0]}: each scheduler with the rack uplinks' "
        f"oversubscription multiplied by {_join([_level(c) for c in levels])}; all {len(rows)} "
        f"runs simulated in {seconds:.1f} s."
    )
    body = (
        f"<p>{html.escape(setup)}</p>"
        f"<p>{html.escape(outcome_text(outcome))}</p>"
        + _table(cells, schedulers, levels)
        + _failures(rows)
        + f'<div class="rp-grid">{"".join(_figures(result, cells, schedulers, levels))}</div>'
    )
    return Section(title=TITLE, key=KEY, html=body, data=data)


def _rank(sweep: Sweep, row: Mapping[str, Any]) -> int:
    return list(sweep.schedulers).index(row["scheduler"])


def _val(row: Mapping[str, Any] | None, key: str) -> float:
    """A metric of a run as a float; NaN for a failed or missing run."""
    value = None if row is None else row.get(key)
    return math.nan if value is None else float(value)


def _ratio(a: float, b: float) -> float:
    """a / b; NaN unless b > 0 (a failed run, or nothing to compare with)."""
    return a / b if b > 0 else math.nan


def _level(c: float) -> str:
    return f"{c:g}×"


def _join(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def measured_outcome(
    cells: Cells, schedulers: Sequence[str], levels: Sequence[float]
) -> dict[str, Any]:
    """What the paragraph states, as data: the lowest mean JCT per level (and the runner-up),
    netsens' comm overhead relative to tiresias' per level, the change of each scheduler's mean
    JCT from the lowest to the highest level, and netsens' locality waits at the highest."""
    lowest = []
    for c in levels:
        ranked = sorted(
            (v, s) for s in schedulers if not math.isnan(v := _val(cells.get((s, c)), "jct_mean_s"))
        )
        entry: dict[str, Any] = {"congestion": c}
        for prefix, (v, s) in zip(("", "next_"), ranked[:2], strict=False):
            entry.update({f"{prefix}scheduler": s, f"{prefix}jct_mean_s": v})
        lowest.append(entry)
    comm = []
    for c in levels:
        ours = _val(cells.get(("netsens", c)), "comm_overhead_frac")
        theirs = _val(cells.get(("tiresias", c)), "comm_overhead_frac")
        comm.append(
            {"congestion": c, "netsens": ours, "tiresias": theirs, "ratio": _ratio(ours, theirs)}
        )
    lo, hi = min(levels), max(levels)
    jct = {s: [_val(cells.get((s, c)), "jct_mean_s") for c in (lo, hi)] for s in schedulers}
    change = {s: _ratio(at_hi, at_lo) - 1 for s, (at_lo, at_hi) in jct.items()}
    top = cells.get(("netsens", hi))
    waits = {
        "congestion": hi,
        "locality_wait_share": _val(top, "locality_wait_share"),
        "locality_wait_mean_s": _val(top, "locality_wait_mean_s"),
        "preemptions": _val(top, "preemptions"),
    }
    return {
        "lowest_jct_mean": lowest,
        "netsens_comm_vs_tiresias": comm,
        "jct_mean_change": change,
        "netsens_at_highest": waits,
    }


def outcome_text(outcome: Mapping[str, Any]) -> str:
    """The measured outcome in words (plain text; the caller escapes it)."""
    parts = []
    best = []
    for e in outcome["lowest_jct_mean"]:
        if "scheduler" not in e:
            best.append(f"at {_level(e['congestion'])} no run finished")
            continue
        text = f"at {_level(e['congestion'])} {e['scheduler']} ({fmt_num(e['jct_mean_s'], 0)} s"
        if "next_scheduler" in e:
            gap = _ratio(e["next_jct_mean_s"], e["jct_mean_s"]) - 1
            text += f"; next {e['next_scheduler']}, {_pct(gap)} higher"
        best.append(text + ")")
    # Only the swept schedulers: others (section 1's srtf, sjf) may be lower on the same trace.
    swept = list(outcome["jct_mean_change"])
    parts.append(
        f"Lowest mean JCT of the schedulers swept here ({', '.join(swept)}): {_join(best)}."
    )
    ratios = [e for e in outcome["netsens_comm_vs_tiresias"] if not math.isnan(e["ratio"])]
    if ratios:
        said = [
            f"{_pct(e['ratio'])} at {_level(e['congestion'])} ({_pct(e['netsens'])} vs "
            f"{_pct(e['tiresias'])} of job time)"
            for e in ratios
        ]
        parts.append(f"netsens' communication overhead as a share of tiresias': {_join(said)}.")
    change = {s: v for s, v in outcome["jct_mean_change"].items() if not math.isnan(v)}
    levels = [e["congestion"] for e in outcome["lowest_jct_mean"]]
    if change and len(levels) > 1:
        said = [f"{_signed(v)} under {s}" for s, v in change.items()]
        parts.append(
            f"From {_level(min(levels))} to {_level(max(levels))} congestion, mean JCT changes "
            f"by {_join(said)}."
        )
    w = outcome["netsens_at_highest"]
    if not math.isnan(w["locality_wait_share"]):
        parts.append(
            f"At {_level(w['congestion'])}, netsens held {_pct(w['locality_wait_share'])} of "
            f"the finished jobs back for locality, for {fmt_num(w['locality_wait_mean_s'], 0)} s "
            f"on average, and preempted {fmt_num(w['preemptions'], 0)} times."
        )
    return " ".join(parts)


def _pct(frac: float) -> str:
    return "—" if math.isnan(frac) else f"{100 * frac:.1f}%"


def _signed(frac: float) -> str:
    return f"{100 * frac:+.1f}%"


def _table(cells: Cells, schedulers: Sequence[str], levels: Sequence[float]) -> str:
    rows: list[list[object]] = []
    bold: list[tuple[int, int]] = []
    for c in levels:
        first = len(rows)
        values = np.array(
            [[_val(cells.get((s, c)), col[0]) * col[2] for col in _COLUMNS] for s in schedulers]
        )
        for s, vals in zip(schedulers, values, strict=True):
            shown = (fmt_num(float(v), col[3]) for v, col in zip(vals, _COLUMNS, strict=True))
            rows.append([s, _level(c), *shown])
        for j, col in enumerate(_COLUMNS):
            if col[4] and np.isfinite(values[:, j]).any():
                best = np.nanmin(values[:, j])
                bold += [(first + int(i), j + 2) for i in np.flatnonzero(values[:, j] == best)]
    header = ["scheduler", "congestion", *(c[1] for c in _COLUMNS)]
    caption = (
        "One row per scheduler and congestion level; best of each level in bold. Locality "
        "columns: the share of finished jobs that were held back from free GPUs to wait for a "
        "tighter placement, and their mean wait."
    )
    return table_html(header, rows, caption=caption, bold=bold)


def _failures(rows: Sequence[Mapping[str, Any]]) -> str:
    failed = [r for r in rows if r["status"] != "ok"]
    if not failed:
        return ""
    body = [[r["scheduler"], _level(float(r["congestion"])), r["error"]] for r in failed]
    return table_html(
        ["scheduler", "congestion", "error"], body, caption="Runs that failed.", left_cols=3
    )


def _figures(
    result: SweepResult, cells: Cells, schedulers: Sequence[str], levels: Sequence[float]
) -> list[str]:
    where = f"{result.rows[0]['trace']} on {result.rows[0]['cluster']}"
    out = [
        figure_html(
            f"{KEY}-{part}",
            _bars(cells, schedulers, levels, key, scale, label),
            f"{label} by congestion level, one bar per scheduler; {where}.",
        )
        for part, key, scale, label in _BARS
    ]
    curves = _jct_curves(result, schedulers, levels)
    if curves:
        hi, lo = _level(max(levels)), _level(min(levels))
        note = f"JCT CDF per scheduler at {hi} congestion (solid) and {lo} (dashed); {where}."
        cdf = jct_cdf_figure(curves, f"JCT CDF at {hi} congestion")
        out.insert(0, figure_html(f"{KEY}-jct-cdf", cdf, note))
    return out


def _bars(
    cells: Cells,
    schedulers: Sequence[str],
    levels: Sequence[float],
    key: str,
    scale: float,
    label: str,
) -> go.Figure:
    fig = go.Figure()
    x = [_level(c) for c in levels]
    table = [[_val(cells.get((s, c)), key) * scale for c in levels] for s in schedulers]
    # Four labels side by side: drop the decimal once the numbers have three digits.
    digits = 0 if np.nanmax(np.abs(table), initial=0.0) >= 100 else 1
    for i, (s, values) in enumerate(zip(schedulers, table, strict=True)):
        fig.add_trace(
            go.Bar(
                x=x,
                y=[None if math.isnan(v) else v for v in values],
                name=html.escape(s),
                marker={"color": color_of(i)},
                text=[fmt_num(v, digits) for v in values],
                textposition="outside",
                textfont={"size": 10},
                cliponaxis=False,
            )
        )
    fig.update_layout(
        **LAYOUT,
        barmode="group",
        title=plot_title(label),
        xaxis={"title": "rack-uplink congestion (x oversubscription)", "type": "category"},
        yaxis={"title": label, "rangemode": "tozero"},
    )
    return fig


def _jct_curves(
    result: SweepResult, schedulers: Sequence[str], levels: Sequence[float]
) -> list[JctCurve]:
    """One curve per scheduler at the highest congestion (solid) and the lowest (dashed),
    leaving out cells in which no job finished (a failed run has none)."""
    jobs = result.jobs
    if jobs is None or jobs.num_rows == 0:
        return []
    sched = np.asarray(jobs.column("scheduler").to_pylist(), dtype=object)
    cong = jobs.column("congestion").to_numpy()
    jct = jobs.column("jct_s").to_numpy(zero_copy_only=False)
    names, models = jobs.column("name").to_pylist(), jobs.column("model").to_pylist()
    hi, lo = max(levels), min(levels)
    curves = []
    for c, dash in ((hi, "solid"), (lo, "dash")) if hi != lo else ((hi, "solid"),):
        for i, s in enumerate(schedulers):
            rows = np.flatnonzero((sched == s) & (cong == c))
            if np.isnan(jct[rows]).all():
                continue
            curves.append(
                JctCurve(
                    name=f"{s} {_level(c)}",
                    jct_s=jct[rows],
                    labels=[f"{names[j]} ({models[j]})" for j in rows],
                    line={"color": color_of(i), "dash": dash},
                    group=s,
                )
            )
    return curves
