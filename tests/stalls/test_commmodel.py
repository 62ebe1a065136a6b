"""The alpha-beta all-reduce model: recovery of known parameters, prediction at a bandwidth it
was not fitted on, the exposed stall, persistence and errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recperf.core.errors import ConfigError
from recperf.stalls.commmodel import (
    CommModel,
    CommSample,
    exposed_stall_s,
    fit,
    nnls,
)

TRUE = CommModel(alpha_s=40e-6, bucket_s=150e-6, beta_intra_s_per_byte=1 / 5e9,
                 net_efficiency=1.15, beta_net_s_per_byte=2e-10)  # fmt: skip
MBIT = 1e6 / 8


def samples(bandwidths_mbit: list[float], noise: float, seed: int = 0) -> list[CommSample]:
    rng = np.random.default_rng(seed)
    out = []
    for ranks, nodes in ((2, 1), (4, 1), (2, 2), (4, 2)):
        for grad_bytes in (1e6, 8e6, 64e6):
            for buckets in (1, 8, 25):
                bws = bandwidths_mbit if nodes > 1 else [0.0]
                for bw in bws:
                    bw_b = bw * MBIT if nodes > 1 else None
                    t = TRUE.predict(grad_bytes, buckets, ranks, nodes, bw_b)
                    t *= 1 + noise * rng.standard_normal()
                    sample = CommSample(
                        grad_bytes=grad_bytes, buckets=buckets, ranks=ranks, nodes=nodes,
                        bandwidth_bytes_per_s=bw_b, seconds=t,
                    )  # fmt: skip
                    out.append(sample)
    return out


def test_fit_recovers_exact_parameters() -> None:
    model = fit(samples([200, 1000], noise=0.0))
    assert np.allclose(model.vector(), TRUE.vector(), rtol=1e-6)
    assert model.rel_rmse < 1e-9


def test_prediction_at_an_unseen_bandwidth_is_within_15_percent_under_noise() -> None:
    model = fit(samples([200, 1000], noise=0.05, seed=3))
    for grad_bytes in (4e6, 32e6):
        want = TRUE.predict(grad_bytes, 10, 2, 2, 500 * MBIT)
        got = model.predict(grad_bytes, 10, 2, 2, 500 * MBIT)
        assert abs(got - want) / want < 0.15
    assert model.rel_rmse < 0.1


def test_exposed_stall_is_between_the_last_bucket_and_everything() -> None:
    assert exposed_stall_s(1.0, 0.2, 10) == pytest.approx(0.8)
    assert exposed_stall_s(1.0, 5.0, 10) == pytest.approx(0.1)
    assert exposed_stall_s(1.0, 0.0, 1) == pytest.approx(1.0)
    assert TRUE.predict(1e6, 4, 1) == 0.0


def test_nnls_keeps_coefficients_non_negative() -> None:
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    b = np.array([3.0, 2.0, 1.0])  # the unconstrained slope is negative
    coef = nnls(a, b)
    assert (coef >= 0).all() and coef[1] == 0 and coef[0] == pytest.approx(2.0)


def test_save_load_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    TRUE.save(path)
    assert CommModel.load(path) == TRUE
    path.write_text("{}")
    with pytest.raises(ConfigError, match=r"model\.json: missing required key 'alpha_s'"):
        CommModel.load(path)
    path.write_text("[1]")
    with pytest.raises(ConfigError, match="not a communication model file: expected a JSON obj"):
        CommModel.load(path)
    with pytest.raises(ConfigError, match="bandwidth_bytes_per_s: required"):
        CommSample(grad_bytes=1.0, buckets=1, ranks=2, nodes=2, seconds=1.0)
    with pytest.raises(ConfigError, match="need at least 5"):
        fit(samples([200], noise=0.0)[:3])
    with pytest.raises(ConfigError, match="ranks"):
        CommSample(grad_bytes=1.0, buckets=1, ranks=1, seconds=1.0)


def test_a_few_jittery_small_messages_do_not_drag_the_per_byte_terms() -> None:
    clean = samples([200, 1000], noise=0.0)
    jitter = [
        CommSample(grad_bytes=s.grad_bytes, buckets=s.buckets, ranks=s.ranks, nodes=s.nodes,
                   bandwidth_bytes_per_s=s.bandwidth_bytes_per_s, seconds=s.seconds * 3)
        if s.grad_bytes == 1e6 and s.buckets == 25 else s
        for s in clean
    ]  # fmt: skip
    model = fit(jitter)
    assert model.net_efficiency == pytest.approx(TRUE.net_efficiency, rel=0.02)
    assert model.beta_intra_s_per_byte == pytest.approx(TRUE.beta_intra_s_per_byte, rel=0.02)
    assert model.rel_median < 0.01 < model.rel_rmse


def test_network_samples_at_one_bandwidth_are_refused_naming_what_is_missing() -> None:
    with pytest.raises(ConfigError) as info:
        fit(samples([500], noise=0.0))
    assert str(info.value) == (
        "fit: every multi-node sample was measured at one bandwidth (500 Mbit/s); profiles at "
        "two or more bandwidths are needed to separate the per-byte term from the bandwidth "
        "term (profile again at another --bandwidth and fit both profiles)"
    )
    assert fit(samples([500, 2000], noise=0.0)).rel_rmse < 1e-9
