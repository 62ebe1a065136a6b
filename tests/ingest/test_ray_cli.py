"""``recperf ingest run|tune --engine ray``: bad input is one line, exit 2, before Ray is imported
or started (Ray missing, an address that does not answer, flags of the other engine or that
contradict each other); and one real spec run's result document."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.ingest.raydata import runtime
from recperf.ingest.raydata.runtime import RayRuntime

RECPERF = [sys.executable, str(Path(sys.executable).parent / "recperf")]
runner = CliRunner()


def _recperf(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    res = subprocess.run([*RECPERF, *args], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **(env or {})}, check=False)  # fmt: skip
    return res.returncode, res.stdout, res.stderr, time.monotonic() - t0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed when the block ends: nothing listens there


def test_without_ray_installed_one_line_naming_the_install(tmp_path: Path) -> None:
    fake = tmp_path / "ray"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no Ray here')\n")
    args = ["ingest", "run", "--engine", "ray", "--spec", "live-2", "--cpus-per-node", "2"]
    code, out, err, _ = _recperf(*args, env={"PYTHONPATH": str(tmp_path)})
    assert code == 2, err
    assert err.splitlines() == [
        "error: --engine ray needs Ray Data, which is not installed: pip install 'recperf[ray]'"
    ]
    assert out == ""


def test_an_address_that_does_not_answer_is_one_line_within_15_s() -> None:
    port = _closed_port()
    code, out, err, wall = _recperf("ingest", "run", "--engine", "ray", "--spec", "live-2",
                                    "--address", f"127.0.0.1:{port}")  # fmt: skip
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --address 127.0.0.1:{port}")
    assert "no Ray cluster answers" in err and out == ""
    assert wall < 15.0


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reaching Ray (its import or the address probe) fails the test: every check comes first."""

    def reached(*_: object) -> None:
        raise AssertionError("reached Ray before the flags were checked")

    monkeypatch.setattr(runtime, "require_ray", reached)
    monkeypatch.setattr(runtime, "probe", reached)


