"""An alpha-beta model of data-parallel gradient all-reduce (ring algorithm), fitted (``fit``)
with non-negative parameters to least absolute relative error over measured all-reduce times, and
its prediction (with an interval) of a model's communication time and exposed (not overlapped)
stall.

Per iteration, ``buckets`` ring all-reduces of ``grad_bytes`` in total over ``ranks`` ranks take

    t = buckets * (bucket_s + 2 (N-1) alpha_s) + 2 (N-1)/N * grad_bytes * beta

where beta is the per-byte time of the ring's slowest link: ``beta_intra_s_per_byte`` inside one
machine, ``net_efficiency / bandwidth + beta_net_s_per_byte`` across machines.

What the fit knows: a term no sample exercises (the network terms without a multi-node sample) is
left out and recorded as ``unmeasured`` (a prediction that needs it is refused); terms the samples
exercise but cannot tell apart (the design matrix over them is rank-deficient or conditioned worse
than ``COND_LIMIT``: all network samples at one bandwidth, all samples at one world size) make the
fit refuse with one line naming them and what is missing, unless the caller holds all but one of
them at a stated value (``hold``). Every prediction carries a ``LEVEL`` interval from the residual
spread (t quantile) and the fitted parameters' covariance, so extrapolation widens it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recperf.core.config import check_range, from_mapping, load_json_object
from recperf.core.errors import ConfigError
from recperf.core.results import write_text

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

    def to_json(self) -> dict[str, Any]:
        """The sample as a summary's ``comm_samples`` holds it."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "comm sample") -> CommSample:
        """Read ``to_json``'s object back; a bad field is one ConfigError naming ``source``."""
        return from_mapping(cls, data, source)


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
        out.append(CommSample.from_json(row, where))
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


LEVEL = 0.95
"""Coverage of every prediction interval."""
PRIOR = {"alpha_s": 25e-6, "bucket_s": 50e-6, "beta_intra_s_per_byte": 0.0,
         "net_efficiency": 1.0, "beta_net_s_per_byte": 0.0}  # fmt: skip
"""Values used where nothing was measured, and suggested to ``hold``: 25 us per ring step, 50 us
per all-reduce call, links at their datasheet or line rate and no per-byte overhead beyond it."""
NETWORK_TERMS = ("net_efficiency", "beta_net_s_per_byte")
LATENCY_TERMS = ("alpha_s", "bucket_s")


@functools.cache
def t_quantile(dof: int) -> float:
    """Student's t quantile for a two-sided ``LEVEL`` interval with ``dof`` degrees of freedom."""
    from scipy.stats import t as student_t  # type: ignore[import-untyped]

    return float(student_t.ppf(0.5 + LEVEL / 2, dof))


@dataclass(kw_only=True, slots=True, frozen=True)
class CommPrediction:
    """All-reduce seconds per iteration for one shape, with a ``LEVEL`` prediction interval."""

    comm_s: float
    """Point prediction."""
    comm_low_s: float
    """Lower end of the interval (>= 0)."""
    comm_high_s: float
    """Upper end of the interval."""
    level: float = LEVEL
    """Coverage the interval aims at."""
    grad_bytes: float = 0.0
    buckets: int = 1
    ranks: int = 1
    nodes: int = 1
    bandwidth_bytes_per_s: float | None = None
    exposed_stall_s: float | None = None
    """Communication the backward pass cannot hide (when the backward time was given)."""
    exposed_stall_low_s: float | None = None
    exposed_stall_high_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> CommPrediction:
        return from_mapping(CommPrediction, data, "a communication prediction")


