"""The report's ingestion section: every tuner on the bundled simulated pipelines (fraction of the
LP bound, throughput over tuning time, final core split) and a short live run on this machine.

Tuner, stage and spec names and error messages are escaped here as in the cluster section:
``html.escape`` for hand-built HTML and for plotly labels (which plotly renders as HTML).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from recperf.core.errors import RecperfError
from recperf.core.progress import ProgressFn
from recperf.ingest.sim import model as sim
from recperf.ingest.sim import solve
from recperf.ingest.tuning import simulate
from recperf.report import ingest_ray
from recperf.report.ingest_live import (
    KEY,
    LIVE,
    QUICK_LIVE,
    SEED,
    bar_keys,
    failed_run,
    failures_html,
    live_html,
    ok_runs,
    run_live,
    segment_workers,
    stacked_bars,
    stage_colors,
)
from recperf.report.ingest_peers import load_bundled, peers_html
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

TITLE = "Ingestion pipeline tuning"
TUNER_NAMES = ("static", "autotune", "plumber", "intune", "oracle")
SPECS = sim.BUNDLED
QUICK_SPECS = ("criteo-16",)
SIM_BUDGET_S = 200.0
QUICK_SIM_BUDGET_S = 30.0
NOISE = 0.02
SIM_SHARE = 0.1
"""Share of the section's progress given to the simulated part (it takes about a second)."""
GIB = 2**30


def ingest_section(*, quick: bool = False, progress: ProgressFn | None = None) -> Section:
    """Run the embedded default (``quick``: one spec, a short live run) and build the section."""
    report = MonotoneProgress(progress)
    specs, budget = (QUICK_SPECS, QUICK_SIM_BUDGET_S) if quick else (SPECS, SIM_BUDGET_S)
    simulated = []
    for i, name in enumerate(specs):
        simulated.append(simulate_spec(name, TUNER_NAMES, budget))
        report(SIM_SHARE * (i + 1) / len(specs))
    live = run_live(
        QUICK_LIVE if quick else LIVE, lambda f: report(SIM_SHARE + (1 - SIM_SHARE) * f)
    )
    return section_from_runs(simulated, live)


# -- running ----------------------------------------------------------------------------------


_RUN_KEYS = (
    "throughput_rows_per_s",
    "measured_throughput_rows_per_s",
    "fraction_of_bound",
    "fraction_of_oracle",
    "tuning_steps",
    "refused",
    "tuning_s",
    "found_at_s",
    "peak_memory_bytes",
    "history",
)
"""What the section keeps of each ``tuning.simulate`` summary (the spec's figures it keeps once)."""


def simulate_spec(name: str, tuners: Sequence[str], budget_s: float) -> dict[str, Any]:
    """Every tuner (seed ``SEED``) through ``tuning.simulate`` on bundled spec ``name``, judged as
    the benchmark does: the model's noise-free throughput of the chosen allocation."""
    spec = sim.load_spec(name)
    bound = solve.lp_bound(spec)
    stages = [s.name for s in spec.stages]
    runs = []
    for tuner in tuners:
        try:
            summary = simulate(spec, tuner, seed=SEED, budget_s=budget_s, noise=NOISE)
        except RecperfError as exc:
            runs.append(failed_run(tuner, exc))
            continue
        allocation = segment_workers(summary["allocation"])
        runs.append({"tuner": tuner, "status": "ok", "allocation": allocation,
                     **{k: summary[k] for k in _RUN_KEYS}})  # fmt: skip
    return {
        "spec": name,
        "cores": spec.cores,
        "stages": stages,
        "memory_budget_bytes": spec.memory_budget_gib * GIB,
        "budget_s": budget_s,
        "seed": SEED,
        "noise": NOISE,
        "lp_bound_rows_per_s": bound.throughput_rows_per_s,
        "lp_binding": bound.binding,
        "lp_workers": {
            "+".join(stages[a:b]): w
            for (a, b), w in zip(
                solve.segments_of(len(stages), bound.cuts), bound.workers, strict=True
            )
        },
        "oracle_rows_per_s": spec.throughput(solve.oracle(spec)),
        "runs": runs,
    }


