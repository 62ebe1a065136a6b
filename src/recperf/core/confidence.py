"""Confidence intervals of a mean from a few repeated samples (Student's t), with the standard
library only: the live ingestion target states each throughput it measures with one."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence

LEVEL = 0.90
"""The confidence level used wherever recperf states an interval."""


def _t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` (integer >= 1) degrees of freedom, in closed
    form (Abramowitz and Stegun 26.7.3-4: a finite sum in cos(theta), theta = atan(t/sqrt(df)))."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return math.sin(theta) * total
    if df == 1:
        return 2 * theta / math.pi
    term = math.cos(theta)
    total = term
    for k in range(1, (df - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return 2 / math.pi * (theta + math.sin(theta) * total)


@functools.lru_cache(maxsize=256)
def t_quantile(df: int, level: float = LEVEL) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` >= 1 degrees of freedom
    (e.g. 2.920 for df 2 at 90%), by bisection of the closed-form distribution; above 1000
    degrees of freedom the normal quantile (within 0.1%)."""
    if df < 1 or not 0 < level < 1:
        raise ValueError(f"t_quantile: df = {df}, level = {level}: expected df >= 1, 0 < level < 1")
    if df > 1000:
        return statistics.NormalDist().inv_cdf(0.5 + level / 2)
    lo, hi = 0.0, 1.0
    while _t_central(hi, df) < level:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_central(mid, df) < level else (lo, mid)
    return (lo + hi) / 2


def half_width(values: Sequence[float], level: float = LEVEL) -> float:
    """Half-width of the ``level`` confidence interval of the mean of ``values`` (independent
    samples of one quantity): t * s / sqrt(n); NaN with fewer than two values."""
    n = len(values)
    if n < 2:
        return math.nan
    return t_quantile(n - 1, level) * statistics.stdev(values) / math.sqrt(n)


def interval(centre: float, values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """The ``level`` interval around ``centre`` (the mean estimate) with the spread of
    ``values``; (NaN, NaN) with fewer than two values."""
    h = half_width(values, level)
    return (centre - h, centre + h) if math.isfinite(h) else (math.nan, math.nan)
