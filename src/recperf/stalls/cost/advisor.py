"""The cloud cost advisor: from one profile's per-iteration summary, predict the time and cost of
training on every catalog instance type x instance count, each with an interval (the comm model's
prediction interval and the profile's run-to-run spread of the data stall), and pick the cheapest
setup whose whole interval meets a time budget; setups whose interval straddles it are marked
"may miss". The time-cost Pareto frontier comes as data (``report.stalls_figures`` draws it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recperf.core.config import from_mapping
from recperf.core.errors import ConfigError
from recperf.stalls.cost.catalog import (
    GpuModel,
    Instance,
    load_gpu_models,
    load_instances,
    pareto_front,
)
from recperf.stalls.cost.inputs import AdvisorConfig, ProfileSummary
from recperf.stalls.cost.predict import (
    Candidate,
    Verdict,
    comm_interval,
    comm_seconds,
    gpu_of,
    match_gpu,
    predict_candidate,
    verdict,
)
from recperf.stalls.model.comm import LEVEL, PARAMS, PRIOR, CommModel

__all__ = ["DEFAULT_MODEL", "Advice", "AdvisorConfig", "Candidate", "ProfileSummary", "Verdict",
           "advise", "choose", "comm_interval", "comm_seconds", "completed", "gpu_of",
           "match_gpu", "predict_candidate", "verdict"]  # fmt: skip

DEFAULT_MODEL = CommModel.from_json(PRIOR, "the default communication model")
"""Used when no fitted model is given: 25 us per ring step, 50 us per all-reduce call, links at
their datasheet or line rate and no per-byte overhead beyond it."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Advice:
    """Every feasible setup's prediction and the choices among them."""

    recommendation: Candidate | None
    """Cheapest setup whose whole interval is within the budget (verdict "meets"; ties: faster);
    when none is, the cheapest whose point prediction is ("may miss"); else None."""
    fastest: Candidate
    """Setup with the least total hours (ties: cheaper)."""
    pareto: list[Candidate]
    """Setups not beaten on both time and cost, by increasing total hours."""
    candidates: list[Candidate]
    """All setups evaluated (memory-feasible ones)."""
    skipped: list[tuple[str, str]]
    """(instance type, why) for types whose GPU memory cannot hold the model."""
    setups_skipped: int
    """Instance type x count setups skipped for memory."""
    model_source: str
    """Where the communication model came from."""
    model: CommModel
    """The communication model used."""
    config: AdvisorConfig
    """The advisor configuration used."""
    memory_needed_bytes: float
    """GPU memory needed per rank: param_bytes x (1 + optimizer_bytes_per_param_byte)."""
    notes: list[str] = dataclasses.field(default_factory=list)
    """What the catalog left out or assumed (instance types skipped and why), one per line."""
    data_stall_method: str = ""
    """How the data stall carried to every setup was read from the profile."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready document: snake_case keys with units in the names (the summary keys of
        earlier versions, plus every candidate and the full model, so ``from_json`` rebuilds it)."""

        def one(c: Candidate | None) -> dict[str, Any] | None:
            return None if c is None else dataclasses.asdict(c)

        cfg = self.config
        comm = {p: getattr(self.model, p) for p in PARAMS}
        return {
            "recommendation": one(self.recommendation), "fastest": one(self.fastest),
            "pareto": [one(c) for c in self.pareto],
            "candidates_evaluated": len(self.candidates),
            "skipped": [{"instance": i, "why": why} for i, why in self.skipped],
            "setups_skipped": self.setups_skipped, "budget_h": cfg.budget_h,
            "epochs": cfg.epochs, "epoch_samples": cfg.epoch_samples,
            "assumptions": {
                "max_instances": cfg.max_instances, "efficiency": cfg.efficiency,
                "precision": cfg.precision,
                "optimizer_bytes_per_param_byte": cfg.optimizer_bytes_per_param_byte,
                "memory_needed_gib": self.memory_needed_bytes / 2**30,
                "compute_methods": sorted({c.compute_method for c in self.candidates}),
                "data_stall": self.data_stall_method, "interval_level": LEVEL,
                "comm_model_source": self.model_source, "comm_model": comm,
            },
            "notes": list(self.notes), "candidates": [one(c) for c in self.candidates],
            "comm_model_fit": self.model.to_json(), "memory_needed_bytes": self.memory_needed_bytes,
        }  # fmt: skip

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Advice:
        """The advice ``to_json`` wrote."""

        def one(c: Any) -> Candidate:
            return from_mapping(Candidate, c, "advice: candidate")

        a = data["assumptions"]
        config = AdvisorConfig(
            budget_h=data["budget_h"], epochs=data["epochs"], epoch_samples=data["epoch_samples"],
            max_instances=a["max_instances"], efficiency=a["efficiency"],
            precision=a["precision"],
            optimizer_bytes_per_param_byte=a["optimizer_bytes_per_param_byte"],
        )  # fmt: skip
        rec = data["recommendation"]
        return Advice(
            recommendation=None if rec is None else one(rec), fastest=one(data["fastest"]),
            pareto=[one(c) for c in data["pareto"]],
            candidates=[one(c) for c in data["candidates"]],
            skipped=[(s["instance"], s["why"]) for s in data["skipped"]],
            setups_skipped=data["setups_skipped"], model_source=a["comm_model_source"],
            model=CommModel.from_json(data["comm_model_fit"]), config=config,
            memory_needed_bytes=data["memory_needed_bytes"], notes=list(data["notes"]),
            data_stall_method=a["data_stall"],
        )  # fmt: skip


