"""``recperf ingest run`` and ``recperf ingest tune``: the JSON contract, files, and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.ingest.data.criteo import GenerateConfig, generate

runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli-live")
    generate(GenerateConfig(rows=15_000, shards=2, seed=2), out)
    return out


def invoke(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_tune_then_run_with_the_tuned_allocation(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "tuned"
    code, stdout, _ = invoke("ingest", "tune", "--data", str(data), "--tuner", "static",
                             "--budget-s", "1.5", "--out", str(out), "--batch-size", "1000",
                             "--warmup-s", "0.3", "--final-s", "0.5", "--json")  # fmt: skip
    assert code == 0
    summary = json.loads(stdout)
    assert summary == json.loads((out / "summary.json").read_text())
    assert (
        summary["allocation"]["label"] == "read x1 | dense x1 | sparse x1 | shuffle x1 | collate x1"
    )
    assert summary["throughput_rows_per_s"] > 0
    assert 0 < summary["fraction_of_bound"] <= 1.5
    lo, hi = summary["throughput_ci_rows_per_s"]
    assert lo <= summary["throughput_rows_per_s"] <= hi and summary["samples"] >= 3
    assert summary["other_load_cores"] >= 0 and summary["tuning_other_load_cores"] >= 0
    steps = summary["history"]
    assert steps and all(h["samples"] >= 3 and len(h["throughput_ci_rows_per_s"]) == 2
                         for h in steps)  # fmt: skip
    code, stdout, stderr = invoke("ingest", "run", "--data", str(data), "--alloc",
                                  str(out / "allocation.toml"), "--batch-size", "1000",
                                  "--seconds", "0.5", "--json")  # fmt: skip
    assert code == 0, stderr
    ran = json.loads(stdout)
    assert ran["allocation"] == summary["allocation"]
    assert ran["throughput_rows_per_s"] > 0 and ran["batch_size"] == 1000
    assert "rows/s" in stderr and "other load" in stderr
    q1, q2, q3 = ran["subwindow_quartiles_rows_per_s"]
    assert q1 <= q2 <= q3 and ran["samples"] == 3
    lo, hi = ran["throughput_ci_rows_per_s"]
    assert lo <= ran["throughput_rows_per_s"] <= hi


def test_run_with_downsampling_has_six_stages(data: Path) -> None:
    args = ["--seconds", "0.5", "--downsample-rate", "0.5", "--batch-size", "1000", "--json"]
    code, stdout, stderr = invoke("ingest", "run", "--data", str(data), *args)
    assert code == 0, stderr
    assert [s["stage"] for s in json.loads(stdout)["per_stage"]] == [
        "read", "dense", "sparse", "downsample", "shuffle", "collate"]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alloc", "nope.toml"], "--alloc nope.toml"),
        (["--batch-size", "0"], "batch_size"),
        (["--downsample-rate", "1.5"], "downsample_rate"),
        (["--memory-budget-gib", "0.01"], "over memory_budget_gib"),
        (["--threads", "65"], "--threads = 65: expected 0..64 threads per worker"),
        (["--threads", "-1"], "--threads = -1: expected 0..64"),
        (["--inflight", "0"], "--inflight = 0: expected 1..256 storage requests"),
        (["--inflight", "257"], "--inflight = 257: expected 1..256"),
        (["--alloc", "auto", "--threads", "2"], "--threads: --alloc auto chooses the shape"),
    ],
)
def test_bad_input_is_one_line_exit_2(data: Path, args: list[str], message: str) -> None:
    code, _, stderr = invoke("ingest", "run", "--data", str(data), "--seconds", "1", *args)
    assert code == 2
    assert message in stderr and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_bad_threads_in_an_allocation_file_is_one_line(data: Path, tmp_path: Path) -> None:
    path = tmp_path / "alloc.toml"
    path.write_text('inflight = 4\n[[segment]]\nstages = ["read", "dense", "sparse", '
                    '"shuffle", "collate"]\nworkers = 1\nthreads = 99\n')  # fmt: skip
    code, _, stderr = invoke("ingest", "run", "--data", str(data), "--alloc", str(path))
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "segment[0].threads = 99: expected 0..64" in stderr


def test_run_reshapes_the_allocation_with_threads_and_inflight(data: Path, tmp_path: Path) -> None:
    code, stdout, stderr = invoke("ingest", "run", "--data", str(data), "--alloc", "even",
                                  "--threads", "2", "--inflight", "8", "--batch-size", "1000",
                                  "--seconds", "0.5", "--json")  # fmt: skip
    assert code == 0, stderr
    alloc = json.loads(stdout)["allocation"]
    assert alloc["threads"] == [2] * 5 and alloc["inflight"] == 8
    assert alloc["label"].endswith("collate x1*2t [inflight 8]")


def test_unknown_tuner_is_refused(data: Path, tmp_path: Path) -> None:
    code, _, stderr = invoke("ingest", "tune", "--data", str(data), "--tuner", "bogus",
                             "--out", str(tmp_path))  # fmt: skip
    assert code == 2 and "bogus" in stderr
    assert not (tmp_path / "summary.json").exists()


def test_run_alloc_auto_tunes_then_runs(data: Path, tmp_path: Path) -> None:
    code, stdout, stderr = invoke("ingest", "run", "--data", str(data), "--alloc", "auto",
                                  "--batch-size", "1000", "--seconds", "0.5", "--json",
                                  "--out", str(tmp_path))  # fmt: skip
    assert code == 0, stderr
    ran = json.loads(stdout)
    assert ran == json.loads((tmp_path / "summary.json").read_text())
    assert ran["tuning_s"] > 0 and ran["throughput_rows_per_s"] > 0
    assert sum(len(g["stages"]) for g in ran["allocation"]["segments"]) == 5
    assert ran["handoff_us_per_row"] > 0 and ran["consumer_us_per_row"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--rel-tol", "-0.1"], "rel_tol = -0.1"), (["--max-extend", "0.5"], "max_extend = 0.5")],
)
def test_tune_bad_window_options_are_one_line(
    data: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    code, _, stderr = invoke("ingest", "tune", "--data", str(data), "--out", str(tmp_path), *args)
    assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "summary.json").exists()
