"""The live pipeline's dispatcher: the chunks moving down the chain, which one a worker with a
free task slot gets (backpressure at each cut and at the output, and the head exception that
keeps the ordered output from starving), what a finished task does to its chunk, and the stage
counters. Its methods run under the pipeline's lock; it never starts or stops a worker (the
pool does) and only talks to workers through the ``Worker`` interface (``send``, ``stop``)."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

from recperf.ingest.base import Allocation
from recperf.ingest.live import items
from recperf.ingest.live.batch import PipelineConfig
from recperf.ingest.live.items import Columns, ItemRef, Layout
from recperf.ingest.live.plan import Plan
from recperf.ingest.live.ring import Ring, Slot
from recperf.ingest.live.workers import Chunk, DoneMsg, TaskMsg, Worker

MIB = 2**20


@dataclass(slots=True)
class StageStats:
    rows: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    busy_s: float = 0.0
    worker_s: float = 0.0
    queue_fill_s: float = 0.0
    restarts: int = 0


@dataclass(slots=True)
class Output:
    """A finished batch: in a ring slot (``slot``, ``layout``) or collated numpy (``cols``)."""

    slot: Slot | None
    layout: Layout
    rows: int
    cols: Columns | None = None


class Dispatcher:
    """Chunks, dispatch rules and stage counters of one pipeline (see the module docstring)."""

    def __init__(
        self, config: PipelineConfig, plan: Plan, stage_names: tuple[str, ...], prefix: str
    ) -> None:
        self.config = config
        self.plan = plan
        self.stage_names = stage_names
        self.prefix = prefix
        self.target = Allocation(workers=(1,))  # the pipeline sets it once checked
        self.ring = Ring(prefix, self.slot_bytes)
        self.waiting: list[Chunk] = []
        self.out: dict[int, Output] = {}
        self.stats = [StageStats() for _ in stage_names]
        self.next_out = self.rows_out = self.batches_out = self.shm_bytes = 0
        self.held_out = 0  # batches claimed by consumer threads ending the chain, not taken
        self.handoff_cpu_s = self.consumer_cpu_s = 0.0
        self.free: list[tuple[str, int]] = []  # spent chunk buffers (path, size) to reuse
        self._task_ids = itertools.count()
        self._free_ids = itertools.count()

    # -- limits ------------------------------------------------------------------------------

    @property
    def slot_bytes(self) -> int:
        return items.item_bytes(self.config.batch_size)

    @property
    def chunk_bytes(self) -> int:
        return self.plan.read_task_splits * self.slot_bytes

    def shapes(self, alloc: Allocation) -> dict[tuple[int, int], tuple[int, int]]:
        """(workers, threads) of each segment."""
        segs = alloc.segments(len(self.stage_names))
        return dict(zip(segs, zip(alloc.workers, alloc.segment_threads(), strict=True),
                        strict=True))  # fmt: skip

    def ring_limit(self, alloc: Allocation) -> int:
        """Output slots: the output queue plus a chunk per task slot of the last segment (its
        tasks ahead included when it reads: their output room is claimed when they are
        sent), and one chunk more."""
        first = alloc.segments(len(self.stage_names))[-1][0]
        per = max(1, alloc.segment_threads()[-1]) + (self.read_ahead(alloc) if first == 0 else 0)
        chunks = alloc.workers[-1] * per + 1
        return self.config.queue_batches + self.plan.read_task_splits * chunks

    def read_ahead(self, alloc: Allocation | None = None) -> int:
        """Tasks a reading worker holds beyond its compute threads, so that their storage
        requests are in flight while it decodes (none without storage latency); of the
        current allocation, or of ``alloc``."""
        if not self.config.read_latency_ms:
            return 0
        return 1 + self.inflight(alloc) // self.plan.read_task_splits

    def inflight(self, alloc: Allocation | None = None) -> int:
        a = self.target if alloc is None else alloc
        return a.inflight or self.config.read_concurrency

    def cut_cap(self, stage: int) -> int:
        """Chunks that may wait before ``stage`` (a cut): one per task slot there, and one."""
        for (a, _), (w, t) in self.shapes(self.target).items():
            if a == stage:
                return w * max(1, t) + 1
        return 1  # not a cut of the current allocation: those chunks are drained first

    def _threads_at(self, stage: int) -> int | None:
        """Threads of the target's segment that runs ``stage`` (None past the chain)."""
        for (a, b), (_, t) in self.shapes(self.target).items():
            if a <= stage < b:
                return t
        return None

    # -- dispatch ----------------------------------------------------------------------------

    def dispatch(self, workers: list[Worker]) -> None:
        """Give workers with a free slot the oldest chunk they can take: first one task per
        compute thread, then the reading tasks ahead."""
        self.refill(workers)
        for ahead in (False, True):
            for w in workers:
                cap = w.capacity if ahead else max(1, w.threads)
                while not w.retiring and len(w.tasks) < cap and self._give(w):
                    pass

    def _give(self, w: Worker) -> bool:
        a, b = w.segment
        n = len(self.stage_names)
        for chunk in sorted((c for c in self.waiting if a <= c.stage < b),
                            key=lambda c: c.first):  # fmt: skip
            if self._claim(chunk, w, b == n):
                self.waiting.remove(chunk)
                w.tasks[chunk.task_id] = chunk
                w.send(self._message(chunk, w))
                return True
        return False

    def _claim(self, chunk: Chunk, w: Worker, last: bool) -> bool:
        """Reserve the chunk's output room (backpressure); the head chunk always gets it."""
        head = chunk.first <= self.next_out
        limit = 1 << 30 if head else self.ring_limit(self.target)
        if last and w.threads == 0:
            if self.held_out + len(chunk.seqs) > limit:
                return False
            chunk.held_out = len(chunk.seqs)
            self.held_out += chunk.held_out
        elif last:
            slots = self.ring.take(len(chunk.seqs), limit)
            if slots is None:
                return False
            chunk.slots = slots
        else:  # chunks in flight to the cut are budgeted per producing task slot
            queued = sum(1 for c in self.waiting if c.stage == w.segment[1])
            if not head and queued >= self.cut_cap(w.segment[1]):
                return False
        chunk.task_id = next(self._task_ids)
        return True

    def _message(self, chunk: Chunk, w: Worker) -> TaskMsg:
        stop = w.segment[1]
        if chunk.local is not None and w.threads:  # a process cannot see Python objects
            path = str(items.SHM_DIR / f"{self.prefix}-c{chunk.first}-in{chunk.stage}-"
                       f"{chunk.attempt}")  # fmt: skip
            chunk.ref = items.write_item(path, items.pack(chunk.local))
            self.shm_bytes += chunk.ref.nbytes
            chunk.local = None
        to_shm = stop < len(self.stage_names) and (w.threads or self._threads_at(stop) != 0)
        if to_shm:
            chunk.lent = self.free.pop() if self.free else None
        return TaskMsg(
            task_id=chunk.task_id,
            attempt=chunk.attempt,
            start=chunk.stage,
            seqs=chunk.seqs,
            splits=chunk.splits if chunk.stage == 0 else (),
            source=chunk.ref,
            out_path=self.out_path(chunk) if to_shm else "",
            reuse=None if chunk.lent is None else chunk.lent[0],
            slots=tuple(s.path for s in chunk.slots),
            local=chunk.local,
        )

    def refill(self, workers: list[Worker]) -> None:
        """Keep enough unread chunks waiting for every reading slot (the plan is lazy: epochs
        may be endless)."""
        want = max(4, sum(w.capacity for w in workers if w.segment[0] == 0))
        unread = sum(1 for c in self.waiting if c.stage == 0)
        while unread < want:
            rt = self.plan.next_read_task()
            if rt is None:
                return
            self.waiting.append(Chunk(seqs=rt.seqs, splits=rt.splits))
            unread += 1

    # -- what finished tasks do ---------------------------------------------------------------

    def done(self, w: Worker, msg: DoneMsg) -> None:
        """A task's output moves on: to the consumer at the end of the chain, else to wait
        before the next stage; a stale attempt's output is dropped."""
        chunk = w.tasks.get(msg.task_id)
        if chunk is None or chunk.attempt != msg.attempt:
            if msg.out is not None:
                items.unlink_quietly(msg.out.path)
            return
        del w.tasks[msg.task_id]
        self._account(w, msg)
        if chunk.ref is not None:
            self._spend(chunk.ref, reuse=w.threads > 0)  # a thread's output may view it
            chunk.ref = None
        chunk.local = None
        if chunk.lent is not None and os.path.exists(chunk.lent[0]):
            self.free.append(chunk.lent)  # lent but not written into
        chunk.lent = None
        if w.segment[1] == len(self.stage_names):
            self._finish(chunk, msg)
        else:
            chunk.ref, chunk.stage = msg.out, w.segment[1]
            if msg.out is not None:
                self.shm_bytes += msg.out.nbytes
            else:
                chunk.local = msg.local
            self.waiting.append(chunk)
        if w.retiring and not w.tasks:
            w.stop()

    def _finish(self, chunk: Chunk, msg: DoneMsg) -> None:
        if msg.local:
            for seq, cols, rows in zip(chunk.seqs, msg.local, msg.rows_out, strict=True):
                self.out[seq] = Output(None, (), rows, cols)
            return
        for seq, slot, layout, rows in zip(chunk.seqs, chunk.slots, msg.layouts, msg.rows_out,
                                           strict=True):  # fmt: skip
            self.out[seq] = Output(slot, layout, rows)
        chunk.slots = []

    def take(self) -> Output | None:
        """The next batch in sequence order, if finished."""
        out = self.out.pop(self.next_out, None)
        if out is not None:
            self.next_out += 1
            if out.cols is not None:
                self.held_out -= 1
        return out

    def _account(self, w: Worker, msg: DoneMsg) -> None:
        a, b = w.segment
        for s in range(a, b):
            stats = self.stats[s]
            stats.cpu_s += msg.stage_cpu_s[s]
            stats.wall_s += msg.stage_wall_s[s] if msg.stage_wall_s else 0.0
            stats.rows += msg.stage_rows[s]
            stats.busy_s += msg.busy_s
        self.handoff_cpu_s += msg.handoff_cpu_s

    def requeue(self, chunk: Chunk) -> None:
        """The chunk goes back where it was; what its dead attempt wrote is dropped."""
        items.unlink_quietly(self.out_path(chunk))
        if chunk.lent is not None and os.path.exists(chunk.lent[0]):
            self.free.append(chunk.lent)
        chunk.lent = None
        self.ring.give_back(chunk.slots)
        chunk.slots = []
        self.held_out -= chunk.held_out
        chunk.held_out = 0
        chunk.attempt += 1
        self.waiting.append(chunk)

    def _spend(self, ref: ItemRef, reuse: bool) -> None:
        """A consumed chunk buffer joins the pool of files outputs are written into (unless
        arrays of a consumer thread may still view its pages: then it is only unlinked)."""
        self.shm_bytes -= ref.nbytes
        if not reuse or len(self.free) >= 2 * len(self.stage_names):
            items.unlink_quietly(ref.path)
            return
        path = str(items.SHM_DIR / f"{self.prefix}-free-{next(self._free_ids)}")
        try:
            os.rename(ref.path, path)
            size = os.stat(path).st_size  # a reused file may be larger than its last chunk
        except FileNotFoundError:
            return
        self.free.append((path, size))

    def out_path(self, chunk: Chunk) -> str:
        return str(items.SHM_DIR / f"{self.prefix}-c{chunk.first}-s{chunk.stage}-{chunk.attempt}")

    def tick(self, workers: list[Worker], dt: float) -> None:
        """Integrate task slots (worker-seconds) per stage and each cut's queue fill."""
        for w in workers:
            if not w.retiring:
                for s in range(*w.segment):
                    self.stats[s].worker_s += dt * max(1, w.threads)
        cuts = {a for a, _ in self.target.segments(len(self.stage_names))} - {0}
        for s in cuts:
            queued = sum(1 for c in self.waiting if c.stage == s)
            self.stats[s].queue_fill_s += min(1.0, queued / self.cut_cap(s)) * dt

    def local_bytes(self) -> int:
        """Bytes of the batches held as Python objects (waiting chunks and finished output)."""
        total = 0
        for c in self.waiting:
            for cols in c.local or ():
                total += sum(v.nbytes for v in cols.values())
        for o in self.out.values():
            if o.cols is not None:
                total += sum(v.nbytes for v in o.cols.values())
        return total


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
