"""One candidate setup's prediction: compute scaled to the instance's GPU (by measured ratio or
FLOPs over datasheet peak), the all-reduce over its links and network from the comm model (with
its interval), the exposed share, the data stall's spread, and the verdict against the budget."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.stalls.cost.catalog import GpuModel, Instance
from recperf.stalls.cost.inputs import AdvisorConfig, ProfileSummary
from recperf.stalls.model.comm import CommModel, exposed_stall_s

Verdict = Literal["meets", "may miss", "misses"]
"""A setup's whole interval within the budget, straddling it, or beyond it."""
FLOP_METHOD = "FLOPs / (datasheet peak x efficiency)"


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
    """Data stall per iteration, carried over from the profile (see ``inputs._data_stall``)."""
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
    profile: ProfileSummary, instance: Instance, count: int,
    gpu_models: Mapping[str, GpuModel], model: CommModel, config: AdvisorConfig,
) -> Candidate:  # fmt: skip
    """Predict one setup: ``count`` machines of type ``instance``, data parallel on all GPUs."""
    check_range("count", count, 1, None)
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
