"""Every registered tuner through check_tuner (cuts and workers), each tuner's behaviour on the
simulator, the SegmentTarget view and the measured oracle's candidate ranking."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import pytest

from recperf.core.errors import ConfigError, ContractError, RegistryError
from recperf.ingest.base import (
    Allocation,
    AllocationRefused,
    Measurement,
    Target,
    cut_patterns,
    even_split,
)
from recperf.ingest.sim import model as sim
from recperf.ingest.sim import solve
from recperf.ingest.sim.model import PipelineSpec, StageSpec, load_spec
from recperf.ingest.sim.target import SimTarget
from recperf.ingest.tuners.autotune import Autotune, hill_climb, static_cuts
from recperf.ingest.tuners.base import TUNERS, TuneLog, TuneResult, check_tuner
from recperf.ingest.tuners.intune import Intune, IntuneConfig
from recperf.ingest.tuners.model import measured_spec
from recperf.ingest.tuners.oracle import Oracle, OracleConfig, ranked_candidates
from recperf.ingest.tuners.plumber import Plumber
from recperf.ingest.tuners.segment import SegmentTarget
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
    return PipelineSpec(
        name="small", cores=4, memory_budget_gib=1.5, stages=stages, transfer_us_per_row=0.5
    )


SPECS = {"small": small, "live-like": live_like}


def spec_named(name: str) -> PipelineSpec:
    return SPECS[name]() if name in SPECS else load_spec(name)


def fraction_of_oracle(spec: PipelineSpec, alloc: Allocation) -> float:
    return spec.throughput(alloc) / spec.throughput(solve.oracle(spec))


class Hidden:
    """The same target with its model hidden (as the live pipeline's)."""

    def __init__(self, target: SimTarget) -> None:
        self.inner = target
        self.stage_names = target.stage_names
        self.cores = target.cores
        self.max_workers = target.max_workers
        self.memory_budget_bytes = target.memory_budget_bytes

    def memory_bytes(self, alloc: Allocation) -> float:
        return self.inner.memory_bytes(alloc)

    def measure(self, alloc: Allocation, window_s: float) -> Measurement:
        return self.inner.measure(alloc, window_s)

    def elapsed_s(self) -> float:
        return self.inner.elapsed_s()


def test_registry_has_every_tuner_and_accepts_module_attr() -> None:
    assert TUNERS.names() == sorted(ALL)
    assert TUNERS.factory("recperf.ingest.tuners.plumber:Plumber") is Plumber
    with pytest.raises(RegistryError, match="unknown tuner 'nope'"):
        TUNERS.build("nope")


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(
    "spec", ["small", "live-like", "membound-128", "live-2", "udfcut-4", "threads-2"]
)
def test_conformance(name: str, spec: str) -> None:
    # with caps that bind (small, udfcut-4), that do not (live-like), none (live-2), memory;
    # check_tuner also runs it again on a fresh target (same seed) and holds it to the budget
    pipeline = spec_named(spec)
    result = check_tuner(
        TUNERS.build(name),
        SimTarget(pipeline, seed=1),
        12.0,
        seed=1,
        target_factory=lambda: SimTarget(pipeline, seed=1),
        overrun_s=0.0,  # the simulated clock moves by exactly the windows asked for
    )
    assert result.allocation == result.allocation.normalized(pipeline.n_stages)
    # the LP bound >= the oracle >= any tuner's choice, judged by the noise-free model
    thr = pipeline.throughput(result.allocation)
    best = pipeline.throughput(solve.oracle(pipeline))
    assert thr <= best * (1 + 1e-9)
    assert best <= solve.lp_bound(pipeline).throughput_rows_per_s * (1 + 1e-9)


@dataclass
class Fixed:
    """A tuner that measures the even split and claims ``alloc``."""

    alloc: Allocation
    name: str = "fixed"

    def tune(self, target: Target, budget_s: float, seed: int = 0) -> TuneResult:
        log = TuneLog(target, budget_s, 1.0)
        m = log.measure(even_split(target))
        assert m is not None
        return TuneResult(tuner=self.name, allocation=self.alloc, throughput_rows_per_s=1.0,
                          history=tuple(log.history))  # fmt: skip


@pytest.mark.parametrize(
    ("alloc", "match"),
    [
        (Allocation(workers=(4, 1), cuts=(2,)), "segment 'a\\+b' got 4 workers \\(cap 3\\)"),
        (Allocation(workers=(1, 1)), "2 worker counts"),
        (Allocation(workers=(1, 1), cuts=(3,)), "cut at stage 3"),
        (Allocation(workers=(2, 2, 2)), "never measured"),
    ],
)
def test_check_tuner_catches_bad_results(alloc: Allocation, match: str) -> None:
    with pytest.raises(ContractError, match=match):
        check_tuner(Fixed(alloc), SimTarget(small()), 5.0)


@dataclass
class Windows:
    """A tuner that measures the even split in windows of ``lengths`` seconds whatever its
    budget, and claims it."""

    lengths: tuple[float, ...]
    name: str = "windows"

    def tune(self, target: Target, budget_s: float, seed: int = 0) -> TuneResult:
        log = TuneLog(target, 1e9, 1.0)  # its own budget, not budget_s
        for length in self.lengths:
            log.record(target.measure(even_split(target), length))
        return log.result(self.name)


BESIDES = "spent 7 s of target time besides its last measurement, over the budget of 5 s"


@pytest.mark.parametrize(
    ("lengths", "overrun_s", "error"),
    [
        ((1.0,) * 5, 0.0, None),  # exactly the budget
        ((1.0,) * 8, None, BESIDES),  # windows started after the budget was spent
        ((1.0,) * 8, 100.0, BESIDES),  # overrun_s allows only the last to overrun
        ((1.0, 1.0, 1.0, 1.0, 3.0), None, None),  # the last may overrun by default
        ((1.0, 1.0, 1.0, 1.0, 3.0), 2.0, None),
        (
            (1.0, 1.0, 1.0, 1.0, 3.0),
            1.5,
            "spent 7 s of target time, over the budget of 5 s + 1.5 s",
        ),
        ((1.0, 1.0, 1.0, 1.0, 3.0), 0.0, "spent 7 s of target time, over the budget of 5 s"),
    ],
)
def test_check_tuner_holds_the_tuner_to_its_budget(
    lengths: tuple[float, ...], overrun_s: float | None, error: str | None
) -> None:
    target = SimTarget(small())
    if error is None:
        r = check_tuner(Windows(lengths), target, 5.0, overrun_s=overrun_s)
        assert r.steps == len(lengths)
        assert target.elapsed_s() == sum(lengths)
        return
    with pytest.raises(ContractError) as exc:
        check_tuner(Windows(lengths), target, 5.0, overrun_s=overrun_s)
    assert str(exc.value) == f"tuner 'windows': {error}"


@dataclass
class Drifting:
    """A tuner that measures one more window each time it runs: its result depends on how often
    it ran, not only on the target and the seed."""

    calls: int = 0
    name: str = "drifting"

    def tune(self, target: Target, budget_s: float, seed: int = 0) -> TuneResult:
        self.calls += 1
        log = TuneLog(target, budget_s, 1.0)
        for _ in range(self.calls):
            log.measure(even_split(target))
        return log.result(self.name)


def test_check_tuner_catches_a_nondeterministic_tuner() -> None:
    def fresh() -> SimTarget:
        return SimTarget(small(), seed=3, noise=0.0)

    with pytest.raises(ContractError) as exc:
        check_tuner(Drifting(), fresh(), 5.0, seed=3, target_factory=fresh)
    assert str(exc.value) == (
        "tuner 'drifting': two runs with seed 3 on fresh targets differ in history, tuning_s "
        "(tune must depend only on the target, budget and seed)"
    )
    # with noise, the last measurement's throughput differs too
    with pytest.raises(ContractError, match="differ in history, throughput_rows_per_s, tuning_s"):
        check_tuner(Drifting(), SimTarget(small()), 5.0, target_factory=lambda: SimTarget(small()))
    # without a factory (a live target cannot be repeated) it is not checked
    tuner = Drifting()
    assert check_tuner(tuner, fresh(), 5.0, seed=3).steps == 1
    assert tuner.calls == 1


def test_the_log_keeps_allocations_normalized() -> None:
    log = TuneLog(SimTarget(small(), noise=0.0), 10.0, 1.0)
    spelled = Allocation(workers=(1, 1, 1), cuts=(1, 2))
    assert log.measure(spelled) is not None
    assert log.measure(Allocation(workers=(1, 1, 1))) is not None
    assert log.count(spelled) == 2
    assert log.best() == Allocation(workers=(1, 1, 1))
    assert log.measure(Allocation(workers=(1, 1), cuts=(5,))) is None  # refused, counted
    assert log.refused == 1


@pytest.mark.parametrize(("field", "value"), [("window_s", 0.0), ("repeats", 0)])
def test_static_config_is_validated(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        Static.Config(**{field: value})


@pytest.mark.parametrize(
    ("cls", "field", "value"),
    [
        (Intune, "epsilon", 1.5),
        (Intune, "updates_per_step", -1),
        (Intune, "prior_windows", -1.0),
        (Intune, "patterns", 0),
        (Intune, "shape_windows", 101),
        (Intune, "shapes", 0),
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
        target = SimTarget(load_spec(name))
        r = Static().tune(target, 5.0)
        assert r.allocation == even_split(target)
        assert r.allocation.cuts is None  # every stage its own segment
    r = Static().tune(SimTarget(load_spec("criteo-16")), 5.0)
    assert r.allocation.workers == (3, 3, 3, 3, 2, 2)
    assert r.steps == 1


@pytest.mark.parametrize(
    ("name", "cuts"),
    [("criteo-16", None), ("live-2", ()), ("udfcut-4", (3, 4)), ("udf-64", None)],
)
def test_plumber_solves_for_cuts_and_workers(name: str, cuts: tuple[int, ...] | None) -> None:
    spec = load_spec(name)
    r = Plumber().tune(SimTarget(spec, seed=0), 10.0)
    assert fraction_of_oracle(spec, r.allocation) >= 0.95
    assert r.steps <= 3
    if cuts is not None:
        assert r.allocation.cuts == cuts


def test_autotune_hill_climbs_the_bottleneck() -> None:
    # costs 1 and 3 on 8 cores: each unit goes to the segment with the lowest rate w/c (on a
    # tie, at (1, 3), to the costlier one), ending at (2, 6)
    order = hill_climb([1.0, 3.0], (None, None), 8)
    assert order == [1, 1, 1, 0, 1, 1]
    assert hill_climb([1.0, 3.0], (None, 2), 8) == [1, 0, 0, 0, 0, 0]


@pytest.mark.parametrize(
    ("caps", "cores", "cuts"),
    [
        ((None,) * 6, 16, ()),  # nothing capped: one segment
        ((4,) * 6, 2, ()),  # caps at or over the cores never bind within them
        ((None, None, None, 2, None, None), 4, (3, 4)),  # the capped UDF alone
        ((1, None, None), 4, (1,)),  # a capped reader alone
        ((8, 40, None, 2, 4, 16), 64, (1, 2, 3, 4, 5)),  # udf-64: all but sparse capped
    ],
)
def test_autotune_fuses_statically(
    caps: tuple[int | None, ...], cores: int, cuts: tuple[int, ...]
) -> None:
    assert static_cuts(caps, cores) == cuts


def test_autotune_cuts_around_the_capped_udf() -> None:
    spec = load_spec("udfcut-4")
    r = Autotune().tune(SimTarget(spec, seed=0), 20.0)
    assert r.allocation == solve.oracle(spec)  # read+dense+sparse x1 | udf x2 | shuffle+collate x1
    assert r.refused == 0


def test_autotune_overshoots_memory_when_fused() -> None:
    spec = load_spec("membound-128")
    target = SimTarget(spec, seed=0)
    r = Autotune().tune(target, 20.0)
    # Fused workers carry every stage's memory (4.1 GiB each): filling 128 cores would need
    # 528 GiB; the target refuses until autotune backs off to 24 workers (99 GiB).
    assert r.refused >= 1
    assert r.allocation == Allocation(workers=(24,), cuts=())
    assert target.peak_memory_bytes <= spec.memory_budget_gib * 2**30
    r16 = Autotune().tune(SimTarget(load_spec("live-2"), seed=0), 20.0)
    assert r16.refused == 0
    assert r16.allocation == Allocation(workers=(2,), cuts=())


def test_oracle_measures_candidates_best_modelled_first_without_a_model() -> None:
    spec = small()
    target = SimTarget(spec, seed=0, noise=0.0)
    r = Oracle(OracleConfig(max_total=7)).tune(Hidden(target), 1000.0)
    # every allocation of at most 7 workers over every cut pattern was measured; noise-free,
    # the best measured is the best of brute force
    expect = max(
        (
            Allocation(workers=w, cuts=cuts).normalized(3)
            for cuts in cut_patterns(3)
            for w in itertools.product(range(1, 8), repeat=len(cuts) + 1)
            if sum(w) <= 7 and _runs(spec, Allocation(workers=w, cuts=cuts))
        ),
        key=lambda a: (spec.throughput(a), -a.total, -len(a.workers)),
    )
    assert spec.throughput(r.allocation) == pytest.approx(spec.throughput(expect))
    assert r.steps == target.measurements > 10
    # within a budget of 4 windows (the even split and 3 candidates) the best comes first
    short = Oracle().tune(Hidden(SimTarget(spec, seed=0)), 4.0)
    assert short.steps == 4
    assert fraction_of_oracle(spec, short.allocation) >= 0.95


def _runs(spec: PipelineSpec, alloc: Allocation) -> bool:
    try:
        spec.check_allocation(alloc)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("limit", [1, 5, 40])
def test_ranked_candidates_are_the_best_by_the_model(limit: int) -> None:
    spec = measured_spec(
        SimTarget(small()), [SimTarget(small(), noise=0.0).measure(Allocation(workers=(1, 1, 1)))]
    )
    everything = [
        Allocation(workers=w, cuts=cuts).normalized(3)
        for cuts in cut_patterns(3)
        for w in itertools.product(range(1, 8), repeat=len(cuts) + 1)
        if sum(w) <= 4 + len(w) and _runs(spec, Allocation(workers=w, cuts=cuts))
    ]
    key = {a: spec.throughput(a) for a in everything}
    got = ranked_candidates(spec, limit)
    assert len(got) == min(limit, len(everything))
    assert set(got) <= set(everything)
    ranks = sorted(key.values(), reverse=True)
    assert [key[a] for a in got] == pytest.approx(ranks[: len(got)])


def test_oracle_uses_the_exact_solver_on_the_simulator() -> None:
    spec = load_spec("udf-64")
    r = Oracle().tune(SimTarget(spec), 5.0)
    assert r.allocation == solve.oracle(spec)
    assert r.steps == 1


def test_segment_target_presents_segments_as_stages() -> None:
    spec = small()
    base = SimTarget(spec, noise=0.0)
    view = SegmentTarget(base, (2,))  # a+b | c
    assert isinstance(view, Target)
    assert (view.stage_names, view.max_workers, view.cores) == (("a+b", "c"), (3, None), 4)
    assert view.base(Allocation(workers=(2, 3))) == Allocation(workers=(2, 3), cuts=(2,))
    assert view.base(Allocation(workers=(4,), cuts=())) == Allocation(workers=(4,), cuts=())
    assert view.view(Allocation(workers=(2, 3), cuts=(2,))) == Allocation(workers=(2, 3))
    assert view.memory_bytes(Allocation(workers=(2, 3))) == spec.memory_bytes(
        Allocation(workers=(2, 3), cuts=(2,))
    )
    m = view.measure(Allocation(workers=(2, 3)), 1.0)
    # a+b: 2 + 5 us/row plus the 0.5 hand-off; c: 1 + 0.5; the view's own hand-off is folded in
    assert m.cost_us_per_row == pytest.approx((7.5, 1.5))
    assert m.handoff_us_per_row == 0.0
    assert m.allocation == Allocation(workers=(2, 3))
    assert m.throughput_rows_per_s == pytest.approx(spec.throughput(view.base(m.allocation)))
    rows = m.throughput_rows_per_s * m.window_s
    assert [c / rows * 1e6 for c in m.cpu_s] == pytest.approx(m.cost_us_per_row)
    with pytest.raises(AllocationRefused):
        view.measure(Allocation(workers=(4, 1)), 1.0)  # a+b inherits b's cap of 3
    with pytest.raises(ConfigError, match="not at the view's"):
        view.view(Allocation(workers=(1, 1, 1)))


@pytest.mark.parametrize("name", ALL)
def test_every_tuner_runs_on_a_segment_view(name: str) -> None:
    spec = load_spec("udfcut-4")

    def fresh() -> SegmentTarget:
        return SegmentTarget(SimTarget(spec, seed=2), (3, 4))

    view = fresh()
    r = check_tuner(TUNERS.build(name), view, 8.0, seed=2, target_factory=fresh, overrun_s=0.0)
    assert spec.throughput(view.base(r.allocation)) <= spec.throughput(solve.oracle(spec)) * (
        1 + 1e-9
    )


def test_intune_is_deterministic_and_stays_in_memory() -> None:
    spec = load_spec("membound-128")
    targets: list[SimTarget] = []

    def fresh() -> SimTarget:
        targets.append(SimTarget(spec, seed=4))
        return targets[-1]

    run = check_tuner(Intune(), fresh(), 30.0, seed=4, target_factory=fresh, overrun_s=0.0)
    assert len(targets) == 2
    assert all(0 < t.peak_memory_bytes <= spec.memory_budget_gib * 2**30 for t in targets)
    assert run.refused == 0
    other = Intune().tune(SimTarget(spec, seed=4), 30.0, seed=5)
    assert other.history != run.history


def test_intune_converges_on_a_two_core_live_like_pipeline() -> None:
    spec = live_like()
    r = Intune().tune(SimTarget(spec, seed=0), 25.0, seed=0)
    assert r.steps == 25
    assert fraction_of_oracle(spec, r.allocation) >= 0.97


@pytest.mark.parametrize(
    ("name", "cuts"), [("live-2", ()), ("udfcut-4", (3, 4)), ("criteo-16", None)]
)
def test_intune_chooses_the_cuts_from_the_cost_model(
    name: str, cuts: tuple[int, ...] | None
) -> None:
    spec = load_spec(name)
    r = Intune().tune(SimTarget(spec, seed=0), 12.0, seed=0)
    assert fraction_of_oracle(spec, r.allocation) >= 0.95
    if cuts is not None:
        assert r.allocation.cuts == cuts
    # the even split first, then the two best patterns' modelled optima
    assert r.history[0].allocation == even_split(SimTarget(spec))
    assert len({s.allocation.cuts for s in r.history[1:3]}) == 2


def test_intune_without_weights() -> None:
    cfg = IntuneConfig(weights="/nonexistent/w.npz", pretrain_episodes=0)
    with pytest.raises(ConfigError, match="no intune weights"):
        Intune(cfg).tune(SimTarget(small()), 5.0)
    cfg = IntuneConfig(weights="/nonexistent/w.npz", pretrain_episodes=1)
    r = Intune(cfg).tune(SimTarget(small()), 5.0)
    assert r.allocation in {s.allocation for s in r.history}


def test_intune_reaches_the_oracle_on_criteo_within_ten_windows() -> None:
    spec = load_spec("criteo-16")
    r = Intune().tune(SimTarget(spec, seed=0), 10.0, seed=0)
    assert r.steps == 10
    assert fraction_of_oracle(spec, r.allocation) >= 0.95


@pytest.mark.parametrize("noise", [0.02, 0.15])
def test_intune_converges_on_a_noisy_five_stage_live_like_pipeline(noise: float) -> None:
    base = live_like()
    spec = base.with_(stages=tuple(s for s in base.stages if s.name != "downsample"))
    for seed in range(3):
        r = Intune().tune(SimTarget(spec, seed=seed, noise=noise), 20.0, seed=seed)
        assert fraction_of_oracle(spec, r.allocation) >= 0.9


class Shaped(Hidden):
    """A hidden-model target that says which thread shapes and in-flight counts it runs; a
    window at ``fast_inflight`` requests in flight measures ``gain`` x the model."""

    def __init__(self, target: SimTarget, inflight: tuple[int, ...] = (0,), gain: float = 1.0):
        super().__init__(target)
        self.thread_options = target.thread_options
        self.inflight_options = inflight
        self.fast_inflight = max(inflight)
        self.gain = gain

    def measure(self, alloc: Allocation, window_s: float) -> Measurement:
        m = self.inner.measure(alloc, window_s)
        if alloc.inflight and alloc.inflight == self.fast_inflight:
            return dataclasses.replace(m, throughput_rows_per_s=m.throughput_rows_per_s * self.gain)
        return m


@pytest.mark.parametrize("name", ["autotune", "plumber", "intune", "oracle"])
def test_tuners_find_the_thread_shape_where_it_wins(name: str) -> None:
    # threads-2: two threads of the consumer's process beat two processes by the copy they save
    spec = load_spec("threads-2")
    best = solve.oracle(spec)
    for target in (SimTarget(spec, seed=2), Shaped(SimTarget(spec, seed=2))):
        r = check_tuner(TUNERS.build(name), target, 40.0, seed=2, overrun_s=0.0)
        # every segment threads of the consumer's process (cutting between such segments
        # copies nothing, so the model may tie the fused chain with a cut one)
        assert best.threads == (0,) and set(r.allocation.segment_threads()) == {0}
        assert spec.throughput(r.allocation) >= 0.99 * spec.throughput(best)


@pytest.mark.parametrize("name", ALL)
def test_a_target_without_thread_options_gets_worker_processes(name: str) -> None:
    target = Hidden(SimTarget(load_spec("threads-2"), seed=2))
    r = check_tuner(TUNERS.build(name), target, 20.0, seed=2, overrun_s=0.0)
    assert r.allocation.threads is None and r.allocation.inflight == 0
    assert all(s.allocation.threads is None for s in r.history)


@pytest.mark.parametrize("name", ["autotune", "plumber", "intune", "oracle"])
def test_tuners_pick_the_in_flight_requests(name: str) -> None:
    spec = load_spec("live-2")
    target = Shaped(SimTarget(spec, seed=4), inflight=(0, 4, 16), gain=1.3)
    r = check_tuner(TUNERS.build(name), target, 30.0, seed=4, overrun_s=0.0)
    assert r.allocation.inflight == 16
    assert {s.allocation.inflight for s in r.history} >= {4, 16}


def test_the_measured_model_reads_gil_and_thread_memory() -> None:
    spec = load_spec("threads-2")
    target = SimTarget(spec, seed=1, noise=0.0)
    ms = [target.measure(Allocation(workers=(2,), cuts=(), threads=(0,)), 1.0)]
    model = measured_spec(target, ms)
    assert [s.gil_frac for s in model.stages] == pytest.approx([s.gil_frac for s in spec.stages])
    assert model.consumer_us_per_row == pytest.approx(0.3)
    assert model.thread_options == spec.thread_options
    assert model.thread_mib() == pytest.approx(spec.thread_mib())
    assert solve.oracle(model) == solve.oracle(spec)
    # without a window of several threads the GIL fractions stay at the conservative default
    plain = measured_spec(target, [target.measure(Allocation(workers=(2,), cuts=()), 1.0)])
    assert all(s.gil_frac == 1.0 for s in plain.stages)


def test_intune_finds_threads_in_its_last_stage_only() -> None:
    # the agent's actions move worker processes; the shape stage measures the model's best
    # thread shapes of its choice (after a GIL probe) and keeps the best measured
    spec = load_spec("threads-2")
    plain = Intune(IntuneConfig(shape_windows=0)).tune(SimTarget(spec, seed=3), 40.0, seed=3)
    assert plain.allocation.threads is None
    r = Intune().tune(SimTarget(spec, seed=3), 40.0, seed=3)
    assert r.allocation == solve.oracle(spec)
    # the kept windows: the agent's choice again, a GIL probe (two consumer threads), the other
    # shapes of the fused chain (a process of 2 and of 4 threads), confirmations
    kept = r.history[-8:]
    assert kept[0].allocation.threads is None
    assert [s.allocation.threads for s in kept[1:4]] == [(0,), (2,), (4,)]
    assert r.tuning_s == pytest.approx(40.0) and r.steps == plain.steps
