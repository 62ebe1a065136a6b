"""Bad input to ``recperf cluster``: one line naming what is wrong, exit code 2, before any work."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from sweeps import NoRayCluster
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.cluster.api import RunSpec, simulate
from recperf.cluster.base import Decision, SchedulerView
from recperf.cluster.jobs import JobTable
from recperf.cluster.limits import MAX_TRACE_S
from recperf.cluster.topology import Cluster
from recperf.cluster.traces.synthetic import SyntheticConfig
from recperf.core.errors import ConfigError

runner = CliRunner()

HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration\n"


def bad(*args: str) -> str:
    """Run the CLI; assert exit 2, no traceback and one output line; return that line."""
    res = runner.invoke(app, list(args))
    text = res.stdout + res.stderr
    assert res.exit_code == 2, text
    assert "Traceback" not in text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    return lines[0]


def simulate_args(tmp_path: Path, *extra: str) -> list[str]:
    out = str(tmp_path / "out")
    return ["cluster", "simulate", "--scheduler", "fifo", "--out", out, *extra]


class NoPreemptive:
    """The README's protocol: reset and schedule only (no name, no preemptive)."""

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        self.resets = 1

    def schedule(self, view: SchedulerView) -> Decision:
        return Decision(order=np.asarray(view.active, dtype=np.int64))


class NoSchedule:
    def reset(self, jobs: JobTable, cluster: Cluster) -> None: ...


class NeedsArgument:
    def __init__(self, required: int) -> None: ...

    def reset(self, jobs: JobTable, cluster: Cluster) -> None: ...

    def schedule(self, view: SchedulerView) -> Decision: ...


HERE = __name__  # this module, as ``module:attr`` plug-ins see it


def test_cluster_dir_is_one_line(tmp_path: Path) -> None:
    line = bad(*simulate_args(tmp_path, "--trace", "tiresias-60", "--cluster", str(tmp_path)))
    assert f"cluster '{tmp_path}' is a directory; allowed: philly," in line
    assert "or a .toml file" in line


@pytest.mark.parametrize("seed", ["-1", str(2**63)])
def test_seed_out_of_range(tmp_path: Path, seed: str) -> None:
    line = bad(*simulate_args(tmp_path, "--trace", "tiresias-60", "--seed", seed))
    assert line == f"error: seed = {seed}: seeds must be whole numbers from 0 to 2**63-1"


def test_run_spec_checks_the_seed() -> None:
    with pytest.raises(ConfigError, match="seed = -3"):
        RunSpec(seed=-3)


def test_function_as_scheduler(tmp_path: Path) -> None:
    args = simulate_args(tmp_path, "--trace", "tiresias-60")
    line = bad(*args[:3], "os.path:join", *args[4:])
    assert line == "error: scheduler 'os.path:join': 'join' is a function, not a class"
    assert not (tmp_path / "out" / "summary.json").exists()


@pytest.mark.parametrize(
    ("attr", "why"),
    [
        ("NoSchedule", "NoSchedule has no schedule() method; it needs reset(), schedule()"),
        ("NeedsArgument", "building it failed: TypeError: "),
    ],
)
def test_class_without_the_protocol(tmp_path: Path, attr: str, why: str) -> None:
    args = simulate_args(tmp_path, "--trace", "tiresias-60")
    line = bad(*args[:3], f"{HERE}:{attr}", *args[4:])
    assert line.startswith(f"error: scheduler '{HERE}:{attr}': {why}")


def test_placement_without_place(tmp_path: Path) -> None:
    line = bad(
        *simulate_args(tmp_path, "--trace", "tiresias-60", "--placement", f"{HERE}:NoSchedule")
    )
    assert "placement policy" in line and "has no place() method" in line


