"""The cloud cost advisor: from one profile's per-iteration summary, predict the time and cost of
training on every catalog instance type x instance count, each with an interval (the comm model's
prediction interval and the profile's run-to-run spread of the data stall), and pick the cheapest
setup whose whole interval meets a time budget; setups whose interval straddles it are marked
"may miss". The time-cost Pareto frontier comes as data (``report.stalls_figures`` draws it)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from recperf.core.config import check_range, from_mapping
from recperf.core.errors import ConfigError
from recperf.stalls.cost.catalog import (
    GpuModel,
    Instance,
    load_gpu_models,
    load_instances,
    pareto_front,
)
from recperf.stalls.model.comm import LEVEL, PARAMS, PRIOR, CommModel, exposed_stall_s

DEFAULT_MODEL = CommModel.from_json(PRIOR, "the default communication model")
"""Used when no fitted model is given: 25 us per ring step, 50 us per all-reduce call, links at
their datasheet or line rate and no per-byte overhead beyond it."""
Verdict = Literal["meets", "may miss", "misses"]
"""A setup's whole interval within the budget, straddling it, or beyond it."""
REAL_DATA_RUNS = ("warm", "cold")
"""The profile's runs that read real data (their direct data waits give the stall's spread)."""

BACKWARD_FRACTION = 2.0 / 3.0
"""Share of compute spent in the backward pass when the profile does not say."""
FLOP_METHOD = "FLOPs / (datasheet peak x efficiency)"
PRECISIONS = ("fp32", "fp16")


@dataclass(kw_only=True, slots=True, frozen=True)
class AdvisorConfig:
    """What the training run needs and how optimistic the compute prediction is."""

    budget_h: float
    """Training time budget in hours for all ``epochs`` epochs (> 0)."""
    epoch_samples: int
    """Samples in one epoch (>= 1)."""
    epochs: float = 1.0
    """Epochs to train (> 0; fractions allowed)."""
    max_instances: int = 16
    """Largest instance count tried; counts 1..max_instances are evaluated (>= 1)."""
    efficiency: float = 0.4
    """Fraction of datasheet peak FLOP/s achieved when predicting from FLOPs (0, 1]."""
    precision: str = "fp32"
    """Peak used: "fp32" (fp32_tflops) or "fp16" (tensor_fp16_tflops)."""
    optimizer_bytes_per_param_byte: float = 3.0
    """Extra GPU memory per parameter byte (grads + 2 Adam moments = 3) (>= 0)."""

    def __post_init__(self) -> None:
        check_range("budget_h", self.budget_h, 0.0, None, lo_open=True)
        check_range("epoch_samples", self.epoch_samples, 1, None)
        check_range("epochs", self.epochs, 0.0, None, lo_open=True)
        check_range("max_instances", self.max_instances, 1, None)
        check_range("efficiency", self.efficiency, 0.0, 1.0, lo_open=True)
        check_range("optimizer_bytes_per_param_byte", self.optimizer_bytes_per_param_byte, 0.0)
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision = {self.precision!r} is not one of fp32, fp16")


@dataclass(kw_only=True, slots=True, frozen=True)
class ProfileSummary:
    """The per-iteration, per-rank figures of one profile that the advisor uses."""

    compute_s: float
    """Measured compute seconds per iteration on the profiling device."""
    backward_s: float
    """Backward part of compute_s (2/3 of it when the profile does not say)."""
    data_fetch_stall_s: float
    """Seconds per iteration waiting for data to arrive."""
    data_prep_stall_s: float
    """Seconds per iteration waiting for data to be preprocessed."""
    grad_bytes: int
    """Gradient bytes all-reduced per iteration."""
    num_layers: int
    """All-reduce buckets per iteration (>= 1)."""
    param_bytes: int
    """Bytes of model parameters."""
    flops_per_iter: float
    """Forward + backward FLOPs per rank per iteration (0 when unknown)."""
    batch_size: int
    """Samples per rank per iteration (>= 1)."""
    device: str
    """Profiling device kind: "cpu" or "cuda"."""
    device_name: str
    """Torch device name, e.g. "NVIDIA H200" ("" when unknown)."""
    data_stall_s: float
    """The data stall carried to every setup, per iteration (see ``data_stall``)."""
    data_stall_low_s: float
    data_stall_high_s: float
    """The range of the data stall over the profile's measurements of it."""
    data_stall_method: str
    """Where data_stall_s came from and why."""

    @staticmethod
    def from_mapping(summary: Mapping[str, Any]) -> ProfileSummary:
        """Validate a loaded summary.json; a bad key raises ConfigError naming it."""
        compute = _key(summary, "compute_s", False)
        backward = _key(summary, "backward_s", False, compute * BACKWARD_FRACTION)
        if backward > compute:
            raise ConfigError(f"profile summary: 'backward_s' = {backward} exceeds compute_s")
        device = summary.get("device")
        if device not in ("cpu", "cuda"):
            raise ConfigError(f"profile summary: 'device' = {device!r}: expected cpu or cuda")
        name = summary.get("device_name", "")
        if not isinstance(name, str):
            raise ConfigError(f"profile summary: 'device_name' = {name!r}: expected a string")
        stall, low, high, method = data_stall(summary)
        return ProfileSummary(
            compute_s=compute, backward_s=backward,
            data_fetch_stall_s=_key(summary, "data_fetch_stall_s", False),
            data_prep_stall_s=_key(summary, "data_prep_stall_s", False), data_stall_s=stall,
            data_stall_low_s=low, data_stall_high_s=high, data_stall_method=method,
            grad_bytes=_key(summary, "grad_bytes", True),
            num_layers=_key(summary, "num_layers", True),
            param_bytes=_key(summary, "param_bytes", True),
            flops_per_iter=_key(summary, "flops_per_iter", False, 0.0),
            batch_size=_key(summary, "batch_size", True), device=device, device_name=name,
        )  # fmt: skip

    @property
    def backward_fraction(self) -> float:
        return self.backward_s / self.compute_s if self.compute_s > 0 else BACKWARD_FRACTION


