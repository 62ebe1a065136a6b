"""Bad input to ``recperf ingest``: each case is one error line naming what is wrong and what is
allowed, exit code 2, no traceback, and nothing written that looks like a result."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.ingest.data.criteo import SCHEMA, GenerateConfig, generate

runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bad-input")
    generate(GenerateConfig(rows=8_000, seed=3), out)
    return out


def fails(*args: str) -> str:
    """Run the CLI; assert exit 2 with exactly one line and no traceback; return that line."""
    res = runner.invoke(app, ["ingest", *args])
    text = res.stdout + res.stderr
    assert res.exit_code == 2, text
    assert "Traceback" not in text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("value", "why"),
    [("nan", "nan: expected a finite number in (0, 86400]"),
     ("inf", "inf: expected a finite number in (0, 86400]"),
     ("0", "0.0 is outside the allowed range (0, 86400]"),
     ("-1", "-1.0 is outside the allowed range (0, 86400]")],
)  # fmt: skip
def test_run_seconds(data: Path, value: str, why: str) -> None:
    assert fails("run", "--data", str(data), "--seconds", value) == f"error: seconds = {why}"


def test_run_cores_zero_is_not_all_cores(data: Path) -> None:
    line = fails("run", "--data", str(data), "--seconds", "0.5", "--cores", "0")
    assert line == "error: cores = 0: expected 1..1024, or leave it out for all cores"


def test_run_downsample_rate_nan_is_refused_up_front(data: Path) -> None:
    line = fails("run", "--data", str(data), "--seconds", "0.5", "--downsample-rate", "nan")
    assert line == "error: pipeline: downsample_rate: expected a finite number, got nan"


def test_pipeline_config_refuses_nan_built_directly() -> None:
    from recperf.core.errors import ConfigError
    from recperf.ingest.live.batch import PipelineConfig

    with pytest.raises(ConfigError, match=r"downsample_rate = nan: expected a finite number"):
        PipelineConfig(downsample_rate=float("nan"))
    with pytest.raises(ConfigError, match=r"memory_budget_gib = inf: expected a finite number"):
        PipelineConfig(memory_budget_gib=float("inf"))


def test_run_directory_without_shards(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("no data here")
    line = fails("run", "--data", str(tmp_path), "--seconds", "0.5")
    assert line == f"error: {tmp_path}: no .parquet, .tsv or .txt files in directory"


def test_run_dataset_with_zero_rows(tmp_path: Path) -> None:
    pq.write_table(SCHEMA.empty_table(), tmp_path / "part-00000.parquet")
    assert fails("run", "--data", str(tmp_path), "--seconds", "0.5") == (
        f"error: {tmp_path}: no rows to read"
    )


def test_run_directory_mixing_parquet_and_tsv_shards(data: Path, tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    generate(GenerateConfig(rows=500, seed=3, format="tsv"), mixed)
    shutil.copy(next(data.glob("*.parquet")), mixed / "part-00001.parquet")
    line = fails("run", "--data", str(mixed), "--seconds", "0.5")
    assert line == (
        f"error: {mixed}: mixes Parquet shards (part-00001.parquet) and text shards "
        "(part-00000.tsv); keep one format per directory"
    )


def test_run_directory_with_a_dangling_shard_link(data: Path, tmp_path: Path) -> None:
    linked = tmp_path / "linked"
    linked.mkdir()
    shutil.copy(next(data.glob("*.parquet")), linked / "part-00000.parquet")
    (linked / "part-00001.parquet").symlink_to(tmp_path / "gone.parquet")
    line = fails("run", "--data", str(linked), "--seconds", "0.5")
    assert line == (
        f"error: {linked / 'part-00001.parquet'}: a symbolic link to "
        f"'{tmp_path / 'gone.parquet'}', which does not exist"
    )


def _tsv_gz(tmp_path: Path, rows: int = 3_000) -> Path:
    src = tmp_path / "src"
    generate(GenerateConfig(rows=rows, format="tsv", gzip=True, seed=1), src)
    return src / "part-00000.tsv.gz"


def test_run_corrupt_gzip_names_the_file(tmp_path: Path) -> None:
    raw = bytearray(_tsv_gz(tmp_path).read_bytes())
    for i in range(2000, 2400):
        raw[i] ^= 0x55
    bad = tmp_path / "bad dir [1] é"
    bad.mkdir()
    (bad / "part-00000.tsv.gz").write_bytes(bytes(raw))
    line = fails("run", "--data", str(bad), "--seconds", "0.5")
    assert line.startswith(f"error: {bad / 'part-00000.tsv.gz'}: cannot read: ")


def test_run_bad_row_in_a_worker_names_file_line_and_field(tmp_path: Path) -> None:
    lines = gzip.decompress(_tsv_gz(tmp_path).read_bytes()).split(b"\n")
    fields = lines[1500].split(b"\t")
    fields[3] = b"abc"  # I3
    lines[1500] = b"\t".join(fields)
    path = tmp_path / "bad.tsv.gz"
    path.write_bytes(gzip.compress(b"\n".join(lines)))
    line = fails("run", "--data", str(path), "--seconds", "0.5", "--batch-size", "500")
    assert line == f"error: {path}:1501: field 'I3' not an integer: 'abc'"


def test_generate_zipf_exponent_nan(tmp_path: Path) -> None:
    line = fails("generate", "--rows", "100", "--out", str(tmp_path / "g"), "--zipf-exponent",
                 "nan")  # fmt: skip
    assert line == "error: zipf_exponent = nan: expected a finite number in (0, 10]"
    assert not (tmp_path / "g" / "manifest.json").exists()


@pytest.mark.parametrize(
    ("rows", "why"),
    [("1e12", "rows = 1000000000000 is outside the allowed range [1, 1e+10]"),
     ("0", "rows = 0 is outside the allowed range [1, 1e+10]"),
     ("-5", "rows = -5 is outside the allowed range [1, 1e+10]"),
     ("abc", "--rows 'abc': expected a whole number of rows, 1..1e+10"),
     ("1.5", "--rows '1.5': expected a whole number of rows, 1..1e+10"),
     ("nan", "--rows 'nan': expected a whole number of rows, 1..1e+10")],
)  # fmt: skip
def test_generate_rows(tmp_path: Path, rows: str, why: str) -> None:
    assert fails("generate", "--rows", rows, "--out", str(tmp_path / "g")) == f"error: {why}"


def test_generate_more_rows_than_the_disk_holds(tmp_path: Path) -> None:
    line = fails("generate", "--rows", "1e10", "--format", "tsv", "--out", str(tmp_path / "g"))
    assert line.startswith("error: rows = 10,000,000,000 needs at least 1,862.6 GiB of tsv")
    assert line.endswith("GiB free")


def test_generate_rows_in_exponent_form_works(tmp_path: Path) -> None:
    res = runner.invoke(app, ["ingest", "generate", "--rows", "2e3", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.stderr
    assert pq.ParquetFile(tmp_path / "part-00000.parquet").metadata.num_rows == 2_000


def test_simulate_spec_memory_budget_nan(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text('cores = 4\nmemory_budget_gib = nan\n[[stage]]\nname = "a"\n'
                    "cost_us_per_row = 1.0\n")  # fmt: skip
    line = fails("simulate", "--spec", str(spec))
    assert line == f"error: {spec}: memory_budget_gib: expected a finite number, got nan"


@pytest.mark.parametrize(
    ("line", "why"),
    [("cost_us_per_row = 1e300", "stage[0] 'a': cost_us_per_row = 1e+300 is outside the "
      "allowed range [1e-06, 1e+09]"),
     ("cost_us_per_row = 1e-300", "stage[0] 'a': cost_us_per_row = 1e-300 is outside the "
      "allowed range [1e-06, 1e+09]"),
     ("cost_us_per_row = 1.0\nmemory_mib_per_worker = 1e300",
      "stage[0] 'a': memory_mib_per_worker = 1e+300 is outside the allowed range [0, 1e+09]")],
)  # fmt: skip
def test_simulate_spec_non_physical_stage(tmp_path: Path, line: str, why: str) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(f'cores = 4\nmemory_budget_gib = 8\n[[stage]]\nname = "a"\n{line}\n')
    assert fails("simulate", "--spec", str(spec)) == f"error: {spec}: {why}"


def test_simulate_at_the_slowest_allowed_cost_prints_its_rate(tmp_path: Path) -> None:
    spec = tmp_path / "slow.toml"
    spec.write_text('cores = 4\nmemory_budget_gib = 8\n[[stage]]\nname = "a"\n'
                    "cost_us_per_row = 1e9\n")  # fmt: skip
    res = runner.invoke(app, ["ingest", "simulate", "--spec", str(spec), "--tuner", "static"])
    assert res.exit_code == 0, res.output
    assert "0.004 rows/s = 1.000 of the LP bound (0.004)" in res.stderr


def test_a_fraction_of_a_zero_bound_is_none_not_one() -> None:
    from recperf.ingest.tuning import fraction

    assert fraction(0.0, 0.0) is None
    assert fraction(1.0, 4.0) == 0.25


def test_spec_built_directly_refuses_non_finite() -> None:
    from recperf.core.errors import ConfigError
    from recperf.ingest.sim.model import PipelineSpec, StageSpec

    with pytest.raises(ConfigError, match=r"cost_us_per_row = inf: expected a finite number"):
        StageSpec(name="a", cost_us_per_row=float("inf"))
    st = StageSpec(name="a", cost_us_per_row=1.0)
    with pytest.raises(ConfigError, match=r"memory_budget_gib = nan: expected a finite number"):
        PipelineSpec(cores=2, memory_budget_gib=float("nan"), stages=(st,))


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [("--budget-s", "nan", "budget_s = nan: expected a finite number in (0, 100000]"),
     ("--budget-s", "0", "budget_s = 0.0 is outside the allowed range (0, 100000]"),
     ("--budget-s", "-1", "budget_s = -1.0 is outside the allowed range (0, 100000]"),
     ("--noise", "nan", "noise = nan: expected a finite number in [0, 0.5]"),
     ("--noise", "-1", "noise = -1.0 is outside the allowed range [0, 0.5]")],
)  # fmt: skip
def test_simulate_numbers(flag: str, value: str, why: str) -> None:
    assert fails("simulate", "--spec", "criteo-16", flag, value) == f"error: {why}"


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [("--final-s", "0", "final_s = 0.0 is outside the allowed range (0, 86400]"),
     ("--budget-s", "nan", "budget_s = nan: expected a finite number in (0, 86400]"),
     ("--warmup-s", "nan", "warmup_s = nan: expected a finite number in [0, 86400]"),
     ("--cores", "0", "cores = 0: expected 1..1024, or leave it out for all cores")],
)  # fmt: skip
def test_tune_numbers(data: Path, tmp_path: Path, flag: str, value: str, why: str) -> None:
    out = tmp_path / "tuned"
    line = fails("tune", "--data", str(data), "--out", str(out), "--budget-s", "1", flag, value)
    assert line == f"error: {why}"
    assert not (out / "allocation.toml").exists()


def test_pretrain_zero_episodes(tmp_path: Path) -> None:
    line = fails("pretrain", "--episodes", "0", "--out", str(tmp_path / "w.pt"))
    assert line == "error: episodes = 0 is outside the allowed range [1, 1e+06]"
    assert not (tmp_path / "w.pt").exists()


@pytest.mark.parametrize(
    "args",
    [("simulate", "--spec", "criteo-16", "--budget-s", "5", "--seed", "-1"),
     ("pretrain", "--episodes", "1", "--seed", "-1", "--out", "{tmp}/w.pt")],
)  # fmt: skip
def test_negative_seed(tmp_path: Path, args: tuple[str, ...]) -> None:
    line = fails(*(a.format(tmp=tmp_path) for a in args))
    assert line == "error: seed = -1: seeds must be whole numbers from 0 to 2**63-1"


def test_run_negative_pipeline_seed(data: Path) -> None:
    line = fails("run", "--data", str(data), "--seconds", "0.5", "--seed", "-1")
    assert line == "error: pipeline: seed = -1: seeds must be whole numbers from 0 to 2**63-1"


def test_pretrain_out_is_a_directory(tmp_path: Path) -> None:
    line = fails("pretrain", "--episodes", "1", "--out", str(tmp_path))
    assert line == f"error: --out {tmp_path}: is a directory; expected the weights file to write"
