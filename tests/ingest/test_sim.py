"""The analytic ingestion-pipeline model: spec loading, throughput and memory with and without
cuts, the LP bound and the exact oracle over every cut pattern."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, cut_patterns, even_split
from recperf.ingest.sim.model import BUNDLED, PipelineSpec, StageSpec, load_spec, spec_from_mapping
from recperf.ingest.sim.solve import (
    lp_bound,
    oracle,
    pattern_bound,
    pattern_oracle,
    segment_limits,
    segments_of,
)
from recperf.ingest.sim.target import SimTarget

GOOD = """
cores = 8
memory_budget_gib = 4.0
transfer_us_per_row = 0.5

[[stage]]
name = "decode"
cost_us_per_row = 1.5
max_workers = 4
memory_mib_per_worker = 100

[[stage]]
name = "collate"
cost_us_per_row = 2.5
"""


def chain(
    cores: int = 8,
    c: tuple[float, ...] = (1.0, 3.0),
    caps: tuple[int | None, ...] | None = None,
    mem: tuple[float, ...] | None = None,
    **kw: float,
) -> PipelineSpec:
    """Stages a, b, c, ... with costs ``c`` (and caps, memory per worker)."""
    n = len(c)
    stages = tuple(
        StageSpec(name=name, cost_us_per_row=ci, max_workers=cap, memory_mib_per_worker=m)
        for name, ci, cap, m in zip(
            "abcdefgh", c, caps or (None,) * n, mem or (0.0,) * n, strict=False
        )
    )
    return PipelineSpec(cores=cores, memory_budget_gib=kw.pop("budget", 64.0), stages=stages, **kw)


two = chain


def even(spec: PipelineSpec) -> Allocation:
    return even_split(SimTarget(spec))


def test_load_good_file(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(GOOD)
    spec = load_spec(path)
    assert spec.name == "p"
    assert spec.cores == 8
    assert [s.name for s in spec.stages] == ["decode", "collate"]
    assert spec.stages[0].max_workers == 4
    assert spec.stages[1].max_workers is None
    assert spec.row_costs_us() == (2.0, 3.0)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (("cores = 8", "cores = 8\ncolour = 1"), "colour"),
        (('name = "collate"', 'name = "collate"\nspeed = 2'), "speed"),
        (('name = "collate"', 'name = "decode"'), "duplicate stage name 'decode'"),
        (("cost_us_per_row = 2.5", "cost_us_per_row = 0"), "cost_us_per_row"),
        (("cost_us_per_row = 2.5", "cost_us_per_row = -1.0"), "cost_us_per_row"),
        (("cost_us_per_row = 2.5", 'cost_us_per_row = "fast"'), "cost_us_per_row"),
        (("max_workers = 4", "max_workers = 0"), "max_workers"),
        (("memory_mib_per_worker = 100", "memory_mib_per_worker = -5"), "memory_mib_per_worker"),
        (("cores = 8", "cores = 0"), "cores"),
        (("cores = 8", "cores = 2000"), "cores"),
        (("cores = 8", ""), "missing required key 'cores'"),
        (("memory_budget_gib = 4.0", "memory_budget_gib = 0.0"), "memory_budget_gib"),
        (("transfer_us_per_row = 0.5", "transfer_us_per_row = -0.5"), "transfer_us_per_row"),
        (("cost_us_per_row = 2.5", ""), "missing required key 'cost_us_per_row'"),
    ],
)
def test_load_errors_name_file_and_field(tmp_path: Path, edit: tuple[str, str], field: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(GOOD.replace(*edit, 1))
    with pytest.raises(ConfigError) as exc:
        load_spec(path)
    msg = str(exc.value)
    assert str(path) in msg
    assert field in msg
    assert "\n" not in msg


def test_stage_errors_name_the_stage(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(GOOD.replace("cost_us_per_row = 2.5", "cost_us_per_row = 0"))
    with pytest.raises(ConfigError, match=r"stage\[1\] 'collate': cost_us_per_row"):
        load_spec(path)


@pytest.mark.parametrize(
    "data",
    [
        {"cores": 4, "memory_budget_gib": 1.0},
        {"cores": 4, "memory_budget_gib": 1.0, "stage": []},
        {"cores": 4, "memory_budget_gib": 1.0, "stage": [1, 2]},
        {"cores": 4, "memory_budget_gib": 1.0, "stages": [{"name": "a", "cost_us_per_row": 1}]},
    ],
)
def test_mapping_without_stage_tables_is_refused(data: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=r"src\.toml: .*stage"):
        spec_from_mapping(data, source="src.toml")


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_spec(tmp_path / "nope.toml")
    bad = tmp_path / "syntax.toml"
    bad.write_text("cores = = 3")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_spec(bad)


@pytest.mark.parametrize(
    ("alloc", "transfer", "caps", "thr", "neck"),
    [
        ((2, 3), 0.0, (None, None), 1e6, "b"),  # a: 2e6, b: 1e6
        ((1, 6), 0.0, (None, None), 1e6, "a"),  # a: 1e6, b: 2e6
        ((2, 3), 1.0, (None, None), 0.75e6, "b"),  # a: 2/2, b: 3/4
        ((2, 2), 1.0, (None, None), 0.5e6, "b"),
        ((5, 6), 0.0, (2, None), 2e6, "a"),  # a capped at 2 workers
    ],
)
def test_throughput_is_the_bottleneck(
    alloc: tuple[int, int],
    transfer: float,
    caps: tuple[int | None, int | None],
    thr: float,
    neck: str,
) -> None:
    spec = two(cores=16, caps=caps, transfer_us_per_row=transfer)
    assert spec.throughput(alloc) == pytest.approx(thr)
    assert spec.throughput(Allocation(workers=alloc)) == pytest.approx(thr)
    assert spec.bottleneck(alloc) == neck


def three(**kw: float) -> PipelineSpec:
    """a, b, c costing 1, 3, 2 us/row; b capped at 2; 100, 200, 50 MiB per worker."""
    return chain(
        c=(1.0, 3.0, 2.0), caps=(None, 2, None), mem=(100.0, 200.0, 50.0), cores=16,
        transfer_us_per_row=0.5, memory_mib_per_batch=10.0, queue_batches=2, **kw,
    )  # fmt: skip


def test_a_segment_sums_its_stages_and_pays_one_hand_off() -> None:
    spec = three()
    alloc = Allocation(workers=(2, 3), cuts=(2,))  # a+b x2 | c x3
    # a+b: 1 + 3 + 0.5 us/row, capped at 2 by b; c: 2 + 0.5 us/row
    assert spec.capacities(alloc) == pytest.approx((2e6 / 4.5, 3e6 / 2.5))
    assert spec.throughput(alloc) == pytest.approx(2e6 / 4.5)
    assert spec.bottleneck(alloc) == "a+b"
    # a fused worker holds both stages' memory; one cut, so one queue of 2 x 10 MiB batches
    assert spec.memory_bytes(alloc) == (2 * 300 + 3 * 50 + 20) * 2**20
    fused = Allocation(workers=(4,), cuts=())
    assert spec.throughput(fused) == pytest.approx(2e6 / 6.5)  # b's cap binds the whole chain
    assert spec.memory_bytes(fused) == 4 * 350 * 2**20  # no cut, no buffers
    assert spec.bottleneck(fused) == "a+b+c"


@pytest.mark.parametrize(
    ("alloc", "match"),
    [
        (Allocation(workers=(3, 3), cuts=(2,)), "segment 'a\\+b' has 3 workers, over its max_w"),
        (Allocation(workers=(0, 3), cuts=(1,)), "stage 'a' has 0 workers; needs >= 1"),
        (Allocation(workers=(1, 3, 1)), "stage 'b' has 3 workers, over its max_workers = 2"),
        (Allocation(workers=(1, 1), cuts=(3,)), "cut at stage 3: the chain has 3"),
        (Allocation(workers=(1, 1)), "2 entries; the pipeline has 3"),
        (Allocation(workers=(1, 1, 1, 1)), "4 entries; the pipeline has 3"),
    ],
)
def test_bad_allocations_name_the_segment(alloc: Allocation, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        three().check_allocation(alloc)


@st.composite
def small_specs(draw: st.DrawFn, n_max: int = 3) -> PipelineSpec:
    n = draw(st.integers(1, n_max))
    stages = tuple(
        StageSpec(
            name=f"s{i}",
            cost_us_per_row=draw(st.integers(1, 40)) / 4,
            max_workers=draw(st.none() | st.integers(1, 5)),
            memory_mib_per_worker=draw(st.sampled_from([0.0, 64.0, 100.0, 256.0])),
        )
        for i in range(n)
    )
    return PipelineSpec(
        cores=draw(st.integers(1, 4)),
        memory_budget_gib=draw(st.sampled_from([0.25, 0.5, 1.0, 4.0])),
        transfer_us_per_row=draw(st.sampled_from([0.0, 0.25, 1.0])),
        memory_mib_per_batch=draw(st.sampled_from([0.0, 16.0])),
        queue_batches=draw(st.integers(0, 3)),
        stages=stages,
    )


@settings(derandomize=True, max_examples=100, deadline=None)
@given(small_specs(n_max=5), st.lists(st.integers(0, 9), min_size=5, max_size=5))
def test_every_stage_its_own_segment_is_the_per_stage_model(
    spec: PipelineSpec, draws: list[int]
) -> None:
    n = spec.n_stages
    w = tuple(draws[:n])
    spelled = Allocation(workers=w, cuts=tuple(range(1, n)))
    total = sum(w)
    scale = 1.0 if total <= spec.cores else spec.cores / total
    # the per-stage model: each stage pays its cost plus one transfer, buffers between all
    expect = [
        (wi if s.max_workers is None else min(wi, s.max_workers))
        * 1e6 / (s.cost_us_per_row + spec.transfer_us_per_row) * scale
        for wi, s in zip(w, spec.stages, strict=True)
    ]  # fmt: skip
    mib = sum(wi * s.memory_mib_per_worker for wi, s in zip(w, spec.stages, strict=True))
    mib += (n - 1) * spec.queue_batches * spec.memory_mib_per_batch
    for alloc in (w, Allocation(workers=w), spelled):
        assert spec.capacities(alloc) == pytest.approx(expect)
        assert spec.memory_bytes(alloc) == pytest.approx(mib * 2**20)
        assert spec.fits(alloc) == spec.fits(w)
    assert spelled.normalized(n) == Allocation(workers=w)


@settings(derandomize=True, max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=6),
    st.integers(1, 16),
    st.sampled_from([0.0, 0.02, 0.3, 1.0]),
)
def test_fused_wins_without_caps(costs: list[int], cores: int, transfer: float) -> None:
    # no caps, memory ample: one segment of a worker per core reaches cores / (sum + one
    # hand-off), the bound; any cut pays another hand-off (and ties go to fewer segments)
    spec = chain(cores=cores, c=tuple(c / 4 for c in costs), transfer_us_per_row=transfer)
    n = spec.n_stages
    best = oracle(spec)
    assert best == Allocation(workers=(cores,), cuts=()).normalized(n)
    fused = cores * 1e6 / (sum(costs) / 4 + transfer)
    assert spec.throughput(best) == pytest.approx(fused)
    assert lp_bound(spec).throughput_rows_per_s == pytest.approx(fused)
    if transfer > 0 and n > 1:
        assert fused > pattern_bound(spec, None).throughput_rows_per_s


def test_a_capped_stage_makes_a_cut_pay() -> None:
    # a (1 us/row) is capped at one worker; fused, the whole chain is: 1e6 / 4.5 rows/s. Cut,
    # a's one worker runs at 1e6 / 1.5 and b gets the other three cores.
    spec = chain(cores=4, c=(1.0, 3.0), caps=(1, None), transfer_us_per_row=0.5)
    assert pattern_oracle(spec, ()) == Allocation(workers=(1,), cuts=())
    assert spec.throughput(Allocation(workers=(1,), cuts=())) == pytest.approx(1e6 / 4.5)
    assert oracle(spec) == Allocation(workers=(1, 3))
    assert spec.throughput((1, 3)) == pytest.approx(1e6 / 1.5)
    b = lp_bound(spec)
    assert (b.binding, b.binding_stage, b.cuts) == ("max_workers", "a", None)
    # udfcut-4: the UDF's 2-worker cap; cutting on both sides of it pays despite 1 us/row
    # hand-offs: read+dense+sparse x1 | udf x2 | shuffle+collate x1
    udf = load_spec("udfcut-4")
    best = oracle(udf)
    assert best == Allocation(workers=(1, 2, 1), cuts=(3, 4))
    assert udf.throughput(best) == pytest.approx(1e6 / 6.9)
    fused = pattern_oracle(udf, ())
    assert fused is not None
    assert udf.throughput(fused) == pytest.approx(2e6 / 20.4)


def test_oversubscription_scales_every_stage() -> None:
    spec = two(cores=4)
    assert spec.contention((2, 2)) == 1.0
    assert spec.contention((4, 4)) == 0.5
    assert spec.contention(Allocation(workers=(8,), cuts=())) == 0.5
    assert spec.capacities((4, 4)) == pytest.approx((2e6, 4e6 / 3 / 2))
    assert spec.throughput((4, 4)) == pytest.approx(2e6 / 3)
    # Adding workers past the cores can still help the bottleneck, but less than linearly.
    assert spec.throughput((1, 6)) == pytest.approx(1e6 * 4 / 7)


def test_memory_accounting_and_refusal() -> None:
    spec = two(mem=(100.0, 200.0), memory_mib_per_batch=50.0, queue_batches=2, budget=0.5)
    # workers 2*100 + 3*200 = 800 MiB, buffers (2-1)*2*50 = 100 MiB
    assert spec.memory_bytes((2, 3)) == 900 * 2**20
    spec.check_allocation((1, 1))  # 300 + 100 MiB fits 512 MiB
    with pytest.raises(ConfigError) as exc:
        spec.check_allocation((2, 3))
    msg = str(exc.value)
    for part in ("900.0 MiB", "worker memory 800.0 MiB", "buffers 100.0 MiB", "0.5 GiB"):
        assert part in msg
    assert not spec.fits((2, 3))
    # fused, one worker holds 300 MiB and there is no queue: one fits, two do not
    assert spec.fits(Allocation(workers=(1,), cuts=()))
    assert not spec.fits(Allocation(workers=(2,), cuts=()))


def test_lp_bound_cores_bind() -> None:
    spec = two(cores=8)
    per_stage = pattern_bound(spec, None)
    assert per_stage.binding == "cores"
    assert per_stage.throughput_rows_per_s == pytest.approx(2e6)
    assert per_stage.workers == pytest.approx((2.0, 6.0))
    # no transfer: fusing gains nothing, and the tie goes to the fewest cuts
    b = lp_bound(spec)
    assert (b.cuts, b.throughput_rows_per_s, b.workers) == ((), pytest.approx(2e6), (8.0,))
    b = lp_bound(two(cores=8, transfer_us_per_row=1.0))
    assert (b.cuts, b.throughput_rows_per_s) == ((), pytest.approx(8e6 / 5))


def test_lp_bound_cap_binds() -> None:
    b = lp_bound(two(cores=8, caps=(None, 3)))
    assert (b.binding, b.binding_stage, b.cuts) == ("max_workers", "b", None)
    assert b.throughput_rows_per_s == pytest.approx(1e6)
    assert b.workers == pytest.approx((1.0, 3.0))
    # fused, b's cap would hold all four us/row to 3 workers: 0.75e6
    assert pattern_bound(two(cores=8, caps=(None, 3)), ()).throughput_rows_per_s == 0.75e6


def test_lp_bound_memory_binds() -> None:
    spec = two(cores=8, mem=(100.0, 200.0), budget=1.0)
    b = lp_bound(spec)
    # per stage, a row/us needs 1 * 100 + 3 * 200 MiB of workers; fused 4 * 300
    assert (b.binding, b.cuts) == ("memory", None)
    assert b.throughput_rows_per_s == pytest.approx(1024e6 / 700)
    assert pattern_bound(spec, ()).throughput_rows_per_s == pytest.approx(1024e6 / 1200)
    used = sum(w * m for w, m in zip(b.workers, (100.0, 200.0), strict=True))
    assert used == pytest.approx(1024.0)


def test_buffers_over_budget_leave_only_the_fused_chain() -> None:
    spec = two(memory_mib_per_batch=1024.0, queue_batches=2, budget=1.0)
    assert pattern_bound(spec, None).throughput_rows_per_s == 0.0
    assert pattern_oracle(spec, None) is None
    b = lp_bound(spec)
    assert (b.binding, b.cuts, b.throughput_rows_per_s) == ("cores", (), pytest.approx(2e6))
    assert oracle(spec) == Allocation(workers=(8,), cuts=())


@pytest.mark.parametrize(
    ("cores", "caps", "expect"),
    [
        (8, (None, None), (4, 4)),
        (7, (None, None), (4, 3)),
        (8, (2, None), (2, 6)),
        (8, (2, 3), (2, 3)),
        (1, (None, None), (1, 1)),
    ],
)
def test_even_split(
    cores: int, caps: tuple[int | None, int | None], expect: tuple[int, int]
) -> None:
    assert even(two(cores=cores, caps=caps)) == Allocation(workers=expect)


def test_even_respects_memory() -> None:
    spec = two(cores=16, mem=(256.0, 256.0), budget=1.0)
    assert even(spec).workers == (2, 2)


def test_per_stage_oracle_hand_case() -> None:
    # Costs 1 and 3 on 8 cores: (2, 6) reaches 2e6 rows/s = the LP bound; nothing reaches more.
    assert pattern_oracle(two(cores=8), None) == Allocation(workers=(2, 6))
    # On 9 cores the bound is 9e6/4 = 2.25e6. Within the cores (2, 6) and (3, 6) reach 2e6, but
    # oversubscribing with (3, 9) reaches min(3, 9/3) * 1e6 * 9/12 = 2.25e6, the bound itself.
    spec = two(cores=9)
    assert pattern_oracle(spec, None) == Allocation(workers=(3, 9))
    assert spec.throughput((3, 9)) == pytest.approx(lp_bound(spec).throughput_rows_per_s)
    # One core still runs both stages, time-shared: (1, 3) reaches 1 * 1e6 * 1/4 = 0.25e6.
    assert pattern_oracle(two(cores=1), None) == Allocation(workers=(1, 3))
    assert two(cores=1).throughput((1, 3)) == pytest.approx(0.25e6)
    # Limited to 2 workers per stage on 9 cores: (1, 2) gives 2/3 * 1e6.
    assert pattern_oracle(two(cores=9), None, worker_limit=2) == Allocation(workers=(1, 2))


def test_oracle_fuses_on_ties() -> None:
    # fused, 8 (9) workers reach 8e6 / 4 (9e6 / 4) as well, with fewer workers than (3, 9)
    assert oracle(two(cores=8)) == Allocation(workers=(8,), cuts=())
    assert oracle(two(cores=9)) == Allocation(workers=(9,), cuts=())


def test_oracle_refuses_when_nothing_fits() -> None:
    # One worker of each stage needs 1.5 GiB, fused or not; the budget is 1 GiB.
    with pytest.raises(ConfigError, match="no allocation"):
        oracle(two(cores=4, mem=(512.0, 1024.0), budget=1.0))


def brute_force(spec: PipelineSpec, limit: int) -> tuple[float, int, int] | None:
    """(best rows/s, fewest workers, then fewest segments reaching it) over every pattern and
    every allocation with each segment in 1..min(cap, limit)."""
    found = []
    for cuts in cut_patterns(spec.n_stages):
        segs = segments_of(spec.n_stages, cuts)
        ranges = [range(1, lim + 1) for lim in segment_limits(spec, segs, limit)]
        for w in itertools.product(*ranges):
            alloc = Allocation(workers=w, cuts=cuts)
            if _valid(spec, alloc):  # oversubscribed or not
                found.append((spec.throughput(alloc), sum(w), len(w)))
    if not found:
        return None
    best = max(t for t, _, _ in found)
    return min(((best, n, k) for t, n, k in found if t >= best * (1 - 1e-9)), key=lambda f: f[1:])


def _valid(spec: PipelineSpec, alloc: Allocation) -> bool:
    try:
        spec.check_allocation(alloc)
    except ConfigError:
        return False
    return True


@settings(derandomize=True, max_examples=150, deadline=None)
@given(small_specs(), st.integers(1, 6))
def test_oracle_matches_brute_force_and_bounds(spec: PipelineSpec, limit: int) -> None:
    # Brute force over every cut pattern and every allocation with each segment in
    # 1..min(cap, limit), oversubscribed or not: the oracle must reach the same best throughput
    # with as few workers and segments.
    expect = brute_force(spec, limit)
    if expect is None:
        with pytest.raises(ConfigError):
            oracle(spec, worker_limit=limit)
        return
    got = oracle(spec, worker_limit=limit)
    spec.check_allocation(got)
    thr = spec.throughput(got)
    assert (thr, got.total, len(got.workers)) == (pytest.approx(expect[0]), *expect[1:])
    bound = lp_bound(spec)
    assert thr <= bound.throughput_rows_per_s * (1 + 1e-9)
    for cuts in cut_patterns(spec.n_stages):  # each pattern's optimum is no better
        alloc = pattern_oracle(spec, cuts, worker_limit=limit)
        if alloc is not None:
            assert spec.throughput(alloc) <= thr * (1 + 1e-9)
            assert spec.throughput(alloc) <= pattern_bound(spec, cuts).throughput_rows_per_s * (
                1 + 1e-9
            )


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_specs(name: str) -> None:
    spec = load_spec(name)
    assert spec.name == name
    best = oracle(spec)
    bound = lp_bound(spec)
    base = even(spec)
    spec.check_allocation(best)  # may oversubscribe the cores
    spec.check_allocation(base)  # within the cores, unless the stages outnumber them
    assert spec.fits(base) == (spec.n_stages <= spec.cores)
    assert spec.throughput(base) <= spec.throughput(best) <= bound.throughput_rows_per_s
    expect = {
        "criteo-16": "cores",
        "udf-64": "max_workers",
        "membound-128": "memory",
        "live-2": "cores",
        "udfcut-4": "max_workers",
        "threads-2": "cores",
        "ray-65540": "cores",
    }[name]
    assert bound.binding == expect


def test_membound_leaves_cores_idle() -> None:
    spec = load_spec("membound-128")
    assert oracle(spec).total < spec.cores


@pytest.mark.parametrize(
    ("name", "bound", "best", "even_thr", "alloc"),
    [
        # cores bind: 16e6 / 15 us (two segments, two hand-offs of 0.2); fusing all of it
        # would be cheaper per row but 2.6 GiB fused workers run out of memory at 12
        ("criteo-16", 16e6 / 15, 16e6 / 15, 15e6 / 31, Allocation(workers=(16, 4), cuts=(4,))),
        # udf's 40-worker cap binds: 40e6 / 40.5 us, reached exactly; shuffle+collate fused
        ("udf-64", 40e6 / 40.5, 40e6 / 40.5, 17e6 / 40.5,
         Allocation(workers=(5, 40, 7, 1, 4), cuts=(1, 2, 3, 4))),
        # memory binds: 90 workers on 128 cores reach 0.985 of the bound
        ("membound-128", 5642633.23, 5555555.56, 3333333.33,
         Allocation(workers=(24, 10, 35, 8, 13), cuts=(1, 2, 3, 5))),
        # a 1 us/row hand-off on 2 cores: the fused chain, a worker per core
        ("live-2", 2e6 / 8.46, 2e6 / 8.46, 1e6 / 11.775, Allocation(workers=(2,), cuts=())),
        ("udfcut-4", 2e6 / 13, 1e6 / 6.9, 1e6 / 19.5, Allocation(workers=(1, 2, 1), cuts=(3, 4))),
        # live-2 with the GIL: two threads of the consumer's process save the copy (7.46 us)
        ("threads-2", 2e6 / 7.46, 2e6 / 7.46, 1e6 / 11.775,
         Allocation(workers=(2,), cuts=(), threads=(0,))),
    ],
)  # fmt: skip
def test_bundled_values(
    name: str, bound: float, best: float, even_thr: float, alloc: Allocation
) -> None:
    spec = load_spec(name)
    assert lp_bound(spec).throughput_rows_per_s == pytest.approx(bound)
    assert oracle(spec) == alloc
    assert spec.throughput(alloc) == pytest.approx(best)
    assert spec.throughput(even(spec)) == pytest.approx(even_thr)