def data_stall(summary: Mapping[str, Any]) -> tuple[float, float, float, str]:
    """The data stall per iteration carried to the target setups, its low and high ends, and
    how it was read. A ``profile`` summary measures it directly (the training loop's own wait for
    the next batch): that figure is carried, its range over the real-data runs' direct waits. The
    differential fetch + prep stall is a difference of two runs' iteration times (~0.2 s each
    here), which on a shared CPU host moves with the host's load by more than the stall itself
    (0 and 54 ms in two identical report profiles, beside direct waits of 2.1 and 2.6 ms); carried
    onto a GPU's sub-millisecond compute it moved the recommendation between identical runs. It is
    used only when the summary has no direct figure (e.g. from ``stalls analyze``)."""
    differential = _key(summary, "data_fetch_stall_s", False) + _key(
        summary, "data_prep_stall_s", False
    )
    direct = summary.get("direct")
    if not isinstance(direct, Mapping) or direct.get("data_stall_s") is None:
        how = "fetch + prep stall per iteration carried over from the profile (differential)"
        return differential, differential, differential, how
    wait = _key(direct, "data_stall_s", False)
    runs = [r for r in summary.get("runs") or [] if isinstance(r, Mapping)]
    real = [r for r in runs if r.get("name") in REAL_DATA_RUNS and r.get("data_wait_s") is not None]
    waits = [wait] + [_key(r, "data_wait_s", False) for r in real]
    how = (
        f"direct: the training loop's measured wait for the next batch in run "
        f"'{direct.get('run')}', {wait * 1e3:.3g} ms ({min(waits) * 1e3:.3g}-"
        f"{max(waits) * 1e3:.3g} ms over the real-data runs), not the differential fetch + prep "
        f"stall ({differential * 1e3:.3g} ms), a difference of two runs' iteration times that "
        "moves with the host's load"
    )
    return wait, min(waits), max(waits), how


ANALYZE_FLAGS = {"batch_size": "--batch-size", "param_bytes": "--param-bytes"}
"""The summary fields ``stalls analyze`` takes from flags, named when a summary lacks them."""


def _key(summary: Mapping[str, Any], key: str, integer: bool, default: Any = None) -> Any:
    if key not in summary or summary[key] is None:
        if default is None:
            hint = ANALYZE_FLAGS.get(key)
            hint = f" (a trace cannot give it: run stalls analyze with {hint})" if hint else ""
            raise ConfigError(f"profile summary: {key!r} missing{hint}")
        return default
    value = summary[key]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (integer and not float(value).is_integer()):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"profile summary: {key!r} = {value!r} is not {kind}")
    if value < 0 or (key in ("batch_size", "num_layers") and value < 1):
        raise ConfigError(f"profile summary: {key!r} = {value!r} is out of range")
    return int(value) if integer else float(value)


