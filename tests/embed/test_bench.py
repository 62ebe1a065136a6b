"""The inference configurations and model adapter, batches from traces, the autotuner and its
cache, the benchmark and the `embed check` / `embed bench` commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.core.errors import ConfigError
from recperf.embed import autotune as at
from recperf.embed import traces
from recperf.embed.bench import bench, make_lookups
from recperf.embed.kernels import KERNELS
from recperf.embed.model import (
    MLPERF_MULTI_HOT,
    EmbedConfig,
    config,
    inference_model,
    lengths_for,
    random_tables,
)
from recperf.models.dlrm import DLRM

TINY = EmbedConfig(
    name="tiny",
    table_rows=(30, 7, 12),
    dim=5,
    pooling_factors=(3, 0, 2),
    batch_size=4,
    bottom_mlp=(8,),
    top_mlp=(8,),
)
cli = CliRunner()


def test_named_configs() -> None:
    paper = config("paper")
    assert paper.table_rows == (500_000,) * 12 and paper.dim == 128
    assert paper.pooling_factors == (150,) * 12 and paper.batch_size == 2048
    mlperf = config("mlperf", rows_cap=100_000)
    assert mlperf.num_tables == 26 and mlperf.pooling_factors == MLPERF_MULTI_HOT
    assert max(mlperf.table_rows) == 100_000 and min(mlperf.table_rows) == 3
    assert config("small", batch_size=8).batch_size == 8
    with pytest.raises(ConfigError, match="paper, mlperf, small"):
        config("huge")
    with pytest.raises(ConfigError, match="pooling_factors"):
        EmbedConfig(name="x", table_rows=(3,), dim=2, pooling_factors=(1, 1), batch_size=1)


def test_kernel_stage_in_the_shared_dlrm_equals_its_own_embedding_bags() -> None:
    tables = random_tables(TINY, torch.float32, "cpu", seed=1)
    for name in ("torch", "torch-hot", "triton"):
        model = inference_model(TINY, KERNELS.build(name, None, tables))
        plain = DLRM(TINY.dlrm()).eval()
        plain.load_state_dict({k: v for k, v in model.state_dict().items()}, strict=False)
        for bag, w in zip(plain.embeddings.bags, tables.weights, strict=True):  # type: ignore[union-attr, arg-type]
            bag.weight.data.copy_(w)
        lengths = lengths_for(TINY, "cpu")
        values = torch.cat(
            [
                torch.randint(0, rows, (TINY.batch_size * per_bag,))
                for rows, per_bag in zip(TINY.table_rows, TINY.pooling_factors, strict=True)
            ]
        )
        dense = torch.rand(TINY.batch_size, 13)
        with torch.no_grad():
            torch.testing.assert_close(model(dense, values, lengths), plain(dense, values, lengths))


def test_batches_follow_each_tables_stream() -> None:
    trace = traces.Trace(name="t", ids=(torch.arange(50) % 40, torch.arange(50)), rows=(40, 50))
    a, b = make_lookups(TINY, trace, 2, "cpu")
    assert a.offsets.tolist() == [0, 3, 6, 9, 12, 12, 12, 12, 12, 14, 16, 18, 20]
    assert a.indices[:12].tolist() == [i % 30 for i in range(12)]  # table 0 stream, mod its rows
    assert a.indices[12:].tolist() == [i % 12 for i in range(8)]  # table 2 takes stream 0 again
    assert b.indices[:12].tolist() == [i % 30 for i in range(12, 24)]


def test_bench_reports_every_variant_against_torch() -> None:
    result = bench(TINY, "zipf:1.1", ["torch-hot", "triton"], reps=3, seed=2)
    names = [v.variant for v in result.variants]
    assert names == ["torch", "torch-hot", "triton"]
    assert result.variants[0].speedup_vs_torch == 1.0
    assert all(v.max_abs_err < 1e-5 and v.ms_per_batch > 0 for v in result.variants)
    per_batch = 4 * 5 * 5 * 4 + 5 * 4 * 8 + 13 * 8 + 4 * 3 * 5 * 4  # rows, ids, offsets, output
    assert result.bytes_per_batch == per_batch and result.lookups_per_batch == 20
    assert set(result.stages_ms) == {"bottom_mlp", "embedding", "interaction", "top_mlp"}
    assert result.locality["accesses"] > 0
    with pytest.raises(ConfigError, match="variant 'nope'"):
        bench(TINY, "uniform", ["nope"])


def test_bench_builds_each_variant_with_its_options_and_rejects_bad_ones() -> None:
    result = bench(TINY, "uniform", ["triton"], reps=2, options={"triton": {"block_n": "8"}})
    assert [v.params for v in result.variants] == [{}, {"block_n": "8"}]
    assert result.variants[1].max_abs_err < 1e-5
    with pytest.raises(ConfigError, match=r"^embedding kernel 'triton': block_n = 3 is not one"):
        bench(TINY, "uniform", ["triton"], options={"triton": {"block_n": 3}})


def test_grid_spans_the_registered_space() -> None:
    space = KERNELS.entry("triton-prefetch").space
    points = at.grid("triton-prefetch")
    assert len(points) == len({tuple(sorted(p.items())) for p in points})
    assert len(points) == 5 * 4 * 4 * 4 * 2 and set(points[0]) == set(space)
    assert at.grid("torch") == [{}] and at.grid("triton", {"block_n": (8, 16)}) == [
        {"block_n": 8},
        {"block_n": 16},
    ]


def test_autotune_picks_the_fastest_correct_candidate_and_caches_it(tmp_path: Path) -> None:
    spaces = {"triton": {"block_d": (16, 32), "num_warps": (1,)}}
    tables = random_tables(TINY, torch.float32, "cpu", seed=0)
    trace = traces.resolve("uniform", rows=30, tables=3, lookups=100)
    lookups = make_lookups(TINY, trace, 2, "cpu")
    cache = tmp_path / "tune.json"

    def tune() -> at.TuneResult:
        return at.autotune(
            tables, lookups, variants=["triton"], trace="u", reps=2, cache=cache, spaces=spaces
        )

    first = tune()
    assert len(first.candidates) == 2 and not first.cached
    assert first.params in ({"block_d": 16, "num_warps": 1}, {"block_d": 32, "num_warps": 1})
    assert first.ms == min(c["ms"] for c in first.candidates)
    again = tune()
    assert again.cached and again.params == first.params
    key = at.cache_key(tables, lookups, "u", ["triton"], spaces=spaces)
    assert key.startswith("cpu|fp32|sum|T3|D5") and key in json.loads(cache.read_text())
    assert key != at.cache_key(tables, lookups, "u", ["triton"])  # another grid, another entry


def test_autotune_keeps_fixed_options_and_rejects_bad_ones_up_front(tmp_path: Path) -> None:
    tables = random_tables(TINY, torch.float32, "cpu", seed=0)
    lookups = make_lookups(
        TINY, traces.resolve("uniform", rows=30, tables=3, lookups=100), 1, "cpu"
    )
    result = at.autotune(
        tables,
        lookups,
        variants=["triton"],
        reps=1,
        cache=None,
        options={"triton": {"block_n": 8, "num_warps": 2}},
        spaces={"triton": {"num_warps": (1, 4)}},
    )
    assert [c["params"] for c in result.candidates] == [
        {"block_n": 8, "num_warps": 1},
        {"block_n": 8, "num_warps": 4},
    ]
    with pytest.raises(ConfigError, match=r"^embedding kernel 'triton': unknown key 'warps'"):
        at.autotune(
            tables, lookups, variants=["triton"], cache=None, spaces={"triton": {"warps": (1,)}}
        )


def test_cli_check_and_bench() -> None:
    res = cli.invoke(app, ["embed", "check", "--variants", "torch,torch-hot", "--json"])
    assert res.exit_code == 0, res.output
    assert [k["result"] for k in json.loads(res.stdout)["kernels"]] == ["ok", "ok"]
    res = cli.invoke(
        app,
        [
            "embed",
            "bench",
            "--config",
            "small",
            "--trace",
            "reuse-low",
            "--variants",
            "torch-hot",
            "--batch-size",
            "8",
            "--reps",
            "3",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["config"] == "small" and [v["variant"] for v in out["variants"]] == [
        "torch",
        "torch-hot",
    ]
    res = cli.invoke(app, ["embed", "bench", "--dtype", "int8"])
    assert res.exit_code == 2 and "--dtype 'int8'" in res.output


def test_an_unwritable_autotune_cache_fails_before_any_timing(tmp_path: Path) -> None:
    tables = random_tables(TINY, torch.float32, "cpu", seed=0)
    lookups = make_lookups(
        TINY, traces.resolve("uniform", rows=30, tables=3, lookups=100), 1, "cpu"
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    ticks: list[float] = []
    with pytest.raises(ConfigError, match=r"a-file/sub/tune\.json: cannot create its directory"):
        at.autotune(
            tables, lookups, variants=["torch"], reps=1, cache=blocker / "sub" / "tune.json",
            progress=ticks.append,
        )  # fmt: skip
    assert ticks == []  # nothing was timed
