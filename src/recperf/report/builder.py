"""Build the report: run every section, render one self-contained report.html, write report.json.

A new capability joins the report as one module whose entry point obeys ``SectionBuilder``,
plus one entry in ``SECTIONS``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

import recperf
from recperf.core.results import dumps_json, write_files
from recperf.report.cluster_section import cluster_section
from recperf.report.embed_section import embed_section
from recperf.report.ingest_section import ingest_section
from recperf.report.netsens_section import netsens_section
from recperf.report.section import FIGURE_CLASS, Section, SectionBuilder
from recperf.report.stalls_section import stalls_section
from recperf.report.summary import headlines, summary_html

SECTIONS: tuple[SectionBuilder, ...] = (
    cluster_section,
    netsens_section,
    ingest_section,
    stalls_section,
    embed_section,
)
"""In page order."""
TEMPLATE = "template.html.j2"
PLOTLY_JS = ("data", "plotly", "plotly-basic.min.js")
"""plotly.js's basic partial bundle (scatter, bar, pie), inlined once: 1.2 MB, not the 4.8 MB
full one (``data/plotly/README.md``); ``section.figure_html`` refuses any other trace type."""
PLOTLY_SHA256 = "99784e3abfb07b142a15e521a439e6d9addceadb3f79553fd24c72774f0649ba"


def plotly_js() -> str:
    """The bundled plotly.js, checked against its recorded digest (a truncated or swapped file
    would draw nothing, silently)."""
    raw = resources.files("recperf").joinpath(*PLOTLY_JS).read_bytes()
    if hashlib.sha256(raw).hexdigest() != PLOTLY_SHA256:
        raise RuntimeError(f"recperf/{'/'.join(PLOTLY_JS)} is not the bundled plotly.js")
    return raw.decode("utf-8")


@dataclass(frozen=True, slots=True)
class _PageSection:
    """What the template sees of a section: its HTML marked as already escaped."""

    title: str
    key: str
    html: Markup


def run_sections(
    builders: Sequence[SectionBuilder],
    *,
    quick: bool = False,
    progress: Callable[[float], None] | None = None,
) -> list[Section]:
    """Run each builder, mapping its 0..1 progress onto its share of the whole."""
    sections = []
    for i, build in enumerate(builders):

        def sub(frac: float, i: int = i) -> None:
            if progress is not None:
                progress((i + min(max(frac, 0.0), 1.0)) / len(builders))

        sections.append(build(quick=quick, progress=sub))
        sub(1.0)
    return sections


def render_page(sections: Sequence[Section], generated: datetime) -> str:
    """The report as one HTML page with plotly.js inline, so it opens with no network."""
    env = Environment(
        loader=PackageLoader("recperf", "report"), autoescape=True, undefined=StrictUndefined
    )
    # Section HTML is escaped by its builder (the Section contract); plotly.js is library code.
    page = [_PageSection(s.title, s.key, Markup(s.html)) for s in sections]
    return env.get_template(TEMPLATE).render(
        title="recperf report",
        summary=Markup(summary_html(headlines(sections))),
        generated=generated.strftime("%Y-%m-%d %H:%M UTC"),
        version=recperf.__version__,
        sections=page,
        figure_class=FIGURE_CLASS,
        plotly_js=Markup(plotly_js()),
    )


def report_data(sections: Sequence[Section], generated: datetime, quick: bool) -> dict[str, Any]:
    """report.json: the numbers each section shows, keyed by section."""
    return {
        "recperf_version": recperf.__version__,
        "generated_utc": generated.isoformat(timespec="seconds"),
        "quick": quick,
        "summary": [h.to_json() for h in headlines(sections)],
        "sections": {s.key: {"title": s.title, "data": s.data} for s in sections},
    }


def build_report(
    out_dir: Path, *, progress: Callable[[float], None] | None = None, quick: bool = False
) -> Path:
    """Run all sections and write ``out_dir/report.json`` and ``out_dir/report.html``;
    return the HTML path. ``quick`` runs a reduced default (for tests and previews)."""
    sections = run_sections(SECTIONS, quick=quick, progress=progress)
    keys = [s.key for s in sections]
    if len(set(keys)) != len(keys):
        raise ValueError(f"report sections share a key: {keys}")
    generated = datetime.now(UTC)
    html = render_page(sections, generated)
    data = dumps_json(report_data(sections, generated, quick))
    write_files(out_dir, {"report.html": html, "report.json": data})  # both or neither
    return Path(out_dir) / "report.html"
