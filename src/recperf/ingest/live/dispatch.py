"""The live pipeline's coordinator bookkeeping: tasks, worker processes and stage counters,
the dispatch rules (which task an idle worker gets, with backpressure and the head-window
exception that keeps the ordered output from starving) and the metrics snapshot. ``Pipeline``
mixes ``Dispatcher`` in; the state it reads is declared here and initialised there."""

from __future__ import annotations

import heapq
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from recperf.ingest.base import Allocation
from recperf.ingest.live import items
from recperf.ingest.live.batch import PipelineConfig, Snapshot, StageCounters
from recperf.ingest.live.plan import Plan, ReadTask
from recperf.ingest.live.workers import TaskMsg

MIB = 2**20


@dataclass(slots=True, eq=False)
class Task:
    stage: int
    task_id: int
    seqs: tuple[int, ...]
    inputs: tuple[Any, ...]
    attempt: int = 0
    window: int = 0
    group: tuple[str, int] | None = None
    lent: tuple[tuple[str, int], ...] = ()


@dataclass(slots=True, eq=False)
class WorkerProc:
    stage: int
    proc: Any
    conn: Connection
    task: Task | None = None
    retiring: bool = False
    group: tuple[str, int] | None = None


@dataclass(slots=True)
class StageStats:
    rows: int = 0
    cpu_s: float = 0.0
    busy_s: float = 0.0
    worker_s: float = 0.0
    queue_fill_s: float = 0.0
    restarts: int = 0


