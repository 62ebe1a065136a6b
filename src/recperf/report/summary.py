"""The report's first screen: one row per capability with its headline figure, what it is
compared to (a peer or a bound, from the same run or the same bundled sitting), the ratio with
its spread, and a verdict word computed from that spread. Every row is drawn from the numbers
its section already carries (``Section.data``), so the summary can never say what the section
below it does not show; ``report.json`` holds the same rows for a CI job to gate on."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from recperf.report.section import Section, fmt_num

Verdict = Literal["ahead", "behind", "within noise", "model only", "not run"]
VERDICTS: tuple[Verdict, ...] = ("ahead", "behind", "within noise", "model only", "not run")


@dataclass(frozen=True, slots=True)
class Headline:
    """One capability's conclusion. ``ratio`` is recperf's figure over the one it is compared
    to, oriented so that above 1 is better for recperf (a time is compared as theirs / ours);
    ``ratio_low``..``ratio_high`` is its spread (repeats' extremes, seeds or quartiles, as
    ``basis`` says)."""

    capability: str
    section: str
    """The section's key: the row links to it."""
    figure: str
    """The headline figure in words, with its value and unit."""
    against: str
    """What it is compared to."""
    ratio: float
    ratio_low: float
    ratio_high: float
    verdict: Verdict
    basis: str
    """Where the numbers come from and what the spread is over."""
    note: str = ""
    """A second fact the reader should not miss (e.g. where a peer is better)."""

    def to_json(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v)
                for k, v in asdict(self).items()}  # fmt: skip

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Headline:
        def num(key: str) -> float:
            value = doc.get(key)
            return math.nan if value is None else float(value)

        verdict = doc["verdict"]
        if verdict not in VERDICTS:
            raise ValueError(f"verdict: {verdict!r}; allowed: {', '.join(VERDICTS)}")
        return Headline(
            capability=str(doc["capability"]),
            section=str(doc["section"]),
            figure=str(doc["figure"]),
            against=str(doc["against"]),
            ratio=num("ratio"),
            ratio_low=num("ratio_low"),
            ratio_high=num("ratio_high"),
            verdict=verdict,
            basis=str(doc["basis"]),
            note=str(doc.get("note", "")),
        )


def verdict_of(low: float, high: float, *, measured: bool) -> Verdict:
    """``ahead`` when the whole spread is above 1, ``behind`` when it is below, else ``within
    noise``; a simulation or model compared with its own bound is ``model only``."""
    if not measured:
        return "model only"
    if math.isnan(low) or math.isnan(high):
        return "not run"
    if low > 1.0:
        return "ahead"
    if high < 1.0:
        return "behind"
    return "within noise"


def ratio_spread(
    ours: float, ours_lo: float, ours_hi: float, theirs: float, theirs_lo: float, theirs_hi: float
) -> tuple[float, float, float]:
    """Our figure over theirs (both higher-is-better) and its widest spread: our low over their
    high to our high over their low."""
    if theirs <= 0 or theirs_lo <= 0 or theirs_hi <= 0:
        return math.nan, math.nan, math.nan
    return ours / theirs, ours_lo / theirs_hi, ours_hi / theirs_lo


def _ratio_text(h: Headline) -> str:
    if math.isnan(h.ratio):
        return "—"
    if h.ratio_low == h.ratio_high == h.ratio:
        return f"{h.ratio:.2f}x"
    return f"{h.ratio:.2f}x [{h.ratio_low:.2f}–{h.ratio_high:.2f}]"


