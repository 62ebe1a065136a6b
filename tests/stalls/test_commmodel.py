"""The alpha-beta all-reduce model: recovery of known parameters, prediction at a bandwidth it
was not fitted on, refusal of terms the samples cannot tell apart, prediction intervals, the
exposed stall, persistence and errors. Samples are the model's own times plus seeded noise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from recperf.core.errors import ConfigError
from recperf.stalls.model.comm import (
    CommModel,
    CommPrediction,
    CommSample,
    describe,
    exposed_stall_s,
)
from recperf.stalls.model.fit import fit, nnls

TRUE = CommModel(alpha_s=40e-6, bucket_s=150e-6, beta_intra_s_per_byte=1 / 5e9,
                 net_efficiency=1.15, beta_net_s_per_byte=2e-10)  # fmt: skip
MBIT = 1e6 / 8


def samples(
    bandwidths_mbit: list[float], noise: float, seed: int = 0,
    shapes: tuple[tuple[int, int], ...] = ((2, 1), (4, 1), (2, 2), (4, 2)),
) -> list[CommSample]:  # fmt: skip
    rng = np.random.default_rng(seed)
    out = []
    for ranks, nodes in shapes:
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
    with pytest.raises(
        ConfigError, match=r"3 samples; need at least 4 \(one more than the 3 terms"
    ):
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


def test_network_samples_at_one_bandwidth_are_refused_in_one_line_naming_what_is_missing() -> None:
    with pytest.raises(ConfigError) as info:
        fit(samples([500], noise=0.0))
    assert str(info.value) == (
        "fit: net_efficiency and beta_net_s_per_byte cannot be told apart: every multi-node "
        "sample was measured at one bandwidth (500 Mbit/s); profiles at two or more bandwidths "
        "are needed (or hold one, e.g. --hold net_efficiency=1)"
    )
    assert fit(samples([500, 2000], noise=0.0)).rel_rmse < 1e-9


def test_nearly_equal_bandwidths_are_refused_by_the_conditioning_not_a_count() -> None:
    with pytest.raises(ConfigError, match="net_efficiency and beta_net_s_per_byte cannot be told"):
        fit(samples([500, 500 * (1 + 1e-7)], noise=0.0))


def test_one_world_size_cannot_separate_the_latency_terms_unless_one_is_held() -> None:
    one_size = samples([500, 2000], noise=0.0, shapes=((2, 1), (2, 2)))
    why = r"^fit: alpha_s and bucket_s cannot be told apart: every sample has 2 ranks; samples at"
    with pytest.raises(ConfigError, match=why):
        fit(one_size)
    model = fit(one_size, hold={"alpha_s": TRUE.alpha_s})
    assert model.held == ("alpha_s",) and "alpha_s" not in model.fitted()
    assert np.allclose(model.vector(), TRUE.vector(), rtol=1e-6)
    assert "held alpha_s = 4e-05" in describe(model)
    with pytest.raises(ConfigError, match="hold: 'gamma' is not one of alpha_s"):
        fit(one_size, hold={"gamma": 1.0})


def test_terms_no_sample_exercises_are_left_out_and_named() -> None:
    intra = samples([], noise=0.0, shapes=((2, 1), (4, 1)))
    model = fit(intra)
    assert model.unmeasured == ("net_efficiency", "beta_net_s_per_byte")
    assert model.predict(8e6, 4, 4) == pytest.approx(TRUE.predict(8e6, 4, 4), rel=1e-6)
    assert "not measured (no sample exercised them): net_efficiency" in describe(model)
    with pytest.raises(ConfigError, match=r"net_efficiency, beta_net_s_per_byte not measured.*"
                       r"cannot predict across machines"):  # fmt: skip
        model.predict(8e6, 4, 4, 2, 1e9)


def test_predictions_at_05_10_100_gbit_follow_the_ring_bandwidth_term() -> None:
    model = fit(samples([200, 1000], noise=0.05, seed=7))
    grad, buckets, ranks = 8.5e6, 2, 8
    gbit = (0.5, 10.0, 100.0)
    preds = [model.predict_interval(grad, buckets, ranks, 2, g * 1e9 / 8) for g in gbit]
    wire = [2 * (ranks - 1) / ranks * grad / (g * 1e9 / 8) for g in gbit]
    assert preds[0].comm_s > preds[1].comm_s > preds[2].comm_s
    # what changes between two bandwidths is the bandwidth term alone
    for i, j in ((0, 1), (1, 2)):
        drop = preds[i].comm_s - preds[j].comm_s
        assert drop == pytest.approx(model.net_efficiency * (wire[i] - wire[j]), rel=1e-9)
        assert drop == pytest.approx(TRUE.net_efficiency * (wire[i] - wire[j]), rel=0.1)
    for g, p in zip(gbit, preds, strict=True):
        truth = TRUE.predict(grad, buckets, ranks, 2, g * 1e9 / 8)
        assert p.comm_low_s <= truth <= p.comm_high_s


def _width(model: CommModel) -> float:
    p = model.predict_interval(16e6, 8, 4, 2, 500 * MBIT)
    return (p.comm_high_s - p.comm_low_s) / p.comm_s


def test_intervals_widen_with_residual_noise() -> None:
    widths = [_width(fit(samples([200, 1000], noise=noise, seed=5))) for noise in (0.0, 0.02, 0.1)]
    assert widths[0] == pytest.approx(0.0, abs=1e-9)
    assert 0 < widths[1] < widths[2]
    assert widths[2] > 3 * widths[1]


def test_intervals_cover_the_truth_at_about_their_level() -> None:
    shapes = [(4e6, 10, 2, 2, 500 * MBIT), (32e6, 4, 4, 2, 300 * MBIT), (1e6, 25, 4, 1, None)]
    hits = []
    for seed in range(8):
        model = fit(samples([200, 1000], noise=0.05, seed=100 + seed))
        for shape in shapes:
            p = model.predict_interval(*shape)
            hits.append(p.comm_low_s <= TRUE.predict(*shape) <= p.comm_high_s)
    assert sum(hits) >= 0.8 * len(hits)


def test_model_and_prediction_round_trip_through_json(tmp_path: Path) -> None:
    model = fit(samples([200, 1000], noise=0.05, seed=2), hold={"bucket_s": 1e-4})
    assert CommModel.from_json(json.loads(json.dumps(model.to_json()))) == model
    model.save(tmp_path / "m.json")
    assert CommModel.load(tmp_path / "m.json") == model
    p = model.predict_interval(8e6, 2, 2, 2, 1e9)
    assert CommPrediction.from_json(json.loads(json.dumps(p.to_json()))) == p
    assert p.comm_low_s < p.comm_s < p.comm_high_s
    # a model without a fit (written by hand, or by an older recperf) predicts a point
    bare = TRUE.predict_interval(8e6, 2, 2, 2, 1e9)
    assert bare.comm_low_s == bare.comm_s == bare.comm_high_s
