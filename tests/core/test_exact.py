"""recperf.core.exact: accurate to a few ulp, and the same bytes whichever SIMD kernels the CPU
offers. The cross-machine test runs the seeded computations that reach a result (synthetic
traces, a cluster simulation's summary.json and jobs.parquet, the ingest simulator and its
tuners, the Criteo generator, the embedding trace generators) in two fresh interpreters, one
with numpy's and torch's SIMD paths switched off, and requires identical digests; a control
proves that the switch really changes numpy's own ``exp`` on this CPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from recperf.core import exact

SCRIPT = Path(__file__).with_name("exact_digests.py")


def ulps(got: np.ndarray, want: np.ndarray) -> float:
    ok = np.isfinite(want) & (want != 0)
    return float(np.max(np.abs(got[ok] - want[ok]) / np.spacing(np.abs(want[ok]))))


def test_exp_and_log_are_within_two_ulp_of_the_correctly_rounded_value() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-745, 709, 20000), rng.uniform(-1, 1, 20000), [0.0, 1e-300]])
    assert ulps(exact.exp(x), np.array([math.exp(v) for v in x])) <= 2
    y = np.concatenate([exact.exp(rng.uniform(-700, 700, 20000)), [5e-324, 1e-310, 1.0, 2.0]])
    assert ulps(exact.log(y), np.array([math.log(v) for v in y])) <= 2
    assert exact.log1(1.0) == 0.0
    assert exact.exp1(0.0) == 1.0


def test_special_values_follow_ieee() -> None:
    got = exact.log([0.0, -1.0, np.inf, np.nan])
    assert got[0] == -np.inf and np.isnan(got[1]) and got[2] == np.inf and np.isnan(got[3])
    got = exact.exp([-800.0, 800.0, np.nan, -np.inf, np.inf])
    assert got[0] == 0.0 and got[1] == np.inf and np.isnan(got[2])
    assert got[3] == 0.0 and got[4] == np.inf


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-300, 1e300), st.floats(-4.0, 4.0))
def test_power_matches_the_library_closely(x: float, a: float) -> None:
    assume(abs(a * math.log(x)) < 690)  # the result is a normal number
    assert float(exact.power(x, a)) == pytest.approx(x**a, rel=1e-12)


def test_draws_have_their_distributions() -> None:
    rng = np.random.default_rng(5)
    z = exact.normal(rng, 1.0, 2.0, 200_000)
    assert z.size == 200_000
    assert abs(z.mean() - 1.0) < 0.02 and abs(z.std() - 2.0) < 0.02
    assert abs(np.mean(np.abs(z - 1.0) < 2.0) - 0.6827) < 0.005  # within one sigma
    e = exact.exponential(rng, 3.0, 200_000)
    assert (
        e.min() >= 0 and abs(e.mean() - 3.0) < 0.03 and abs(np.median(e) - 3 * math.log(2)) < 0.03
    )
    u = exact.loguniform(rng, 2.0, 128.0, 100_000)
    assert u.min() >= 2.0 and u.max() < 128.0
    assert abs(np.mean(u < 16.0) - 0.5) < 0.01  # 16 is the geometric midpoint
    ln = exact.lognormal(rng, 0.0, 0.5, 100_000)
    assert abs(np.median(ln) - 1.0) < 0.01


def test_draws_are_reproducible_and_use_a_fixed_stream() -> None:
    a = exact.normal(np.random.default_rng(3), 0.0, 1.0, 1001)
    b = exact.normal(np.random.default_rng(3), 0.0, 1.0, 1001)
    assert a.tobytes() == b.tobytes()
    head = exact.normal(np.random.default_rng(3), 0.0, 1.0, 10)
    assert head.tobytes() == a[:10].tobytes()


def simd_features() -> list[str]:
    """The SIMD feature groups numpy dispatches to on this CPU beyond its compiled baseline."""
    from numpy._core import _multiarray_umath as mu

    return [f for f in mu.__cpu_dispatch__ if mu.__cpu_features__.get(f)]


def start(disable: list[str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NPY_DISABLE_CPU_FEATURES",)}
    if disable:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(disable)
        env["ATEN_CPU_CAPABILITY"] = "default"  # torch's scalar kernels
    return subprocess.Popen(
        [sys.executable, str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def digests(run: subprocess.Popen[str]) -> dict[str, str]:
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-2000:]
    result: dict[str, str] = json.loads(out)
    return result


def test_results_are_the_same_bytes_without_the_cpus_simd_features() -> None:
    features = simd_features()
    if not features:
        pytest.skip("this CPU offers numpy no SIMD features beyond its baseline: nothing to switch")
    runs = [start([]), start(features)]  # side by side
    plain, scalar = (digests(r) for r in runs)
    control = {k: (plain.pop(k), scalar.pop(k)) for k in list(plain) if k.startswith("control:")}
    assert plain == scalar
    if any(f in features for f in ("X86_V4", "AVX512F", "AVX512_SKX")):
        # numpy's AVX-512 float64 exp differs in the last bits from its scalar one: the switch
        # works, so the equality above is a real test
        assert control["control:np.exp"][0] != control["control:np.exp"][1]