def summary_html(headlines: Sequence[Headline]) -> str:
    """The summary table (escaped): capability (linked), figure, compared to, ratio with its
    spread, verdict, basis."""
    rows = []
    for h in headlines:
        note = f'<div class="rp-note">{html.escape(h.note)}</div>' if h.note else ""
        rows.append(
            "<tr>"
            f'<td class="rp-l"><a href="#{html.escape(h.section)}">'
            f"{html.escape(h.capability)}</a></td>"
            f'<td class="rp-l">{html.escape(h.figure)}{note}</td>'
            f'<td class="rp-l">{html.escape(h.against)}</td>'
            f"<td>{html.escape(_ratio_text(h))}</td>"
            f'<td class="rp-l"><span class="rp-verdict rp-{h.verdict.replace(" ", "-")}">'
            f"{html.escape(h.verdict)}</span></td>"
            f'<td class="rp-l rp-basis">{html.escape(h.basis)}</td>'
            "</tr>"
        )
    head = "".join(
        f'<th class="rp-l">{t}</th>' if t != "ratio [spread]" else f"<th>{t}</th>"
        for t in ("capability", "headline", "compared to", "ratio [spread]", "verdict", "basis")
    )
    return (
        '<div class="rp-table-wrap"><table class="rp-table rp-summary">'
        "<caption>Ratio: recperf's figure over the one it is compared to, above 1 better for "
        "recperf; the spread is over repeats, seeds or windows as the basis says, and a spread "
        "that straddles 1 is called within noise rather than ranked.</caption>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


# -- one headline per section, from the numbers it carries ------------------------------------

Extractor = Callable[[Section], Headline | None]


def headlines(sections: Sequence[Section]) -> list[Headline]:
    """The summary's rows, in page order; a section without an extractor or without the
    numbers for one gives no row."""
    by_key = {s.key: s for s in sections}
    out = []
    for s in sections:
        if s.key == "netsens":
            row = _netsens(s, by_key.get("cluster"))
        else:
            fn = EXTRACTORS.get(s.key)
            row = fn(s) if fn is not None else None
        if row is not None:
            out.append(row)
    return out


def _ingest(s: Section) -> Headline | None:
    """The live pipeline's tuned throughput against the best peer of the bundled sitting, on
    the setting where recperf fares best, with the worst one named in the note."""
    bench = s.data.get("peers") or {}
    settings = bench.get("settings") or {}
    rows = []
    for name, peers in settings.items():
        ours = peers.get("recperf")
        others = [p for k, p in peers.items() if not k.startswith("recperf")]
        if ours is None or not others:
            continue
        best = max(others, key=lambda p: float(p["rows_per_s"]))
        ratio = ratio_spread(
            float(ours["rows_per_s"]), float(ours["rows_per_s_min"]),
            float(ours["rows_per_s_max"]), float(best["rows_per_s"]),
            float(best["rows_per_s_min"]), float(best["rows_per_s_max"]),
        )  # fmt: skip
        rows.append((name, ours, best, ratio))
    if not rows:
        return None
    name, ours, best, (r, lo, hi) = max(rows, key=lambda x: x[3][0])
    worst = min(rows, key=lambda x: x[3][0])
    note = ""
    if worst[0] != name:
        w_name, _, w_best, (wr, wlo, whi) = worst
        note = (
            f"On {w_name}: {wr:.2f}x [{wlo:.2f}–{whi:.2f}] of {w_best['peer']} "
            f"({verdict_of(wlo, whi, measured=True)})."
        )
    runs = int(ours.get("runs", 0))
    return Headline(
        capability="ingest",
        section=s.key,
        figure=f"{fmt_num(float(ours['rows_per_s']) / 1e6, 2)}M rows/s tuned on {name}",
        against=f"{best['peer']} ({best.get('variant') or 'default'}), the best peer there",
        ratio=r,
        ratio_low=lo,
        ratio_high=hi,
        verdict=verdict_of(lo, hi, measured=True),
        basis=f"bundled sitting {bench.get('date', '?')}, {runs} runs each, min–max",
        note=note,
    )


def _cluster(s: Section) -> Headline | None:
    """The best scheduler's mean JCT against FIFO's, per trace: the headline on the trace where
    the gain is smallest (the spread runs over the traces)."""
    gains = []
    for trace, run in (s.data.get("traces") or {}).items():
        jct = {n: float(r["jct_mean_s"]) for n, r in run["schedulers"].items()
               if r.get("jct_mean_s") is not None}  # fmt: skip
        if "fifo" not in jct or len(jct) < 2:
            continue
        best = min(jct, key=lambda n: jct[n])
        gains.append((jct["fifo"] / jct[best], trace, best, jct))
    if not gains:
        return None
    ratios = [g[0] for g in gains]
    r, trace, best, jct = min(gains)
    return Headline(
        capability="cluster",
        section=s.key,
        figure=f"{best}: mean JCT {fmt_num(jct[best], 0)} s on {trace}",
        against="FIFO on the same trace and cluster",
        ratio=r,
        ratio_low=min(ratios),
        ratio_high=max(ratios),
        verdict="model only",
        basis=f"simulated, {len(gains)} traces, seed 0; spread over the traces",
        note="Best scheduler per trace: "
        + "; ".join(f"{t}: {b} ({g:.2f}x)" for g, t, b, _ in sorted(gains, key=lambda g: g[1]))
        + ".",
    )


def _netsens(s: Section, cluster: Section | None) -> Headline | None:
    """netsens' mean JCT at the lowest congestion against the best other scheduler on the same
    trace: of this grid, and of the cluster section's schedulers where it ran the same trace
    (the grid does not sweep every scheduler)."""
    runs = [r for r in s.data.get("runs") or [] if r.get("status") == "ok"]
    levels = sorted({float(r["congestion"]) for r in runs})
    if not levels:
        return None
    at = [r for r in runs if float(r["congestion"]) == levels[0]]
    ours = [float(r["jct_mean_s"]) for r in at if r["scheduler"] == "netsens"]
    others = {r["scheduler"]: float(r["jct_mean_s"]) for r in at if r["scheduler"] != "netsens"}
    trace = s.data.get("trace")
    where = "this grid"
    if cluster is not None and trace in (cluster.data.get("traces") or {}):
        for name, r in cluster.data["traces"][trace]["schedulers"].items():
            if name != "netsens" and r.get("jct_mean_s") is not None:
                others.setdefault(name, float(r["jct_mean_s"]))
        where = "this grid and section 1"
    if not ours or not others:
        return None
    best = min(others, key=lambda n: others[n])
    mean = sum(ours) / len(ours)
    ratios = [others[best] / x for x in ours]
    return Headline(
        capability="network-sensitive scheduling",
        section=s.key,
        figure=f"netsens: mean JCT {fmt_num(mean, 0)} s on {trace} at congestion {levels[0]:g}",
        against=f"{best}, the lowest mean JCT of the other schedulers in {where}",
        ratio=others[best] / mean,
        ratio_low=min(ratios),
        ratio_high=max(ratios),
        verdict="model only",
        basis=f"simulated, {len(ours)} seed(s); {len(others) + 1} schedulers compared",
    )


DROPIN = "EmbeddingBags(auto)"
"""The embedding benchmark's name for the drop-in as users build it."""


def _embed(s: Section) -> Headline | None:
    """The drop-in (``EmbeddingBags(kernel="auto")`` given the input the fastest peer is given,
    where the sitting says what each took; recperf's fastest variant in a sitting from before
    it was measured) against the fastest CPU peer, per bundled setting: the headline on the
    worst setting (the target holds in every one), the spread from the quartiles of both."""
    peers = s.data.get("cpu_peers") or {}
    rows = []
    for st in peers.get("settings") or []:
        ours = [v for v in st["variants"] if v.get("kind") == "recperf"]
        theirs = [v for v in st["variants"] if v.get("kind") == "peer"]
        if not ours or not theirs:
            continue
        best = min(theirs, key=lambda v: float(v["ms_per_batch"]))
        # what users run, where measured: the drop-in given the input the fastest peer is given
        dropin = [v for v in ours if str(v["variant"]).startswith(DROPIN)]
        same = [v for v in dropin if v.get("takes") == best.get("takes", "")]
        mine = (same or dropin or [min(ours, key=lambda v: float(v["ms_per_batch"]))])[0]
        r = float(best["ms_per_batch"]) / float(mine["ms_per_batch"])
        lo = float(best["ms_q1"]) / float(mine["ms_q3"])
        hi = float(best["ms_q3"]) / float(mine["ms_q1"])
        rows.append((r, lo, hi, st, mine, best))
    if not rows:
        return None
    r, lo, hi, st, mine, best = min(rows, key=lambda x: x[0])
    label = f"{st['config']} {st.get('dtype', '')}, {st['trace']}, {st['threads']} thread(s)"
    return Headline(
        capability="embed",
        section=s.key,
        figure=f"{mine['variant']}: {fmt_num(float(mine['ms_per_batch']), 2)} ms per batch "
        f"({label})",
        against=f"{best['variant']}, the fastest CPU peer there",
        ratio=r,
        ratio_low=lo,
        ratio_high=hi,
        verdict=verdict_of(lo, hi, measured=True),
        basis=f"bundled sitting {peers.get('date', '?')}, {peers.get('calls', '?')} "
        f"interleaved calls x {peers.get('builds', 1)} builds, quartiles; worst of {len(rows)} "
        "settings",
    )


def _stalls(s: Section) -> Headline | None:
    """The network stall found by the differential method (two runs, one shaped) against the
    one measured directly in the shaped run: the profiler's own cross-check."""
    check = (s.data.get("cross_check") or {}).get("network_stall_s")
    if not check:
        return None
    diff, direct = float(check["differential_s"]), float(check["direct_s"])
    if diff <= 0 or direct <= 0:
        return None
    rmse = s.data.get("comm_model_rel_rmse")
    note = "" if rmse is None else f"Comm model fit: relative RMSE {100 * float(rmse):.0f}%."
    return Headline(
        capability="stalls",
        section=s.key,
        figure=f"network stall {fmt_num(1e3 * diff, 1)} ms per iteration (differential)",
        against=f"the same stall measured directly: {fmt_num(1e3 * direct, 1)} ms",
        ratio=direct / diff,
        ratio_low=direct / diff,
        ratio_high=direct / diff,
        verdict="model only",
        basis="one profile of the emulated two-node run; no repeats",
        note=note,
    )


EXTRACTORS: dict[str, Extractor] = {
    "cluster": _cluster,
    "ingest": _ingest,
    "embed": _embed,
    "stalls": _stalls,
}
