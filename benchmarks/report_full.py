"""The whole report at its full default, as ``recperf report`` (the README's first command)
builds it: each section's wall time, the page's weight, and (with Chromium) whether every figure
drew and the page's own layout check passed at 1400 and 1000 px.

The test suite builds the quick report and the full cluster sections; the full ingestion,
stall and embedding sections take about two minutes on 2 cores, over the suite's budget, so
they are checked here. Exits 1 when a check fails, naming it.

    python benchmarks/report_full.py [--out DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recperf.core.results import dumps_json, write_files
from recperf.report import browser
from recperf.report.builder import (
    SECTIONS,
    plotly_js,
    render_page,
    report_data,
    run_sections,
)
from recperf.report.section import Section, SectionBuilder

WEIGHT_LIMIT_BYTES = 1_500_000
"""The page besides plotly.js (issue 29's budget)."""
WIDTHS = (1400, 1000)


def _timed(build: SectionBuilder, seconds: dict[str, float]) -> SectionBuilder:
    def run(*, quick: bool = False, progress: Callable[[float], None] | None = None) -> Section:
        t0 = time.perf_counter()
        section = build(quick=quick, progress=progress)
        seconds[section.key] = round(time.perf_counter() - t0, 2)
        print(f"{section.key}: {seconds[section.key]:.1f} s", file=sys.stderr, flush=True)
        return section

    return run


def build(out: Path) -> dict[str, Any]:
    """Build the full report into ``out``; its timings, weight and figure count."""
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    sections = run_sections([_timed(b, seconds) for b in SECTIONS], quick=False)
    generated = datetime.now(UTC)
    page = render_page(sections, generated)
    data = dumps_json(report_data(sections, generated, False))
    write_files(out, {"report.html": page, "report.json": data})
    size = len(page.encode("utf-8"))
    return {
        "section_seconds": seconds,
        "total_seconds": round(time.perf_counter() - t0, 2),
        "page_bytes": size,
        "besides_plotly_bytes": size - len(plotly_js().encode("utf-8")),
        "figures": page.count('class="rp-figure"'),
    }


def browse(page: Path, scratch: Path) -> dict[str, Any]:
    """What the page recorded about itself in Chromium at each width (None without it)."""
    binary = browser.find_chromium()
    if binary is None:
        return {"chromium": None}
    out: dict[str, Any] = {"chromium": binary}
    for width in WIDTHS:
        got = browser.dump_dom(binary, page, scratch / f"profile-{width}", width)
        bottom = got.body_data("summary-bottom")
        out[str(width)] = {
            "figures": got.figures(),
            "layout": got.body_data("layout"),
            "summary_bottom_px": int(bottom) if bottom else None,
            "console": list(got.console),
        }
    return out


def failures(doc: dict[str, Any]) -> list[str]:
    """The checks that failed, one line each."""
    bad = []
    if doc["besides_plotly_bytes"] >= WEIGHT_LIMIT_BYTES:
        bad.append(f"page besides plotly.js is {doc['besides_plotly_bytes']:,} B "
                   f"(limit {WEIGHT_LIMIT_BYTES:,})")  # fmt: skip
    for width in WIDTHS:
        seen = doc["browser"].get(str(width))
        if seen is None:
            continue
        drawn = seen["figures"]
        if drawn is None or drawn[0] != drawn[1] or drawn[1] != doc["figures"]:
            bad.append(f"{width} px: figures drawn {drawn} of {doc['figures']} on the page")
        if seen["layout"] != "ok":
            bad.append(f"{width} px: layout check says {seen['layout']!r}")
        if seen["console"]:
            bad.append(f"{width} px: the JS console says {seen['console'][0]!r}")
        if width >= 1400 and (seen["summary_bottom_px"] or 10**6) > 900:
            bad.append(f"{width} px: the summary ends at {seen['summary_bottom_px']} px (> 900)")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/report-full"), help="report directory")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    doc = {"date_utc": datetime.now(UTC).isoformat(timespec="seconds"), **build(args.out)}
    with tempfile.TemporaryDirectory() as scratch:
        doc["browser"] = browse(args.out / "report.html", Path(scratch))
    doc["failures"] = failures(doc)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    for line in doc["failures"]:
        print(f"report_full: {line}", file=sys.stderr)
    return 1 if doc["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
