"""Every registered tuner through check_tuner, and each tuner's behaviour on the simulator."""

from __future__ import annotations

import pytest

import recperf.ingest.tuners  # noqa: F401 - registers every tuner
from recperf.core.errors import ConfigError, RegistryError
from recperf.ingest.base import Allocation, even_split
from recperf.ingest.sim import model as sim
from recperf.ingest.sim.model import PipelineSpec, StageSpec, load_spec
from recperf.ingest.sim.target import SimTarget
from recperf.ingest.tuners.autotune import Autotune, hill_climb
from recperf.ingest.tuners.base import TUNERS, TuneResult, check_tuner
from recperf.ingest.tuners.intune import Intune, IntuneConfig
from recperf.ingest.tuners.oracle import Oracle, OracleConfig
from recperf.ingest.tuners.plumber import Plumber
from recperf.ingest.tuners.static import Static

ALL = ("autotune", "intune", "oracle", "plumber", "static")


def live_like(cores: int = 2) -> PipelineSpec:
    """A 2-core, 6-stage Criteo pipeline like the live one; up to 4 workers per stage."""
    costs = (("read", 3.0), ("dense", 0.6), ("sparse", 1.5), ("downsample", 0.2),
             ("shuffle", 0.5), ("collate", 1.0))  # fmt: skip
    stages = tuple(
        StageSpec(name=n, cost_us_per_row=c, max_workers=4, memory_mib_per_worker=150.0)
        for n, c in costs
    )
    return PipelineSpec(name="live-like", cores=cores, memory_budget_gib=3.0, stages=stages)


def small() -> PipelineSpec:
    stages = tuple(
        StageSpec(name=n, cost_us_per_row=c, max_workers=cap, memory_mib_per_worker=m)
        for n, c, cap, m in (("a", 2.0, None, 100.0), ("b", 5.0, 3, 300.0), ("c", 1.0, None, 50.0))
    )
    return PipelineSpec(name="small", cores=4, memory_budget_gib=1.5, stages=stages)


def test_registry_has_every_tuner_and_accepts_module_attr() -> None:
    assert TUNERS.names() == sorted(ALL)
    assert TUNERS.factory("recperf.ingest.tuners.plumber:Plumber") is Plumber
    with pytest.raises(RegistryError, match="unknown tuner 'nope'"):
        TUNERS.create("nope")


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("spec", ["small", "live-like", "membound-128"])
def test_conformance(name: str, spec: str) -> None:
    pipeline = {"small": small, "live-like": live_like}.get(spec, lambda: load_spec(spec))()
    budget = 12.0
    result = check_tuner(TUNERS.create(name), SimTarget(pipeline, seed=1), budget, seed=1)
    again = check_tuner(TUNERS.create(name), SimTarget(pipeline, seed=1), budget, seed=1)
    assert isinstance(result, TuneResult)
    assert result == again  # deterministic given the seed
    assert result.tuning_s <= budget
    assert 1 <= result.steps <= budget


