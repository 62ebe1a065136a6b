"""LiveTarget's measurement with a stated confidence, on a stand-in pipeline whose counters
advance by a script (no workers), and on the real pipeline."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from recperf.core.confidence import t_quantile
from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation
from recperf.ingest.live.allocfile import read_allocation, write_allocation
from recperf.ingest.live.batch import PipelineConfig, Snapshot, StageCounters
from recperf.ingest.live.executor import Pipeline
from recperf.ingest.live.target import (
    LiveTarget,
    repeated_measurement,
    subwindow_rates,
)

NAMES = ("read", "collate")


def snap(t: float, rows: int) -> Snapshot:
    st = StageCounters(rows=rows, cpu_s=t, busy_s=t, worker_s=2 * t, queue_fill_s=0.0,
                       workers=1, memory_bytes=1.0, restarts=0)  # fmt: skip
    return Snapshot(t=t, stages=(st, st), rows_out=rows, batches_out=rows // 10,
                    memory_bytes=1.0, peak_memory_bytes=5.0)  # fmt: skip


@dataclass
class Scripted:
    """A stand-in Pipeline: each snapshot advances 1 s of its own clock at the next scripted
    rate (the last one repeats)."""

    rates: Sequence[float]
    config: PipelineConfig = field(default_factory=lambda: PipelineConfig(epochs=None))
    allocation: Allocation = field(default_factory=lambda: Allocation(workers=(1, 1)))
    stage_names: tuple[str, ...] = NAMES
    cores: int = 2
    taken: int = 0
    t: float = 0.0
    rows: int = 0
    memory_reads: int = 0

    def __iter__(self) -> Iterator[int]:
        while True:
            yield 0

    def snapshot(self, memory: bool = True) -> Snapshot:
        self.memory_reads += memory
        if self.taken:
            self.rows += int(self.rates[min(self.taken - 1, len(self.rates) - 1)])
            self.t += 1.0
        self.taken += 1
        return snap(self.t, self.rows)

    def resize(self, alloc: Allocation) -> None:
        self.allocation = alloc


def target(rates: Sequence[float], **kw: float) -> tuple[LiveTarget, Scripted]:
    p = Scripted(rates)
    t = LiveTarget(p, settle_s=0.0, warmup_s=0.0, subwindow_s=0.01, **kw)  # type: ignore[arg-type]
    return t, p


def test_repeated_measurement_states_the_t_interval_of_sub_window_rates() -> None:
    snaps = [snap(0.0, 0), snap(1.0, 100), snap(2.0, 220), snap(3.0, 310), snap(4.0, 400)]
    alloc = Allocation(workers=(1, 1))
    assert subwindow_rates(snaps, alloc) == [100.0, 120.0, 90.0, 90.0]
    m = repeated_measurement(snaps, alloc, other_load_cores=0.5)
    h = t_quantile(3) * statistics.stdev([100, 120, 90, 90]) / 2
    assert m.throughput_rows_per_s == 100.0 and m.samples == 4 and m.window_s == 4.0
    assert m.throughput_ci == pytest.approx((100 - h, 100 + h))
    assert m.other_load_cores == 0.5


def test_a_steady_pipeline_is_measured_in_the_window_asked_for() -> None:
    t, p = target([1000.0])
    reads = p.memory_reads
    m = t.measure(Allocation(workers=(1, 1)), 0.04)
    assert m.samples == 4 and m.throughput_ci == (1000.0, 1000.0)
    assert p.memory_reads - reads == 2  # the workers' memory is read before and after only
    assert m.throughput_rows_per_s == 1000.0 and t.measurements == [m]
    assert math.isnan(m.other_load_cores) or m.other_load_cores >= 0


def test_a_noisy_window_grows_until_confident_or_at_its_limit() -> None:
    noisy = [1000.0, 800.0] + [1000.0] * 10
    t, _ = target(noisy, rel_tol=0.05, max_extend=3.0)
    m = t.measure(Allocation(workers=(1, 1)), 0.03)
    # 3 to 7 sub-windows are not within 5% (7: 971 +- 55.5); 8 are (975 +- 47.4)
    rates = noisy[: m.samples]
    lo, hi = m.throughput_ci
    assert m.samples == 8
    assert (hi - lo) / 2 <= 0.05 * m.throughput_rows_per_s
    assert m.throughput_rows_per_s == pytest.approx(sum(rates) / len(rates))
    wild = [1000.0, 100.0] * 10
    t, _ = target(wild, rel_tol=0.05, max_extend=2.0)
    m = t.measure(Allocation(workers=(1, 1)), 0.03)
    assert m.samples == 6  # at most twice the three asked for
    assert m.throughput_ci[0] < 550 < m.throughput_ci[1]


def test_rel_tol_zero_without_extension_keeps_the_window() -> None:
    t, _ = target([1000.0, 100.0] * 10, rel_tol=0.0, max_extend=1.0)
    assert t.measure(Allocation(workers=(1, 1)), 0.05).samples == 5


@pytest.mark.parametrize(
    ("option", "value"),
    [("subwindow_s", 0.0), ("min_samples", 1), ("rel_tol", -0.1), ("max_extend", 0.5)],
)
def test_bad_options_name_the_option(option: str, value: float) -> None:
    with pytest.raises(Exception, match=option):
        target([1.0], **{option: value})


def test_live_pipeline_reports_interval_samples_and_other_load(tmp_path: Path) -> None:
    from recperf.ingest.data.criteo import GenerateConfig, generate

    generate(GenerateConfig(rows=8_000, shards=2, seed=1), tmp_path)
    cfg = PipelineConfig(batch_size=500, epochs=None)
    with Pipeline(tmp_path, cfg, cores=2) as p:
        t = LiveTarget(p, settle_s=0.1, warmup_s=0.2, subwindow_s=0.1, max_extend=1.0)
        m = t.measure(Allocation(workers=(2,), cuts=()), 0.3)
    assert m.samples == 3 and m.throughput_rows_per_s > 0
    lo, hi = m.throughput_ci
    assert lo <= m.throughput_rows_per_s <= hi
    assert m.other_load_cores >= 0


STAGES = ("read", "dense", "sparse", "shuffle", "collate")


@pytest.mark.parametrize(
    "alloc",
    [
        Allocation(workers=(2, 1), cuts=(3,), threads=(4, 0)),
        Allocation(workers=(3,), cuts=(), threads=(0,), inflight=16),
        Allocation(workers=(1, 1, 1, 1, 1), inflight=256),
    ],
)
def test_allocation_files_with_threads_and_inflight_round_trip(
    tmp_path: Path, alloc: Allocation
) -> None:
    path = tmp_path / "alloc.toml"
    write_allocation(path, STAGES, alloc, "shaped")
    assert read_allocation(path, STAGES) == alloc.normalized(len(STAGES))
    text = path.read_text()
    assert ("threads = " in text) == (alloc.threads is not None)
    assert (f"inflight = {alloc.inflight}" in text) == bool(alloc.inflight)


def test_threads_of_one_everywhere_read_as_processes(tmp_path: Path) -> None:
    path = tmp_path / "alloc.toml"
    path.write_text('[[segment]]\nstages = ["read", "dense", "sparse", "shuffle", "collate"]\n'
                    "workers = 2\nthreads = 1\n")  # fmt: skip
    assert read_allocation(path, STAGES) == Allocation(workers=(2,), cuts=())
    path.write_text("inflight = 8\n[allocation]\nread = 1\ndense = 1\nsparse = 1\n"
                    "shuffle = 1\ncollate = 2\n")  # fmt: skip
    assert read_allocation(path, STAGES) == Allocation(workers=(1, 1, 1, 1, 2), inflight=8)


FUSED = '[[segment]]\nstages = ["read", "dense", "sparse", "shuffle", "collate"]\nworkers = 2\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (FUSED + "threads = 65\n", r"segment\[0\]\.threads = 65: expected 0\.\.64 threads"),
        (FUSED + "threads = -1\n", r"segment\[0\]\.threads = -1: expected 0\.\.64"),
        (FUSED + "threads = 2.5\n", r"segment\[0\]\.threads = 2\.5: expected 0\.\.64"),
        (FUSED + "threads = true\n", r"segment\[0\]\.threads = True: expected 0\.\.64"),
        ("inflight = 0\n" + FUSED, r"inflight = 0: expected 1\.\.256 storage requests"),
        ("inflight = 257\n" + FUSED, r"inflight = 257: expected 1\.\.256"),
        ('inflight = "8"\n' + FUSED, r"inflight = '8': expected 1\.\.256"),
        (FUSED + "procs = 2\n", r"segment\[0\]: expected the keys stages and workers, and opt"),
    ],
)
def test_bad_threads_or_inflight_in_a_file_is_one_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "alloc.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        read_allocation(path, STAGES)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
