"""Parameter sweeps: the run product, input parsing, the local/ray/serial backends agreeing with
direct simulation, failed runs becoming rows, and the ``recperf cluster sweep`` CLI (interrupts,
--resume and the progress lines are in test_sweep_resume.py)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from sweeps import metrics, small_sweep
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.cluster.api import RunSpec, run_summary, simulate
from recperf.cluster.outcome import EngineConfig
from recperf.cluster.sweep import (
    RUN_KEYS,
    RunOutcome,
    Sweep,
    SweepResult,
    SweepRun,
    SweepSpec,
    _run_local,
    error_text,
    run_sweep,
    split_trace,
    write_sweep,
)
from recperf.core.errors import ConfigError, RecperfError
from recperf.core.progress import Count

# 4 GPUs: too small for the trace's 8-GPU jobs, so every run on it fails.
TINY_TOML = "[cluster]\nracks = 1\nmachines_per_rack = 1\ngpus_per_machine = 4\n"
runner = CliRunner()


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


def _options(**given: dict[str, Any]) -> Any:
    """A stand-in for ``Settings.resolve``: ``given`` options by scope, the rest empty."""
    return lambda scopes: {s: dict(given.get(s, {})) for s in scopes}


def test_sweep_spec_builds_the_sweep_from_flag_text() -> None:
    spec = SweepSpec.build(
        traces="tiresias-60,helios-500", schedulers="fifo, netsens", congestion="1,4",
        seeds="0-2,9", options=_options(engine={"round_s": "60"}, netsens={"timers": "auto"}),
        jitter_s=30.0, backend="serial",
    )  # fmt: skip
    sweep = spec.sweep
    assert (sweep.traces, sweep.schedulers) == (("tiresias-60", "helios-500"), ("fifo", "netsens"))
    assert (sweep.congestion, sweep.seeds, sweep.size) == ((1.0, 4.0), (0, 1, 2, 9), 32)
    assert sweep.scheduler_options == {"netsens": {"timers": "auto"}}  # fifo's empty: left out
    assert sweep.base.engine.round_s == 60.0 and sweep.base.jitter_s == 30.0
    assert (spec.backend, spec.keep_jobs, spec.resume) == ("serial", False, False)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"backend": "spark"}, "unknown backend 'spark'; allowed: local, ray, serial"),
        ({"workers": 0}, "workers = 0"),
        ({"address": "auto"}, "--address only applies to --backend ray"),
        ({"max_runs": 0}, "--max-runs = 0"),
        ({"seeds": "0-9", "max_runs": 5}, "--seeds 0-9: 10 seeds, above --max-runs 5"),
        ({"congestion": "1,x"}, "--congestion"),
        ({"schedulers": " , "}, "--schedulers is empty"),
        ({"options": _options(engine={"congestion": 2})}, "engine.congestion: a sweep takes"),
        ({"options": _options(engine={"nope": 1})}, "engine: unknown key 'nope'"),
    ],
)
def test_sweep_spec_refuses_a_bad_field_in_one_line(flags: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"traces": "tiresias-60", "schedulers": "fifo", **flags}
    with pytest.raises(ConfigError) as err:
        SweepSpec.build(**args)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_sweep_spec_checks_its_own_fields() -> None:
    sweep = Sweep(traces=("tiresias-60",), schedulers=("fifo",))
    with pytest.raises(ConfigError, match=r"^workers = 5000"):
        SweepSpec(sweep=sweep, workers=5000)
    assert SweepSpec(sweep=sweep, backend="serial").run().rows[0]["status"] == "ok"
