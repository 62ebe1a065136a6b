"""The CLI contract other tools script against: files, keys, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recperf.cli.main import app

runner = CliRunner()

SUMMARY_KEYS = {
    "jobs_total",
    "jobs_finished",
    "makespan_s",
    "jct_mean_s",
    "jct_p50_s",
    "jct_p95_s",
    "jct_p99_s",
    "queue_mean_s",
    "utilization",
    "comm_overhead_frac",
}


def run(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_simulate_writes_summary_and_jobs(tmp_path: Path) -> None:
    code, out, _ = run(
        "cluster", "simulate", "--trace", "tiresias-60", "--scheduler", "tiresias",
        "--out", str(tmp_path), "--json",
    )  # fmt: skip
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary.keys() >= SUMMARY_KEYS
    assert json.loads(out) == summary
    assert summary["jobs_finished"] == 60
    assert summary["jobs_total"] == 60
    table = pq.read_table(tmp_path / "jobs.parquet")
    assert table.num_rows == 60
    jct = table.column("jct_s").to_numpy()
    assert jct.mean() == pytest.approx(summary["jct_mean_s"])
    assert (tmp_path / "utilization.parquet").exists()


def test_tables_go_to_stdout_unless_it_carries_json(tmp_path: Path) -> None:
    base = ["cluster", "simulate", "--trace", "tiresias-60", "--scheduler", "fifo"]
    res = runner.invoke(app, [*base, "--out", str(tmp_path / "a")])
    title = "tiresias-60 on tiresias-n32g4"
    assert res.exit_code == 0 and title in res.stdout and title not in res.stderr  # the table
    res = runner.invoke(app, [*base, "--out", str(tmp_path / "b"), "--json"])
    assert json.loads(res.stdout)["jobs_finished"] == 60 and title in res.stderr


def test_same_seed_gives_identical_summary_bytes(tmp_path: Path) -> None:
    args = [
        "cluster", "simulate", "--trace", "synthetic", "--jobs", "300", "--load", "0.9",
        "--scheduler", "srtf", "--placement", "random", "--cluster", "helios", "--seed", "5",
    ]  # fmt: skip
    assert run(*args, "--out", str(tmp_path / "a"))[0] == 0
    assert run(*args, "--out", str(tmp_path / "b"))[0] == 0
    a = (tmp_path / "a" / "summary.json").read_bytes()
    assert a == (tmp_path / "b" / "summary.json").read_bytes()
    assert run(*args[:-1], "6", "--out", str(tmp_path / "c"))[0] == 0
    assert a != (tmp_path / "c" / "summary.json").read_bytes()


def test_compare_runs_each_scheduler(tmp_path: Path) -> None:
    code, _, _ = run(
        "cluster", "compare", "--trace", "tiresias-60", "--schedulers", "fifo,sjf",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0
    runs = json.loads((tmp_path / "compare.json").read_text())["runs"]
    assert [r["scheduler"] for r in runs] == ["fifo", "sjf"]
    for r in runs:
        on_disk = json.loads((tmp_path / r["scheduler"] / "summary.json").read_text())
        assert on_disk == r


def test_netsens_flags_reach_the_run(tmp_path: Path) -> None:
    code, out, _ = run(
        "cluster", "simulate", "--trace", "helios-500", "--scheduler", "netsens",
        "--timers", "600,3600", "--congestion", "4", "--out", str(tmp_path), "--json",
    )  # fmt: skip
    assert code == 0
    summary = json.loads(out)
    assert summary["congestion"] == 4.0 and summary["scheduler"] == "netsens"
    assert 0.0 <= summary["locality_wait_share"] <= 1.0
    jobs = pq.read_table(tmp_path / "jobs.parquet").to_pydict()
    waits = jobs["locality_wait_s"]
    assert min(waits) >= 0.0
    held = sum(w > 0 for w in waits) / len(waits)
    assert held == pytest.approx(summary["locality_wait_share"])


def test_compare_gives_timers_to_netsens_only(tmp_path: Path) -> None:
    def compare(out: Path, *extra: str) -> dict[str, dict[str, object]]:
        code, _, err = run(
            "cluster", "compare", "--trace", "helios-500", "--schedulers", "fifo,netsens",
            "--congestion", "4", *extra, "--out", str(out),
        )  # fmt: skip
        assert code == 0, err
        runs = json.loads((out / "compare.json").read_text())["runs"]
        return {r["scheduler"]: r for r in runs}

    learned, zero = compare(tmp_path / "a"), compare(tmp_path / "b", "--timers", "0,0")
    # zero timers accept a spread placement at once, so far fewer jobs wait for locality
    assert zero["netsens"]["locality_wait_share"] < learned["netsens"]["locality_wait_share"] / 5
    assert zero["netsens"]["jct_mean_s"] != learned["netsens"]["jct_mean_s"]
    assert learned["fifo"] == zero["fifo"]  # fifo never saw the timers


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--trace", "nope", "--scheduler", "fifo"], "bundled"),
        (["--trace", "philly", "--scheduler", "lottery"], "allowed: consolidate, fifo"),
        (["--trace", "philly", "--scheduler", "fifo", "--cluster", "tiny"], "unknown cluster"),
        (["--trace", "philly", "--scheduler", "fifo", "--jobs", "5"], "--jobs only applies"),
        (["--trace", "synthetic", "--scheduler", "fifo", "--load", "-1"], "load"),
        (["--trace", "synthetic", "--scheduler", "fifo", "--duration-dist", "pareto"], "'exp'"),
        (["--trace", "tiresias-60", "--scheduler", "tiresias", "--opt", "promote_factor=x"],
         "promote_factor"),
        (["--trace", "tiresias-60", "--scheduler", "fifo", "--opt", "speed=9"], "unknown key"),
        (["--trace", "tiresias-60", "--scheduler", "fifo", "--timers", "auto"],
         "--timers (= --set netsens.timers) only applies when 'netsens'"),
        (["--trace", "tiresias-60", "--scheduler", "netsens", "--timers", "9,3"], "'9,3'"),
        (["--trace", "tiresias-60", "--scheduler", "netsens", "--congestion", "0.5"],
         "congestion"),
        (["--trace", "tiresias-60", "--scheduler", "fifo", "--jitter-s", "-1"], "jitter_s"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    code, _, err = run("cluster", "simulate", *args, "--out", str(tmp_path / "o"))
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "summary.json").exists()


def test_malformed_trace_names_file_line_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
        "0,4,0,100,vgg16,60,1\n"
        "1,two,5,100,vgg16,60,1\n"
    )
    code, _, err = run(
        "cluster", "simulate", "--trace", str(bad), "--format", "tiresias",
        "--scheduler", "fifo", "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert code == 2
    assert f"{bad}:3" in err and "num_gpu" in err


@pytest.mark.parametrize("cmd", [[], ["cluster"], ["cluster", "simulate"], ["cluster", "compare"],
                                 ["report"]])  # fmt: skip
def test_help_everywhere(cmd: list[str]) -> None:
    code, out, _ = run(*cmd, "--help")
    assert code == 0
    assert "Usage" in out