@dataclass(kw_only=True, slots=True, frozen=True)
class CommModel:
    """Fitted parameters (all >= 0), what the fit could not know, and how well it fits."""

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
    held: tuple[str, ...] = ()
    """Terms held at a given value, not fitted."""
    unmeasured: tuple[str, ...] = ()
    """Terms no sample exercised (value 0): a prediction that needs one is refused."""
    rel_scale: float = 0.0
    """Robust spread of the relative residuals (1.4826 x their median absolute value)."""
    dof: int = 0
    """Samples less fitted terms (0: no interval; e.g. a model written by hand)."""
    param_cov: tuple[float, ...] = ()
    """Covariance of the parameters (PARAMS x PARAMS, row-major; 0 for held and unmeasured)."""

    def __post_init__(self) -> None:
        for name in (*PARAMS, "rel_rmse", "rel_median", "rel_scale"):
            check_range(name, getattr(self, name), 0.0, None)
        check_range("samples", self.samples, 0, None)
        check_range("dof", self.dof, 0, None)
        for name in ("held", "unmeasured"):
            bad = [term for term in getattr(self, name) if term not in PARAMS]
            if bad:
                raise ConfigError(f"{name}: {bad[0]!r} is not one of {', '.join(PARAMS)}")
        if self.param_cov and len(self.param_cov) != len(PARAMS) ** 2:
            raise ConfigError(f"param_cov: expected {len(PARAMS) ** 2} numbers or none, "
                              f"got {len(self.param_cov)}")  # fmt: skip

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, p) for p in PARAMS])

    def fitted(self) -> tuple[str, ...]:
        """The terms the fit estimated."""
        return tuple(p for p in PARAMS if p not in self.held and p not in self.unmeasured)

    def check_measured(self, terms: Sequence[str], what: str) -> None:
        """Refuse (one line) when ``what`` needs a term the fit never measured."""
        missing = [t for t in terms if t in self.unmeasured]
        if missing:
            raise ConfigError(f"model: {', '.join(missing)} not measured (no sample in the fit "
                              f"exercised it): it cannot predict {what}; fit profiles that "
                              "include such runs")  # fmt: skip

    def interval_s(self, x: np.ndarray, point_s: float) -> tuple[float, float]:
        """The ``LEVEL`` prediction interval of ``point_s``, the model's time for regressors
        ``x``: t quantile x sqrt(parameter variance along x + relative residual noise)."""
        if self.dof < 1 or not self.param_cov:
            return point_s, point_s
        cov = np.array(self.param_cov).reshape(len(PARAMS), len(PARAMS))
        var = max(float(x @ cov @ x), 0.0) + (self.rel_scale * point_s) ** 2
        half = t_quantile(self.dof) * var**0.5
        return max(0.0, point_s - half), point_s + half

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
        return self.predict_interval(
            grad_bytes, buckets, ranks, nodes, bandwidth_bytes_per_s
        ).comm_s

    def predict_interval(
        self, grad_bytes: float, buckets: int, ranks: int, nodes: int = 1,
        bandwidth_bytes_per_s: float | None = None,
    ) -> CommPrediction:  # fmt: skip
        """``predict`` with its ``LEVEL`` interval."""
        check_shape(grad_bytes, buckets, ranks, nodes)
        if bandwidth_bytes_per_s is not None:
            check_range("bandwidth_bytes_per_s", bandwidth_bytes_per_s, 0.0, None, lo_open=True)
        point = low = high = 0.0
        if ranks >= 2:
            x = features(grad_bytes, buckets, ranks, nodes, bandwidth_bytes_per_s)
            needs = [p for p, xi in zip(PARAMS, x, strict=True) if xi > 0]
            self.check_measured(needs, "across machines" if nodes > 1 else "inside one machine")
            point = float(x @ self.vector())
            low, high = self.interval_s(x, point)
        return CommPrediction(
            comm_s=point, comm_low_s=low, comm_high_s=high, grad_bytes=grad_bytes,
            buckets=buckets, ranks=ranks, nodes=nodes, bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Mapping[str, Any], source: str = "a communication model") -> CommModel:
        return from_mapping(CommModel, data, source)

    def save(self, path: Path) -> None:
        """Write the model as JSON, atomically (a temporary name renamed at the end)."""
        write_text(path, json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")

    @staticmethod
    def load(path: Path) -> CommModel:
        """A model written by ``save`` (or by an older recperf, without the interval fields);
        a file that is not one, or a parameter that is not a finite number >= 0, is one
        ConfigError naming the file and the field."""
        data = load_json_object(path, "a communication model file")
        return CommModel.from_json(data, str(path))


def exposed_stall_s(comm_s: float, backward_s: float, buckets: int) -> float:
    """Communication not hidden behind the backward pass when buckets are reduced as their
    gradients become ready: at least the last bucket's share, at most all of it."""
    check_range("buckets", buckets, 1, None)
    check_range("comm_s", comm_s, 0.0, None)
    check_range("backward_s", backward_s, 0.0, None)
    return min(comm_s, max(comm_s / buckets, comm_s - backward_s))


def describe(model: CommModel) -> str:
    """One line: what was fitted, held and not measured, and how well."""
    parts = [f"fitted {', '.join(model.fitted())} on {model.samples} samples"]
    if model.held:
        parts.append("held " + ", ".join(f"{p} = {getattr(model, p):g}" for p in model.held))
    if model.unmeasured:
        parts.append(f"not measured (no sample exercised them): {', '.join(model.unmeasured)}")
    parts.append(f"relative RMSE {model.rel_rmse:.1%}, residual spread {model.rel_scale:.1%} "
                 f"(intervals at {LEVEL:.0%})")  # fmt: skip
    return "; ".join(parts)