def _extremes(runs: Sequence[Mapping[str, Any]], key: str) -> dict[str, Any]:
    """The tuners at the highest value of ``key`` (ties within 1e-9) and the one at the lowest."""
    ok = ok_runs(runs)
    if not ok:
        return {}
    top = max(float(r[key]) for r in ok)
    low = min(ok, key=lambda r: float(r[key]))
    return {
        "best": [r["tuner"] for r in ok if float(r[key]) >= top * (1 - 1e-9)],
        "best_value": top,
        "worst": low["tuner"],
        "worst_value": float(low[key]),
    }


def measured_outcome(
    simulated: Sequence[Mapping[str, Any]], live: Mapping[str, Any]
) -> dict[str, Any]:
    """What the paragraph states, as data: per spec the tuners with the highest and lowest
    fraction of the LP bound, refusals and failures; live, the same by measured throughput."""
    specs = []
    for s in simulated:
        ext = _extremes(s["runs"], "fraction_of_bound")
        oracle = {r["tuner"]: r["fraction_of_oracle"] for r in ok_runs(s["runs"])}
        specs.append(
            {
                "spec": s["spec"],
                "cores": s["cores"],
                "lp_binding": s["lp_binding"],
                **ext,
                "best_fraction_of_oracle": oracle[ext["best"][0]] if ext else math.nan,
                "refused": {r["tuner"]: r["refused"] for r in ok_runs(s["runs"]) if r["refused"]},
                "failed": [r["tuner"] for r in s["runs"] if r["status"] != "ok"],
            }
        )
    ok = ok_runs(live["runs"])
    ext = _extremes(live["runs"], "throughput_rows_per_s")
    by_tuner = {r["tuner"]: r for r in ok}
    live_out = {
        "cores": ok[0]["cores"] if ok else live["machine_cores"],
        **ext,
        "fraction_of_bound": {t: float(r["fraction_of_bound"]) for t, r in by_tuner.items()},
        "failed": [r["tuner"] for r in live["runs"] if r["status"] != "ok"],
    }
    if ext:
        best = by_tuner[ext["best"][0]]
        live_out |= {k: best.get(k) for k in ("throughput_ci_rows_per_s", "samples",
                                              "other_load_cores")}  # fmt: skip
    return {"simulated": specs, "live": live_out}


def _pct(frac: float) -> str:
    return "—" if math.isnan(frac) else f"{100 * frac:.1f}%"


