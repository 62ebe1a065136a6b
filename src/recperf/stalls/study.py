"""A stall study, profile -> fit -> advise, as the report shows it: the profile's summary, the
torch.profiler traces' figures beside the direct ones of the same iterations, the all-reduce model
fitted to the profile's samples, and the cloud advice; each part that cannot be made is None with
a sentence saying why. The report renders a ``Study``; it runs nothing itself."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recperf.core.errors import RecperfError
from recperf.stalls.cost.advisor import Advice, AdvisorConfig, ProfileSummary, advise
from recperf.stalls.model.comm import PRIOR, CommModel, CommSample
from recperf.stalls.model.fit import fit
from recperf.stalls.result import StallSummary
from recperf.stalls.run.profile import ProfileConfig, profile
from recperf.stalls.trace.facade import StallAnalysis

BUDGET_H = 2.0
EPOCH_SAMPLES = {"dlrm": 45_840_617, "mlp": 1_000_000}
"""Samples per epoch for the advisor: the Criteo Kaggle training rows for DLRM."""
DEFAULT_EPOCH_SAMPLES = 1_000_000
LATENCY_HOLD = {"alpha_s": PRIOR["alpha_s"]}
"""Held when every sample has one world size (the profile's ranks): the ring-step latency and
the per-call cost then cannot be told apart, so the step latency keeps its default and the
per-call cost is fitted (``fit`` refuses otherwise)."""
TRACED = ("iteration_s", "data_wait_s", "compute_s", "exposed_comm_s", "overlapped_comm_s")
"""The figures ``stalls analyze`` reads from a torch.profiler trace, in table order."""


@dataclass(kw_only=True, slots=True, frozen=True)
class TracedFigure:
    """One figure per iteration as ``stalls analyze`` reads it from the torch.profiler traces,
    and as the direct instrumentation measured it in the same iterations."""

    analyze_s: float
    direct_s: float
    diff_of_iteration: float
    """(analyze - direct) over the direct iteration time."""

    def to_json(self) -> dict[str, float]:
        """The figure's object in ``torch_trace_analysis.figures``."""
        return {"analyze": self.analyze_s, "direct": self.direct_s,
                "diff_of_iteration": self.diff_of_iteration}  # fmt: skip


@dataclass(kw_only=True, slots=True, frozen=True)
class TracedFigures:
    """``stalls analyze`` on one run's torch.profiler traces beside its direct figures."""

    run: str
    iterations: int
    """Timed iterations per rank the traces hold (the first ones of the run)."""
    figures: Mapping[str, TracedFigure]
    """By figure name, in TRACED's order."""
    exposed_method: str
    """How the traces' exposed communication was measured."""

    def to_json(self) -> dict[str, Any]:
        """The report's ``torch_trace_analysis`` object."""
        return {"run": self.run, "iterations": self.iterations,
                "figures": {k: f.to_json() for k, f in self.figures.items()},
                "exposed_method": self.exposed_method}  # fmt: skip


@dataclass(kw_only=True, slots=True, frozen=True)
class Study:
    """What one study found; a ``*_note`` says why its part is missing (empty when present)."""

    summary: StallSummary
    """The profile's summary."""
    traced: TracedFigures | None = None
    """``traced_figures``' comparison, when the runs captured torch.profiler traces."""
    traced_note: str = ""
    model: CommModel | None = None
    model_note: str = ""
    advice: Advice | None = None
    advice_note: str = ""


def study(
    config: ProfileConfig, out: Path, progress: Callable[[float, str], None] | None = None
) -> Study:
    """Profile ``config`` into ``out``, read its torch.profiler traces, fit and advise."""
    summary = profile(config, out, progress=progress)
    traced, traced_note = traced_figures(out, summary)
    return conclude(summary, traced, traced_note)


def conclude(
    summary: StallSummary, traced: TracedFigures | None = None, traced_note: str = ""
) -> Study:
    """The fit and the advice for a finished profile's summary."""
    model, model_note = fit_model(summary)
    advice, advice_note = run_advisor(summary, model)
    return Study(summary=summary, traced=traced, traced_note=traced_note, model=model,
                 model_note=model_note, advice=advice, advice_note=advice_note)  # fmt: skip


def traced_figures(out: Path, summary: StallSummary) -> tuple[TracedFigures | None, str]:
    """``stalls analyze`` on the torch.profiler traces of the profile's last run, beside the
    direct instrumentation of the same iterations (its own rank traces); or None and why."""
    name = str(summary.details["runs"][-1]["name"])
    run_dir = out / "runs" / name
    paths = sorted(run_dir.glob("torch_rank*.json"))
    if not paths:
        return None, ""
    try:
        analysis, direct = StallAnalysis(paths), StallAnalysis(run_dir)
    except RecperfError as exc:
        return None, f"The torch.profiler traces of run '{name}' could not be analysed: {exc}"
    traced = analysis.summary().to_json()
    k = int(traced["iters"])  # the traced window is the first k timed iterations
    ranks = [its[:k] for its in direct.iterations]
    direct_mean = {
        key: sum(sum(getattr(b, key) for b in its) / len(its) for its in ranks) / len(ranks)
        for key in TRACED
    }
    scale = max(direct_mean["iteration_s"], 1e-12)  # tiny figures: relative error is noise
    rows = {
        key: TracedFigure(analyze_s=float(traced[key]), direct_s=d,
                          diff_of_iteration=(float(traced[key]) - d) / scale)
        for key, d in direct_mean.items()
    }  # fmt: skip
    method = traced["method"]["network_stall_s" if traced["nodes"] > 1 else "interconnect_stall_s"]
    return TracedFigures(run=name, iterations=k, figures=rows, exposed_method=str(method)), ""


def fit_model(summary: StallSummary) -> tuple[CommModel | None, str]:
    """The all-reduce model fitted to the profile's microbenchmark (its ``comm_samples``), or
    None and why not."""
    samples = summary.details.get("comm_samples", [])
    try:
        parsed = [CommSample(**s) for s in samples]
        hold = LATENCY_HOLD if len({s.ranks for s in parsed}) < 2 else {}
        return fit(parsed, hold=hold), ""
    except (RecperfError, TypeError) as exc:
        return None, (
            f"The profile measured {len(samples)} all-reduce sample(s) and the communication "
            f"model could not be fitted ({exc}), so the measured-vs-predicted figure is left "
            f"out and the advisor uses its default model."
        )


def run_advisor(summary: StallSummary, model: CommModel | None) -> tuple[Advice | None, str]:
    """The advisor's advice for the profiled workload, or None and why not."""
    samples = EPOCH_SAMPLES.get(str(summary.details.get("workload")), DEFAULT_EPOCH_SAMPLES)
    try:
        config = AdvisorConfig(budget_h=BUDGET_H, epoch_samples=samples)
        return advise(ProfileSummary.from_mapping(summary.to_json()), config, model=model), ""
    except RecperfError as exc:
        return None, f"The cloud advisor could not run on this profile: {exc}"
