"""How busy the machine is besides one process tree: the whole machine's busy CPU (``/proc/stat``)
minus the CPU of a process and its descendants (``/proc/<pid>/stat``), as cores. Linux only;
elsewhere the load reads as NaN (not measured)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""Of /proc/stat's cpu line (user nice system idle iowait irq softirq steal ...): user, nice,
system, irq, softirq, steal. Steal counts as busy: on a virtual machine it is the CPU that
neighbours took. Guest time is already inside user."""


@dataclass(kw_only=True, slots=True, frozen=True)
class CpuSample:
    """Cumulative CPU counters at one instant."""

    t: float
    """time.monotonic() when read."""
    busy_s: float
    """CPU seconds the whole machine has spent busy since boot (all cores); NaN if unknown."""
    own_s: float
    """CPU seconds of the process tree (live processes, and children already waited for)."""


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK"))


def machine_busy_s(proc: Path = PROC) -> float:
    """Busy CPU seconds of the machine since boot (all cores together); NaN without /proc."""
    try:
        with open(proc / "stat") as fh:
            head = fh.readline().split()
    except OSError:
        return math.nan
    if not head or head[0] != "cpu":
        return math.nan
    vals = [int(x) for x in head[1:]]
    return sum(vals[i] for i in _BUSY_FIELDS if i < len(vals)) / _ticks()


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first); None if gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _children(pid: int, proc: Path) -> list[int]:
    """Direct children of ``pid``: from each thread's ``children`` list, or by scanning every
    process's parent where the kernel does not keep those lists."""
    tasks = proc / str(pid) / "task"
    try:
        lists = [t / "children" for t in tasks.iterdir()]
    except OSError:
        return []
    if lists and lists[0].exists():
        out: list[int] = []
        for f in lists:
            try:
                out += [int(x) for x in f.read_text().split()]
            except OSError:
                continue
        return out
    found = []
    for d in proc.iterdir():
        if d.name.isdigit():
            fields = _stat_fields(int(d.name), proc)
            if fields is not None and len(fields) > 1 and int(fields[1]) == pid:
                found.append(int(d.name))
    return found


def tree_cpu_s(pid: int, proc: Path = PROC) -> float:
    """CPU seconds (user + system) of ``pid``, of every live descendant, and of the children
    ``pid`` has already waited for (so a worker that exits keeps counting); NaN if ``pid`` is
    gone or /proc is missing."""
    fields = _stat_fields(pid, proc)
    if fields is None:
        return math.nan
    ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    todo, seen = _children(pid, proc), {pid}
    while todo:
        child = todo.pop()
        if child in seen:
            continue
        seen.add(child)
        f = _stat_fields(child, proc)
        if f is None:
            continue
        # a child's own cutime/cstime belong to its reaped children, also the tree's
        ticks += sum(int(x) for x in f[11:15])
        todo += _children(child, proc)
    return ticks / _ticks()


def sample(pid: int | None = None, proc: Path = PROC) -> CpuSample:
    """The machine's and the tree of ``pid``'s (default: this process's) CPU counters now."""
    return CpuSample(
        t=time.monotonic(),
        busy_s=machine_busy_s(proc),
        own_s=tree_cpu_s(os.getpid() if pid is None else pid, proc),
    )


def other_load_cores(a: CpuSample, b: CpuSample) -> float:
    """Cores that processes outside the tree kept busy between two samples (>= 0); NaN when a
    counter was unknown or no time passed."""
    dt = b.t - a.t
    other = (b.busy_s - a.busy_s) - (b.own_s - a.own_s)
    if not dt > 0 or not math.isfinite(other):
        return math.nan
    return max(0.0, other / dt)


def tree_pids(pid: int, proc: Path = PROC) -> list[int]:
    """``pid`` and its live descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.append(p)
        todo += _children(p, proc)
    return out


def tree_memory_bytes(pid: int | None = None, proc: Path = PROC) -> float:
    """Proportional set size (shared pages split among their sharers, so a shared-memory
    object store is not counted once per process) of ``pid``'s tree (default: this process's),
    bytes; NaN where /proc has no smaps_rollup."""
    total = 0.0
    for p in tree_pids(os.getpid() if pid is None else pid, proc):
        try:
            text = (proc / str(p) / "smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
                break
        else:
            return math.nan
    return total
