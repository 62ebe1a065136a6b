"""Synthetic traces: Poisson arrivals at a set load, a GPU-demand mix, exp/lognormal durations."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np

from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.jobs import JobTable
from recperf.cluster.limits import MAX_TRACE_S
from recperf.cluster.models import grad_bytes_for
from recperf.cluster.network import calibrate_reference
from recperf.cluster.topology import Cluster
from recperf.core import exact
from recperf.core.config import check_range
from recperf.core.errors import ConfigError

MODELS = ("resnet18", "resnet50", "vgg16", "inception3", "bert", "transformer", "mobilenetv3")


def parse_mix(spec: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """``"4"`` (fixed) or ``"1:0.6,2:0.1,4:0.2,8:0.1"`` (GPUs:weight, normalised)."""
    gpus: list[int] = []
    weights: list[float] = []
    for part in spec.split(","):
        g, sep, w = part.strip().partition(":")
        try:
            gpus.append(int(g))
            weights.append(float(w) if sep else 1.0)
        except ValueError:
            raise ConfigError(
                f"gpus_per_job = {spec!r}: expected K or a mix like '1:0.6,4:0.3,8:0.1'"
            ) from None
    finite = all(math.isfinite(w) for w in weights)
    if not gpus or min(gpus) < 1 or not finite or min(weights) < 0 or sum(weights) <= 0:
        raise ConfigError(
            f"gpus_per_job = {spec!r}: GPUs must be >= 1, weights finite, >= 0, not all 0"
        )
    total = sum(weights)
    return tuple(gpus), tuple(w / total for w in weights)


@dataclass(kw_only=True, slots=True, frozen=True)
class SyntheticConfig:
    """Shape of a synthetic trace."""

    jobs: int = 1000
    """Number of jobs."""
    load: float = 0.8
    """Offered load: arrival rate x mean GPU-seconds per job / cluster GPUs (1e-6 to 100)."""
    gpus_per_job: str = "1:0.6,2:0.1,4:0.15,8:0.15"
    """Fixed GPU count ('4') or a weighted mix ('1:0.6,4:0.3,8:0.1')."""
    duration_dist: Literal["exp", "lognormal"] = "exp"
    """Distribution of job run time at the tightest placement."""
    mean_duration_s: float = 3600.0
    """Mean job run time, seconds (1e-3 to 10 years)."""
    lognormal_sigma: float = 1.5
    """Shape of the lognormal durations (its mean stays mean_duration_s)."""
    iter_s_min: float = 0.05
    """Fastest per-iteration time (log-uniform between min and max; 1e-6 to 3600 s)."""
    iter_s_max: float = 0.5
    """Slowest per-iteration time."""

    def __post_init__(self) -> None:
        # Finite and bounded, so that the arrival rate and durations derived from them are too.
        check_range("jobs", self.jobs, 1, 10_000_000)
        check_range("load", self.load, 1e-6, 100.0)
        check_range("mean_duration_s", self.mean_duration_s, 1e-3, MAX_TRACE_S)
        check_range("lognormal_sigma", self.lognormal_sigma, 0.0, 10.0, lo_open=True)
        check_range("iter_s_min", self.iter_s_min, 1e-6, 3_600.0)
        check_range("iter_s_max", self.iter_s_max, self.iter_s_min, 3_600.0)
        parse_mix(self.gpus_per_job)


@TRACE_LOADERS.register("synthetic")
class SyntheticTrace:
    """Generates jobs for a cluster; the arrival rate is set from the load and the cluster size."""

    name: ClassVar[str] = "synthetic"
    default_cluster: ClassVar[str] = "synthetic-1024"
    Config = SyntheticConfig

    def __init__(self, config: SyntheticConfig | None = None) -> None:
        self.config = config or SyntheticConfig()

    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable:
        cfg = self.config
        sizes, weights = parse_mix(cfg.gpus_per_job)
        if max(sizes) > cluster.gpus:
            raise ConfigError(
                f"gpus_per_job asks for {max(sizes)} GPUs; the cluster has {cluster.gpus}"
            )
        n = cfg.jobs
        gpus = rng.choice(np.asarray(sizes, dtype=np.int64), size=n, p=np.asarray(weights))
        if cfg.duration_dist == "exp":
            dur = exact.exponential(rng, cfg.mean_duration_s, n)
        else:
            mu = exact.log1(cfg.mean_duration_s) - cfg.lognormal_sigma * cfg.lognormal_sigma / 2
            dur = exact.lognormal(rng, mu, cfg.lognormal_sigma, n)
        dur = np.maximum(dur, 1e-3)
        mean_gpus = math.fsum(s * w for s, w in zip(sizes, weights, strict=True))
        rate = cfg.load * cluster.gpus / (mean_gpus * cfg.mean_duration_s)
        arrivals = np.cumsum(exact.exponential(rng, 1.0 / rate, n))
        arrivals -= arrivals[0]
        iter_s = exact.loguniform(rng, cfg.iter_s_min, cfg.iter_s_max, n)
        iter_s = np.minimum(iter_s, dur)
        model_idx = rng.integers(0, len(MODELS), size=n)
        models = [MODELS[i] for i in model_idx.tolist()]
        grad = np.asarray([grad_bytes_for(m) for m in MODELS])[model_idx]  # per model, not job
        compute, grad = calibrate_reference(cluster, gpus, iter_s, grad)
        return JobTable.build(
            name=[f"syn-{i}" for i in range(n)],
            model=models,
            arrival_s=arrivals,
            gpus=gpus,
            total_iters=dur / iter_s,
            compute_s=compute,
            grad_bytes=grad,
        )