@dataclass(kw_only=True, slots=True, frozen=True)
class Candidate:
    """The predicted time and cost of training on ``count`` instances of one type."""

    instance: str
    """Instance type."""
    count: int
    """Instances (machines)."""
    gpus_total: int
    """Data-parallel ranks: count x GPUs per instance."""
    gpu_model: str
    """GPU model of the instance type."""
    iteration_s: float
    """Predicted seconds per iteration: compute + data stall + exposed communication."""
    compute_s: float
    """Predicted compute seconds per iteration."""
    comm_s: float
    """Predicted all-reduce seconds per iteration."""
    exposed_comm_s: float
    """Part of comm_s not hidden behind the backward pass."""
    data_stall_s: float
    """Data stall per iteration, carried over from the profile (see ``data_stall``)."""
    iterations_per_epoch: int
    """Iterations in one epoch at this world size."""
    epoch_h: float
    """Hours per epoch."""
    total_h: float
    """Hours for all epochs."""
    cost_usd: float
    """Cost of all epochs in US dollars."""
    usd_per_hour: float
    """Price of the whole setup per hour."""
    meets_budget: bool
    """Whether total_h is within the budget."""
    compute_method: str
    """How the compute time was predicted."""
    comm_low_s: float
    comm_high_s: float
    """The all-reduce time's prediction interval (LEVEL, from the comm model's fit)."""
    total_low_h: float
    total_high_h: float
    """Hours for all epochs at the interval's ends (comm and data stall both low, both high)."""
    verdict: Verdict
    """The whole interval within the budget, straddling it, or beyond it."""


def comm_seconds(
    model: CommModel, grad_bytes: float, buckets: int, ranks: int, nodes: int,
    intra_bytes_per_s: float, net_bytes_per_s: float,
) -> float:  # fmt: skip
    """Ring all-reduce seconds per iteration: buckets (bucket_s + 2(N-1) alpha_s) + 2(N-1)/N
    grad_bytes beta, beta the slowest link's per-byte time. Inside a machine that is the link's
    datasheet rate (the model's fitted beta_intra belongs to the profiling machine's link);
    across machines net_efficiency / bandwidth + beta_net_s_per_byte. An infinite
    ``intra_bytes_per_s`` means one GPU per machine."""
    if ranks < 2:
        return 0.0
    if intra_bytes_per_s <= 0 or (ranks > nodes and math.isinf(intra_bytes_per_s)):
        raise ConfigError(f"intra_bytes_per_s = {intra_bytes_per_s}: no link between the GPUs")
    beta = 1.0 / intra_bytes_per_s
    if nodes > 1:
        if net_bytes_per_s <= 0:
            raise ConfigError(f"net_bytes_per_s = {net_bytes_per_s}: expected > 0")
        beta = max(beta, model.net_efficiency / net_bytes_per_s + model.beta_net_s_per_byte)
    steps = 2 * (ranks - 1)
    return buckets * (model.bucket_s + steps * model.alpha_s) + steps / ranks * grad_bytes * beta


def comm_interval(
    model: CommModel, comm_s: float, grad_bytes: float, buckets: int, ranks: int, nodes: int,
    intra_bytes_per_s: float, net_bytes_per_s: float,
) -> tuple[float, float]:  # fmt: skip
    """``comm_seconds``' interval: the fitted terms it used (the network's when the network is
    the slowest link; a datasheet link has no fitted uncertainty) and the residual noise."""
    if ranks < 2:
        return 0.0, 0.0
    steps = 2 * (ranks - 1)
    volume = steps / ranks * grad_bytes
    x = np.array([buckets * steps, buckets, 0.0, 0.0, 0.0])
    if nodes > 1 and (model.net_efficiency / net_bytes_per_s + model.beta_net_s_per_byte
                      >= 1.0 / intra_bytes_per_s):  # fmt: skip
        x[3:] = volume / net_bytes_per_s, volume
    return model.interval_s(x, comm_s)


def verdict(low_h: float, high_h: float, budget_h: float) -> Verdict:
    """Where a setup's interval of hours lies against the budget."""
    return "meets" if high_h <= budget_h else "misses" if low_h > budget_h else "may miss"


def gpu_of(instance: Instance, gpu_models: Mapping[str, GpuModel]) -> GpuModel:
    """The instance's GPU row; an unknown model raises ConfigError listing the known ones."""
    gpu = gpu_models.get(instance.gpu_model)
    if gpu is None:
        known = ", ".join(sorted(gpu_models))
        raise ConfigError(f"instance {instance.instance!r}: gpu_model {instance.gpu_model!r} "
                          f"is not in the GPU table (known: {known})")  # fmt: skip
    return gpu


def match_gpu(device_name: str, gpu_models: Mapping[str, GpuModel]) -> GpuModel | None:
    """The GPU model whose name occurs in ``device_name`` (longest name wins), if any."""
    for name in sorted(gpu_models, key=len, reverse=True):
        if name and name.lower() in device_name.lower():
            return gpu_models[name]
    return None


def peak_flops(gpu: GpuModel, precision: str) -> float:
    """Datasheet peak FLOP/s of ``gpu`` at ``precision``."""
    tflops = gpu.fp32_tflops if precision == "fp32" else gpu.tensor_fp16_tflops
    if tflops <= 0:
        raise ConfigError(f"gpu_model {gpu.gpu_model!r}: no {precision} peak in the GPU table")
    return tflops * 1e12