def test_scheduler_without_preemptive_runs_as_non_preemptive() -> None:
    res = simulate(RunSpec(trace="tiresias-60", scheduler=f"{HERE}:NoPreemptive"))
    assert res.scheduler == "NoPreemptive"  # no name either: the class name
    assert int(res.preemptions.sum()) == 0
    assert int(np.isfinite(res.finish_s).sum()) == 60


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--mean-duration-s", "inf", "synthetic: mean_duration_s: expected a finite number"),
        ("--load", "nan", "synthetic: load: expected a finite number, got nan"),
        ("--load", "1e-300", "synthetic: load = 1e-300 is outside the allowed range [1e-06, 100]"),
        ("--mean-duration-s", "1e300", "mean_duration_s = 1e+300 is outside the allowed range"),
        ("--jobs", "0", "synthetic: jobs = 0 is outside the allowed range [1, 1e+07]"),
    ],
)
def test_synthetic_flags(tmp_path: Path, flag: str, value: str, message: str) -> None:
    line = bad(*simulate_args(tmp_path, "--trace", "synthetic", flag, value))
    assert message in line


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mean_duration_s", float("inf")),
        ("mean_duration_s", float("nan")),
        ("load", float("nan")),
        ("load", 0.0),
        ("iter_s_max", 1e9),
        ("lognormal_sigma", float("inf")),
    ],
)
def test_synthetic_config_rejects_non_finite_and_absurd(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        SyntheticConfig(**{field: value})


def test_header_only_trace(tmp_path: Path) -> None:
    trace = tmp_path / "header.csv"
    trace.write_text(HEADER)
    line = bad(*simulate_args(tmp_path, "--trace", str(trace), "--format", "tiresias"))
    assert line == f"error: {trace}: holds no jobs"
    assert not (tmp_path / "out" / "summary.json").exists()


@pytest.mark.parametrize(
    ("row", "field", "why"),
    [
        ("1,1,0,100,resnet50,1e308", "duration", "at most 3.15576e+08 s (10 years), got '1e308'"),
        ("1,1,1e12,100,resnet50,100", "submit_time", "at most 3.15576e+08 s (10 years)"),
        ("1,1e30,0,100,resnet50,100", "num_gpu", "must be > 0 and at most 1e+12, got '1e30'"),
        ("1,1,0,1e300,resnet50,100", "iterations", "must be > 0 and at most 1e+12"),
    ],
)
def test_absurd_trace_values(tmp_path: Path, row: str, field: str, why: str) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + row + "\n")
    line = bad(*simulate_args(tmp_path, "--trace", str(trace), "--format", "tiresias"))
    assert line.startswith(f"error: {trace}:2: field {field!r} ")
    assert why in line


def test_ten_years_is_the_bound() -> None:
    assert pytest.approx(315_576_000.0) == MAX_TRACE_S


def test_helios_duration_bound(tmp_path: Path) -> None:
    trace = tmp_path / "h.json"
    trace.write_text(
        '[\n {"job_id": "a", "max_parallelism": 1, "arrival_time": 0, "duration": 1e308,'
        ' "model": "resnet50"}\n]\n'
    )
    line = bad(*simulate_args(tmp_path, "--trace", str(trace), "--format", "helios"))
    assert line.startswith(f"error: {trace}:2: field 'duration' must be > 0 and at most")


@pytest.mark.parametrize("fmt", ["tiresias", "helios", "philly"])
def test_binary_trace(tmp_path: Path, fmt: str) -> None:
    trace = tmp_path / "binary.trace"
    trace.write_bytes(bytes(range(256)) * 4)
    line = bad(*simulate_args(tmp_path, "--trace", str(trace), "--format", fmt))
    assert line == f"error: {trace}: not a text file (invalid start byte)"


def test_nul_byte_in_csv(tmp_path: Path) -> None:
    trace = tmp_path / "nul.csv"
    trace.write_text(HEADER + "1,1,0,100,resnet50,100\x00\n")
    line = bad(*simulate_args(tmp_path, "--trace", str(trace), "--format", "tiresias"))
    assert line.startswith(f"error: {trace}:2:")


def test_deeply_nested_json(tmp_path: Path) -> None:
    trace = tmp_path / "deep.json"
    trace.write_text("[" * 100_000)
    line = bad(*simulate_args(tmp_path, "--trace", str(trace), "--format", "helios"))
    assert line == f"error: {trace}: invalid JSON: nested too deeply"


