"""The live pipeline's coordinator bookkeeping: chunks moving down the chain, worker processes
and stage counters, the dispatch rules (which chunk an idle worker of a segment gets, with
backpressure and the head exception that keeps the ordered output from starving) and the
metrics snapshot. ``Pipeline`` mixes ``Dispatcher`` in; the state it reads is declared here and
initialised there."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from recperf.ingest.base import Allocation
from recperf.ingest.data import stages as st
from recperf.ingest.live import items
from recperf.ingest.live.batch import PipelineConfig, Snapshot, StageCounters
from recperf.ingest.live.items import ItemRef, Layout
from recperf.ingest.live.plan import Plan
from recperf.ingest.live.ring import Ring, Slot
from recperf.ingest.live.workers import TaskMsg

MIB = 2**20


@dataclass(slots=True, eq=False)
class Chunk:
    """Consecutive batches moving down the chain together; ``stage`` is the next stage to run
    (0: not read yet), ``ref`` the packed batches after stage ``stage - 1``."""

    seqs: tuple[int, ...]
    splits: tuple[st.Split, ...]
    stage: int = 0
    ref: ItemRef | None = None
    attempt: int = 0
    task_id: int = -1
    lent: tuple[str, int] | None = None
    slots: list[Slot] = field(default_factory=list)

    @property
    def first(self) -> int:
        return self.seqs[0]


@dataclass(slots=True, eq=False)
class WorkerProc:
    segment: tuple[int, int]
    proc: Any
    conn: Connection
    task: Chunk | None = None
    retiring: bool = False


@dataclass(slots=True)
class StageStats:
    rows: int = 0
    cpu_s: float = 0.0
    busy_s: float = 0.0
    worker_s: float = 0.0
    queue_fill_s: float = 0.0
    restarts: int = 0


@dataclass(slots=True)
class Output:
    slot: Slot
    layout: Layout
    rows: int


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
    _target: Allocation
    _waiting: list[Chunk]
    _out: dict[int, Output]
    _ring: Ring
    _free: list[tuple[str, int]]
    _task_ids: Any
    _next_out: int
    _stats: list[StageStats]
    _seg_mib: dict[tuple[int, int], float]
    _shm_bytes: int
    _peak: float
    _rows_out: int
    _batches_out: int
    _handoff_cpu_s: float
    _consumer_cpu_s: float
    _last_t: float

    def _send(self, w: WorkerProc, msg: TaskMsg | None) -> None:
        raise NotImplementedError

    def _out_path(self, chunk: Chunk) -> str:
        raise NotImplementedError

    def _tick(self) -> None:
        raise NotImplementedError

    # -- limits ------------------------------------------------------------------------------

    @property
    def slot_bytes(self) -> int:
        return items.item_bytes(self.config.batch_size)

    @property
    def chunk_bytes(self) -> int:
        return self.plan.read_task_splits * self.slot_bytes

    def _segment_workers(self, alloc: Allocation) -> dict[tuple[int, int], int]:
        segs = alloc.segments(len(self.stage_names))
        return dict(zip(segs, alloc.workers, strict=True))

    def ring_limit(self, alloc: Allocation) -> int:
        """Ring slots: the output queue plus a chunk per worker of the last segment and one."""
        last = alloc.workers[-1]
        return self.config.queue_batches + self.plan.read_task_splits * (last + 1)

    def cut_cap(self, stage: int) -> int:
        """Chunks that may wait before ``stage`` (a cut): one per worker there, and one."""
        for (a, _), w in self._segment_workers(self._target).items():
            if a == stage:
                return w + 1
        return 1  # not a cut of the current allocation: those chunks are drained first

    # -- dispatch ----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        n = len(self.stage_names)
        self._refill()
        for w in self._workers:
            if w.task is not None or w.retiring:
                continue
            a, b = w.segment
            for chunk in sorted((c for c in self._waiting if a <= c.stage < b),
                                key=lambda c: c.first):  # fmt: skip
                if self._claim(chunk, b, n):
                    self._waiting.remove(chunk)
                    w.task = chunk
                    self._send(w, self._message(chunk))
                    break

    def _claim(self, chunk: Chunk, stop: int, n: int) -> bool:
        """Reserve the chunk's output room (backpressure); the head chunk always gets it."""
        head = chunk.first <= self._next_out
        if stop == n:
            limit = 1 << 30 if head else self.ring_limit(self._target)
            slots = self._ring.take(len(chunk.seqs), limit)
            if slots is None:
                return False
            chunk.slots = slots
            return True
        # chunks in flight to the cut are budgeted per producing worker (memory_bytes)
        queued = sum(1 for c in self._waiting if c.stage == stop)
        if not head and queued >= self.cut_cap(stop):
            return False
        chunk.lent = self._free.pop() if self._free else None
        return True

    def _message(self, chunk: Chunk) -> TaskMsg:
        chunk.task_id = next(self._task_ids)
        return TaskMsg(
            task_id=chunk.task_id,
            attempt=chunk.attempt,
            start=chunk.stage,
            seqs=chunk.seqs,
            splits=chunk.splits if chunk.stage == 0 else (),
            source=chunk.ref,
            out_path=self._out_path(chunk),
            reuse=None if chunk.lent is None else chunk.lent[0],
            slots=tuple(s.path for s in chunk.slots),
        )

    def _refill(self) -> None:
        """Keep a few unread chunks waiting (the plan is lazy: epochs may be endless)."""
        unread = sum(1 for c in self._waiting if c.stage == 0)
        while unread < 4:
            rt = self.plan.next_read_task()
            if rt is None:
                return
            self._waiting.append(Chunk(seqs=rt.seqs, splits=rt.splits))
            unread += 1

    # -- metrics ------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Cumulative per-stage counters now, with current memory (reads each worker's PSS)."""
        with self._lock:
            self._tick()
            workers = [(w.segment, w.proc.pid, w.retiring) for w in self._workers]
        pss = {pid: pss_mib(pid) for _, pid, _ in workers}
        with self._lock:
            est = self.config.worker_memory_mib  # a floor: PSS of a new fork understates it
            for seg, pid, _ in workers:
                self._seg_mib[seg] = max(self._seg_mib.get(seg, est), pss[pid])
            total = float(self._shm_bytes + self._ring.nbytes + sum(s for _, s in self._free))
            total += sum(pss.values()) * MIB
            stages = []
            for s, stats in enumerate(self._stats):
                mine = [pss[pid] for (a, b), pid, _ in workers if a <= s < b]
                buf = sum(c.ref.nbytes for c in self._waiting if c.stage == s and c.ref)
                stages.append(StageCounters(
                    rows=stats.rows, cpu_s=stats.cpu_s, busy_s=stats.busy_s,
                    worker_s=stats.worker_s, queue_fill_s=stats.queue_fill_s,
                    workers=sum(1 for (a, b), _, r in workers if a <= s < b and not r),
                    memory_bytes=sum(mine) * MIB + buf, restarts=stats.restarts,
                ))  # fmt: skip
            self._peak = max(self._peak, total)
            return Snapshot(
                t=self._last_t, stages=tuple(stages), rows_out=self._rows_out,
                batches_out=self._batches_out, memory_bytes=total, peak_memory_bytes=self._peak,
                handoff_cpu_s=self._handoff_cpu_s, consumer_cpu_s=self._consumer_cpu_s,
            )  # fmt: skip


def sweep_stale_items() -> int:
    """Delete shared-memory files left by pipelines whose process is gone (killed before it or
    its workers could clean up); returns how many."""
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
