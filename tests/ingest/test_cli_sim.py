"""``recperf ingest simulate`` and ``recperf ingest pretrain``: keys, values, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.ingest.base import Allocation
from recperf.ingest.sim import model as sim
from recperf.ingest.sim import solve
from recperf.ingest.tuners import dqn

runner = CliRunner()
KEYS = {
    "allocation",
    "workers",
    "cuts",
    "stage_workers",
    "lp_cuts",
    "oracle_allocation",
    "oracle_rows_per_s",
    "fraction_of_oracle",
    "throughput_rows_per_s",
    "lp_bound_rows_per_s",
    "fraction_of_bound",
    "peak_memory_bytes",
    "memory_budget_bytes",
    "tuning_steps",
}


def run(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize("tuner", ["static", "plumber", "oracle"])
def test_simulate_json(tuner: str) -> None:
    code, out, _ = run("ingest", "simulate", "--spec", "criteo-16", "--tuner", tuner,
                       "--budget-s", "10", "--json")  # fmt: skip
    assert code == 0
    summary = json.loads(out)
    assert summary.keys() >= KEYS
    spec = sim.load_spec("criteo-16")
    bound = solve.lp_bound(spec).throughput_rows_per_s
    assert summary["lp_bound_rows_per_s"] == pytest.approx(bound)
    alloc = Allocation(workers=tuple(summary["workers"]), cuts=tuple(summary["cuts"]))
    thr = spec.throughput(alloc)
    assert summary["throughput_rows_per_s"] == pytest.approx(thr)
    assert summary["fraction_of_bound"] == pytest.approx(thr / bound)
    # the readable form: each segment's stages and workers, in chain order
    segs = summary["allocation"]["segments"]
    assert [s for seg in segs for s in seg["stages"]] == [s.name for s in spec.stages]
    assert [seg["workers"] for seg in segs] == summary["workers"]
    assert len(summary["stage_workers"]) == spec.n_stages
    assert summary["allocation"]["label"] == alloc.label(spec.stage_names)
    best = solve.oracle(spec)
    assert summary["oracle_allocation"]["workers"] == list(best.workers)
    assert summary["oracle_rows_per_s"] == pytest.approx(spec.throughput(best))
    assert summary["lp_cuts"] == [1]  # criteo-16's bound: decode | the rest
    assert summary["peak_memory_bytes"] <= summary["memory_budget_bytes"] == 32 * 2**30
    assert 1 <= summary["tuning_steps"] <= 10


def test_simulate_toml_spec_and_human_output(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        'cores = 4\nmemory_budget_gib = 2.0\n[[stage]]\nname = "a"\ncost_us_per_row = 1.0\n'
        '[[stage]]\nname = "b"\ncost_us_per_row = 3.0\n'
    )
    code, out, err = run("ingest", "simulate", "--spec", str(path), "--tuner", "oracle")
    assert code == 0
    assert out == ""
    assert "p / oracle: 1,000,000 rows/s = 1.000 of the LP bound" in err


@pytest.mark.parametrize("tuner", ["plumber", "oracle"])
def test_simulate_finds_thread_shapes(tuner: str) -> None:
    code, out, _ = run("ingest", "simulate", "--spec", "threads-2", "--tuner", tuner,
                       "--budget-s", "10", "--json")  # fmt: skip
    assert code == 0
    summary = json.loads(out)
    # two threads of the consumer's process, the fused chain: the copy into shared memory saved
    assert summary["allocation"]["label"] == "read+dense+sparse+shuffle+collate x2t"
    assert summary["fraction_of_oracle"] == pytest.approx(1.0)
    assert summary["lp_bound_rows_per_s"] == pytest.approx(2e6 / 7.46)


def test_a_spec_with_a_bad_gil_fraction_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('cores = 2\nmemory_budget_gib = 1.0\nthread_options = [0, 1]\n[[stage]]\n'
                    'name = "a"\ncost_us_per_row = 1.0\ngil_frac = 2.0\n')  # fmt: skip
    code, _, err = run("ingest", "simulate", "--spec", str(path))
    assert code == 2
    assert "gil_frac = 2.0 is outside the allowed range [0, 1]" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("--spec", "nope-3"), "nope-3: no such file"),
        (("--spec", "criteo-16", "--tuner", "magic"), "unknown tuner 'magic'"),
        (("--spec", "criteo-16", "--budget-s", "0"), "budget_s"),
    ],
)
def test_simulate_errors_are_one_line(args: tuple[str, ...], match: str) -> None:
    code, _, err = run("ingest", "simulate", *args)
    assert code == 2
    assert match in err
    assert err.count("\n") == 1


def test_pretrain_writes_loadable_weights(tmp_path: Path) -> None:
    out = tmp_path / "w.npz"
    code, _, err = run("ingest", "pretrain", "--episodes", "2", "--seed", "1", "--out", str(out))
    assert code == 0
    assert "pretrained 2 episodes" in err
    _, meta = dqn.load(out)
    assert meta["episodes"] == 2
    assert meta["command"] == f"recperf ingest pretrain --episodes 2 --seed 1 --out {out}"
    code, _, err = run("ingest", "pretrain", "--episodes", "0", "--out", str(out))
    assert code == 2
    assert "episodes" in err
