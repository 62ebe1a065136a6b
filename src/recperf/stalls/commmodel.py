"""An alpha-beta model of data-parallel gradient all-reduce (ring algorithm), fitted with
non-negative parameters to least absolute relative error over measured all-reduce times, and its
prediction of a model's communication time and exposed (not overlapped) stall from its shape.

Per iteration, ``buckets`` ring all-reduces of ``grad_bytes`` in total over ``ranks`` ranks take

    t = buckets * (bucket_s + 2 (N-1) alpha_s) + 2 (N-1)/N * grad_bytes * beta

where beta is the per-byte time of the ring's slowest link: ``beta_intra_s_per_byte`` inside one
machine, ``net_efficiency / bandwidth + beta_net_s_per_byte`` across machines.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recperf.core.config import check_range, from_mapping, load_json_object
from recperf.core.errors import ConfigError
from recperf.core.results import write_text

L1_FLOOR = 0.01
"""Relative residual below which a sample's reweighting stops growing (keeps IRLS stable)."""
PARAMS = ("alpha_s", "bucket_s", "beta_intra_s_per_byte", "net_efficiency", "beta_net_s_per_byte")


@dataclass(kw_only=True, slots=True, frozen=True)
class CommSample:
    """One measured configuration: the all-reduce time per iteration and what was reduced."""

    grad_bytes: float
    """Gradient bytes all-reduced per iteration (> 0)."""
    buckets: int
    """All-reduce calls per iteration (DDP buckets, >= 1)."""
    ranks: int
    """World size (>= 2)."""
    nodes: int = 1
    """Machines the ranks span (1..ranks)."""
    bandwidth_bytes_per_s: float | None = None
    """Inter-machine link bandwidth per machine, bytes/s; required when nodes > 1."""
    seconds: float
    """Measured all-reduce time per iteration (> 0)."""

    def __post_init__(self) -> None:
        check_range("grad_bytes", self.grad_bytes, 0.0, None, lo_open=True)
        check_range("buckets", self.buckets, 1, None)
        check_range("ranks", self.ranks, 2, None)
        check_range("nodes", self.nodes, 1, self.ranks)
        check_range("seconds", self.seconds, 0.0, None, lo_open=True)
        if self.nodes > 1:
            if self.bandwidth_bytes_per_s is None:
                raise ConfigError("bandwidth_bytes_per_s: required when nodes > 1")
            check_range("bandwidth_bytes_per_s", self.bandwidth_bytes_per_s, 0.0, None,
                         lo_open=True)  # fmt: skip


def samples_from(rows: Any, source: str) -> list[CommSample]:
    """The ``comm_samples`` list of a profile summary as CommSamples; a value that is not a list
    of objects with CommSample's fields is one ConfigError naming ``source`` and the field."""
    if rows is None:
        return []
    if not isinstance(rows, list):
        raise ConfigError(f"{source}: comm_samples: expected a list, got {type(rows).__name__}")
    out = []
    for i, row in enumerate(rows):
        where = f"{source}: comm_samples[{i}]"
        if not isinstance(row, Mapping):
            raise ConfigError(f"{where}: expected an object, got {row!r}")
        out.append(from_mapping(CommSample, row, where))
    return out


SHAPE_NAMES = ("grad_bytes", "buckets", "ranks", "nodes")


def check_shape(
    grad_bytes: float, buckets: int, ranks: int, nodes: int, names: Sequence[str] = SHAPE_NAMES
) -> None:
    """Raise ConfigError unless the all-reduce shape is one a data-parallel run can have;
    ``names`` are what the error calls the four values (e.g. the CLI's flags)."""
    g, b, r, n = names
    check_range(g, grad_bytes, 0.0, None)
    check_range(b, buckets, 1, None)
    check_range(r, ranks, 1, None)
    check_range(n, nodes, 1, ranks)
    if ranks % nodes:
        raise ConfigError(f"{r} = {ranks}: must be a multiple of {n} = {nodes}")


def features(
    grad_bytes: float, buckets: int, ranks: int, nodes: int, bandwidth: float | None
) -> np.ndarray:
    """The model's regressors, one per parameter in ``PARAMS`` order."""
    steps = 2 * (ranks - 1)
    volume = steps / ranks * grad_bytes
    if nodes > 1:
        if bandwidth is None or bandwidth <= 0:
            raise ConfigError("bandwidth: a positive bandwidth is needed for more than one node")
        return np.array([buckets * steps, buckets, 0.0, volume / bandwidth, volume])
    return np.array([buckets * steps, buckets, volume, 0.0, 0.0])


