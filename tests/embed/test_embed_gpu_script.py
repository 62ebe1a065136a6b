"""The GPU benchmark script (``benchmarks/embed_gpu.py``) on the CPU, Triton interpreted: its
format sweep measures every (row format, variant) on tiny shapes, counts each format's bytes at
its row size and checks every output against the reference; its arguments parse."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from recperf.embed.bench import bench_trace, make_lookups
from recperf.embed.model import EmbedConfig, random_tables
from recperf.embed.timing import lookup_bytes

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "embed_gpu.py"
TINY = EmbedConfig(name="tiny", table_rows=(40, 24), dim=8, pooling_factors=(3, 2), batch_size=2)


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("embed_gpu_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


def test_format_sweep_measures_every_format_and_variant(script: ModuleType) -> None:
    formats = ["fp32", "int8", "int4"]
    sweep = script.format_sweep(
        TINY, "uniform", ["triton", "combined"], formats, params={"combined": {"prefetch": 2}},
        device="cpu", reps=1, inputs=2,
    )  # fmt: skip
    rows = sweep["rows"]
    assert [(r["format"], r["variant"]) for r in rows] == [
        (f, v) for f in formats for v in ("triton", "combined")
    ]
    lookup = make_lookups(TINY, bench_trace(TINY, "uniform"), 1, "cpu")[0]
    n = int(lookup.indices.numel())
    rest = lookup_bytes(lookup, TINY.dim, 0, TINY.num_tables)
    row_bytes = {"fp32": 32, "int8": 8 + 4, "int4": 4 + 4}  # int8/int4: codes, scale and bias
    for r in rows:
        assert r["matches_reference"], r
        assert r["row_bytes"] == row_bytes[r["format"]]
        assert r["bytes_per_batch"] == rest + n * row_bytes[r["format"]]
        assert r["gb_per_s"] == pytest.approx(r["bytes_per_batch"] / r["ms_per_batch"] / 1e6)
        pct = 100 * r["gb_per_s"] / sweep["copy_gb_per_s"]
        assert r["pct_of_copy_bw"] == pytest.approx(pct)
    assert rows[2]["params"] == {} and rows[3]["params"] == {"prefetch": 2}
    err = {r["format"]: r["max_err_vs_fp32_of_max"] for r in rows if r["variant"] == "triton"}
    assert err["fp32"] < 1e-6 < err["int8"] < err["int4"] < 0.2  # 8 bits lose less than 4


def test_format_sweep_starts_no_format_past_its_deadline(script: ModuleType) -> None:
    sweep = script.format_sweep(TINY, "uniform", ["triton"], ["int8", "int4"], params={},
                                device="cpu", reps=1, inputs=1, deadline=0.0)  # fmt: skip
    assert sweep["rows"] == [
        {"format": "int8", "skipped": "time budget"},
        {"format": "int4", "skipped": "time budget"},
    ]


def test_quantized_tables_keep_the_shapes_and_pooling(script: ModuleType) -> None:
    base = random_tables(TINY, torch.float32, "cpu", 0)
    tables = script.quantized_tables(base, "int4")
    assert (tables.row_format, tables.dim, tables.rows, tables.pooling) == (
        "int4", 8, (40, 24), base.pooling,
    )  # fmt: skip
    assert tables.scale_bias is not None and script.quantized_tables(base, "fp8").scale_bias is None


def test_arguments_parse_and_a_bad_format_is_one_line(
    script: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["embed_gpu.py", "--help"])
    with pytest.raises(SystemExit) as done:
        script.main()
    assert done.value.code == 0 and "--formats-trace" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["embed_gpu.py", "--formats", "int8,int9"])
    with pytest.raises(SystemExit) as done:
        script.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2
    assert err[-1].endswith("--formats: 'int9' is not a row format; allowed: fp32, fp16, bf16, "
                            "fp8, int8, int4")  # fmt: skip