@pytest.mark.parametrize(
    ("field", "value"),
    [("window_s", 0.0), ("repeats", 0)],
)
def test_static_config_is_validated(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        Static.Config(**{field: value})


@pytest.mark.parametrize(
    ("cls", "field", "value"),
    [
        (Intune, "epsilon", 1.5),
        (Intune, "updates_per_step", -1),
        (Intune, "prior_windows", -1.0),
        (Autotune, "ram_fraction", 0.0),
        (Plumber, "oversubscribe", 0.5),
        (Oracle, "max_total", 0),
    ],
)
def test_configs_are_validated(cls: type, field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        cls.Config(**{field: value})


def test_static_is_the_even_split() -> None:
    for name in sim.BUNDLED:
        spec = load_spec(name)
        assert even_split(SimTarget(spec)) == sim.even(spec)
    r = Static().tune(SimTarget(load_spec("criteo-16")), 5.0)
    assert r.allocation.workers == (3, 3, 3, 3, 2, 2)
    assert r.steps == 1


def test_plumber_reaches_the_bound_on_criteo() -> None:
    spec = load_spec("criteo-16")
    r = Plumber().tune(SimTarget(spec, seed=0), 10.0)
    frac = spec.throughput(r.allocation) / sim.lp_bound(spec).throughput_rows_per_s
    assert frac >= 0.9
    assert r.steps <= 3


def test_autotune_hill_climbs_the_bottleneck() -> None:
    # costs 1 and 3 on 8 cores: each unit goes to the stage with the lowest rate w/c (on a tie,
    # at (1, 3), to the costlier one), ending at (2, 6)
    order = hill_climb([1.0, 3.0], (None, None), 8)
    assert order == [1, 1, 1, 0, 1, 1]
    assert hill_climb([1.0, 3.0], (None, 2), 8) == [1, 0, 0, 0, 0, 0]


def test_autotune_overshoots_memory_on_membound() -> None:
    spec = load_spec("membound-128")
    target = SimTarget(spec, seed=0)
    r = Autotune().tune(target, 20.0)
    # Filling 128 cores needs ~134 GiB; the target refuses until autotune backs off to 100 GiB.
    assert r.refused >= 1
    assert target.peak_memory_bytes <= spec.memory_budget_gib * 2**30
    r16 = Autotune().tune(SimTarget(load_spec("criteo-16"), seed=0), 20.0)
    assert r16.refused == 0
    assert r16.allocation.total == 16


def test_oracle_measures_every_allocation_without_a_model() -> None:
    spec = small()
    target = SimTarget(spec, seed=0, noise=0.0)

    class NoSpec:  # the same target with its model hidden
        stage_names = target.stage_names
        cores = target.cores
        max_workers = target.max_workers
        memory_budget_bytes = target.memory_budget_bytes
        memory_bytes = target.memory_bytes
        measure = target.measure
        elapsed_s = target.elapsed_s

    r = Oracle(OracleConfig(max_total=7)).tune(NoSpec(), 1000.0)  # type: ignore[arg-type]
    assert r.allocation == sim.oracle(spec, worker_limit=7 - 2)
    assert r.steps == target.measurements > 10


def test_oracle_uses_the_exact_solver_on_the_simulator() -> None:
    spec = load_spec("udf-64")
    r = Oracle().tune(SimTarget(spec), 5.0)
    assert r.allocation == sim.oracle(spec)
    assert r.steps == 1


def test_intune_is_deterministic_and_stays_in_memory() -> None:
    spec = load_spec("membound-128")
    runs = []
    for _ in range(2):
        target = SimTarget(spec, seed=4)
        runs.append(Intune().tune(target, 30.0, seed=4))
        assert target.peak_memory_bytes <= spec.memory_budget_gib * 2**30
    assert runs[0] == runs[1]
    assert runs[0].refused == 0
    other = Intune().tune(SimTarget(spec, seed=4), 30.0, seed=5)
    assert other.history != runs[0].history


def test_intune_converges_on_a_two_core_live_like_pipeline() -> None:
    spec = live_like()
    target = SimTarget(spec, seed=0)
    r = Intune().tune(target, 25.0, seed=0)
    frac = spec.throughput(r.allocation) / sim.lp_bound(spec).throughput_rows_per_s
    best = spec.throughput(sim.oracle(spec)) / sim.lp_bound(spec).throughput_rows_per_s
    assert r.steps == 25
    assert frac >= 0.97 * best  # the capped optimum, (4, 1, 2, 1, 1, 2), within 25 windows


def test_intune_without_weights(tmp_path: object) -> None:
    cfg = IntuneConfig(weights="/nonexistent/w.pt", pretrain_episodes=0)
    with pytest.raises(ConfigError, match="no intune weights"):
        Intune(cfg).tune(SimTarget(small()), 5.0)
    cfg = IntuneConfig(weights="/nonexistent/w.pt", pretrain_episodes=1)
    r = Intune(cfg).tune(SimTarget(small()), 5.0)
    assert r.allocation == Allocation(workers=r.allocation.workers)


def test_intune_reaches_the_bound_on_criteo_within_ten_windows() -> None:
    spec = load_spec("criteo-16")
    r = Intune().tune(SimTarget(spec, seed=0), 10.0, seed=0)
    frac = spec.throughput(r.allocation) / sim.lp_bound(spec).throughput_rows_per_s
    assert r.steps == 10
    assert frac >= 0.95  # the re-fit to the measured costs at up to 4 x cores: 0.9875


@pytest.mark.parametrize("noise", [0.02, 0.15])
def test_intune_converges_on_a_noisy_five_stage_live_like_pipeline(noise: float) -> None:
    base = live_like()
    spec = base.with_(stages=tuple(s for s in base.stages if s.name != "downsample"))
    best = spec.throughput(sim.oracle(spec))
    for seed in range(3):
        r = Intune().tune(SimTarget(spec, seed=seed, noise=noise), 20.0, seed=seed)
        assert spec.throughput(r.allocation) >= 0.9 * best