def _join(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def outcome_text(outcome: Mapping[str, Any]) -> str:
    """The measured outcome in words (plain text; the caller escapes it)."""
    said = []
    for e in outcome["simulated"]:
        head = f"on {e['spec']} ({e['cores']} cores, LP bound set by {e['lp_binding']}) "
        if "best" not in e:
            said.append(head + "no tuner finished")
            continue
        text = (
            f"{head}{_join(e['best'])} reached {_pct(e['best_value'])} of the LP bound "
            f"({_pct(e['best_fraction_of_oracle'])} of the oracle)"
        )
        if e["worst"] not in e["best"]:
            text += f", {e['worst']} the least at {_pct(e['worst_value'])}"
        refusals = [f"{n:,} of {t}'s proposals" for t, n in e["refused"].items()]
        if refusals:
            text += f"; the target refused {_join(refusals)}"
        if e["failed"]:
            text += f"; {_join(e['failed'])} failed"
        said.append(text)
    parts = [f"Simulated (final allocations judged by the noise-free model): {'; '.join(said)}."]
    lv = outcome["live"]
    if "best" in lv:
        best = lv["best"][0]
        text = (
            f"Live on this machine ({lv['cores']} cores): {best} measured the most, "
            f"{fmt_num(lv['best_value'], 0)} rows/s{_spread(lv)}, "
            f"{_pct(lv['fraction_of_bound'][best])} of the bound from its measured stage costs"
        )
        others = [f"{t} {_pct(f)}" for t, f in lv["fraction_of_bound"].items() if t != best]
        if others:
            text += f"; {_join(others)}"
        parts.append(text + ".")
    if lv["failed"]:
        parts.append(f"Live runs that failed: {_join(lv['failed'])}.")
    return " ".join(parts)


def _spread(lv: Mapping[str, Any]) -> str:
    """`` (± h at 90% over n sub-windows, with x cores of other load)`` where measured."""
    said = []
    if lv.get("throughput_ci_rows_per_s"):
        lo, hi = lv["throughput_ci_rows_per_s"]
        said.append(f"± {fmt_num((hi - lo) / 2, 0)} at 90% over {lv['samples']} sub-windows")
    if lv.get("other_load_cores") is not None:
        said.append(f"{fmt_num(lv['other_load_cores'], 2)} cores of other load on the machine")
    return f" ({', with '.join(said)})" if said else ""


# -- HTML -------------------------------------------------------------------------------------


def section_from_runs(simulated: Sequence[Mapping[str, Any]], live: Mapping[str, Any]) -> Section:
    """The section for already finished simulated and live runs."""
    outcome = measured_outcome(simulated, live)
    bench, ray_doc = load_bundled(), ingest_ray.load_bundled()
    data = {"tuners": list(TUNER_NAMES), "simulated": list(simulated), "live": live,
            "peers": bench, "ray": ingest_ray.summary(ray_doc)}  # fmt: skip
    data["outcome"] = outcome
    budgets = sorted({float(s["budget_s"]) for s in simulated})
    setup = (
        f"Simulated: each tuner, seed {SEED}, tunes each bundled pipeline model for "
        f"{_join([f'{b:g}' for b in budgets])} simulated seconds of 1-s measurement windows "
        f"with {100 * NOISE:g}% multiplicative noise; its final allocation is judged by the "
        f"model's noise-free throughput against the LP bound (fractional workers) and the "
        f"oracle (the best integer allocation)."
    )
    sim_figs = [_sim_line(i, s) for i, s in enumerate(simulated)]
    sim_figs.append(_sim_split(simulated))
    body = (
        f"<p>{html.escape(setup)}</p>"
        f"<p>{html.escape(outcome_text(outcome))}</p>"
        + _sim_table(simulated)
        + failures_html([(s["spec"], r) for s in simulated for r in s["runs"]])
        + f'<div class="rp-grid">{"".join(sim_figs)}</div>'
        + live_html(live)
        + peers_html(bench)
        + ingest_ray.ray_html(ray_doc)
    )
    return Section(title=TITLE, key=KEY, html=body, data=data)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-") or "spec"


def _sim_table(simulated: Sequence[Mapping[str, Any]]) -> str:
    rows: list[list[object]] = []
    bold: list[tuple[int, int]] = []
    for s in simulated:
        ok = ok_runs(s["runs"])
        top = max((float(r["fraction_of_bound"]) for r in ok), default=math.nan)
        for r in ok:
            if float(r["fraction_of_bound"]) >= top * (1 - 1e-9):
                bold.append((len(rows), 2))
            rows.append(
                [
                    s["spec"],
                    r["tuner"],
                    fmt_num(100 * r["fraction_of_bound"]),
                    fmt_num(100 * r["fraction_of_oracle"]),
                    fmt_num(r["throughput_rows_per_s"], 0),
                    r["tuning_steps"],
                    fmt_num(r["found_at_s"], 0),
                    r["refused"],
                    fmt_num(r["peak_memory_bytes"] / GIB),
                    fmt_num(s["memory_budget_bytes"] / GIB),
                ]
            )
    header = ["spec", "tuner", "of LP bound (%)", "of oracle (%)", "rows/s (model)", "steps"]
    header += ["found at (s)", "refused", "peak memory (GiB)", "memory budget (GiB)"]
    caption = (
        "Final allocation of each tuner; best fraction of the LP bound per spec in bold. "
        "'found at' is the simulated time when the chosen allocation was first measured; "
        "'refused' counts proposals the target rejected (over the memory budget or a cap)."
    )
    return table_html(header, rows, caption=caption, bold=bold, left_cols=2)


def _sim_line(index: int, s: Mapping[str, Any]) -> str:
    fig = go.Figure()
    bound = float(s["lp_bound_rows_per_s"])
    for i, r in enumerate(s["runs"]):
        if r["status"] != "ok":
            continue
        hist = r["history"]
        fig.add_trace(
            go.Scatter(
                x=[h["elapsed_s"] for h in hist],
                y=[100 * h["throughput_rows_per_s"] / bound for h in hist],
                mode="lines+markers",
                marker={"size": 4},
                line={"color": color_of(i), "width": 1.5},
                name=html.escape(r["tuner"]),
                text=[html.escape(str(h["allocation"])) for h in hist],
                hovertemplate="%{text}<br>%{x:.0f} s: %{y:.1f}% of the LP bound",
            )
        )
    oracle = 100 * float(s["oracle_rows_per_s"]) / bound
    fig.add_hline(y=oracle, line={"dash": "dash", "color": "#888"})
    fig.update_layout(
        **LAYOUT,
        title=plot_title(f"Measured throughput while tuning — {s['spec']}"),
        xaxis={"title": "simulated tuning time (s)", "rangemode": "tozero"},
        yaxis={"title": "measured throughput (% of LP bound)", "rangemode": "tozero"},
    )
    note = (
        f"Throughput each measurement window saw (with noise, not best-so-far), as a share of "
        f"the LP bound, over simulated tuning time; dashed: the oracle allocation "
        f"({oracle:.1f}%). {s['spec']}, {s['cores']} cores."
    )
    return figure_html(f"{KEY}-sim-{index}-{_slug(s['spec'])}", fig, note)


SPLIT_COLS = 4
"""Pipelines per row of the final-workers figure."""


def _sim_split(simulated: Sequence[Mapping[str, Any]]) -> str:
    all_bars = []
    for s in simulated:
        bars = {r["tuner"]: r["allocation"] for r in ok_runs(s["runs"])}
        bars["LP bound"] = s["lp_workers"]
        all_bars.append(bars)
    colors = stage_colors([bar_keys(b) for b in all_bars])
    titles = [html.escape(f"{s['spec']} ({s['cores']} cores)") for s in simulated]
    # At most SPLIT_COLS pipelines a row (seven in one row put their titles over each other).
    cols = max(1, min(SPLIT_COLS, len(simulated)))
    rows = max(1, math.ceil(len(simulated) / cols))
    fig = make_subplots(
        rows=rows, cols=cols, subplot_titles=titles, vertical_spacing=0.5 / rows,
        horizontal_spacing=0.06,
    )  # fmt: skip
    for i, bars in enumerate(all_bars):
        stacked_bars(fig, bars, bar_keys(bars), colors, row=1 + i // cols, col=1 + i % cols)
    fig.update_layout(
        **{**LAYOUT, "height": 150 + 300 * rows, "legend": {"orientation": "h", "y": -0.08}},
        barmode="stack",
        title=plot_title("Final workers per segment"),
    )
    fig.update_annotations(font={"size": 12})
    fig.update_yaxes(title_text="workers", col=1)
    note = (
        "Each tuner's final allocation (workers per segment, a segment's stages joined with +, "
        "stacked), and the LP bound's fractional workers, per simulated pipeline."
    )
    return figure_html(f"{KEY}-sim-split", fig, note, wide=True)
