"""Student's t quantiles and confidence intervals from the standard library."""

from __future__ import annotations

import math
import statistics

import pytest

from recperf.core.confidence import half_width, interval, t_quantile

# two-sided 90% (and one 95%) quantiles from published t tables
TABLE = [(1, 6.314), (2, 2.920), (3, 2.353), (5, 2.015), (10, 1.812), (11, 1.796), (30, 1.697)]


@pytest.mark.parametrize(("df", "want"), TABLE)
def test_t_quantile_matches_the_table(df: int, want: float) -> None:
    assert t_quantile(df) == pytest.approx(want, abs=6e-4)


def test_t_quantile_other_levels_and_the_normal_limit() -> None:
    assert t_quantile(9, 0.95) == pytest.approx(2.262, abs=6e-4)
    z = statistics.NormalDist().inv_cdf(0.95)
    assert t_quantile(5000) == pytest.approx(z)
    assert t_quantile(1000) == pytest.approx(z, rel=1e-3)
    with pytest.raises(ValueError):
        t_quantile(0)


def test_interval_is_t_times_standard_error_around_the_centre() -> None:
    vals = [10.0, 12.0, 11.0, 13.0]
    h = 2.353 * statistics.stdev(vals) / 2
    assert half_width(vals) == pytest.approx(h, rel=1e-3)
    lo, hi = interval(11.4, vals)
    assert (lo, hi) == pytest.approx((11.4 - h, 11.4 + h), rel=1e-3)
    assert interval(5.0, [5.0, 5.0, 5.0]) == (5.0, 5.0)
    assert all(math.isnan(x) for x in interval(5.0, [5.0]))
