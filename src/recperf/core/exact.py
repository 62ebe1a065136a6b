"""Transcendental functions and random draws whose bits are the same on every CPU.

numpy picks its ``exp``/``log``/``power`` kernels by CPU at run time (AVX-512 has float64 code
of its own) and the C library's scalar versions differ between machines too, in the last bit;
``Generator.lognormal``, ``normal`` and ``exponential`` call those scalar versions. A seeded
result must be the same bytes everywhere, so every transcendental value that decides one
(synthetic job durations and arrivals, simulated noise, Zipf weights) is computed here from
IEEE-754 basic operations only (``+ - * /``, ``sqrt``, ``frexp``/``ldexp``, ``rint``), which every
conforming CPU rounds identically, each as its own numpy call so that nothing is fused into an
FMA; polynomials are evaluated in a fixed order. Accuracy is within a few ulp of the correctly
rounded value, far below any figure's noise. ``tests/core/test_exact.py`` runs the same draws
with and without the CPU's SIMD features and requires the same bytes.
"""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike, NDArray

F64 = NDArray[np.float64]


def _split_ln2() -> tuple[float, float]:
    """ln 2 as hi + lo: hi keeps 32 significant bits, so k * hi is exact for |k| < 2**21, and
    lo is the rest, rounded once (computed in decimal, which is the same everywhere)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 50
        ln2 = decimal.Decimal(2).ln()
        bits = np.array([float(ln2)]).view(np.uint64) & np.uint64(~((1 << 21) - 1) & (2**64 - 1))
        hi = float(bits.view(np.float64)[0])
        lo = float(ln2 - decimal.Decimal(hi))
    return hi, lo


_LN2_HI, _LN2_LO = _split_ln2()
_INV_LN2 = float(1 / decimal.Context(prec=50).ln(decimal.Decimal(2)))
_SQRT_HALF = float(decimal.Context(prec=50).sqrt(decimal.Decimal("0.5")))
_EXP_TAYLOR = tuple(float(Fraction(1, math.factorial(k))) for k in range(14))
"""1/k! for k = 0..13: on |r| <= ln(2)/2 the next term is below 4e-18."""
_ATANH_ODD = tuple(float(Fraction(1, 2 * k + 1)) for k in range(1, 13))
"""1/3, 1/5, ... 1/25: the series of atanh(s)/s - 1 in s**2, for |s| <= 0.172."""


def _horner(z: F64, coefficients: tuple[float, ...]) -> F64:
    """sum(c[i] * z**i), highest power first, one rounding per step in a fixed order."""
    acc = np.full_like(z, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        acc = acc * z
        acc = acc + c
    return acc


def _array(x: ArrayLike) -> F64:
    return np.asarray(x, dtype=np.float64)


def log(x: ArrayLike) -> F64:
    """Natural logarithm, elementwise: -inf at 0, NaN below 0 and for NaN, inf at inf."""
    x = _array(x)
    with np.errstate(all="ignore"):
        m, e = np.frexp(x)  # x = m * 2**e, m in [0.5, 1): exact
        low = m < _SQRT_HALF
        m = np.where(low, m * 2.0, m)  # m in [0.707, 1.414): exact
        k = (e - low).astype(np.float64)
        f = m - 1.0  # exact (Sterbenz)
        s = f / (2.0 + f)  # log(1 + f) = 2 atanh(s)
        z = s * s
        tail = _horner(z, _ATANH_ODD) * z
        tail = tail * s
        two_s = s * 2.0
        log1p_f = two_s + tail * 2.0
        out = k * _LN2_LO
        out = out + log1p_f
        out = out + k * _LN2_HI
        out = np.where(x == 0.0, -np.inf, out)
        out = np.where(x == np.inf, np.inf, out)
        out = np.where((x < 0.0) | np.isnan(x), np.nan, out)
    return out


def exp(x: ArrayLike) -> F64:
    """e**x, elementwise: 0 below about -745, inf above about 709.8, NaN for NaN."""
    x = _array(x)
    with np.errstate(all="ignore"):
        xc = np.clip(np.nan_to_num(x, nan=0.0), -746.0, 710.0)
        k = np.rint(xc * _INV_LN2)  # exp(x) = 2**k * exp(r), |r| <= ln(2)/2
        r = xc - k * _LN2_HI  # k * _LN2_HI is exact
        r = r - k * _LN2_LO
        out = np.ldexp(_horner(r, _EXP_TAYLOR), k.astype(np.int64))
        out = np.where(np.isnan(x), np.nan, out)
    return out


def power(x: ArrayLike, a: ArrayLike) -> F64:
    """x**a for x >= 0 (0**a is 0 for a > 0 and inf for a < 0), as exp(a * log(x))."""
    return exp(np.multiply(_array(a), log(x)))


def log1(x: float) -> float:
    """:func:`log` of one number."""
    return float(log(x))


def exp1(x: float) -> float:
    """:func:`exp` of one number."""
    return float(exp(x))


def uniform(rng: np.random.Generator, low: float, high: float, size: int) -> F64:
    """Uniform on [low, high): ``low + (high - low) * u``, two separate roundings (numpy's own
    ``Generator.uniform`` computes the same in C, where a compiler may fuse it into an FMA)."""
    u = rng.random(size)
    return (u * (high - low)) + low


def exponential(rng: np.random.Generator, scale: float, size: int) -> F64:
    """Exponential draws of mean ``scale``, by inversion: -log(1 - u) * scale."""
    return -log(1.0 - rng.random(size)) * scale


def normal(rng: np.random.Generator, loc: float, scale: float, size: int) -> F64:
    """Normal draws by Marsaglia's polar method: pairs (u, v) uniform on the square, kept
    inside the unit circle (which pairs are kept is exact, so the stream is the same
    everywhere), each kept pair giving two draws."""
    out = np.empty(size, dtype=np.float64)
    filled = 0
    while filled < size:
        pairs = max(16, (size - filled) * 2 // 3 + 8)  # about 1.33x what 78.5% acceptance needs
        uv = rng.random(2 * pairs) * 2.0 - 1.0
        u, v = uv[0::2], uv[1::2]
        s = u * u + v * v
        ok = (s > 0.0) & (s < 1.0)
        u, v, s = u[ok], v[ok], s[ok]
        f = np.sqrt((log(s) * -2.0) / s)
        z = np.empty(2 * s.size, dtype=np.float64)
        z[0::2], z[1::2] = u * f, v * f
        take = min(z.size, size - filled)
        out[filled : filled + take] = z[:take]
        filled += take
    return out * scale + loc


def lognormal(rng: np.random.Generator, mean: float, sigma: float, size: int) -> F64:
    """exp of :func:`normal` draws with ``mean`` and ``sigma`` (those of the logarithm)."""
    return exp(normal(rng, mean, sigma, size))


def loguniform(rng: np.random.Generator, low: float, high: float, size: int) -> F64:
    """Log-uniform draws on [low, high) (0 < low < high)."""
    return exp(uniform(rng, log1(low), log1(high), size))
