"""IngestEnv: gymnasium's checker, masks, rewards and seeded random pipelines; the env's chain
is every stage its own segment, as intune's agent sees a SegmentTarget view."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from recperf.ingest.sim import env as ienv
from recperf.ingest.sim.model import PipelineSpec
from recperf.ingest.sim.solve import pattern_bound, pattern_oracle


def per_stage_oracle(spec: PipelineSpec) -> tuple[int, ...]:
    best = pattern_oracle(spec, None)
    assert best is not None
    return best.workers


@pytest.mark.parametrize("spec", [None, "criteo-16", "udf-64", "membound-128"])
def test_passes_gymnasium_checker(spec: str | None) -> None:
    check_env(ienv.IngestEnv(spec), skip_render_check=True)


def test_registered_lazily_and_idempotently() -> None:
    assert ienv.register() == ienv.register() == "recperf/Ingest-v0"
    env = gym.make("recperf/Ingest-v0", spec="criteo-16")
    obs, info = env.reset(seed=0)
    assert obs.shape == (ienv.OBS_SIZE,)
    assert info["allocation"] == (3, 3, 3, 3, 2, 2)


def test_same_seed_same_random_pipelines() -> None:
    a, b = ienv.IngestEnv(), ienv.IngestEnv()
    for seed in range(5):
        oa, _ = a.reset(seed=seed)
        ob, _ = b.reset(seed=seed)
        assert np.array_equal(oa, ob)
        assert a.target is not None and b.target is not None
        assert a.target.spec == b.target.spec
        assert 2 <= a.target.spec.cores <= 128
        assert 2 <= a.target.spec.n_stages <= ienv.MAX_STAGES


def test_masked_actions_are_refused_with_penalty_and_valid_ones_apply() -> None:
    env = ienv.IngestEnv("membound-128", noise=0.0, penalty=0.5)
    _, info = env.reset(seed=0)
    mask = info["action_mask"]
    assert np.array_equal(mask, env.action_mask())
    assert mask[ienv.NOOP] == 1
    # Stages 6 and 7 do not exist: every action naming them is masked.
    for a, (_, i, j) in enumerate(ienv.ACTIONS):
        if max(i, j) >= 6:
            assert mask[a] == 0
    # The even split of membound-128 uses 97.875 of 100 GiB: moving 8 workers (128/16) from
    # dense (0.25 GiB each) to sparse (1.5 GiB) adds 10 GiB, so it is masked; stepping it
    # changes nothing and pays 0.5.
    add_decode = ienv.ACTIONS.index((1, 1, 2))
    assert mask[add_decode] == 0
    before = info["allocation"]
    _, r_bad, _, _, info2 = env.step(add_decode)
    assert info2["allocation"] == before
    _, r_noop, _, _, _ = env.step(ienv.NOOP)
    assert r_bad == pytest.approx(r_noop - 0.5)
    # Moving 1 worker from dense (1) to sparse (2) is valid and changes the allocation.
    move = ienv.ACTIONS.index((0, 1, 2))
    assert env.action_mask()[move] == 1
    _, _, _, _, info3 = env.step(move)
    assert info3["allocation"] == (22, 21, 22, 21, 21, 21)


def test_reward_is_throughput_over_bound() -> None:
    env = ienv.IngestEnv("criteo-16", noise=0.0)
    env.reset(seed=0)
    spec = env.fixed
    assert spec is not None
    _, r, _, trunc, _ = env.step(ienv.NOOP)
    # the bound of the env's space: every stage its own segment
    frac = spec.throughput((3, 3, 3, 3, 2, 2)) / pattern_bound(spec, None).throughput_rows_per_s
    mem = spec.memory_bytes((3, 3, 3, 3, 2, 2)) / (spec.memory_budget_gib * 2**30)
    assert r == pytest.approx(frac - 0.01 * mem)
    assert not trunc


def test_episode_truncates() -> None:
    env = ienv.IngestEnv("criteo-16", episode_steps=3)
    env.reset(seed=1)
    flags = [env.step(ienv.NOOP)[3] for _ in range(3)]
    assert flags == [False, False, True]


def test_grow_places_workers_in_proportion_to_cost() -> None:
    env = ienv.IngestEnv("criteo-16", noise=0.0)
    env.reset(seed=0)
    grow = ienv.ACTIONS.index((7, -1, -1))
    shrink = ienv.ACTIONS.index((8, -1, -1))
    # 16 workers -> 20 in all, each stage ceil(20 * c_i / 15.8): costs 4.2, 1.7, 6.2, .5, 1, 2.2
    info = env.step(grow)[4]
    assert info["allocation"] == (6, 3, 8, 1, 2, 3)
    assert ienv.rescale((6, 3, 8, 1, 2, 3), (4.2, 1.7, 6.2, 0.5, 1.0, 2.2), 0.8) == [
        4,
        1,
        7,
        1,
        1,
        2,
    ]  # floor(18.4 * c_i / 15.8), at least 1
    assert env.step(shrink)[4]["allocation"] == (4, 1, 7, 1, 1, 2)


def test_fit_actions_follow_the_measured_costs() -> None:
    env = ienv.IngestEnv("criteo-16", noise=0.0)
    _, info = env.reset(seed=0)
    spec = env.fixed
    assert spec is not None and env._ctx is not None
    costs = env.costs()
    # each stage's measured cost plus the measured hand-off, as SegmentTarget folds them
    assert costs == pytest.approx(spec.row_costs_us())
    fit = ienv.fit(env._ctx, costs)
    # every plan entry adds one worker to the slowest stage, so each maximises min w / c
    assert [sum(w) for w in fit.plan] == list(range(6, ienv.max_total(16, 6) + 1))
    assert fit.plan[fit.best] == per_stage_oracle(spec)  # the exact optimum within 4 x cores
    kind = {k: ienv.ACTIONS.index((k, -1, -1)) for k in range(ienv.FIT_NOW, ienv.FIT_BEST + 1)}
    # the even split already has 16 workers: fitting at the current total equals fit1
    now = ienv.apply(env._ctx, info["allocation"], kind[ienv.FIT_NOW], costs)
    assert now == ienv.apply(env._ctx, info["allocation"], kind[10], costs) == fit.plan[10]
    assert sum(ienv.apply(env._ctx, info["allocation"], kind[11], costs) or ()) == 32
    info = env.step(kind[ienv.FIT_BEST])[4]
    assert info["allocation"] == (17, 7, 25, 2, 4, 9)
    assert info["throughput_rows_per_s"] / info["lp_bound_rows_per_s"] == pytest.approx(0.9875)
    # at the best fit, re-fitting to it changes nothing (masked); without costs no fit is valid
    assert env.action_mask()[kind[ienv.FIT_BEST]] == 0
    assert ienv.apply(env._ctx, (3, 3, 3, 3, 2, 2), kind[ienv.FIT_BEST], None) is None


def test_fit_stops_at_a_capped_bottleneck_and_the_memory_budget() -> None:
    for name in ("udf-64", "membound-128"):
        env = ienv.IngestEnv(name, noise=0.0)
        env.reset(seed=0)
        spec = env.fixed
        assert spec is not None and env._ctx is not None
        fit = ienv.fit(env._ctx, env.costs())
        last = fit.plan[-1]
        assert spec.memory_bytes(last) <= spec.memory_budget_gib * 2**30
        assert sum(last) < 4 * spec.cores  # stopped early: the cap (udf) or memory binds
        assert fit.plan[fit.best] == per_stage_oracle(spec)
