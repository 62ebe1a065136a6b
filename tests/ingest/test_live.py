"""The live pipeline as a tuning target: measurements, allocation files, calibration of the
simulator, and the run / tune entry points."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recperf.core.errors import ConfigError
from recperf.ingest import api
from recperf.ingest.base import Allocation, AllocationRefused, Target
from recperf.ingest.data.criteo import GenerateConfig, generate
from recperf.ingest.live.allocfile import read_allocation, write_allocation
from recperf.ingest.live.batch import PipelineConfig
from recperf.ingest.live.executor import Pipeline
from recperf.ingest.live.target import (
    LiveTarget,
    calibrate,
    spec_toml,
)
from recperf.ingest.sim.model import spec_from_mapping
from recperf.ingest.sim.solve import lp_bound

STAGES = ("read", "dense", "sparse", "shuffle", "collate")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("live")
    generate(GenerateConfig(rows=20_000, shards=2, seed=11), out)
    return out


def test_live_target_measures_and_refuses(data: Path) -> None:
    cfg = PipelineConfig(batch_size=1000, epochs=None, memory_budget_gib=1.0)
    with Pipeline(data, cfg, cores=2) as p:
        target = LiveTarget(p, warmup_s=0.3, settle_s=0.2, max_workers=3, max_extend=1.0)
        assert isinstance(target, Target)
        m = target.measure(Allocation(workers=(2, 1, 1, 1, 1)), 0.4)
        assert p.allocation.workers == (2, 1, 1, 1, 1)
        # 3 sub-windows (no growth); each snapshot between them reads every worker's PSS
        assert m.throughput_rows_per_s > 0 and 0.3 < m.window_s < 2.0 and m.samples == 3
        assert all(0 <= b <= 1 for b in m.busy_frac) and all(0 <= q <= 1 for q in m.queue_fill)
        assert all(c > 0 for c in m.cost_us_per_row) and all(c > 0 for c in m.cpu_s)
        with pytest.raises(AllocationRefused, match="cap 3"):
            target.measure(Allocation(workers=(4, 1, 1, 1, 1)), 0.4)
        with pytest.raises(AllocationRefused, match="memory_budget_gib"):
            target.measure(Allocation(workers=(3, 3, 3, 3, 3)), 0.4)
        assert p.allocation.workers == (2, 1, 1, 1, 1)
        spec = calibrate(target)
    assert [s.name for s in spec.stages] == list(STAGES)
    assert spec.cores == 2 and spec.memory_budget_gib == 1.0
    again = spec_from_mapping(__import__("tomllib").loads(spec_toml(spec)))
    assert again.stages == spec.stages
    assert lp_bound(spec).throughput_rows_per_s > 0


def test_allocation_files_round_trip_and_reject_bad_ones(tmp_path: Path) -> None:
    path = tmp_path / "alloc.toml"
    write_allocation(path, STAGES, Allocation(workers=(2, 1, 3, 1, 1)), "note\nsecond line")
    assert read_allocation(path, STAGES).workers == (2, 1, 3, 1, 1)
    path.write_text("[allocation]\nread = 1\ndense = 1\nsparse = 1\nshuffle = 1\n")
    with pytest.raises(ConfigError, match=r"allocation\.collate: missing"):
        read_allocation(path, STAGES)
    path.write_text("[allocation]\nread = 1\nbogus = 2\n")
    with pytest.raises(ConfigError, match=r"allocation\.bogus: unknown stage"):
        read_allocation(path, STAGES)
    path.write_text("[allocation]\nread = 0\n")
    with pytest.raises(ConfigError, match=r"allocation\.read = 0"):
        read_allocation(path, ("read",))
    cut = Allocation(workers=(2, 1), cuts=(3,))
    write_allocation(path, STAGES, cut, "fused in two")
    assert read_allocation(path, STAGES) == cut
    assert "[[segment]]" in path.read_text()
    path.write_text('[[segment]]\nstages = ["read", "sparse"]\nworkers = 1\n')
    with pytest.raises(ConfigError, match=r"segment\[0\]\.stages .* starting at 'read'"):
        read_allocation(path, STAGES)
    path.write_text('[[segment]]\nstages = ["read", "dense"]\nworkers = 1\n')
    with pytest.raises(ConfigError, match="stop before 'sparse'"):
        read_allocation(path, STAGES)


def test_run_reports_throughput_and_stage_metrics(data: Path, tmp_path: Path) -> None:
    alloc = tmp_path / "a.toml"
    write_allocation(alloc, STAGES, Allocation(workers=(1, 1, 1, 1, 2)), "test")
    out = api.run(data, alloc, PipelineConfig(batch_size=1000), 0.6, warmup_s=0.3, cores=2)
    assert [g["workers"] for g in out["allocation"]["segments"]] == [1, 1, 1, 1, 2]
    assert out["handoff_us_per_row"] > 0 and out["consumer_us_per_row"] > 0
    assert out["throughput_rows_per_s"] > 0 and out["rows"] > 0
    assert 0 < out["peak_memory_bytes"] <= out["memory_budget_bytes"]
    assert [s["stage"] for s in out["per_stage"]] == list(STAGES)
    with pytest.raises(ConfigError, match="--alloc"):
        api.run(data, tmp_path / "nope.toml", PipelineConfig(), 1.0)


def test_tune_writes_allocation_summary_and_calibrated_spec(data: Path, tmp_path: Path) -> None:
    cfg = PipelineConfig(batch_size=1000)
    s = api.tune(
        data, "plumber", 3.0, cfg, tmp_path, final_s=0.5, settle_s=0.2, warmup_s=0.3, cores=2
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("allocation", "throughput_rows_per_s", "bound_rows_per_s", "fraction_of_bound",
                "tuning_s"):  # fmt: skip
        assert key in summary
    assert summary["allocation"] == s["allocation"]
    assert math.isclose(
        summary["fraction_of_bound"],
        summary["throughput_rows_per_s"] / summary["bound_rows_per_s"],
    )
    alloc = read_allocation(tmp_path / "allocation.toml", STAGES)
    assert alloc.label(STAGES) == s["allocation"]["label"]
    spec = spec_from_mapping(
        __import__("tomllib").loads((tmp_path / "calibrated.toml").read_text())
    )
    assert spec.cores == 2
    assert summary["tuning_steps"] >= 1 and summary["history"]
