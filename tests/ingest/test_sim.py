"""The analytic ingestion-pipeline model: spec loading, throughput, memory, bound and allocators."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation
from recperf.ingest.sim.model import (
    BUNDLED,
    PipelineSpec,
    StageSpec,
    even,
    load_spec,
    lp_bound,
    oracle,
    spec_from_mapping,
    stage_limits,
)

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


def two(
    cores: int = 8,
    c: tuple[float, float] = (1.0, 3.0),
    caps: tuple[int | None, int | None] = (None, None),
    mem: tuple[float, float] = (0.0, 0.0),
    **kw: float,
) -> PipelineSpec:
    stages = tuple(
        StageSpec(name=n, cost_us_per_row=ci, max_workers=cap, memory_mib_per_worker=m)
        for n, ci, cap, m in zip("ab", c, caps, mem, strict=True)
    )
    return PipelineSpec(cores=cores, memory_budget_gib=kw.pop("budget", 64.0), stages=stages, **kw)


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


def test_oversubscription_scales_every_stage() -> None:
    spec = two(cores=4)
    assert spec.contention((2, 2)) == 1.0
    assert spec.contention((4, 4)) == 0.5
    assert spec.capacities((4, 4)) == pytest.approx((2e6, 4e6 / 3 / 2))
    assert spec.throughput((4, 4)) == pytest.approx(2e6 / 3)
    # Adding workers past the cores can still help the bottleneck, but less than linearly.
    assert spec.throughput((1, 6)) == pytest.approx(1e6 * 4 / 7)


def test_allocation_length_is_checked() -> None:
    with pytest.raises(ConfigError, match="3 entries; the pipeline has 2"):
        two().throughput((1, 2, 3))


def test_memory_accounting_and_refusal() -> None:
    spec = two(mem=(100.0, 200.0), memory_mib_per_batch=50.0, queue_batches=2, budget=0.5)
    # workers 2*100 + 3*200 = 800 MiB, buffers (2-1)*2*50 = 100 MiB
    assert spec.memory_bytes((2, 3)) == 900 * 2**20
    spec.check_allocation((1, 1))  # 300 + 100 MiB fits 512 MiB
    with pytest.raises(ConfigError) as exc:
        spec.check_allocation((2, 3))
    msg = str(exc.value)
    for part in ("900.0 MiB", "stage memory 800.0 MiB", "buffers 100.0 MiB", "0.5 GiB"):
        assert part in msg
    assert not spec.fits((2, 3))


@pytest.mark.parametrize(
    ("alloc", "match"),
    [((0, 1), "'a' has 0 workers"), ((1, 4), "'b' has 4 workers, over its max_workers = 3")],
)
def test_check_allocation_worker_limits(alloc: tuple[int, int], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        two(caps=(None, 3)).check_allocation(alloc)


def test_lp_bound_cores_bind() -> None:
    b = lp_bound(two(cores=8))
    assert b.binding == "cores"
    assert b.throughput_rows_per_s == pytest.approx(2e6)
    assert b.workers == pytest.approx((2.0, 6.0))


def test_lp_bound_cap_binds() -> None:
    b = lp_bound(two(cores=8, caps=(None, 3)))
    assert (b.binding, b.binding_stage) == ("max_workers", "b")
    assert b.throughput_rows_per_s == pytest.approx(1e6)
    assert b.workers == pytest.approx((1.0, 3.0))


def test_lp_bound_memory_binds() -> None:
    spec = two(cores=8, mem=(100.0, 200.0), budget=1.0)
    b = lp_bound(spec)
    assert b.binding == "memory"
    assert b.throughput_rows_per_s == pytest.approx(1024e6 / 700)
    assert spec.memory_bytes((1, 1)) < 2**30
    used = sum(w * m for w, m in zip(b.workers, (100.0, 200.0), strict=True))
    assert used == pytest.approx(1024.0)


def test_lp_bound_buffers_over_budget_give_zero() -> None:
    spec = two(memory_mib_per_batch=1024.0, queue_batches=2, budget=1.0)
    b = lp_bound(spec)
    assert (b.binding, b.throughput_rows_per_s) == ("memory", 0.0)


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
    assert even(two(cores=cores, caps=caps)).workers == expect


def test_even_respects_memory() -> None:
    spec = two(cores=16, mem=(256.0, 256.0), budget=1.0)
    assert even(spec).workers == (2, 2)


def test_oracle_hand_case() -> None:
    # Costs 1 and 3 on 8 cores: (2, 6) reaches 2e6 rows/s = the LP bound; nothing reaches more.
    assert oracle(two(cores=8)).workers == (2, 6)
    # On 9 cores the bound is 9e6/4 = 2.25e6. Within the cores (2, 6) and (3, 6) reach 2e6, but
    # oversubscribing with (3, 9) reaches min(3, 9/3) * 1e6 * 9/12 = 2.25e6, the bound itself.
    spec = two(cores=9)
    assert oracle(spec).workers == (3, 9)
    assert spec.throughput((3, 9)) == pytest.approx(lp_bound(spec).throughput_rows_per_s)
    # One core still runs both stages, time-shared: (1, 3) reaches 1 * 1e6 * 1/4 = 0.25e6.
    assert oracle(two(cores=1)).workers == (1, 3)
    assert two(cores=1).throughput((1, 3)) == pytest.approx(0.25e6)


def test_oracle_worker_limit() -> None:
    # Limited to 2 workers per stage, costs 1 and 3 on 9 cores: (1, 2) gives 2/3 * 1e6.
    assert oracle(two(cores=9), worker_limit=2).workers == (1, 2)


def test_oracle_refuses_when_nothing_fits() -> None:
    # One worker of each stage needs 1.5 GiB; the budget is 1 GiB.
    with pytest.raises(ConfigError, match="no allocation"):
        oracle(two(cores=4, mem=(512.0, 1024.0), budget=1.0))


def brute_force(spec: PipelineSpec, limit: int) -> Allocation | None:
    ranges = [range(1, lim + 1) for lim in stage_limits(spec, limit)]
    feasible = []
    for w in itertools.product(*ranges):
        try:
            spec.check_allocation(w)
        except ConfigError:
            continue
        feasible.append(w)
    if not feasible:
        return None
    best = max(spec.throughput(w) for w in feasible)
    near = [w for w in feasible if spec.throughput(w) >= best * (1 - 1e-9)]
    return Allocation(workers=min(near, key=sum))


@st.composite
def small_specs(draw: st.DrawFn) -> PipelineSpec:
    n = draw(st.integers(1, 3))
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


@settings(derandomize=True, max_examples=300, deadline=None)
@given(small_specs(), st.integers(1, 7))
def test_oracle_matches_brute_force_and_bounds(spec: PipelineSpec, limit: int) -> None:
    # Brute force over every allocation with each stage in 1..min(cap, limit), oversubscribed
    # or not; the oracle must find the same (unique) fastest allocation with fewest workers.
    expect = brute_force(spec, limit)
    if expect is None:
        with pytest.raises(ConfigError):
            oracle(spec, worker_limit=limit)
        return
    got = oracle(spec, worker_limit=limit)
    assert got == expect
    spec.check_allocation(got)
    thr = spec.throughput(got)
    assert thr <= lp_bound(spec).throughput_rows_per_s * (1 + 1e-9)
    alloc = even(spec)
    if spec.fits(alloc) and all(w <= limit for w in alloc.workers):
        assert thr >= spec.throughput(alloc) * (1 - 1e-9)


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_specs(name: str) -> None:
    spec = load_spec(name)
    assert spec.name == name
    best = oracle(spec)
    bound = lp_bound(spec)
    base = even(spec)
    spec.check_allocation(best)  # may oversubscribe the cores
    assert spec.fits(base)
    assert spec.throughput(base) <= spec.throughput(best) <= bound.throughput_rows_per_s
    # Each spec is built so that a different constraint binds.
    expect = {"criteo-16": "cores", "udf-64": "max_workers", "membound-128": "memory"}[name]
    assert bound.binding == expect


def test_membound_leaves_cores_idle() -> None:
    spec = load_spec("membound-128")
    assert oracle(spec).total < spec.cores


@pytest.mark.parametrize(
    ("name", "bound", "best", "even_thr", "workers"),
    [
        # cores bind: 16e6 / 15.8 us; the oracle oversubscribes 64 workers (memory stops it)
        ("criteo-16", 16e6 / 15.8, 1e6, 15e6 / 31, (17, 7, 25, 2, 4, 9)),
        # udf's 40-worker cap binds: 40e6 / 40.5 us, reached exactly
        ("udf-64", 40e6 / 40.5, 40e6 / 40.5, 17e6 / 40.5, (5, 40, 7, 1, 2, 3)),
        # memory binds: 93 workers on 128 cores reach 0.985 of the bound
        ("membound-128", 5642633.23, 5555555.56, 3333333.33, (24, 10, 35, 4, 7, 13)),
    ],
)
def test_bundled_values(
    name: str, bound: float, best: float, even_thr: float, workers: tuple[int, ...]
) -> None:
    spec = load_spec(name)
    assert lp_bound(spec).throughput_rows_per_s == pytest.approx(bound)
    assert oracle(spec).workers == workers
    assert spec.throughput(workers) == pytest.approx(best)
    assert spec.throughput(even(spec)) == pytest.approx(even_thr)