RUN = ("ingest", "run")
TUNE = ("ingest", "tune")
BAD = [
    (RUN, ["--engine", "gpu", "--spec", "live-2"], "--engine gpu: expected native or ray"),
    (RUN, ["--engine", "ray", "--spec", "live-2", "--nodes", "2", "--address", "h:1"],
     "--nodes: it shapes a cluster recperf starts"),
    (RUN, ["--engine", "ray", "--spec", "live-2", "--cpus-per-node", "2", "--address", "h:1"],
     "--cpus-per-node: it shapes a cluster recperf starts"),
    (RUN, ["--spec", "live-2"], "--spec: only with --engine ray"),
    (RUN, ["--engine", "native", "--spec", "live-2"], "--spec: only with --engine ray"),
    (RUN, ["--data", "x", "--address", "h:1"], "--address: only with --engine ray"),
    (RUN, ["--data", "x", "--nodes", "2"], "--nodes: only with --engine ray"),
    (RUN, ["--data", "x", "--budget-s", "5"], "--budget-s: only with --engine ray"),
    (RUN, ["--engine", "ray", "--spec", "live-2", "--threads", "2"],
     "--threads: only with --engine native, not --engine ray (Ray workers are single-threaded"),
    (RUN, ["--engine", "ray", "--spec", "live-2", "--inflight", "2"],
     "--inflight: only with --engine native"),
    (RUN, ["--engine", "ray", "--spec", "live-2", "--cores", "2"],
     "--cores: only with --engine native"),
    (RUN, ["--engine", "ray", "--spec", "live-2", "--nodes", "2"],
     "--nodes N needs --cpus-per-node C"),
    (RUN, ["--engine", "ray", "--spec", "live-2", "--alloc", "bogus"],
     "--alloc bogus: expected ray-default, auto, plumber"),
    (RUN, ["--engine", "ray", "--spec", "live-2", "--budget-s", "5"],
     "--budget-s: a tuning budget, but --alloc fused names no tuner"),
    (RUN, ["--engine", "ray", "--spec", "nope"], "--spec nope: expected a bundled spec"),
    (RUN, ["--engine", "ray"], "--data or --spec: give one"),
    (RUN, ["--engine", "ray", "--spec", "live-2", "--data", "x"], "--spec and --data: give one"),
    (RUN, ["--engine", "ray", "--spec", "live-2", "--batch-size", "64"],
     "--batch-size (pipeline.batch_size): a --spec run takes its pipeline from the spec"),
    (RUN, ["--engine", "ray", "--spec", "live-2", "--link-gbps", "0"], "--link-gbps"),
    (RUN, ["--engine", "ray", "--spec", "live-2", "--nodes", "0"], "--nodes 0: expected 1..64"),
    (RUN, [], "--data: required"),
    (TUNE, ["--engine", "ray", "--spec", "live-2", "--warmup-s", "1"],
     "--warmup-s: only with --engine native"),
    (TUNE, ["--engine", "ray", "--spec", "live-2", "--tuner", "m:a"],
     "--tuner m:a: expected plumber, autotune, intune, oracle, static"),
    (TUNE, ["--spec", "live-2"], "--spec: only with --engine ray"),
    (TUNE, [], "--data: required"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "args", "says"), BAD, ids=[" ".join((c[1], *a)) for c, a, _ in BAD]
)
def test_bad_flags_are_one_line_before_ray(
    no_ray: None, tmp_path: Path, command: tuple[str, ...], args: list[str], says: str
) -> None:
    res = runner.invoke(app, [*command, *args, "--out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(f"error: {says}"), res.stderr
    assert len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stdout == ""


def test_an_allocation_file_is_read_against_the_spec_before_ray(
    no_ray: None, tmp_path: Path
) -> None:
    alloc = tmp_path / "alloc.toml"
    alloc.write_text('[[segment]]\nstages = ["read", "dense"]\nworkers = 1\n')
    res = runner.invoke(app, [*RUN, "--engine", "ray", "--spec", "live-2", "--alloc", str(alloc)])
    assert res.exit_code == 2 and "the segments stop before 'sparse'" in res.stderr, res.stderr
    alloc.write_text('[[segment]]\nstages = ["read", "dense", "sparse", "shuffle", "collate"]\n'
                     "workers = 2\nthreads = 2\n")  # fmt: skip
    res = runner.invoke(app, [*RUN, "--engine", "ray", "--spec", "live-2", "--alloc", str(alloc)])
    assert res.exit_code == 2 and "Ray workers are single-threaded" in res.stderr, res.stderr


def test_a_spec_run_joins_a_cluster_by_address_and_leaves_it_running(
    tmp_path: Path, ray_runtime: RayRuntime
) -> None:
    """Joins the package's Ray instance (2 logical CPUs) by its address: no Ray start here."""
    code, out, err, _ = _recperf("ingest", "run", "--engine", "ray", "--spec", "live-2",
                                 "--address", ray_runtime.address, "--alloc", "fused",
                                 "--seconds", "3", "--json", "--out",
                                 str(tmp_path / "out"))  # fmt: skip
    assert code == 0, err
    assert out.startswith("{"), (out[:2000], err[-4000:])
    doc = json.loads(out)
    assert doc == json.loads((tmp_path / "out" / "summary.json").read_text())
    for key in ("allocation", "operators", "throughput_ci_rows_per_s", "idle_logical_cpus",
                "ray_overhead_ms_per_task", "time_to_first_block_s", "chosen_by",
                "lp_bound_rows_per_s", "fraction_of_bound", "nodes", "cpus_per_node"):  # fmt: skip
        assert key in doc, key
    assert doc["throughput_rows_per_s"] > 0 and 0 < doc["fraction_of_bound"] <= 1.5
    assert doc["chosen_by"] == "fused" and doc["nodes"] == 1 and doc["cpus_per_node"] == [2]
    assert doc["allocation"]["label"] == "read+dense+sparse+shuffle+collate x2"
    assert [op["workers"] for op in doc["operators"]] == [2]
    # the cluster given by --address is left running
    assert [n["Alive"] for n in ray_runtime.ray.nodes() if n["Resources"].get("CPU")] == [True]
    assert "of the LP bound" in err and "Ray overhead" in err and "Traceback" not in err
