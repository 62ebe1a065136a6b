"""The L2 model: stack distances give the hit counts of an exact LRU simulation at every size,
layouts are the kernels' own, pinning removes the pinned lines from the LRU and shrinks it by the
carve-out, the bundled trace agrees with ``recperf embed stats``, specs are validated, and the
``recperf embed predict`` CLI."""

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
from recperf.embed import gpus, l2layout, l2model, locality, stackdist, traces
from recperf.embed.kernels.torch_hot import hot_first_order
from recperf.embed.model import EmbedConfig

LINE = 128


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
) -> float:  # fmt: skip
    """Replay the batches line by line through an OrderedDict LRU, computing the combined or
    the hot-first buffer's addresses here (rows of the tables one after another)."""
    bases = np.concatenate([[0], np.cumsum(cfg.table_rows)[:-1]])
    pos = l2layout.hot_first_positions(cfg.table_rows, hot) if hot is not None else None
    per_batch = [cfg.batch_size * p for p in cfg.pooling_factors]
    lines, counted = [], []
    for k in range(batches):
        for t, n in enumerate(per_batch):
            stream = trace.ids[t].numpy()
            for j in range(k * n, (k + 1) * n):
                g = int(bases[t] + stream[j % stream.size] % cfg.table_rows[t])
                p = g if pos is None else int(pos[g])
                for line in range(p * row_bytes // LINE, ((p + 1) * row_bytes - 1) // LINE + 1):
                    pinned = (line + 1) * LINE <= pinned_rows * row_bytes
                    lines.append(-2 - line if pinned else line)
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
        replays = [l2model._replay(spec, acc, a, 128, 0, opts, None) for a in addrs]
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
    assert page.count('class="rp-figure"') == 1 and "set associativity" in page
    bad = embed_l2.model_for_report(
        True, {**run, "runs": [{"trace": "nope", "variants": variants}]}
    )
    assert "unknown trace 'nope'" in bad["error"]
    assert embed_l2.l2_html({"error": "<b>"}) == "<p>L2 model not run: &lt;b&gt;</p>"