def pss_mib(pid: int) -> float:
    """Proportional set size of a process (shared pages split among sharers), MiB."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Dispatcher:
    """Dispatch and metrics over the coordinator state of a ``Pipeline``."""

    config: PipelineConfig
    plan: Plan
    stage_names: tuple[str, ...]
    _lock: threading.Condition
    _workers: list[WorkerProc]
    _bufs: list[dict[int, items.ItemRef]]
    _caps: list[int]
    _ready_read: list[tuple[int, int, Task]]
    _task_ids: Iterator[int]
    _free: list[tuple[str, int]]
    _next_out: int
    _stats: list[StageStats]
    _est_mib: list[float]
    _shm_bytes: int
    _peak: float
    _rows_out: int
    _batches_out: int
    _last_t: float

    def _send(self, w: WorkerProc, msg: TaskMsg | None) -> None:
        raise NotImplementedError

    def _out_prefix(self, task: Task) -> str:
        raise NotImplementedError

    def _shuffle_stage(self) -> int:
        raise NotImplementedError

    def _tick(self) -> None:
        raise NotImplementedError

    # -- dispatch -----------------------------------------------------------------------------

    def _head_limit(self) -> int:
        """Seqs below this may always move on, so the next item out can never be starved."""
        k = max(1, self.config.shuffle_window)
        return (self._next_out // k + 1) * k

    def _room(self, stage: int, first_seq: int) -> bool:
        """Backpressure: a stage takes a task while its output buffer has room (in-flight
        outputs, at most one task's per worker, are budgeted per worker in memory_bytes)."""
        return len(self._bufs[stage + 1]) < self._caps[stage + 1] or first_seq < self._head_limit()

    def _dispatch(self) -> None:
        idle = [w for w in self._workers if w.task is None and not w.retiring]
        for w in idle:
            task = self._next_task(w)
            if task is None:
                continue
            w.task = task
            if task.group is not None:
                w.group = task.group
            n = min(len(task.seqs), len(self._free))
            task.lent = tuple(self._free.pop() for _ in range(n))
            msg = TaskMsg(
                task.task_id, task.attempt, task.inputs, self._out_prefix(task), task.window,
                tuple(p for p, _ in task.lent),
            )  # fmt: skip
            self._send(w, msg)

    def _next_task(self, w: WorkerProc) -> Task | None:
        s = w.stage
        if s == 0:
            return self._next_read(w)
        buf = self._bufs[s]
        if not buf:
            return None
        if s == self._shuffle_stage():
            return self._next_window(s)
        seq = min(buf)
        if not self._room(s, seq):
            return None
        ref = buf.pop(seq)
        return Task(stage=s, task_id=next(self._task_ids), seqs=(seq,), inputs=(ref,))

    def _next_read(self, w: WorkerProc) -> Task | None:
        """The earliest read task, or a near one of the row group this worker has cached;
        the task holding the head window always goes first."""
        self._refill_reads()
        if not self._ready_read:
            return None
        near = heapq.nsmallest(4, self._ready_read)
        head = near[0]
        pick = None
        if head[0] >= self._head_limit() and w.group is not None:
            same = [e for e in near if e[2].group == w.group]
            pick = next((e for e in same if self._room(0, e[0])), None)
        if pick is None:
            if not self._room(0, head[0]):
                return None
            pick = head
        self._ready_read.remove(pick)
        heapq.heapify(self._ready_read)
        return pick[2]

    def _refill_reads(self) -> None:
        while len(self._ready_read) < 8:
            rt: ReadTask | None = self.plan.next_read_task()
            if rt is None:
                return
            task = Task(
                stage=0,
                task_id=next(self._task_ids),
                seqs=rt.seqs,
                inputs=rt.splits,
                group=rt.group,
            )
            heapq.heappush(self._ready_read, (rt.seqs[0], task.task_id, task))

    def _next_window(self, s: int) -> Task | None:
        k = self.config.shuffle_window
        buf = self._bufs[s]
        first = min(buf)
        win = first // k
        seqs = tuple(q for q in range(win * k, (win + 1) * k) if q < self.plan.total_items)
        if not all(q in buf for q in seqs) or not self._room(s, seqs[0]):
            return None
        refs = tuple(buf.pop(q) for q in seqs)
        return Task(stage=s, task_id=next(self._task_ids), seqs=seqs, inputs=refs, window=win)

    # -- metrics ------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Cumulative per-stage counters now, with current memory (reads each worker's PSS)."""
        with self._lock:
            self._tick()
            workers = [(w.stage, w.proc.pid, w.retiring) for w in self._workers]
        pss = {pid: pss_mib(pid) for _, pid, _ in workers}
        with self._lock:
            stages = []
            total = float(self._shm_bytes + sum(size for _, size in self._free))
            for s, stats in enumerate(self._stats):
                mine = [pss[pid] for stg, pid, _ in workers if stg == s]
                if mine:
                    self._est_mib[s] = max(self._est_mib[s], max(mine))
                buf_bytes = sum(r.nbytes for r in self._bufs[s].values()) if s else 0
                mem = sum(mine) * MIB + buf_bytes
                total += sum(mine) * MIB
                stages.append(StageCounters(
                    rows=stats.rows, cpu_s=stats.cpu_s, busy_s=stats.busy_s,
                    worker_s=stats.worker_s, queue_fill_s=stats.queue_fill_s,
                    workers=sum(1 for stg, _, r in workers if stg == s and not r),
                    memory_bytes=mem, restarts=stats.restarts,
                ))  # fmt: skip
            self._peak = max(self._peak, total)
            return Snapshot(
                t=self._last_t, stages=tuple(stages), rows_out=self._rows_out,
                batches_out=self._batches_out, memory_bytes=total, peak_memory_bytes=self._peak,
            )  # fmt: skip


def sweep_stale_items() -> int:
    """Delete item files left in SHM_DIR by pipelines whose process is gone (killed before it
    could clean up); returns how many."""
    removed = 0
    for path in items.SHM_DIR.glob("rp*x*-*"):
        pid = path.name[2:].split("x", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            items.unlink_quietly(str(path))
            removed += 1
        except PermissionError:
            pass  # another user's live process
    return removed


def even_split(n_stages: int, cores: int) -> Allocation:
    """One worker per stage, then the remaining cores dealt round-robin from the first stage."""
    w = [1] * n_stages
    for i in range(max(0, cores - n_stages)):
        w[i % n_stages] += 1
    return Allocation(workers=tuple(w))
