"""The machine's other load: busy CPU from /proc/stat minus a process tree's CPU."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recperf.core import hostload
from recperf.core.hostload import CpuSample, other_load_cores, sample, tree_cpu_s

TICK = os.sysconf("SC_CLK_TCK")


def _proc(root: Path, pid: int, ppid: int, cpu: tuple[int, int, int, int], kids: list[int]) -> None:
    d = root / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True)
    fields = ["S", str(ppid)] + ["0"] * 9 + [str(x) for x in cpu] + ["0"] * 30
    (d / "stat").write_text(f"{pid} (a (weird) name) {' '.join(fields)}\n")
    (d / "task" / str(pid) / "children").write_text(" ".join(map(str, kids)) + " ")


@pytest.fixture
def fake_proc(tmp_path: Path) -> Path:
    (tmp_path / "stat").write_text(
        f"cpu  {3 * TICK} {TICK} {2 * TICK} 999 77 {TICK} 0 {TICK} 5 0\ncpu0 1 2 3 4\n"
    )
    _proc(tmp_path, 10, 1, (TICK, TICK, TICK, 0), [11, 12])
    _proc(tmp_path, 11, 10, (2 * TICK, 0, 0, 0), [13])
    _proc(tmp_path, 12, 10, (0, TICK, 0, 0), [])
    _proc(tmp_path, 13, 11, (TICK, 0, 0, TICK), [])
    _proc(tmp_path, 20, 1, (50 * TICK, 0, 0, 0), [])  # not in the tree
    return tmp_path


def test_machine_busy_counts_user_nice_system_irq_softirq_steal(fake_proc: Path) -> None:
    assert hostload.machine_busy_s(fake_proc) == pytest.approx(3 + 1 + 2 + 1 + 0 + 1)


def test_tree_cpu_sums_descendants_and_reaped_children(fake_proc: Path) -> None:
    assert tree_cpu_s(10, fake_proc) == pytest.approx(3 + 2 + 1 + 2)
    assert tree_cpu_s(11, fake_proc) == pytest.approx(2 + 2)
    assert math.isnan(tree_cpu_s(99, fake_proc))


def test_tree_cpu_finds_children_by_scanning_without_children_lists(fake_proc: Path) -> None:
    for f in fake_proc.glob("*/task/*/children"):
        f.unlink()
    assert tree_cpu_s(10, fake_proc) == pytest.approx(3 + 2 + 1 + 2)


def test_other_load_is_busy_minus_own_over_time() -> None:
    a = CpuSample(t=10.0, busy_s=100.0, own_s=40.0)
    b = CpuSample(t=12.0, busy_s=106.0, own_s=43.0)
    assert other_load_cores(a, b) == pytest.approx(1.5)
    assert other_load_cores(a, CpuSample(t=12.0, busy_s=101.0, own_s=43.0)) == 0.0
    assert math.isnan(other_load_cores(a, a))
    assert math.isnan(other_load_cores(a, CpuSample(t=11.0, busy_s=math.nan, own_s=41.0)))


def test_missing_proc_reads_as_not_measured(tmp_path: Path) -> None:
    s = sample(proc=tmp_path / "absent")
    assert math.isnan(s.busy_s) and math.isnan(s.own_s)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc")
def test_a_busy_child_counts_as_own_cpu() -> None:
    a = sample()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt=time.process_time()\nwhile time.process_time()-t<0.4: pass",
        ]
    )
    time.sleep(0.2)
    mid = tree_cpu_s(os.getpid()) - a.own_s  # the child is alive: counted from its own stat
    child.wait()
    b = sample()
    assert mid > 0
    assert b.own_s - a.own_s >= 0.4 - 2 / TICK  # reaped: counted in our cutime
    assert other_load_cores(a, b) >= 0.0
