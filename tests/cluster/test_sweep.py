"""Parameter sweeps: the run product, input parsing, the local/ray/serial backends agreeing with
direct simulation, failed runs becoming rows, runs kept on disk through an interrupt and resumed
to the same result, progress with runs left and ETA, and the ``recperf cluster sweep`` CLI."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.cluster.api import RunSpec, run_summary, simulate
from recperf.cluster.outcome import EngineConfig
from recperf.cluster.sweep import (
    RUN_KEYS,
    RunOutcome,
    Sweep,
    SweepInterrupted,
    SweepResult,
    SweepRun,
    _run_local,
    error_text,
    run_sweep,
    split_trace,
    write_sweep,
)
from recperf.cluster.sweep_tally import SweepTally
from recperf.core.errors import ConfigError, OutputError, RecperfError
from recperf.core.progress import Count, count_progress
from recperf.core.results import exclusive_dir

# 4 racks of 2 machines x 2 GPUs with thin uplinks: the trace's 8-GPU jobs must cross racks, so
# congestion changes their communication time.
CROSS_RACK_TOML = (
    "[cluster]\nracks = 4\nmachines_per_rack = 2\ngpus_per_machine = 2\ncore_gbps = 100.0\n"
)
# 4 GPUs: too small for the trace's 8-GPU jobs, so every run on it fails.
TINY_TOML = "[cluster]\nracks = 1\nmachines_per_rack = 1\ngpus_per_machine = 4\n"
runner = CliRunner()


def small_sweep(cluster_toml: Path) -> Sweep:
    return Sweep(
        traces=(f"tiresias-60@{cluster_toml}",),
        schedulers=("fifo", "tiresias"),
        congestion=(1.0, 2.0),
        seeds=(0, 1),
        base=RunSpec(jitter_s=300.0),
    )


def metrics(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "wall_s"}


@pytest.fixture(scope="module")
def cross_rack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("clusters") / "xrack.toml"
    path.write_text(CROSS_RACK_TOML)
    return path


@pytest.fixture(scope="module")
def local_result(cross_rack: Path) -> SweepResult:
    fracs: list[float] = []
    counts: list[Count] = []
    res = run_sweep(
        small_sweep(cross_rack), backend="local", workers=2, keep_jobs=True,
        progress=fracs.append, counts=counts.append,
    )  # fmt: skip
    assert fracs == [i / 8 for i in range(9)]  # 0.0 once every check passed
    assert [(c.done, c.left) for c in counts] == [(i, 8 - i) for i in range(9)]
    assert counts[0].eta_s is None and counts[-1].eta_s == 0.0  # no finished run yet; none left
    assert all(c.eta_s is not None and c.eta_s > 0 for c in counts[1:-1])
    return res


def test_runs_are_the_product_in_order() -> None:
    sweep = Sweep(
        traces=("tiresias-60", "tiresias-480@helios"),
        schedulers=("fifo", "tiresias"),
        congestion=(1.0, 2.0, 4.0),
        seeds=(3, 0),
        base=RunSpec(placement="first-fit", jitter_s=60.0, engine=EngineConfig(round_s=100.0)),
    )
    runs = sweep.runs()
    assert len(runs) == sweep.size == 24
    expected = itertools.product(
        ("tiresias-60", "tiresias-480@helios"), ("fifo", "tiresias"), (1.0, 2.0, 4.0), (3, 0)
    )
    assert [(r.trace, r.scheduler, r.congestion, r.seed) for r in runs] == list(expected)
    for r in runs:
        assert (r.spec.scheduler, r.spec.seed, r.spec.engine.congestion) == (
            r.scheduler,
            r.seed,
            r.congestion,
        )
        assert r.spec.placement == "first-fit"
        assert r.spec.jitter_s == 60.0
        assert r.spec.engine.round_s == 100.0
    assert {(r.spec.trace, r.spec.cluster, r.cluster) for r in runs} == {
        ("tiresias-60", None, "tiresias-n32g4"),
        ("tiresias-480", "helios", "helios"),
    }


def test_trace_at_cluster(tmp_path: Path) -> None:
    assert split_trace("philly@philly-third") == ("philly", "philly-third")
    assert split_trace("helios-500") == ("helios-500", None)
    odd = tmp_path / "a@b.csv"  # an existing file keeps its @
    odd.write_text("")
    assert split_trace(str(odd)) == (str(odd), None)
    with pytest.raises(ConfigError, match="NAME@CLUSTER"):
        split_trace("philly@")
    base = RunSpec(cluster="helios")
    sweep = Sweep(
        traces=("tiresias-60", "tiresias-60@philly-third"), schedulers=("fifo",), base=base
    )
    assert [r.cluster for r in sweep.runs()] == ["helios", "philly-third"]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"schedulers": ("fifo", "tiresais")}, "tiresais"),
        ({"traces": ("tiresias-61",)}, "tiresias-61"),
        ({"traces": ("tiresias-60@nowhere",)}, "nowhere"),
        ({"congestion": (0.5,)}, "congestion = 0.5"),
        ({"seeds": (1, 1)}, "seeds lists 1 twice"),
        ({"seeds": ()}, "seeds is empty"),
        ({"scheduler_options": {"sjf": {}}}, "'sjf', which is not in the sweep"),
        ({"scheduler_options": {"fifo": {"nope": 1}}}, "unknown key 'nope'"),
    ],
)
def test_bad_sweeps_fail_before_running(changes: dict[str, Any], match: str) -> None:
    fields: dict[str, Any] = {"traces": ("tiresias-60",), "schedulers": ("fifo",), **changes}
    with pytest.raises(RecperfError, match=match):
        Sweep(**fields).runs()


def test_local_sweep_matches_direct_simulation(local_result: SweepResult, tmp_path: Path) -> None:
    rows = local_result.rows
    assert [r["status"] for r in rows] == ["ok"] * 8
    for run, row in zip(local_result.sweep.runs(), rows, strict=True):
        expected = run_summary(run.spec, simulate(run.spec))
        assert {k: row[k] for k in expected if k != "trace"} == {
            k: v for k, v in expected.items() if k != "trace"
        }
        assert row["trace"] == run.trace
    by_key = {(r["scheduler"], r["seed"], r["congestion"]): r for r in rows}
    for sched, seed in itertools.product(("fifo", "tiresias"), (0, 1)):
        calm, congested = by_key[sched, seed, 1.0], by_key[sched, seed, 2.0]
        assert congested["comm_overhead_frac"] > calm["comm_overhead_frac"]
        assert congested["jobs_across_racks"] > 0

    summary = write_sweep(tmp_path, local_result)
    table = pq.read_table(tmp_path / "runs.parquet")
    assert table.column_names[:8] == [*RUN_KEYS, "status", "error", "wall_s"]
    assert table.num_rows == 8
    jobs = pq.read_table(tmp_path / "jobs.parquet")
    assert jobs.num_rows == 8 * 60
    assert jobs.column_names[:5] == list(RUN_KEYS)
    assert json.loads((tmp_path / "sweep.json").read_text())["runs_ok"] == 8
    groups = summary["groups"]
    assert [(g["scheduler"], g["congestion"], g["runs_ok"]) for g in groups] == [
        ("fifo", 1.0, 2),
        ("fifo", 2.0, 2),
        ("tiresias", 1.0, 2),
        ("tiresias", 2.0, 2),
    ]
    jct = [by_key["fifo", s, 1.0]["jct_mean_s"] for s in (0, 1)]
    assert groups[0]["jct_mean_s_mean"] == pytest.approx(sum(jct) / 2)
    assert groups[0]["jct_mean_s_std"] == pytest.approx(abs(jct[0] - jct[1]) / math.sqrt(2))


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_sweep_equals_local(local_result: SweepResult) -> None:
    import ray

    try:
        res = run_sweep(local_result.sweep, backend="ray", workers=2, keep_jobs=True)
        assert not ray.is_initialized()  # the sweep started Ray, so it shut it down
    finally:
        ray.shutdown()
    assert [metrics(r) for r in res.rows] == [metrics(r) for r in local_result.rows]
    assert res.jobs is not None and local_result.jobs is not None
    assert res.jobs.equals(local_result.jobs)


def test_failed_run_becomes_a_row(tmp_path: Path) -> None:
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(TINY_TOML)
    sweep = Sweep(traces=(f"tiresias-60@{tiny}", "tiresias-60"), schedulers=("fifo",), seeds=(0, 1))
    res = run_sweep(sweep, backend="serial", keep_jobs=True)
    assert [r["status"] for r in res.rows] == ["failed", "failed", "ok", "ok"]
    bad = res.rows[0]
    assert bad["cluster"] == "tiny"
    assert bad["error"].startswith("RecperfError: ")
    assert "needs 8 GPUs" in bad["error"] and "has only 4" in bad["error"]
    assert bad["makespan_s"] is None and res.rows[2]["makespan_s"] > 0
    summary = write_sweep(tmp_path / "out", res)
    assert (summary["runs_ok"], summary["runs_failed"]) == (2, 2)
    assert summary["failures"][0]["error"] == bad["error"]
    table = pq.read_table(tmp_path / "out" / "runs.parquet").to_pylist()
    assert [r["status"] for r in table] == ["failed", "failed", "ok", "ok"]
    assert pq.read_table(tmp_path / "out" / "jobs.parquet").num_rows == 2 * 60

    args = ["cluster", "sweep", "--traces", f"tiresias-60@{tiny},tiresias-60", "--schedulers"]
    cli = runner.invoke(app, [*args, "fifo", "--backend", "serial", "--out", str(tmp_path / "c")])
    assert cli.exit_code == 1
    assert "seed 0: RecperfError: job" in cli.stderr
    assert (tmp_path / "c" / "sweep.json").exists()


def test_error_text_is_one_line() -> None:
    class Wrapped(Exception):
        cause = ValueError("inner\n  detail")

    assert error_text(Wrapped("ray::run_one()\nTraceback...")) == "ValueError: inner | detail"
    assert error_text(KeyError()) == "KeyError"
    assert len(error_text(RuntimeError("x" * 1000))) == 300


def test_cli_sweep_json(tmp_path: Path) -> None:
    cli = runner.invoke(
        app,
        [
            "cluster", "sweep", "--traces", "tiresias-60", "--schedulers", "fifo,sjf",
            "--seeds", "0-1", "--jitter-s", "300", "--workers", "2", "--no-jobs",
            "--opt", "fifo.backfill=true", "--out", str(tmp_path), "--json",
        ],
    )  # fmt: skip
    assert cli.exit_code == 0, cli.stderr
    summary = json.loads(cli.stdout)
    assert summary == json.loads((tmp_path / "sweep.json").read_text())
    assert summary["runs_ok"] == 4 and summary["failures"] == []
    assert summary["sweep"]["scheduler_options"] == {"fifo": {"backfill": "true"}}
    assert summary["sweep"]["shared"]["jitter_s"] == 300.0
    assert pq.read_table(tmp_path / "runs.parquet").num_rows == 4
    assert not (tmp_path / "jobs.parquet").exists()
    assert "4 runs: 4 ok, 0 failed" in cli.stderr  # the grouped table
    assert "sweep (local): 0/4 runs done, 4 left, ETA ?" in cli.stderr  # off a terminal: lines
    assert "sweep (local): 4/4 runs done, 0 left, ETA 0s" in cli.stderr
    assert len(list((tmp_path / "runs").glob("*.parquet"))) == 4  # each run as it finished


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--schedulers", "fifo,tiresais", "'tiresais'"),
        ("--seeds", "0-x", "--seeds"),
        ("--opt", "gavel.timers=auto", "'gavel.timers=auto'"),
        ("--backend", "spark", "'spark'"),
    ],
)
def test_cli_bad_input_is_one_line(tmp_path: Path, flag: str, value: str, named: str) -> None:
    args = ["cluster", "sweep", "--traces", "tiresias-60", "--out", str(tmp_path), flag, value]
    cli = runner.invoke(app, args)
    assert cli.exit_code == 2
    assert cli.stderr.count("\n") == 1 and named in cli.stderr
    assert not (tmp_path / "runs.parquet").exists()


def crash_on_seed_1(run: SweepRun, keep_jobs: bool) -> RunOutcome:
    """A run task whose worker dies on seed 1, as on a segfault or an OOM kill."""
    if run.seed == 1:
        os._exit(1)
    return RunOutcome({**run.keys(), "status": "ok"})


def test_local_worker_crash_fails_only_its_run() -> None:
    runs = Sweep(traces=("tiresias-60",), schedulers=("fifo",), seeds=(0, 1, 2, 3, 4)).runs()
    outcomes: dict[int, RunOutcome] = {}
    _run_local(runs, False, 2, outcomes.__setitem__, task=crash_on_seed_1)
    assert sorted(outcomes) == [0, 1, 2, 3, 4]
    assert [outcomes[i].row["status"] for i in range(5)] == ["ok", "failed", "ok", "ok", "ok"]
    assert outcomes[1].row["error"].startswith("BrokenProcessPool")


class StopAfter:
    """A progress callback that interrupts the sweep, as Ctrl-C would, once ``k`` runs are done."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, count: Count) -> None:
        if count.done == self.k:
            raise KeyboardInterrupt


