"""Sweeps that keep their runs: each run written to ``--out/runs`` as it finishes, an interrupt
(a callback's KeyboardInterrupt, SIGINT to the CLI) keeping the finished ones, ``--resume``
running only the rest to the same bytes as an uninterrupted sweep, other sweeps' runs refused;
and the progress: runs done, left and the ETA."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from sweeps import CROSS_RACK_TOML, NoRayCluster, metrics, small_sweep
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.cluster.sweep import Sweep, SweepInterrupted, run_sweep, write_sweep
from recperf.cluster.sweep_tally import SweepTally
from recperf.core.errors import ConfigError, OutputError
from recperf.core.progress import Count, count_progress
from recperf.core.results import exclusive_dir

runner = CliRunner()


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
    backend: str, cross_rack: Path, uninterrupted: Path, tmp_path: Path
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
    in_memory = run_sweep(sweep, backend="serial", keep_jobs=True)  # no --out: no run files
    assert [metrics(r) for r in res.rows] == [metrics(r) for r in in_memory.rows]
    assert res.jobs is not None and in_memory.jobs is not None
    assert res.jobs.equals(in_memory.jobs)  # through the run files, exactly what was simulated


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
    monkeypatch.setattr("recperf.cluster.sweep_backends._import_ray", lambda: NoRayCluster)
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
    env = {**os.environ, "PYTHONPATH": path, "SLOW_FIFO_S": "2.0"}  # wide enough under load
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
