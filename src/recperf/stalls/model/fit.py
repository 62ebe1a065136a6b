"""Fitting the communication model (``comm``) to measured all-reduce samples: iteratively
reweighted non-negative least squares on relative residuals, after checking that the samples can
tell the measured terms apart (``COND_LIMIT``); held and unmeasured terms are recorded."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.stalls.model.comm import (
    LATENCY_TERMS,
    NETWORK_TERMS,
    PARAMS,
    PRIOR,
    CommModel,
    CommSample,
    features,
)

L1_FLOOR = 0.01
"""Relative residual below which a sample's reweighting stops growing (keeps IRLS stable)."""


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