def test_empty_trace_name(tmp_path: Path) -> None:
    line = bad(*simulate_args(tmp_path, "--trace", ""))
    assert line.startswith("error: trace '' is neither a file nor a bundled name; bundled: ")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[cluster]\nracks = 1000000\nmachines_per_rack = 1000000\n", "at most 10,000,000"),
        ("[cluster]\nrack_gbps = 1e-300\n", "rack_gbps = 1e-300 is outside the allowed range"),
    ],
)
def test_absurd_cluster_file(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(toml)
    line = bad(*simulate_args(tmp_path, "--trace", "tiresias-60", "--cluster", str(path)))
    assert line.startswith(f"error: {path}: ") and message in line


def test_compare_header_only_and_duplicates(tmp_path: Path) -> None:
    trace = tmp_path / "header.csv"
    trace.write_text(HEADER)
    out = str(tmp_path / "out")
    args = ["cluster", "compare", "--out", out, "--format", "tiresias"]
    assert bad(*args, "--trace", str(trace)) == f"error: {trace}: holds no jobs"
    line = bad(*args[:-2], "--trace", "tiresias-60", "--schedulers", "fifo,sjf,fifo")
    assert line == "error: --schedulers lists 'fifo' twice"


def sweep_args(tmp_path: Path, *extra: str) -> list[str]:
    out = str(tmp_path / "out")
    return ["cluster", "sweep", "--schedulers", "fifo", "--backend", "serial", "--out", out, *extra]


def test_sweep_with_a_garbled_trace_runs_nothing(tmp_path: Path) -> None:
    garbled = tmp_path / "garbled.csv"
    garbled.write_text("garbage,,\n")
    traces = f"tiresias-60,{garbled}"
    line = bad(*sweep_args(tmp_path, "--traces", traces, "--format", "tiresias"))
    assert line == f"error: {garbled}:1: field 'job_id' missing from the header"
    assert not (tmp_path / "out" / "sweep.json").exists()
    assert not (tmp_path / "out" / "runs.parquet").exists()


def test_sweep_with_a_header_only_trace_runs_nothing(tmp_path: Path) -> None:
    trace = tmp_path / "header.csv"
    trace.write_text(HEADER)
    line = bad(*sweep_args(tmp_path, "--traces", f"{trace},tiresias-60", "--format", "tiresias"))
    assert line == f"error: {trace}: holds no jobs"


@pytest.mark.parametrize(
    ("seeds", "schedulers", "message"),
    [
        ("0-100000", "fifo", "--seeds 0-100000: 100,001 seeds, above --max-runs 10,000"),
        ("0-99999999999999", "fifo", "--seeds 0-99999999999999: 100,000,000,000,000 seeds"),
        (
            "0-5000",
            "fifo,sjf",
            "sweep: 1 traces x 2 schedulers x 1 congestion values x 5001 seeds = 10,002 runs, "
            "above the limit of 10,000; narrow it or raise the limit with --max-runs",
        ),
    ],
)
def test_sweep_size_is_capped(tmp_path: Path, seeds: str, schedulers: str, message: str) -> None:
    args = sweep_args(tmp_path, "--traces", "tiresias-60", "--seeds", seeds)
    args[3] = schedulers
    assert message in bad(*args)


def test_max_runs_lowers_the_cap(tmp_path: Path) -> None:
    args = sweep_args(tmp_path, "--traces", "tiresias-60", "--seeds", "0-2", "--max-runs", "2")
    assert bad(*args) == "error: --seeds 0-2: 3 seeds, above --max-runs 2"


def test_sweep_with_a_function_as_scheduler(tmp_path: Path) -> None:
    args = sweep_args(tmp_path, "--traces", "tiresias-60")
    args[3] = "fifo,os.path:join"
    assert bad(*args) == "error: scheduler 'os.path:join': 'join' is a function, not a class"


def test_ray_without_a_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("recperf.cluster.sweep_backends._import_ray", lambda: NoRayCluster)
    args = sweep_args(tmp_path, "--traces", "tiresias-60", "--address", "auto")
    args[5] = "ray"
    line = bad(*args)
    assert line == (
        "error: --backend ray: cannot start or reach the Ray cluster at --address auto: "
        "ConnectionError: Could not find any running Ray instance."
    )
    assert not (tmp_path / "out" / "sweep.json").exists()


def test_ray_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    args = sweep_args(tmp_path, "--traces", "tiresias-60")
    args[5] = "ray"
    line = bad(*args)
    assert (
        line == "error: --backend ray needs Ray, which is not installed: pip install 'recperf[ray]'"
    )


def test_odd_paths_print_literally(tmp_path: Path) -> None:
    folder = tmp_path / "odd [/] ü dir"
    folder.mkdir(parents=True)  # "[/]" spans two folders: "odd [" and "] ü dir"
    trace = folder / "t r[a]ce [b].csv"
    trace.write_text(HEADER + "1,1,0,100,resnet50,100\n2,2,5,100,vgg16,50\n")
    out = tmp_path / "out [/] ü"
    res = runner.invoke(
        app,
        ["cluster", "simulate", "--scheduler", "fifo", "--trace", str(trace), "--format",
         "tiresias", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    assert f"{trace} on tiresias-n32g4" in " ".join((res.stdout + res.stderr).split())
    assert f"results in {out}" in res.stderr
    assert (out / "summary.json").exists()


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_cluster_too_small_for_the_trace(tmp_path: Path, command: str) -> None:
    tiny = tmp_path / "tiny.toml"
    tiny.write_text("[cluster]\nracks = 1\nmachines_per_rack = 1\ngpus_per_machine = 2\n")
    args = ["cluster", command, "--trace", "tiresias-60", "--cluster", str(tiny)]
    line = bad(
        *args, "--out", str(tmp_path / "out"), *(["--scheduler", "fifo"] * (command == "simulate"))
    )
    assert line == "error: job '1' needs 8 GPUs but cluster 'tiny' has only 2"