def predict_compute(
    profile: ProfileSummary, gpu: GpuModel, gpu_models: Mapping[str, GpuModel],
    config: AdvisorConfig,
) -> tuple[float, str]:  # fmt: skip
    """Compute seconds per iteration on ``gpu`` and how they were obtained."""
    measured = match_gpu(profile.device_name, gpu_models) if profile.device == "cuda" else None
    target = peak_flops(gpu, config.precision)
    if measured is not None:
        ratio = peak_flops(measured, config.precision) / target
        method = f"measured on {measured.gpu_model}, scaled by datasheet peak"
        return profile.compute_s * ratio, method
    if profile.flops_per_iter <= 0:
        why = "the profile has no FLOP count and was not measured on a GPU in the table"
        raise ConfigError(f"profile summary: 'flops_per_iter' missing or 0: {why}")
    return profile.flops_per_iter / (target * config.efficiency), FLOP_METHOD


def _link_bytes_per_s(instance: Instance, gpu: GpuModel) -> float:
    link = instance.intra_node_link
    rate = 0.0
    if link != "none" and instance.intra_node_gb_per_s is not None:
        rate = instance.intra_node_gb_per_s  # the catalog's own figure for this instance type
    elif link.startswith("nvlink"):
        rate = gpu.nvlink_gb_per_s_per_gpu
    elif link.startswith("pcie"):
        rate = gpu.pcie_gb_per_s
    elif instance.gpus == 1:
        return math.inf
    if rate <= 0:
        raise ConfigError(f"instance {instance.instance!r}: intra_node_link {link!r} has no "
                          f"bandwidth for {instance.gpus} {gpu.gpu_model} GPUs")  # fmt: skip
    return rate * 1e9


def predict_candidate(
    summary: Mapping[str, Any] | ProfileSummary, instance: Instance, count: int,
    gpu_models: Mapping[str, GpuModel], model: CommModel, config: AdvisorConfig,
) -> Candidate:  # fmt: skip
    """Predict one setup: ``count`` machines of type ``instance``, data parallel on all GPUs."""
    check_range("count", count, 1, None)
    profile = (
        summary if isinstance(summary, ProfileSummary) else ProfileSummary.from_mapping(summary)
    )
    gpu = gpu_of(instance, gpu_models)
    compute, method = predict_compute(profile, gpu, gpu_models, config)
    ranks = count * instance.gpus
    link, net = _link_bytes_per_s(instance, gpu), instance.network_gbps * 1e9 / 8
    shape = (profile.grad_bytes, profile.num_layers, ranks, count, link, net)
    comm = comm_seconds(model, *shape)
    comm_low, comm_high = comm_interval(model, comm, *shape)
    backward = compute * profile.backward_fraction
    iterations = math.ceil(config.epoch_samples / (profile.batch_size * ranks))

    def hours(comm_s: float, data_s: float) -> float:
        exposed = exposed_stall_s(comm_s, backward, profile.num_layers)
        return iterations * (compute + data_s + exposed) / 3600.0 * config.epochs

    exposed = exposed_stall_s(comm, backward, profile.num_layers)
    data = profile.data_stall_s
    iteration = compute + data + exposed
    epoch_h = iterations * iteration / 3600.0
    total_h = epoch_h * config.epochs
    low_h = hours(comm_low, profile.data_stall_low_s)
    high_h = hours(comm_high, profile.data_stall_high_s)
    usd_per_hour = count * instance.usd_per_hour
    if not math.isfinite(total_h * usd_per_hour):
        raise ConfigError(f"epochs = {config.epochs:g}, epoch_samples = {config.epoch_samples}: "
                          "the predicted time or cost is too large to represent")  # fmt: skip
    return Candidate(
        instance=instance.instance, count=count, gpus_total=ranks, gpu_model=gpu.gpu_model,
        iteration_s=iteration, compute_s=compute, comm_s=comm, exposed_comm_s=exposed,
        data_stall_s=data, iterations_per_epoch=iterations, epoch_h=epoch_h, total_h=total_h,
        cost_usd=total_h * usd_per_hour, usd_per_hour=usd_per_hour,
        meets_budget=total_h <= config.budget_h, compute_method=method, comm_low_s=comm_low,
        comm_high_s=comm_high, total_low_h=low_h, total_high_h=high_h,
        verdict=verdict(low_h, high_h, config.budget_h),
    )  # fmt: skip


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
    summary: Mapping[str, Any], config: AdvisorConfig, *,
    instances: Sequence[Instance] | None = None,
    gpu_models: Mapping[str, GpuModel] | None = None, model: CommModel | None = None,
    notes: Sequence[str] = (),
) -> Advice:  # fmt: skip
    """Evaluate every instance type x count 1..max_instances and choose among them; ``notes``
    (what loading the catalog skipped) are carried into the advice."""
    profile = ProfileSummary.from_mapping(summary)
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
