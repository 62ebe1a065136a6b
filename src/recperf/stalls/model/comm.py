"""An alpha-beta model of data-parallel gradient all-reduce (ring algorithm), fitted with
non-negative parameters to least absolute relative error over measured all-reduce times, and its
prediction (with an interval) of a model's communication time and exposed (not overlapped) stall.

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


COND_LIMIT = 1e4
"""Largest condition number of the fit's design (relative residuals, unit columns) over the
terms it estimates: beyond it the samples cannot tell those terms apart."""


def _missing(group: Sequence[str], samples: Sequence[CommSample]) -> str:
    """What the samples would need to vary for ``group``'s terms to be told apart."""
    if set(group) & set(NETWORK_TERMS):
        rates = sorted({s.bandwidth_bytes_per_s or 0.0 for s in samples if s.nodes > 1})
        if len(rates) < 2:
            return (f"every multi-node sample was measured at one bandwidth "
                    f"({rates[0] * 8 / 1e6:g} Mbit/s); profiles at two or more bandwidths are "
                    "needed")  # fmt: skip
    if set(group) & set(LATENCY_TERMS):
        sizes = sorted({s.ranks for s in samples})
        if len(sizes) < 2:
            return (f"every sample has {sizes[0]} ranks; samples at two or more world sizes "
                    "are needed")  # fmt: skip
    return "the samples do not vary enough to separate them"


def unidentified(x: np.ndarray, y: np.ndarray, terms: Sequence[int]) -> list[list[int]]:
    """Groups of columns ``terms`` of the relative design ``x / y`` that the samples cannot tell
    apart. The design's near-null space (singular values below 1/COND_LIMIT of the largest, the
    columns scaled to unit length) is what the samples cannot see; two terms belong together
    when its projector couples them (which does not depend on the basis the SVD picks)."""
    a = x[:, list(terms)] / y[:, None]
    a = a / np.linalg.norm(a, axis=0)
    _, sv, vt = np.linalg.svd(a, full_matrices=True)
    sv = np.concatenate([sv, np.zeros(len(terms) - len(sv))])
    null = vt[sv < sv[0] / COND_LIMIT]
    proj = null.T @ null
    groups: list[set[int]] = []
    for i in range(len(terms)):
        if proj[i, i] < 0.01:
            continue
        group = {i} | {j for j in range(len(terms)) if abs(proj[i, j]) > 0.01}
        for other in [g for g in groups if g & group]:
            groups.remove(other)
            group |= other
        groups.append(group)
    return [sorted(terms[j] for j in g) for g in groups]


def _check_identifiable(
    samples: Sequence[CommSample], x: np.ndarray, y: np.ndarray, free: Sequence[int]
) -> None:
    groups = unidentified(x, y, free)
    if not groups:
        return
    why = []
    for g in groups:
        names = [PARAMS[j] for j in g]
        hold = names[0]
        why.append(f"{' and '.join(names)} cannot be told apart: {_missing(names, samples)} "
                   f"(or hold one, e.g. --hold {hold}={PRIOR[hold]:g})")  # fmt: skip
    raise ConfigError("fit: " + "; ".join(why))


def fit(
    samples: Sequence[CommSample], hold: Mapping[str, float] | None = None, iterations: int = 30
) -> CommModel:
    """Fit the terms the samples measure to least absolute relative error, by iteratively
    reweighted least squares: a few noisy small messages (millisecond jitter on a shared host)
    then cannot drag the per-byte terms that large gradients depend on. ``hold`` fixes terms at
    given values. Refused (one ConfigError line) when measured terms cannot be told apart or
    the samples are too few to leave a residual spread."""
    hold = dict(hold or {})
    for term, value in hold.items():
        if term not in PARAMS:
            raise ConfigError(f"hold: {term!r} is not one of {', '.join(PARAMS)}")
        check_range(f"hold {term}", value, 0.0, None)
    x = np.array([features(s.grad_bytes, s.buckets, s.ranks, s.nodes, s.bandwidth_bytes_per_s)
                  for s in samples]).reshape(len(samples), len(PARAMS))  # fmt: skip
    y = np.array([s.seconds for s in samples])
    if not samples:
        raise ConfigError("fit: no all-reduce samples in the profiles (profile 2 ranks or more)")
    measured = [j for j in range(len(PARAMS)) if np.any(x[:, j] > 0)]
    free = [j for j in measured if PARAMS[j] not in hold]
    if len(samples) < len(free) + 1 or not free:
        need = f"need at least {len(free) + 1} (one more than the {len(free)} terms they measure"
        raise ConfigError(f"fit: {len(samples)} samples; {need}, for the residual spread)")
    _check_identifiable(samples, x, y, free)
    fixed = np.array([hold.get(p, 0.0) for p in PARAMS])
    a = x[:, free] / y[:, None]
    target = 1.0 - (x @ fixed) / y
    scale = a.max(axis=0)
    weight = np.ones(len(y))
    for _ in range(iterations):
        coef = nnls(a / scale * weight[:, None], target * weight) / scale
        rel = a @ coef - target
        weight = 1.0 / np.sqrt(np.maximum(np.abs(rel), L1_FLOOR))
    values = fixed.copy()
    values[free] = coef
    rel_scale = 1.4826 * float(np.median(np.abs(rel)))
    cov = np.zeros((len(PARAMS), len(PARAMS)))
    cov[np.ix_(free, free)] = rel_scale**2 * np.linalg.pinv(a.T @ a)
    return CommModel(
        **dict(zip(PARAMS, (float(v) for v in values), strict=True)), samples=len(samples),
        rel_rmse=float(np.sqrt(np.mean(rel**2))), rel_median=float(np.median(np.abs(rel))),
        held=tuple(p for p in PARAMS if p in hold),
        unmeasured=tuple(p for j, p in enumerate(PARAMS) if j not in measured and p not in hold),
        rel_scale=rel_scale, dof=len(samples) - len(free),
        param_cov=tuple(float(c) for c in cov.ravel()),
    )  # fmt: skip


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