def _model_source(model: CommModel | None) -> str:
    if model is None:
        return "default: 25 us per ring step, 50 us per call, links at datasheet/line rate"
    text = f"given: fitted on {model.samples} samples, relative RMSE {model.rel_rmse:.1%}"
    if model.held:
        text += "; held " + ", ".join(f"{p} = {getattr(model, p):g}" for p in model.held)
    if model.unmeasured:
        text += f"; not measured, at the default: {', '.join(model.unmeasured)}"
    return text


def completed(model: CommModel) -> CommModel:
    """``model`` with the terms its fit never measured at their defaults (``PRIOR``): a model
    fitted on one machine's samples still prices a multi-machine setup, at line rate."""
    return CommModel.from_json({**model.to_json(), **{p: PRIOR[p] for p in model.unmeasured}})


def choose(candidates: Sequence[Candidate]) -> Candidate | None:
    """The cheapest setup (ties: faster) that surely meets the budget, else the cheapest that
    may (its point prediction does), else None."""
    for ok in ((c for c in candidates if c.verdict == "meets"),
               (c for c in candidates if c.verdict == "may miss" and c.meets_budget)):  # fmt: skip
        best = min(ok, key=lambda c: (c.cost_usd, c.total_h), default=None)
        if best is not None:
            return best
    return None


def advise(
    profile: ProfileSummary, config: AdvisorConfig, *,
    instances: Sequence[Instance] | None = None,
    gpu_models: Mapping[str, GpuModel] | None = None, model: CommModel | None = None,
    notes: Sequence[str] = (),
) -> Advice:  # fmt: skip
    """Evaluate every instance type x count 1..max_instances for the profiled workload
    (``ProfileSummary.from_mapping`` reads a summary.json) and choose among them; ``notes``
    (what loading the catalog skipped) are carried into the advice."""
    instances = load_instances() if instances is None else instances
    gpu_models = load_gpu_models() if gpu_models is None else gpu_models
    comm_model = DEFAULT_MODEL if model is None else completed(model)
    needed = profile.param_bytes * (1.0 + config.optimizer_bytes_per_param_byte)
    candidates: list[Candidate] = []
    skipped: list[tuple[str, str]] = []
    for inst in instances:
        gpu_of(inst, gpu_models)
        if inst.gpu_mem_gib * 2**30 < needed:
            why = f"needs {needed / 2**30:.3g} GiB per GPU, has {inst.gpu_mem_gib:g} GiB"
            skipped.append((inst.instance, why))
            continue
        candidates += [predict_candidate(profile, inst, n, gpu_models, comm_model, config)
                       for n in range(1, config.max_instances + 1)]  # fmt: skip
    if not candidates:
        raise ConfigError(f"no instance type has enough GPU memory: the model needs "
                          f"{needed / 2**30:.3g} GiB per GPU")  # fmt: skip
    return Advice(
        recommendation=choose(candidates),
        fastest=min(candidates, key=lambda c: (c.total_h, c.cost_usd)),
        pareto=pareto_front(candidates, key=lambda c: (c.total_h, c.cost_usd)),
        candidates=candidates, skipped=skipped,
        setups_skipped=len(skipped) * config.max_instances,
        model_source=_model_source(model), model=comm_model, config=config,
        memory_needed_bytes=needed, notes=list(notes), data_stall_method=profile.data_stall_method,
    )  # fmt: skip
