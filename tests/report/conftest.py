"""Each quick section is built once per test session and shared: the report's page tests and
each section's own tests read the same build (the stall section's quick profile alone takes
about 20 s). A section is built by its real builder on first use, with what its tests inspect
captured on the way: the progress fractions, the stall profile's summary and the arguments the
embedding section was drawn from. Tests treat what they get as read-only (they deep-copy before
changing anything)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from recperf.report import embed_section as es
from recperf.report.section import Section, SectionBuilder
from recperf.stalls import study as study_module


@dataclass
class Built:
    """One quick section as its builder made it."""

    section: Section
    fractions: list[float]
    captured: Any = None
    """The stall profile's summary, or the embedding section's ``section_from_results`` args."""


@dataclass
class QuickSections:
    built: dict[SectionBuilder, Built] = field(default_factory=dict)

    def get(self, build: SectionBuilder) -> Built:
        if build not in self.built:
            self.built[build] = _build(build)
        return self.built[build]

    def replay(self, build: SectionBuilder) -> SectionBuilder:
        """A builder that reports ``build``'s recorded progress and returns its section."""
        done = self.get(build)

        def run(*, quick: bool = False, progress: Callable[[float], None] | None = None) -> Section:
            assert quick, "the shared sections are the quick ones"
            for f in done.fractions if progress is not None else ():
                progress(f)
            return done.section

        return run


def _build(build: SectionBuilder) -> Built:
    seen: list[Any] = []
    fractions: list[float] = []
    with pytest.MonkeyPatch.context() as mp:
        real_profile, real_draw = study_module.profile, es.section_from_results

        def profile(config: Any, out: Path, progress: Any = None) -> Any:
            summary = real_profile(config, out, progress)
            seen.append(summary.to_json())
            return summary

        def draw(*args: Any) -> Section:
            seen.append(args)
            return real_draw(*args)

        mp.setattr(study_module, "profile", profile)
        mp.setattr(es, "section_from_results", draw)
        section = build(quick=True, progress=fractions.append)
    return Built(section, fractions, seen[0] if len(seen) == 1 else None)


@pytest.fixture(scope="session")
def quick_sections() -> Iterator[QuickSections]:
    yield QuickSections()