@dataclass(kw_only=True, slots=True, frozen=True)
class CommModel:
    """Fitted parameters (all >= 0) and how well they fit."""

    alpha_s: float
    """Latency of one ring step."""
    bucket_s: float
    """Fixed cost of one all-reduce call."""
    beta_intra_s_per_byte: float
    """Per-byte time inside one machine."""
    net_efficiency: float
    """Network per-byte time in units of 1/bandwidth (1 = line rate)."""
    beta_net_s_per_byte: float
    """Network per-byte time beyond the bandwidth term (protocol, copies)."""
    samples: int = 0
    """Samples fitted."""
    rel_rmse: float = 0.0
    """Root mean square of the relative residuals on the fitted samples."""
    rel_median: float = 0.0
    """Median absolute relative residual on the fitted samples."""

    def __post_init__(self) -> None:
        for name in (*PARAMS, "rel_rmse", "rel_median"):
            check_range(name, getattr(self, name), 0.0, None)
        check_range("samples", self.samples, 0, None)

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, p) for p in PARAMS])

    def predict(
        self,
        grad_bytes: float,
        buckets: int,
        ranks: int,
        nodes: int = 1,
        bandwidth_bytes_per_s: float | None = None,
    ) -> float:
        """All-reduce seconds per iteration (0 for a single rank); a shape no run can have
        (see ``check_shape``) or a bandwidth that is not a finite number > 0 is a ConfigError."""
        check_shape(grad_bytes, buckets, ranks, nodes)
        if bandwidth_bytes_per_s is not None:
            check_range("bandwidth_bytes_per_s", bandwidth_bytes_per_s, 0.0, None, lo_open=True)
        if ranks < 2:
            return 0.0
        x = features(grad_bytes, buckets, ranks, nodes, bandwidth_bytes_per_s)
        return float(x @ self.vector())

    def save(self, path: Path) -> None:
        """Write the model as JSON, atomically (a temporary name renamed at the end)."""
        write_text(path, json.dumps(asdict(self), indent=1, sort_keys=True) + "\n")

    @staticmethod
    def load(path: Path) -> CommModel:
        """A model written by ``save``; a file that is not one, or a parameter that is not a
        finite number >= 0, is one ConfigError naming the file and the field."""
        data = load_json_object(path, "a communication model file")
        return from_mapping(CommModel, data, str(path))


def exposed_stall_s(comm_s: float, backward_s: float, buckets: int) -> float:
    """Communication not hidden behind the backward pass when buckets are reduced as their
    gradients become ready: at least the last bucket's share, at most all of it."""
    check_range("buckets", buckets, 1, None)
    check_range("comm_s", comm_s, 0.0, None)
    check_range("backward_s", backward_s, 0.0, None)
    return min(comm_s, max(comm_s / buckets, comm_s - backward_s))


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares by trying every support set (exact; fine for 5 columns)."""
    best, best_err = np.zeros(a.shape[1]), float(b @ b)
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            sub = a[:, cols]
            coef, *_ = np.linalg.lstsq(sub, b, rcond=None)
            if (coef < 0).any():
                continue
            err = float(np.sum((sub @ coef - b) ** 2))
            if err < best_err - 1e-18:
                best = np.zeros(a.shape[1])
                best[list(cols)] = coef
                best_err = err
    return best


def check_bandwidths(samples: Sequence[CommSample]) -> None:
    """Refuse multi-node samples all at one bandwidth: there ``volume / bandwidth`` is a fixed
    multiple of ``volume``, so any split between net_efficiency and beta_net_s_per_byte fits
    them alike, and the model's time at any other bandwidth is a guess."""
    rates = sorted({s.bandwidth_bytes_per_s or 0.0 for s in samples if s.nodes > 1})
    if len(rates) == 1:
        raise ConfigError(
            f"fit: every multi-node sample was measured at one bandwidth "
            f"({rates[0] * 8 / 1e6:g} Mbit/s); profiles at two or more bandwidths are needed to "
            "separate the per-byte term from the bandwidth term (profile again at another "
            "--bandwidth and fit both profiles)"
        )


def fit(samples: Sequence[CommSample], iterations: int = 30) -> CommModel:
    """Fit the parameters to least absolute relative error, by iteratively reweighted least
    squares: a few noisy small messages (millisecond jitter on a shared host) then cannot drag
    the per-byte terms that large gradients depend on."""
    if len(samples) < len(PARAMS):
        raise ConfigError(f"fit: {len(samples)} samples; need at least {len(PARAMS)}")
    check_bandwidths(samples)
    x = np.array([features(s.grad_bytes, s.buckets, s.ranks, s.nodes, s.bandwidth_bytes_per_s)
                  for s in samples])  # fmt: skip
    y = np.array([s.seconds for s in samples])
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    weight = np.ones(len(y))
    for _ in range(iterations):
        coef = nnls(x / scale / y[:, None] * weight[:, None], weight) / scale
        rel = (x @ coef - y) / y
        weight = 1.0 / np.sqrt(np.maximum(np.abs(rel), L1_FLOOR))
    values = dict(zip(PARAMS, (float(c) for c in coef), strict=True))
    return CommModel(
        **values, samples=len(samples), rel_rmse=float(np.sqrt(np.mean(rel**2))),
        rel_median=float(np.median(np.abs(rel))),
    )  # fmt: skip
