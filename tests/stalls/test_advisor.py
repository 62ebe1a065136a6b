"""The cloud cost advisor: communication and compute predictions equal hand computations, the
recommendation is the cheapest setup within budget (surely, by its interval, where one is),
setups whose interval straddles the budget are marked, the data stall carried is the measured
one (the noisy differential one moved the choice between identical runs), and bad input is
named."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recperf.core.errors import ConfigError
from recperf.report.stalls_figures import write_pareto_html
from recperf.stalls.cost.advisor import (
    DEFAULT_MODEL,
    Advice,
    AdvisorConfig,
    ProfileSummary,
    advise,
    comm_seconds,
    predict_candidate,
    verdict,
)
from recperf.stalls.cost.catalog import (
    INSTANCE_COLUMNS,
    Instance,
    load_gpu_models,
    load_instances,
)
from recperf.stalls.model.comm import CommModel, CommSample
from recperf.stalls.model.fit import fit

GPUS = load_gpu_models()
INSTANCES = {i.instance: i for i in load_instances()}


def summary(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "compute_s": 0.5, "backward_s": 0.3, "data_fetch_stall_s": 0.01,
        "data_prep_stall_s": 0.02, "grad_bytes": 100_000_000, "num_layers": 10,
        "param_bytes": 100_000_000, "flops_per_iter": 1e12, "batch_size": 256,
        "device": "cpu", "device_name": "x86_64",
    }  # fmt: skip
    base.update(overrides)
    return base


def profile(**overrides: Any) -> ProfileSummary:
    return ProfileSummary.from_mapping(summary(**overrides))


def model(net_efficiency: float = 1.0, beta_net: float = 0.0) -> CommModel:
    return CommModel(alpha_s=25e-6, bucket_s=50e-6, beta_intra_s_per_byte=0.0,
                     net_efficiency=net_efficiency, beta_net_s_per_byte=beta_net)  # fmt: skip


@pytest.mark.parametrize(
    ("ranks", "nodes", "intra", "net", "eff", "beta_net", "expected"),
    [
        # 10 * (50us + 14 * 25us) + 14/8 * 1e8 / 600e9
        (8, 1, 600e9, 0.0, 1.0, 0.0, 4e-3 + 1.75e8 / 600e9),
        # 10 * (50us + 30 * 25us) + 30/16 * 1e8 * (2 / 50e9 + 1e-12): the network is slower
        (16, 2, 600e9, 50e9, 2.0, 1e-12, 8e-3 + 1.875e8 * 4.1e-11),
        # same shape, but the link inside the machine (1 GB/s) is the slowest
        (16, 2, 1e9, 50e9, 1.0, 0.0, 8e-3 + 1.875e8 / 1e9),
        # one GPU per machine: no link inside, only the network
        (2, 2, math.inf, 1.25e9, 1.0, 0.0, 10 * (50e-6 + 2 * 25e-6) + 1e8 / 1.25e9),
    ],
)
def test_comm_seconds_matches_hand_computation(
    ranks: int, nodes: int, intra: float, net: float, eff: float, beta_net: float,
    expected: float,
) -> None:  # fmt: skip
    got = comm_seconds(model(eff, beta_net), 1e8, 10, ranks, nodes, intra, net)
    assert got == pytest.approx(expected, rel=1e-12)


def test_single_rank_has_no_communication() -> None:
    assert comm_seconds(DEFAULT_MODEL, 1e9, 50, 1, 1, math.inf, 0.0) == 0.0
    config = AdvisorConfig(budget_h=10, epoch_samples=1_000_000)
    one = predict_candidate(profile(), INSTANCES["p3.2xlarge"], 1, GPUS, DEFAULT_MODEL, config)
    assert (one.gpus_total, one.comm_s, one.exposed_comm_s) == (1, 0.0, 0.0)
    two = predict_candidate(profile(), INSTANCES["p3.2xlarge"], 2, GPUS, DEFAULT_MODEL, config)
    assert two.comm_s > 0


@pytest.mark.parametrize(("instance", "precision", "peak_tflops"),
                         [("p4d.24xlarge", "fp32", 19.5), ("p4d.24xlarge", "fp16", 312),
                          ("p5.48xlarge", "fp32", 67), ("g5.12xlarge", "fp16", 125)])  # fmt: skip
@pytest.mark.parametrize("efficiency", [0.4, 1.0])
def test_flop_based_compute(
    instance: str, precision: str, peak_tflops: float, efficiency: float
) -> None:
    config = AdvisorConfig(budget_h=10, epoch_samples=10**6, efficiency=efficiency,
                           precision=precision)  # fmt: skip
    cand = predict_candidate(profile(), INSTANCES[instance], 1, GPUS, DEFAULT_MODEL, config)
    assert cand.compute_s == pytest.approx(1e12 / (peak_tflops * 1e12 * efficiency))
    assert cand.compute_method == "FLOPs / (datasheet peak x efficiency)"


@pytest.mark.parametrize(
    ("device_name", "measured", "instance", "target", "precision"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100", "p5.48xlarge", 67, "fp32"),
        ("NVIDIA A100-SXM4-80GB", "A100", "p5.48xlarge", 989, "fp16"),
        ("NVIDIA H200", "H200", "p4d.24xlarge", 19.5, "fp32"),
        ("Tesla V100-SXM2-16GB", "V100", "g4dn.xlarge", 8.1, "fp32"),
    ],
)
def test_measured_cuda_compute_scales_by_peak_ratio(
    device_name: str, measured: str, instance: str, target: float, precision: str
) -> None:
    config = AdvisorConfig(budget_h=10, epoch_samples=10**6, precision=precision)
    prof = profile(device="cuda", device_name=device_name)
    cand = predict_candidate(prof, INSTANCES[instance], 1, GPUS, DEFAULT_MODEL, config)
    gpu = GPUS[measured]
    peak = gpu.fp32_tflops if precision == "fp32" else gpu.tensor_fp16_tflops
    assert cand.compute_s == pytest.approx(0.5 * peak / target)
    assert cand.compute_method == f"measured on {measured}, scaled by datasheet peak"


def test_unknown_cuda_device_falls_back_to_flops() -> None:
    config = AdvisorConfig(budget_h=10, epoch_samples=10**6)
    prof = profile(device="cuda", device_name="Some Future GPU")
    cand = predict_candidate(prof, INSTANCES["p4d.24xlarge"], 1, GPUS, DEFAULT_MODEL, config)
    assert cand.compute_s == pytest.approx(1e12 / (19.5e12 * 0.4))


def test_candidate_adds_up_by_hand() -> None:
    config = AdvisorConfig(budget_h=2, epoch_samples=1_000_000, epochs=3)
    fitted = model(net_efficiency=1.5, beta_net=1e-12)
    prof = profile(backward_s=None)  # missing backward: 2/3 of compute
    cand = predict_candidate(prof, INSTANCES["p4d.24xlarge"], 2, GPUS, fitted, config)
    compute = 1e12 / (19.5e12 * 0.4)
    comm = 10 * (50e-6 + 30 * 25e-6) + 30 / 16 * 1e8 * (1.5 / 50e9 + 1e-12)
    exposed = min(comm, max(comm / 10, comm - compute * 2 / 3))
    iteration = compute + 0.03 + exposed
    iters = math.ceil(1_000_000 / (256 * 16))
    total_h = iters * iteration / 3600 * 3
    assert cand.comm_s == pytest.approx(comm)
    assert cand.exposed_comm_s == pytest.approx(exposed)
    assert cand.iteration_s == pytest.approx(iteration)
    assert cand.iterations_per_epoch == iters
    assert cand.total_h == pytest.approx(total_h)
    assert cand.usd_per_hour == pytest.approx(2 * 21.957642)
    assert cand.cost_usd == pytest.approx(total_h * 2 * 21.957642)
    assert cand.meets_budget == (total_h <= 2)


@pytest.mark.parametrize("quantile", [0.1, 0.5, 0.9])
def test_advise_picks_cheapest_within_budget(quantile: float) -> None:
    probe = advise(profile(), AdvisorConfig(budget_h=1e9, epoch_samples=10**8, max_instances=4))
    hours = sorted(c.total_h for c in probe.candidates)
    budget = hours[int(quantile * (len(hours) - 1))]
    config = AdvisorConfig(budget_h=budget, epoch_samples=10**8, max_instances=4)
    advice = advise(profile(), config)
    assert len(advice.candidates) == len(INSTANCES) * 4
    within = [c for c in advice.candidates if c.total_h <= budget]
    best = min(c.cost_usd for c in within)
    rec = advice.recommendation
    assert rec is not None and rec.meets_budget and rec.cost_usd == best
    assert rec.total_h == min(c.total_h for c in within if c.cost_usd == best)
    assert advice.fastest.total_h == hours[0]


def test_impossible_budget_has_no_recommendation() -> None:
    advice = advise(profile(), AdvisorConfig(budget_h=1e-9, epoch_samples=10**8))
    assert advice.recommendation is None
    assert not any(c.meets_budget for c in advice.candidates)
    assert advice.to_json()["recommendation"] is None


def test_pareto_is_sorted_and_non_dominated() -> None:
    advice = advise(profile(), AdvisorConfig(budget_h=5, epoch_samples=10**8))
    front = advice.pareto
    assert len(front) >= 2
    assert all(a.total_h < b.total_h and a.cost_usd > b.cost_usd
               for a, b in itertools.pairwise(front))  # fmt: skip
    for c in advice.candidates:
        on_front = any(f is c for f in front)
        beaten = any(f.total_h <= c.total_h and f.cost_usd <= c.cost_usd and f is not c
                     for f in front)  # fmt: skip
        assert on_front or beaten
        assert not (on_front and any(
            o.total_h <= c.total_h and o.cost_usd <= c.cost_usd
            and (o.total_h, o.cost_usd) != (c.total_h, c.cost_usd) for o in advice.candidates
        ))  # fmt: skip


def test_memory_infeasible_instances_are_skipped() -> None:
    # 5 GiB of parameters x (1 + 3) = 20 GiB: the 16 GiB types cannot hold it
    config = AdvisorConfig(budget_h=5, epoch_samples=10**7, max_instances=2)
    advice = advise(profile(param_bytes=5 * 2**30), config)
    small = {name for name, i in INSTANCES.items() if i.gpu_mem_gib < 20}
    assert small == {"p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "g4dn.xlarge", "g4dn.12xlarge"}
    assert {name for name, _ in advice.skipped} == small
    assert all("20 GiB" in why for _, why in advice.skipped)
    assert not small & {c.instance for c in advice.candidates}
    assert len(advice.candidates) == (len(INSTANCES) - len(small)) * 2
    assert advice.setups_skipped == len(small) * 2
    with pytest.raises(ConfigError, match="enough GPU memory"):
        advise(profile(param_bytes=100 * 2**30), config)


@pytest.mark.parametrize(
    "key", ["compute_s", "data_fetch_stall_s", "data_prep_stall_s", "grad_bytes", "num_layers",
            "param_bytes", "batch_size"],
)  # fmt: skip
def test_missing_summary_key_is_named(key: str) -> None:
    prof = summary()
    del prof[key]
    with pytest.raises(ConfigError, match=f"'{key}' missing"):
        advise(ProfileSummary.from_mapping(prof), AdvisorConfig(budget_h=1, epoch_samples=1000))


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [("grad_bytes", "lots", "not an integer"), ("grad_bytes", 1.5, "not an integer"),
     ("compute_s", -1.0, "out of range"), ("batch_size", 0, "out of range"),
     ("data_prep_stall_s", True, "not a number"), ("device", "tpu", "expected cpu or cuda"),
     ("backward_s", 0.9, "exceeds compute_s")],
)  # fmt: skip
def test_bad_summary_value_is_named(key: str, value: Any, why: str) -> None:
    with pytest.raises(ConfigError, match=f"'{key}'.*{why}"):
        advise(profile(**{key: value}), AdvisorConfig(budget_h=1, epoch_samples=1000))


def test_cpu_profile_without_flops_is_rejected() -> None:
    with pytest.raises(ConfigError, match="no FLOP count"):
        advise(profile(flops_per_iter=0), AdvisorConfig(budget_h=1, epoch_samples=1000))


@pytest.mark.parametrize(
    ("field", "value"),
    [("budget_h", 0.0), ("epoch_samples", 0), ("epochs", 0.0), ("max_instances", 0),
     ("efficiency", 1.5), ("efficiency", 0.0), ("precision", "int8"),
     ("optimizer_bytes_per_param_byte", -1.0)],
)  # fmt: skip
def test_bad_config_names_the_field(field: str, value: Any) -> None:
    kwargs: dict[str, Any] = {"budget_h": 1.0, "epoch_samples": 100, field: value}
    with pytest.raises(ConfigError, match=field):
        AdvisorConfig(**kwargs)


def test_unknown_gpu_model_is_named() -> None:
    odd = Instance(instance="x1.big", gpus=8, gpu_model="B200", gpu_mem_gib=192,
                   intra_node_link="nvlink4", network_gbps=3200, usd_per_hour=99)  # fmt: skip
    with pytest.raises(ConfigError, match=r"'x1\.big'.*'B200'.*known: A100"):
        advise(profile(), AdvisorConfig(budget_h=1, epoch_samples=1000), instances=[odd])


def test_user_catalog_csv(tmp_path: Path) -> None:
    path = tmp_path / "my-cloud.csv"
    rows = ["box1,1,A100,80,none,100,2.0", "box4,4,H100,80,nvlink4,400,20.0"]
    path.write_text(",".join(INSTANCE_COLUMNS) + "\n" + "\n".join(rows) + "\n")
    config = AdvisorConfig(budget_h=1e6, epoch_samples=10**6, max_instances=3)
    advice = advise(profile(), config, instances=load_instances(path))
    assert sorted({(c.instance, c.count) for c in advice.candidates}) == [
        (name, n) for name in ("box1", "box4") for n in (1, 2, 3)
    ]
    rec = advice.recommendation
    assert rec is not None and rec.cost_usd == min(c.cost_usd for c in advice.candidates)
    box4 = next(c for c in advice.candidates if (c.instance, c.count) == ("box4", 2))
    assert (box4.gpus_total, box4.usd_per_hour) == (8, 40.0)


def test_to_json_and_html(tmp_path: Path) -> None:
    advice = advise(profile(), AdvisorConfig(budget_h=5, epoch_samples=10**8, max_instances=3))
    data = json.loads(json.dumps(advice.to_json()))
    assert data["candidates_evaluated"] == len(INSTANCES) * 3
    assert (data["budget_h"], data["epochs"], data["epoch_samples"]) == (5, 1.0, 10**8)
    assert data["assumptions"]["comm_model"]["alpha_s"] == 25e-6
    assert len(data["pareto"]) == len(advice.pareto)
    rec = advice.recommendation
    assert rec is not None and data["recommendation"]["instance"] == rec.instance
    out = write_pareto_html(advice, tmp_path / "pareto.html")
    text = out.read_text()
    assert "plotly" in text and "Pareto frontier" in text
    assert [p.name for p in tmp_path.iterdir()] == ["pareto.html"]


def _profile_run(differential_ms: float, direct_ms: tuple[float, float]) -> dict[str, Any]:
    """A CPU profile summary as ``profile`` writes it: the differential data stall and the
    direct waits of its real-data runs (warm, cold)."""
    warm, cold = direct_ms
    return summary(
        compute_s=0.073, backward_s=0.042, data_fetch_stall_s=differential_ms / 1e3,
        data_prep_stall_s=0.0, grad_bytes=8_506_436, num_layers=2, param_bytes=8_506_436,
        flops_per_iter=722_690_048.0, device="cpu", device_name="cpu",
        direct={"run": "cold", "data_stall_s": cold / 1e3},
        runs=[{"name": "network", "data_wait_s": 4e-5}, {"name": "warm", "data_wait_s": warm / 1e3},
              {"name": "cold", "data_wait_s": cold / 1e3}],
    )  # fmt: skip


def _profile(differential_ms: float, direct_ms: tuple[float, float]) -> ProfileSummary:
    return ProfileSummary.from_mapping(_profile_run(differential_ms, direct_ms))


def test_two_identical_advise_runs_recommend_the_same_setup() -> None:
    config = AdvisorConfig(budget_h=2.0, epoch_samples=45_840_617)
    fitted = _noisy_model()
    first, second = (advise(_profile(54.1, (3.0, 2.6)), config, model=fitted) for _ in "ab")
    assert first.to_json() == second.to_json()


def test_the_noisy_differential_data_stall_does_not_move_the_recommendation() -> None:
    # two identical report profiles measured here: the differential data stall read 54 ms and
    # 0 ms (host load), the loop's own wait 2.6 ms and 2.1 ms; carried onto a T4's 0.2 ms of
    # compute the first made g4dn.xlarge x 2 the choice, the second x 1
    config = AdvisorConfig(budget_h=2.0, epoch_samples=45_840_617)
    picks = []
    for run in (_profile(54.1, (3.0, 2.6)), _profile(0.0, (2.6, 2.1))):
        advice = advise(run, config, model=_noisy_model())
        assert advice.recommendation is not None
        picks.append((advice.recommendation.instance, advice.recommendation.count))
        assert "direct: the training loop's measured wait" in advice.data_stall_method
    assert picks[0] == picks[1] == ("g4dn.xlarge", 1)
    one = advise(_profile(54.1, (3.0, 2.6)), config).candidates[0]
    assert (one.data_stall_s, one.total_low_h <= one.total_h < one.total_high_h) == (2.6e-3, True)


def _noisy_model() -> CommModel:
    """A model fitted to noisy samples at two bandwidths (so its intervals are not empty)."""
    rng = np.random.default_rng(11)
    rows = []
    for ranks, nodes, bw in ((2, 1, None), (4, 1, None), (2, 2, 62.5e6), (4, 2, 62.5e6),
                             (2, 2, 250e6), (4, 2, 250e6)):  # fmt: skip
        for grad in (1e6, 8e6, 32e6):
            t = model(1.1, 1e-10).predict(grad, 1, ranks, nodes, bw) + grad * 1e-10 * (nodes == 1)
            rows.append(CommSample(grad_bytes=grad, buckets=1, ranks=ranks, nodes=nodes,
                                   bandwidth_bytes_per_s=bw,
                                   seconds=t * (1 + 0.05 * rng.standard_normal())))  # fmt: skip
    return fit(rows)


def test_a_setup_whose_interval_straddles_the_budget_is_marked() -> None:
    fitted = _noisy_model()
    probe = advise(profile(), AdvisorConfig(budget_h=1e9, epoch_samples=10**8), model=fitted)
    c = next(c for c in probe.candidates if c.count == 4 and c.comm_high_s > c.comm_low_s)
    assert c.total_low_h < c.total_h < c.total_high_h
    for budget, expected in ((c.total_h, "may miss"), (c.total_high_h * 1.01, "meets"),
                             (c.total_low_h * 0.99, "misses")):  # fmt: skip
        config = AdvisorConfig(budget_h=budget, epoch_samples=10**8)
        again = next(x for x in advise(profile(), config, model=fitted).candidates
                     if (x.instance, x.count) == (c.instance, c.count))  # fmt: skip
        assert again.verdict == expected
    assert verdict(1.0, 3.0, 2.0) == "may miss" and verdict(1.0, 2.0, 2.0) == "meets"


def test_recommendation_prefers_a_sure_setup_to_a_cheaper_unsure_one() -> None:
    fitted = _noisy_model()
    probe = advise(profile(), AdvisorConfig(budget_h=1e9, epoch_samples=10**8), model=fitted)
    budget = sorted(c.total_h for c in probe.candidates)[len(probe.candidates) // 2]
    advice = advise(profile(), AdvisorConfig(budget_h=budget, epoch_samples=10**8), model=fitted)
    rec = advice.recommendation
    assert rec is not None and rec.verdict == "meets"
    sure = [c for c in advice.candidates if c.total_high_h <= budget]
    assert rec.cost_usd == min(c.cost_usd for c in sure)
    assert any(c.verdict == "may miss" for c in advice.candidates)


def test_multi_instance_setups_are_charged_their_own_network() -> None:
    fitted = model(net_efficiency=1.0)
    config = AdvisorConfig(budget_h=10, epoch_samples=10**6, max_instances=2)
    for name in ("g4dn.xlarge", "p4d.24xlarge"):
        inst = INSTANCES[name]
        cand = predict_candidate(profile(), inst, 2, GPUS, fitted, config)
        ranks = 2 * inst.gpus
        wire = 2 * (ranks - 1) / ranks * 1e8 / (inst.network_gbps * 1e9 / 8)
        latency = 10 * (50e-6 + 2 * (ranks - 1) * 25e-6)
        assert cand.comm_s == pytest.approx(latency + wire, rel=1e-9)


def test_unmeasured_network_terms_take_the_default_and_are_named() -> None:
    intra_only = CommModel(alpha_s=30e-6, bucket_s=60e-6, beta_intra_s_per_byte=1e-10,
                           net_efficiency=0.0, beta_net_s_per_byte=0.0, samples=6,
                           unmeasured=("net_efficiency", "beta_net_s_per_byte"))  # fmt: skip
    advice = advise(profile(), AdvisorConfig(budget_h=5, epoch_samples=10**7), model=intra_only)
    assert advice.model.net_efficiency == 1.0
    assert "not measured, at the default: net_efficiency, beta_net_s_per_byte" in (
        advice.model_source
    )
    two = next(c for c in advice.candidates if (c.instance, c.count) == ("g4dn.xlarge", 2))
    assert two.comm_s > 1e8 / (25e9 / 8)  # the network is not free


def test_advice_round_trips_through_json() -> None:
    advice = advise(_profile(10.0, (3.0, 2.6)),
                    AdvisorConfig(budget_h=0.2, epoch_samples=10**7, max_instances=3),
                    model=_noisy_model())  # fmt: skip
    again = Advice.from_json(json.loads(json.dumps(advice.to_json())))
    assert again == advice