def run_files(out: Path) -> list[Path]:
    return sorted((out / "runs").glob("*.parquet"))


def assert_same_results(out: Path, ref: Path) -> None:
    """sweep.json and jobs.parquet byte for byte; runs.parquet but for the wall times."""
    assert (out / "sweep.json").read_bytes() == (ref / "sweep.json").read_bytes()
    assert (out / "jobs.parquet").read_bytes() == (ref / "jobs.parquet").read_bytes()
    runs, ref_runs = (pq.read_table(p / "runs.parquet").drop(["wall_s"]) for p in (out, ref))
    assert runs.equals(ref_runs)


@pytest.fixture(scope="module")
def uninterrupted(cross_rack: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    write_sweep(out, run_sweep(small_sweep(cross_rack), backend="serial", keep_jobs=True, out=out))
    return out


@pytest.mark.parametrize("backend", ["serial", "local"])
def test_interrupted_sweep_keeps_its_runs_and_resumes_to_the_same_result(
    backend: str, cross_rack: Path, uninterrupted: Path, local_result: SweepResult, tmp_path: Path
) -> None:
    sweep, out = small_sweep(cross_rack), tmp_path / "out"
    with pytest.raises(SweepInterrupted) as stop:
        run_sweep(sweep, backend=backend, workers=2, keep_jobs=True, counts=StopAfter(3), out=out)
    assert (stop.value.kept, stop.value.total) == (3, 8)
    assert len(run_files(out)) == 3 and not list(out.rglob(".*.tmp"))
    assert not (out / "sweep.json").exists()
    counts: list[Count] = []
    res = run_sweep(
        sweep, backend=backend, workers=2, keep_jobs=True, counts=counts.append, out=out,
        resume=True,
    )  # fmt: skip
    assert [c.done for c in counts] == [3, 4, 5, 6, 7, 8]  # the kept three are not run again
    assert counts[0].eta_s is not None and counts[0].eta_s > 0  # from the kept runs' wall times
    write_sweep(out, res)
    assert_same_results(out, uninterrupted)
    assert [metrics(r) for r in res.rows] == [metrics(r) for r in local_result.rows]
    assert res.jobs is not None and local_result.jobs is not None
    assert res.jobs.equals(local_result.jobs)  # through the run files, exactly what was simulated


def test_another_sweep_in_out_is_refused(cross_rack: Path, uninterrupted: Path) -> None:
    before = {p: p.read_bytes() for p in run_files(uninterrupted)}
    sweep = small_sweep(cross_rack)
    with pytest.raises(ConfigError, match=r"already holds 8 of the 8 runs .* add --resume"):
        run_sweep(sweep, backend="serial", keep_jobs=True, out=uninterrupted)
    other = dataclasses.replace(sweep, seeds=(0, 1, 2))
    with pytest.raises(
        ConfigError, match=r"another sweep \(seeds: \[0, 1\] there, \[0, 1, 2\] here"
    ):
        run_sweep(other, backend="serial", keep_jobs=True, out=uninterrupted, resume=True)
    with pytest.raises(ConfigError, match="keep_jobs: true there, false here"):
        run_sweep(sweep, backend="serial", keep_jobs=False, out=uninterrupted, resume=True)
    assert {p: p.read_bytes() for p in run_files(uninterrupted)} == before


def test_a_second_sweep_into_a_busy_out_is_refused(tmp_path: Path) -> None:
    sweep = Sweep(traces=("tiresias-60",), schedulers=("fifo",))
    with exclusive_dir(tmp_path), pytest.raises(OutputError, match="another run is writing"):
        run_sweep(sweep, backend="serial", out=tmp_path, resume=True)
    assert not (tmp_path / "runs").exists()


def test_no_ray_cluster_leaves_no_run_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NoCluster:
        @staticmethod
        def is_initialized() -> bool:
            return False

        @staticmethod
        def init(**kwargs: object) -> None:
            raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr("recperf.cluster.sweep_backends._import_ray", lambda: NoCluster)
    sweep = Sweep(traces=("tiresias-60",), schedulers=("fifo",))
    with pytest.raises(ConfigError, match="cannot start or reach"):
        run_sweep(sweep, backend="ray", out=tmp_path)
    assert not (tmp_path / "runs").exists()


def test_an_input_file_changed_since_the_first_runs_is_refused(tmp_path: Path) -> None:
    toml = tmp_path / "xrack.toml"
    toml.write_text(CROSS_RACK_TOML)
    sweep, out = small_sweep(toml), tmp_path / "out"
    with pytest.raises(SweepInterrupted):
        run_sweep(sweep, backend="serial", counts=StopAfter(1), out=out)
    toml.write_text(CROSS_RACK_TOML.replace("100.0", "50.0"))
    with pytest.raises(
        ConfigError, match=rf"another sweep \(input_files\.{re.escape(str(toml))}: "
    ):
        run_sweep(sweep, backend="serial", out=out, resume=True)


def test_a_damaged_run_file_is_one_line(cross_rack: Path, tmp_path: Path) -> None:
    sweep = small_sweep(cross_rack)
    with pytest.raises(SweepInterrupted):
        run_sweep(sweep, backend="serial", counts=StopAfter(2), out=tmp_path)
    run_files(tmp_path)[0].write_bytes(b"PAR1 not parquet")
    with pytest.raises(ConfigError, match=r"not a finished run of this sweep .* delete it"):
        run_sweep(sweep, backend="serial", out=tmp_path, resume=True)


def test_eta_is_each_groups_mean_wall_time_times_its_runs_left_over_workers() -> None:
    runs = Sweep(traces=("tiresias-60",), schedulers=("fifo", "sjf"), seeds=(0, 1, 2)).runs()
    seen: list[Count] = []
    tally = SweepTally(runs, {0: 2.0, 1: 4.0}, 2, None, seen.append)  # two fifo runs kept
    tally.start()  # one fifo and three sjf left, no sjf run finished: all cost fifo's mean
    tally.finished(3, math.nan)  # a failed run without a wall time counts as done, not as time
    tally.finished(4, 30.0)  # sjf runs take 30 s
    tally.finished(2, 6.0)
    assert seen == [
        Count(2, 6, (3.0 + 3 * 3.0) / 2, eta_partial=True),  # no sjf run timed yet
        Count(3, 6, (3.0 + 2 * 3.0) / 2, eta_partial=True),
        Count(4, 6, (3.0 + 30.0) / 2),
        Count(5, 6, 30.0),  # one run left and two workers: one run's time
    ]
    assert SweepTally(runs, {}, 2).eta_s() is None  # no run finished yet


def test_count_lines_are_throttled_and_say_done_left_and_eta(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with count_progress("sweep (local)", "runs") as update:
        update(Count(0, 120, None))
        update(Count(1, 120, 754.0))  # within the gap: held back for the heartbeat thread
        update(Count(120, 120, 0.0))  # the last is always said
    with count_progress("sweep (serial)", "runs") as update:
        update(Count(7, 120, 7390.0, eta_partial=True))
    lines = capsys.readouterr().err.splitlines()
    assert [line[9:] for line in lines[:2]] == [
        "sweep (local): 0/120 runs done, 120 left, ETA ?",
        "sweep (local): 120/120 runs done, 0 left, ETA 0s",
    ]
    assert lines[2][9:].startswith("sweep (local): done in ")
    assert lines[3][9:] == "sweep (serial): 7/120 runs done, 113 left, ETA >2h03m"
    assert all(time.strptime(line[:8], "%H:%M:%S") for line in lines)


SLOW_SCHEDULER = """
import os, time
from recperf.cluster.schedulers.fifo import Fifo

class SlowFifo(Fifo):
    def reset(self, jobs, cluster):  # FIFO, slowed where the test interrupts it
        time.sleep(float(os.environ.get("SLOW_FIFO_S", "0")))
"""
RECPERF = [sys.executable, str(Path(sys.executable).parent / "recperf")]


def test_cli_sigint_keeps_finished_runs_and_resume_finishes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "slowsched.py").write_text(SLOW_SCHEDULER)
    monkeypatch.syspath_prepend(str(tmp_path))  # for the in-process resume below
    out, ref = tmp_path / "out", tmp_path / "ref"
    args = ["cluster", "sweep", "--traces", "tiresias-60", "--schedulers", "slowsched:SlowFifo,sjf",
            "--seeds", "0-4", "--jitter-s", "300", "--workers", "2"]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "SLOW_FIFO_S": "1.0"}
    proc = subprocess.Popen(
        [*RECPERF, *args, "--out", str(out)], env=env, text=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(run_files(out)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "the sweep ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    kept = len(run_files(out))
    assert proc.returncode == 130 and 2 <= kept < 10, err
    assert f"{kept} of 10 runs kept in {out / 'runs'}; to run the other {10 - kept}" in err
    assert "--resume" in err and "Traceback" not in err and not list(out.rglob(".*.tmp"))

    monkeypatch.delenv("SLOW_FIFO_S", raising=False)
    serial = [*args, "--backend", "serial"]  # the backend is not part of the sweep's definition
    resumed = runner.invoke(app, [*serial, "--out", str(out), "--resume"])
    assert resumed.exit_code == 0, resumed.stderr
    assert f"{kept}/10 runs done, {10 - kept} left" in resumed.stderr
    assert runner.invoke(app, [*serial, "--out", str(ref)]).exit_code == 0
    assert_same_results(out, ref)
    again = runner.invoke(app, [*serial, "--out", str(out)])
    assert again.exit_code == 2 and again.stderr.count("\n") == 1
    assert "already holds 10 of the 10 runs of this sweep; add --resume" in again.stderr
