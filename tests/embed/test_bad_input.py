"""Bad input to ``recperf embed``: each case is one error line naming what is wrong and the
allowed values, exit code 2, no traceback, and nothing computed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from recperf.cli.embed import app

cli = CliRunner()
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a build without CUDA")


def one_line_error(args: list[str]) -> str:
    res = cli.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error: ")
    return lines[0].removeprefix("error: ")


@CPU_ONLY
@pytest.mark.parametrize("command", ["check", "bench"])
def test_cuda_on_a_cpu_only_build(command: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    message = one_line_error([command, "--device", "cuda", "--out", str(out)])
    assert message == (
        f"--device cuda: CUDA is not available (torch {torch.__version__}, a CPU-only build); "
        "use --device cpu"
    )
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("command", ["check", "bench"])
@pytest.mark.parametrize("device", ["tpu", "", "cuda:x"])
def test_unknown_device(command: str, device: str) -> None:
    message = one_line_error([command, "--device", device])
    assert message == f"--device {device!r}: expected cpu, cuda or cuda:N"


@pytest.mark.parametrize("reps", ["0", "-3"])
def test_bench_reps_must_be_at_least_one(reps: str) -> None:
    assert one_line_error(["bench", "--reps", reps]) == f"reps = {reps}: expected an integer >= 1"


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        ("1\n1e23\n", 2, "'1e23': expected an integer row id in [0, 100,000,000)"),
        ("1\n100000000000000000000000\n", 2,
         "row id 100000000000000000000000: expected an integer row id in [0, 100,000,000)"),
        ("-1\n", 1, "row id -1: expected an integer row id in [0, 100,000,000)"),
        ("1\nnan\n", 2, "'nan': expected an integer row id in [0, 100,000,000)"),
    ],
)  # fmt: skip
def test_trace_ids_are_integers_within_the_rows(
    tmp_path: Path, text: str, line: int, why: str
) -> None:
    path = tmp_path / "odd [x] é.txt"
    path.write_text(text)
    assert one_line_error(["stats", "--trace", str(path)]) == f"{path}:{line}: field 'row_id' {why}"


def test_trace_id_beyond_given_rows_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("1\n2\n9\n")
    message = one_line_error(["stats", "--trace", str(path), "--rows", "5"])
    assert message == f"{path}:3: field 'row_id' row id 9: expected an integer row id in [0, 5)"


@pytest.mark.parametrize("rows", ["0", "-5", "1000000000000"])
@pytest.mark.parametrize("trace", ["uniform", "zipf:1.0", "reuse-medium-500k"])
def test_stats_rows_out_of_range_is_an_error_not_the_default(trace: str, rows: str) -> None:
    message = one_line_error(["stats", "--trace", trace, "--rows", rows])
    assert message == f"rows = {rows}: expected 1..100,000,000 (not given: the default)"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["stats", "--trace", "zipf:nan"], "zipf alpha must be in [0, 10], got nan"),
        (["stats", "--trace", "zipf:inf"], "zipf alpha must be in [0, 10], got inf"),
        (["stats", "--trace", "zipf:-1"], "zipf alpha must be in [0, 10], got -1.0"),
        (["bench", "--trace", "zipf:nan"], "zipf alpha must be in [0, 10], got nan"),
        (["stats", "--trace", "zipf:"], "trace 'zipf:': alpha must be a number, e.g. zipf:1.05"),
    ],
)
def test_non_finite_trace_parameters(args: list[str], message: str) -> None:
    assert one_line_error(args) == message


def test_bench_bad_trace_file_is_one_line_before_the_work(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("3\n1e23\n")
    message = one_line_error(["bench", "--trace", str(path), "--reps", "1"])
    assert (
        message
        == f"{path}:2: field 'row_id' '1e23': expected an integer row id in [0, 100,000,000)"
    )


def test_quantize_bad_input_is_one_line(tmp_path: Path) -> None:
    odd = tmp_path / "odd.pt"
    torch.save([torch.ones(4, 2), torch.ones(5, 3)], odd)
    assert one_line_error(["quantize", "--tables", str(odd), "--dtype", "int4"]) == (
        "tables[1] dim: int4 packs two columns per byte; 3 is odd"
    )
    assert one_line_error(["quantize", "--dtype", "int3"]).startswith(
        "--dtype: 'int3' is not a row format; allowed: fp32, fp16, bf16, fp8, int8, int4"
    )
    ints = tmp_path / "ints.pt"
    torch.save([torch.ones(4, 2, dtype=torch.int64)], ints)
    assert one_line_error(["quantize", "--tables", str(ints)]) == (
        f"--tables {ints}: tables[0]: expected a 2-D float32, float16 or bfloat16 tensor, "
        "got (4, 2) torch.int64"
    )
    junk = tmp_path / "junk.pt"
    junk.write_text("not a tensor file")
    assert one_line_error(["quantize", "--tables", str(junk)]).startswith(
        f"--tables {junk}: not a torch.save file of tensors: "
    )
    nan = tmp_path / "nan.pt"
    torch.save({"t": torch.tensor([[1.0, float("inf")]])}, nan)
    assert one_line_error(["quantize", "--tables", str(nan)]) == (
        "table 't' weight: holds NaN or infinite values, which no row format can scale"
    )
    missing = one_line_error(["quantize", "--tables", str(tmp_path / "none.pt")])
    assert missing.startswith(f"--tables {tmp_path / 'none.pt'}: ")
    assert one_line_error(["quantize", "--save"]) == (
        "--save: needs --out DIR to write the quantized tables into"
    )
    assert one_line_error(["quantize", "--tables", str(odd), "--config", "small"]) == (
        "--tables, --config: give one (your tables, or a configuration's)"
    )
    assert one_line_error(["quantize", "--bags", "0"]) == (
        "bags = 0 is outside the allowed range [1, inf]"
    )
    assert one_line_error(["quantize", "--pooling-factor", "0"]) == (
        "pooling_factor = 0 is outside the allowed range [1, inf]"
    )
    assert one_line_error(["quantize", "--bags", "100000000000000000000"]) == (
        "bags x pooling_factor = 100,000,000,000,000,000,000 x 20 ids a table; at most 10,000,000"
    )
    assert one_line_error(["quantize", "--seed", "-1"]) == (
        "seed = -1 is outside the allowed range [0, inf]"
    )
