"""The L2 model: stack distances give the hit counts of an exact LRU simulation at every size,
layouts are the kernels' own (read off their traits, a user's ``module:attr`` kernel's too),
rows take their row format's real size, pinning removes the pinned lines from the LRU and
shrinks it by the carve-out, the bundled trace agrees with ``recperf embed stats``, specs are
validated, and the ``recperf embed predict`` CLI."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from recperf.cli.embed import app
from recperf.core.errors import ConfigError
from recperf.embed import gpus, l2layout, l2model, l2sweep, locality, stackdist, traces
from recperf.embed.kernels.base import KERNELS, KernelTraits, Lookup, Tables
from recperf.embed.kernels.formats import ROW_FORMATS, row_bytes
from recperf.embed.kernels.torch_hot import hot_first_order
from recperf.embed.model import EmbedConfig, config

LINE = 128


class UserPinned:
    """A user's kernel (the reference's arithmetic) whose traits say: every row format, hot rows
    first in one buffer, pinned in L2; the model knows it only by them."""

    traits = KernelTraits(
        formats=frozenset(ROW_FORMATS), hot_rows=True, layout="hot-first", pins_l2=True
    )

    def __init__(self, tables: Tables, hot_rows: object = None) -> None:
        self.name = "user-pinned"
        self._ref = KERNELS.build("torch", None, tables)

    def __call__(self, lookup: Lookup) -> torch.Tensor:
        return self._ref(lookup)


class UserCombined(UserPinned):
    """The same, every table in one buffer in table order, nothing pinned."""

    traits = KernelTraits(formats=frozenset(ROW_FORMATS), layout="combined")


class UserTables(UserPinned):
    """The same, one allocation per table, rows read in their own format (FBGEMM's rows)."""

    traits = KernelTraits(formats=frozenset(ROW_FORMATS), layout="tables", fused=False)


class UserUntraited:
    """A user's kernel that gives no traits: the defaults (fp32 and fp16 rows, one buffer)."""

    def __init__(self, tables: Tables) -> None:
        self.name = "user-untraited"
        self._ref = KERNELS.build("torch", None, tables)

    def __call__(self, lookup: Lookup) -> torch.Tensor:
        return self._ref(lookup)


USER = f"{__name__}:UserPinned"


def lru_hits(stream: Iterable[int], capacity: int) -> list[bool]:
    """An exact LRU cache of ``capacity`` lines: per access, whether it hit."""
    cache: OrderedDict[int, None] = OrderedDict()
    out = []
    for x in stream:
        hit = x in cache
        out.append(hit)
        if hit:
            cache.move_to_end(x)
        else:
            cache[x] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return out


def engines() -> list[stackdist.Engine]:
    return ["numpy", "numba"] if stackdist._numba_kernel() is not None else ["numpy"]


def test_stack_distances_of_a_known_stream() -> None:
    # a b c a b b d a: the second a has b, c between it and its first use (2) ...
    d = stackdist.stack_distances([0, 1, 2, 0, 1, 1, 3, 0], engine="numpy")
    assert d.tolist() == [-1, -1, -1, 2, 2, 0, -1, 2]
    assert stackdist.stack_distances([], engine="numpy").tolist() == []


@settings(max_examples=60, deadline=None)
@given(
    stream=st.lists(st.integers(0, 40), max_size=300),
    capacities=st.lists(st.integers(1, 45), min_size=1, max_size=5),
)
def test_hits_equal_an_exact_lru_at_every_capacity(
    stream: list[int], capacities: list[int]
) -> None:
    for engine in engines():
        d = stackdist.stack_distances(stream, engine=engine)
        hits = stackdist.hits_by_capacity(d, capacities)
        assert hits.tolist() == [sum(lru_hits(stream, c)) for c in capacities], engine


def test_hits_equal_an_exact_lru_on_a_longer_skewed_stream() -> None:
    rng = np.random.default_rng(3)
    stream = (rng.zipf(1.2, 20_000) % 3_000).tolist()
    d = stackdist.stack_distances(stream, engine="numpy")
    for c in (1, 16, 300, 2_000):
        per_access = lru_hits(stream, c)
        assert ((d >= 0) & (d < c)).tolist() == per_access


def test_numba_equals_numpy_when_installed() -> None:
    if stackdist._numba_kernel() is None:
        with pytest.raises(ConfigError, match="numba is not installed"):
            stackdist.stack_distances([1, 2], engine="numba")
        pytest.skip("numba is not installed: its engine is optional")
    stream = np.random.default_rng(4).integers(0, 5_000, 50_000)
    a = stackdist.stack_distances(stream, engine="numba")
    assert np.array_equal(a, stackdist.stack_distances(stream, engine="numpy"))


def test_sampled_hit_rate_is_close_to_the_exact_one() -> None:
    stream = np.random.default_rng(5).zipf(1.1, 200_000) % 50_000
    exact = stackdist.stack_distances(stream, engine="numpy")
    keep = stackdist.sampled(stream, 0.1, seed=0)
    assert 0.07 < keep.mean() < 0.13
    d = stackdist.stack_distances(stream[keep], engine="numpy")
    for c in (500, 5_000, 20_000):
        want = float(np.mean((exact >= 0) & (exact < c)))
        got = float(np.mean((d >= 0) & (d < 0.1 * c)))
        assert abs(got - want) < 0.03, (c, got, want)
    assert stackdist.sampled(stream, 1.0, 0).all()
    with pytest.raises(ConfigError, match="sample"):
        stackdist.sampled(stream, 0.0, 0)


# -- layouts and the whole model on tiny shapes ------------------------------------------------


def tiny_spec(l2_lines: int, persisting_lines: int, **kw: object) -> gpus.GpuSpec:
    return gpus.GpuSpec(
        name="tiny", device="test", l2_bytes=l2_lines * LINE,
        persisting_l2_max_bytes=persisting_lines * LINE, dram_gb_per_s=100.0,
        l2_gb_per_s=1000.0, sm_count=1, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def tiny_case(dim: int = 32, seed: int = 0) -> tuple[EmbedConfig, traces.Trace]:
    cfg = EmbedConfig(name="tiny", table_rows=(300, 120, 50), dim=dim,
                      pooling_factors=(5, 3, 2), batch_size=8)  # fmt: skip
    g = np.random.default_rng(seed)
    ids = tuple(torch.from_numpy(g.zipf(1.3, 400) % r) for r in cfg.table_rows)
    return cfg, traces.Trace(name="tiny", ids=ids, rows=cfg.table_rows)


def expected_hit_rate(
    cfg: EmbedConfig, trace: traces.Trace, row_bytes: int, capacity: int, pinned_rows: int = 0,
    hot: list[np.ndarray] | None = None, batches: int = 3, warmup: int = 1,
    codes: int | None = None,
) -> float:  # fmt: skip
    """Replay the batches line by line through an OrderedDict LRU, computing the combined or
    the hot-first buffer's addresses here (rows of the tables one after another); with
    ``codes`` (int8/int4 code bytes per row), as ``RowBuffer`` lays them out: the codes from
    the first line after a block of every row's 4 scale-and-bias bytes in reverse order."""
    bases = np.concatenate([[0], np.cumsum(cfg.table_rows)[:-1]])
    base = -(-4 * sum(cfg.table_rows) // LINE) * LINE  # where the codes start

    def lines_of(p: int) -> list[int]:
        if codes is None:
            return list(range(p * row_bytes // LINE, ((p + 1) * row_bytes - 1) // LINE + 1))
        first, last = base + p * codes, base + (p + 1) * codes - 1
        return [(base - 4 * (p + 1)) // LINE, *range(first // LINE, last // LINE + 1)]

    def pinned(line: int) -> bool:
        if codes is None:
            return (line + 1) * LINE <= pinned_rows * row_bytes
        window = (base - 4 * pinned_rows, base + pinned_rows * codes)
        return pinned_rows > 0 and window[0] <= line * LINE and (line + 1) * LINE <= window[1]

    pos = l2layout.hot_first_positions(cfg.table_rows, hot) if hot is not None else None
    per_batch = [cfg.batch_size * p for p in cfg.pooling_factors]
    lines, counted = [], []
    for k in range(batches):
        for t, n in enumerate(per_batch):
            stream = trace.ids[t].numpy()
            for j in range(k * n, (k + 1) * n):
                g = int(bases[t] + stream[j % stream.size] % cfg.table_rows[t])
                p = g if pos is None else int(pos[g])
                for line in lines_of(p):
                    lines.append(-2 - line if pinned(line) else line)
                    counted.append(k >= warmup)
    lru = [x for x in lines if x >= 0]
    hits = iter(lru_hits(lru, capacity))
    seen: set[int] = set()  # a pinned line misses once, then stays
    hit = []
    for x in lines:
        hit.append(x in seen if x < -1 else next(hits))
        seen.add(x)
    return sum(h for h, c in zip(hit, counted, strict=True) if c) / sum(counted)


@pytest.mark.parametrize("dim", [32, 8, 12])  # whole lines; 4 rows a line; rows across lines
def test_unpinned_variants_equal_a_line_by_line_lru(dim: int) -> None:
    cfg, trace = tiny_case(dim)
    spec = tiny_spec(40, 20)
    opts = l2model.PredictConfig(batches=3, engine="numpy")
    pred = l2model.predict(spec, cfg, trace, ["triton", "torch", "torch-hot"], opts)
    want = expected_hit_rate(cfg, trace, dim * 4, 40)
    assert pred.variants[0].hit_rate == pytest.approx(want, abs=1e-12)
    if dim == 32:  # whole aligned rows: the layouts only rename rows, so all hit alike
        assert {v.hit_rate for v in pred.variants} == {pred.variants[0].hit_rate}
        acc = l2layout.accesses(cfg, trace, 3)
        hot = l2layout.hot_rows(cfg, trace, 4)
        layouts: list[l2layout.Layout] = ["tables", "tables-hot", "combined"]
        addrs = [l2layout.row_addresses(x, acc, cfg.table_rows, 128, hot) for x in layouts]
        streams = [l2layout.line_stream(a, 128, spec) for a in addrs]
        replays = [l2model.replay_carve_outs(spec, acc, s, [0], opts)[0] for s in streams]
        assert all(np.array_equal(r.hits, replays[0].hits) for r in replays)


@pytest.mark.parametrize("persisting", [0, 6, 30])
def test_pinning_takes_hot_lines_out_of_the_lru_and_shrinks_it(persisting: int) -> None:
    cfg, trace = tiny_case(32)
    spec = tiny_spec(48, persisting)
    opts = l2model.PredictConfig(batches=3, engine="numpy", hot_rows_per_table=4)
    (v,) = l2model.predict(spec, cfg, trace, ["hot-l2"], opts).variants
    hot = l2layout.hot_rows(cfg, trace, 4)
    carve = min(12 * 128, persisting * LINE)  # 3 tables x 4 hot rows of one line each
    assert v.carve_out_bytes == carve
    want = expected_hit_rate(cfg, trace, 128, 48 - carve // LINE, carve // 128, hot)
    assert v.hit_rate == pytest.approx(want, abs=1e-12)
    assert (v.pinned_share > 0) == (persisting > 0)


def test_accesses_are_the_benchmarks_batches() -> None:
    from recperf.embed.bench import make_lookups

    cfg, trace = tiny_case(32)
    acc = l2layout.accesses(cfg, trace, 3)
    lookups = make_lookups(cfg, trace, 3, "cpu")
    assert np.array_equal(acc.row, torch.cat([lk.indices for lk in lookups]).numpy())
    per_table = [cfg.batch_size * p for p in cfg.pooling_factors]
    want = np.tile(np.repeat(np.arange(3), per_table), 3)
    assert np.array_equal(acc.table, want) and acc.lookups == (40, 24, 16)
    assert np.array_equal(acc.batch, np.repeat(np.arange(3), 80))


def test_layouts_are_the_kernels_own() -> None:
    rng = np.random.default_rng(0)
    for _ in range(30):
        rows = int(rng.integers(1, 40))
        hot = rng.integers(0, rows, int(rng.integers(0, 50)))
        want = hot_first_order(rows, torch.from_numpy(hot)).numpy()
        assert np.array_equal(l2layout.hot_first(rows, hot), want)
    pytest.importorskip("triton")
    from recperf.embed.kernels import Tables
    from recperf.embed.kernels.hotrows import HotRowRemap

    tables = Tables(weights=tuple(torch.zeros(r, 4) for r in (7, 3, 5)))
    chosen = [np.array([5, 0, 2]), np.array([1]), np.array([4, 3])]
    remap = HotRowRemap(tables, [torch.from_numpy(h) for h in chosen])
    assert np.array_equal(l2layout.hot_first_positions((7, 3, 5), chosen), remap._remap.numpy())


def test_a_sampled_prediction_is_close_to_the_exact_one() -> None:
    cfg = EmbedConfig(name="two", table_rows=(20_000, 8_000), dim=32, pooling_factors=(20, 10),
                      batch_size=256)  # fmt: skip
    g = np.random.default_rng(1)
    ids = tuple(torch.from_numpy(g.zipf(1.1, 20_000) % r) for r in cfg.table_rows)
    trace = traces.Trace(name="zipf", ids=ids, rows=cfg.table_rows)
    spec = tiny_spec(4_096, 2_048)
    exact, sampled = (
        l2model.predict(spec, cfg, trace, ["triton", "hot-l2"], l2model.PredictConfig(sample=r))
        for r in (1.0, 0.25)
    )
    for e, s in zip(exact.variants, sampled.variants, strict=True):
        assert s.hit_rate == pytest.approx(e.hit_rate, abs=0.03), e.variant
        assert s.dram_bytes_per_batch == pytest.approx(e.dram_bytes_per_batch, rel=0.1)
        assert s.l2_bytes_per_batch == e.l2_bytes_per_batch  # counted exactly, not sampled


def test_time_bounds_add_per_launch_and_take_the_larger_bandwidth() -> None:
    cfg, trace = tiny_case(32)
    pred = l2model.predict(tiny_spec(40, 20), cfg, trace, ["torch", "triton"])
    torch_v, triton_v = pred.variants
    assert torch_v.time_lower_bound_ms == pytest.approx(
        sum(t.time_lower_bound_ms for t in torch_v.tables)
    )
    dram = sum(t.dram_bytes for t in triton_v.tables) / 100e9
    l2 = sum(t.l2_bytes for t in triton_v.tables) / 1000e9
    assert triton_v.time_lower_bound_ms == pytest.approx(max(dram, l2) * 1e3)
    assert triton_v.l2_bytes_per_batch >= triton_v.dram_bytes_per_batch > 0
    assert [t.lookups for t in triton_v.tables] == [40, 24, 16]
    # fp16 tables: the Triton kernels read half the bytes, the reference its float32 copies
    half = l2model.PredictConfig(dtype="fp16")
    pred16 = l2model.predict(tiny_spec(40, 20), cfg, trace, ["torch", "triton"], half)
    torch16, triton16 = pred16.variants
    assert torch16.l2_bytes_per_batch == torch_v.l2_bytes_per_batch
    rows = sum(t.lookups for t in triton_v.tables) * 32 * 4
    assert triton_v.l2_bytes_per_batch - triton16.l2_bytes_per_batch == rows / 2


# -- row formats and kernel traits ------------------------------------------------------------


def test_int8_rows_take_their_real_size_in_every_layout() -> None:
    cfg, trace = tiny_case(32)
    rb = row_bytes("int8", 32)
    assert rb == 32 + 4
    acc = l2layout.accesses(cfg, trace, 3)
    hot = l2layout.hot_rows(cfg, trace, 4)
    # per-table allocations (FBGEMM's rows, scale and bias in front): rows back to back
    starts = np.cumsum([0, *(-(-r * rb // 512) * 512 for r in cfg.table_rows[:-1])])
    addr = l2layout.row_addresses("tables", acc, cfg.table_rows, rb, hot)
    assert np.array_equal(addr, starts[acc.table] + acc.row * rb)
    # a 132-byte row at 132 reads sectors 4-7 of line 1 and sector 0 of line 2
    s = l2layout.line_stream(np.array([0, 132]), 132, tiny_spec(8, 4))
    assert (s.unit.tolist(), np.asarray(s.nbytes).tolist()) == ([0, 1, 1, 2], [128, 32, 128, 32])
    # the reference reads float32 copies whatever the format, the others the format's bytes
    opts = l2model.PredictConfig(dtype="int8", batches=3, engine="numpy")
    names = ["torch", f"{__name__}:UserTables", f"{__name__}:UserCombined"]
    torch_v, tables_v, combined_v = l2model.predict(
        tiny_spec(40, 20), cfg, trace, names, opts
    ).variants
    assert (torch_v.row_bytes, tables_v.row_bytes, combined_v.row_bytes) == (128, rb, rb)
    fp32 = l2model.predict(tiny_spec(40, 20), cfg, trace, ["torch"], replace(opts, dtype="fp32"))
    assert torch_v.l2_bytes_per_batch == fp32.variants[0].l2_bytes_per_batch


@pytest.mark.parametrize(
    ("fmt", "persisting", "dim"),
    [("int8", 0, 32), ("int8", 30, 32), ("int4", 30, 32), ("int8", 30, 40), ("int8", 30, 256)],
)  # codes of a quarter line, a half, rows across lines, two whole lines
def test_quantized_rows_in_one_buffer_equal_a_line_by_line_lru(
    fmt: str, persisting: int, dim: int
) -> None:
    # RowBuffer's layout: codes from a line boundary, each row's scale and bias in a block before
    cfg, trace = tiny_case(dim)
    codes = row_bytes(fmt, dim) - 4
    spec = tiny_spec(48, persisting)
    opts = l2model.PredictConfig(dtype=fmt, batches=3, engine="numpy", hot_rows_per_table=4)
    names = [f"{__name__}:UserCombined", USER]
    plain, pinned = l2model.predict(spec, cfg, trace, names, opts).variants
    assert plain.hit_rate == pytest.approx(
        expected_hit_rate(cfg, trace, 0, 48, codes=codes), abs=1e-12
    )
    hot = l2layout.hot_rows(cfg, trace, 4)
    carve = min(12 * row_bytes(fmt, dim), persisting * LINE)
    assert pinned.carve_out_bytes == carve
    want = expected_hit_rate(cfg, trace, 0, 48 - -(-carve // LINE), carve // row_bytes(fmt, dim),
                             hot, codes=codes)  # fmt: skip
    assert pinned.hit_rate == pytest.approx(want, abs=1e-12)
    assert (pinned.pinned_share > 0) == (persisting > 0)


def test_smaller_rows_hit_at_least_as_often_at_every_carve_out() -> None:
    cfg, trace = tiny_case(32)
    spec = tiny_spec(48, 30)
    opts = l2model.PredictConfig(batches=3, engine="numpy")
    sweep = l2sweep.sweep_formats(spec, cfg, trace, ["fp32", "fp16", "int8", "int4"],
                                  (0.0, 0.5, 1.0), opts, USER)  # fmt: skip
    assert [f.row_bytes for f in sweep] == [128, 64, 36, 20]
    rates = np.array([[p.hit_rate for p in f.points] for f in sweep])
    assert np.all(np.diff(rates, axis=0) >= 0), rates  # down the formats, at each carve-out
    assert rates[0, 0] < rates[-1, -1]
    assert [p.carve_out_bytes for p in sweep[0].points] == [0, 1920, 3840]
    assert all(p.pinned_share == 0 for p in (f.points[0] for f in sweep))
    # whole-line rows: the hot rows past the carve-out are only renamed, as sweep_carve_out has it
    sized = l2sweep.sweep_carve_out(spec, cfg, trace, (0.5, 1.0), opts, variant=USER)
    assert [v.hit_rate for v in sized] == pytest.approx(rates[0, 1:].tolist(), abs=1e-12)
    assert sweep[0].to_json()["hit_rate"] == rates[0].tolist()


def test_variants_come_from_the_registry_traits() -> None:
    own = l2layout.default_variants("fp32")
    assert {"torch", "torch-hot"} <= set(own) and own[0] == "torch"
    assert all(not l2layout.variant_traits(n).peer for n in own)
    assert all(
        l2layout.variant_traits(n).pins_l2 for n in own[own.index(l2sweep.pinning_variant()) :]
    )
    with pytest.raises(
        ConfigError, match=r"no L2 model; modelled: the registered kernels \(.*torch"
    ):
        l2model.check_variants(["nope"])
    with pytest.raises(ConfigError, match="variant 'no_such_module:K'"):
        l2model.check_variants(["no_such_module:K"])
    with pytest.raises(ConfigError, match="does not read int8 rows"):
        l2model.check_variants([f"{__name__}:UserUntraited"], "int8")
    with pytest.raises(ConfigError, match="dtype: 'int9' is not a row format; allowed: fp32"):
        l2model.PredictConfig(dtype="int9")  # type: ignore[arg-type]
    # a peer is modelled when named, never by default
    KERNELS.register("test-peer", traits=KernelTraits(layout="combined", peer="torch"))(UserPinned)
    try:
        assert "test-peer" not in l2layout.default_variants("fp32")
        cfg, trace = tiny_case(32)
        (v,) = l2model.predict(tiny_spec(40, 20), cfg, trace, ["test-peer"]).variants
        (t,) = l2model.predict(tiny_spec(40, 20), cfg, trace, [f"{__name__}:UserCombined"]).variants
        assert (v.layout, v.hit_rate) == ("combined", t.hit_rate)
    finally:
        KERNELS.unregister("test-peer")


# -- the bundled trace against `recperf embed stats` --------------------------------------------


@pytest.fixture(scope="module")
def bundled() -> traces.Trace:
    return traces.resolve("reuse-medium-500k")


def test_pinning_the_top_k_rows_hits_exactly_the_top_k_coverage(bundled: traces.Trace) -> None:
    # one pass of the trace is one batch (3 bags of 143,317 ids = 429,951); an L2 that is all
    # carve-out, holding the k hottest rows, hits exactly the accesses those rows take
    k = 60_000
    cfg = EmbedConfig(name="one", table_rows=(500_000,), dim=32, pooling_factors=(143_317,),
                      batch_size=3)  # fmt: skip
    spec = tiny_spec(k, k)
    opts = l2model.PredictConfig(hot_rows_per_table=k, engine="numpy")
    (v,) = l2model.predict(spec, cfg, bundled, ["hot-l2"], opts).variants
    stats = locality.stats(bundled, top_k=k)
    assert v.hit_rate == pytest.approx(stats.top_k_coverage, abs=1e-12)
    assert v.pinned_share == v.hit_rate


def test_lru_hits_against_the_reuse_histogram(bundled: traces.Trace) -> None:
    # a reuse's stack distance (distinct rows between) is at most its reuse distance (accesses
    # between): an LRU of 2**j rows hits at least the reuses closer than 2**j, and an LRU that
    # holds every row misses only the first accesses
    ids = bundled.ids[0].numpy()
    d = stackdist.stack_distances(ids, engine="numpy")
    stats = locality.stats(bundled)
    hist = np.cumsum(stats.reuse_distance_hist)
    for j in (4, 10, 16):
        assert stackdist.hits_by_capacity(d, [2**j])[0] >= hist[j]
    assert stackdist.hits_by_capacity(d, [500_000])[0] == stats.accesses - stats.cold_accesses


# -- specs --------------------------------------------------------------------------------------


def test_bundled_specs_load_with_a_source_for_every_number() -> None:
    specs = gpus.bundled()
    assert [s.name for s in specs] == list(gpus.BUNDLED)
    for s in specs:
        assert s.unsourced() == [], s.name
        assert 0 < s.persisting_l2_max_bytes <= s.l2_bytes and s.line_bytes == 128
    assert gpus.load("a100-40gb").persisting_l2_max_bytes == 30 * 2**20
    assert gpus.for_device("NVIDIA A100-SXM4-80GB").name == "a100-80gb"  # type: ignore[union-attr]
    assert gpus.for_device("NVIDIA H200").name == "h200"  # type: ignore[union-attr]
    assert gpus.for_device("NVIDIA L40S") is None


SPEC = """device = "x"
l2_bytes = 1048576
persisting_l2_max_bytes = 524288
dram_gb_per_s = 100.0
l2_gb_per_s = 500.0
sm_count = 4
"""


@pytest.mark.parametrize(
    ("line", "becomes", "message"),
    [
        ("", "", None),
        ("sm_count = 4", "", "missing required key 'sm_count'"),
        ("sm_count = 4", "sm_count = 4\nwarp = 1", "unknown key 'warp'"),
        ("sm_count = 4", "sm_count = 4\nsm_count = 5", "invalid TOML"),
        ("sm_count = 4", "sm_count = 4\nline_bytes = 96", "line_bytes = 96: expected a power"),
        ("sm_count = 4", "sm_count = 4\nsector_bytes = 0", "sector_bytes = 0 is outside"),
        ("sm_count = 4", "sm_count = 'many'", "sm_count: expected an integer"),
        ("persisting_l2_max_bytes = 524288", "persisting_l2_max_bytes = 2097152",
         "persisting_l2_max_bytes = 2097152 is outside"),
        ("dram_gb_per_s = 100.0", "dram_gb_per_s = 0.0", "dram_gb_per_s = 0.0 is outside"),
        ("sm_count = 4", "sm_count = 4\n[sources]\nwarp = 'x'", "[sources] 'warp'"),
    ],
)  # fmt: skip
def test_spec_files_are_validated(
    tmp_path: Path, line: str, becomes: str, message: str | None
) -> None:
    path = tmp_path / "my-gpu.toml"
    path.write_text(SPEC.replace(line + "\n", becomes + "\n") if line else SPEC)
    if message is None:
        spec = gpus.load(path)
        assert (spec.name, spec.l2_lines, spec.carve_out(10**9)) == ("my-gpu", 8192, 524288)
        return
    with pytest.raises(ConfigError) as err:
        gpus.load(path)
    assert message in str(err.value) and str(err.value).count("\n") == 0


def test_bad_gpu_names_and_predict_options() -> None:
    with pytest.raises(ConfigError, match="expected one of a100-40gb"):
        gpus.load("h300")
    with pytest.raises(ConfigError, match="no such file"):
        gpus.load("/no/such.toml")
    with pytest.raises(ConfigError, match="persisting_l2_max_bytes"):
        replace(tiny_spec(8, 4), persisting_l2_max_bytes=10**9)
    with pytest.raises(ConfigError, match="warmup"):
        l2model.PredictConfig(batches=2, warmup=2)
    with pytest.raises(ConfigError, match="no L2 model"):
        l2model.check_variants(["fbgemm"])


# -- the CLI ------------------------------------------------------------------------------------

runner = CliRunner()


def test_predict_cli_json_table_and_figure(tmp_path: Path) -> None:
    spec = tmp_path / "gpu.toml"
    spec.write_text(SPEC)
    fig = tmp_path / "fig.html"
    args = ["predict", "--gpu", str(spec), "--config", "small", "--trace", "reuse-high",
            "--batch-size", "16", "--variants", "triton,hot-l2"]  # fmt: skip
    res = runner.invoke(app, [*args, "--json", "--figure", str(fig)])
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["model"] == l2model.MODEL_NOTE and "set associativity" in data["leaves_out"]
    assert [v["variant"] for v in data["variants"]] == ["triton", "hot-l2"]
    assert data["gpu"]["name"] == "gpu" and data["batch_size"] == 16
    hot = data["variants"][1]
    assert hot["carve_out_bytes"] == 524288 and 0 < hot["pinned_share"] <= 1
    assert 0 < hot["hit_rate"] <= 1 and hot["dram_bytes_per_batch"] > 0
    assert "Model: L2 hit rate" in fig.read_text()
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "MODEL (not measured)" in res.stdout
    assert "A model, not a measurement." in res.stderr


def test_predict_cli_bad_input_is_one_line() -> None:
    for args, message in [
        (["--gpu", "h300"], "--gpu 'h300'"),
        (["--gpu", "h200", "--variants", "torch,nope"], "variant 'nope'"),
        (["--gpu", "h200", "--sample", "0"], "sample = 0.0"),
        (["--gpu", "h200", "--config", "huge"], "config 'huge'"),
        (["--gpu", "h200", "--dtype", "int9"], "allowed: fp32, fp16, bf16, fp8, int8, int4"),
        (["--gpu", "h200", "--variants", "no_such_module:K"], "variant 'no_such_module:K'"),
    ]:
        res = runner.invoke(app, ["predict", *args])
        assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
        assert message in res.stderr


# -- the report's part ---------------------------------------------------------------------------


def test_report_puts_a_gpu_runs_times_beside_the_bounds() -> None:
    from recperf.report import embed_l2

    variants = [
        {"variant": "triton", "ms_per_batch": 0.5},
        {"variant": "fbgemm", "ms_per_batch": 1},
    ]
    run = {"device": "NVIDIA H200", "config": "small",
           "runs": [{"trace": "reuse-high", "batch_size": 32, "variants": variants},
                    {"trace": "uniform", "skipped": "time budget"}]}  # fmt: skip
    data = embed_l2.model_for_report(True, run)
    (pred,) = data["predictions"]
    assert (pred["gpu"]["name"], pred["config"], pred["trace"]) == ("h200", "small", "reuse-high")
    assert pred["sample"] == embed_l2.QUICK_SAMPLE and data["measured"] is run
    assert (pred["batch_size"], pred["dtype"]) == (32, "fp32")
    (row,) = embed_l2.side_by_side(pred, run["runs"][0])
    bound = next(v for v in pred["variants"] if v["variant"] == "triton")["time_lower_bound_ms"]
    assert row["variant"] == "triton" and row["measured_over_bound"] == pytest.approx(0.5 / bound)
    page = embed_l2.l2_html(data)
    assert "beside the model&#x27;s lower bound" in page and "A model, not a measurement." in page
    assert page.count('class="rp-figure"') == 2 and "set associativity" in page
    # the carve-out by row format, on the run's device: the quick one's formats and carve-outs
    by_format = data["by_format"]
    assert by_format["gpu"]["name"] == "h200" and by_format["unread"] == []
    assert (by_format["config"], by_format["trace"]) == ("small", "reuse-high")
    assert [(c["row_format"], c["row_bytes"]) for c in by_format["formats"]] == [
        ("fp32", 128),
        ("int8", 36),
    ]
    persisting = gpus.load("h200").persisting_l2_max_bytes
    for c in by_format["formats"]:
        # the small tables' rows all fit: the last carve-out is all of them
        rows = sum(config("small").table_rows)
        assert c["carve_out_bytes"] == [0, min(persisting, rows * c["row_bytes"])]
        assert c["pinned_share"][0] == 0 < c["pinned_share"][-1]
    assert 'id="embed-l2model-formats"' in page and "will pinning pay by row format?" in page
    fig = embed_l2.carve_out_figure(by_format)
    assert [t.name for t in fig.data] == ["fp32 (128 B rows)", "int8 (36 B rows)"]
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text and fig.layout.title.text
    bad = embed_l2.model_for_report(
        True, {**run, "runs": [{"trace": "nope", "variants": variants}]}
    )
    assert "unknown trace 'nope'" in bad["error"]
    assert embed_l2.l2_html({"error": "<b>"}) == "<p>L2 model not run: &lt;b&gt;</p>"
