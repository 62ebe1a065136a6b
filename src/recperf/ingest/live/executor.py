"""The live ingestion pipeline: the stage chain cut into segments, each served by workers that
are processes of T threads or threads of the consumer's own process (``pool``), fed by a
dispatcher (``dispatch``) that one coordinator thread and the worker threads drive; chunks cross
a cut as one packed shared-memory buffer when a process is on either side (as Python objects
between consumer threads), and leave the chain through a reused ring of slots the consumer reads
as tensor views (from a process) or as the collated arrays themselves (from a thread).

Exactly-once: every task (one chunk through one segment) has an attempt number; its input stays
until a worker of the current attempt reports its output, so a worker process that dies (or is
killed) mid-task only costs a redo, and the outputs of a stale attempt are dropped. A worker
thread that raises stops the run with that one error. Resizing, re-cutting or re-threading
starts workers or lets surplus ones finish their tasks and exit; a chunk waiting before stage s
is taken by whichever segment now holds s. Batches leave in sequence order, so a seed fixes
every batch whatever the allocation or crashes.

Who drives what: the coordinator thread starts and retires workers, reads what worker processes
report and dispatches; a worker thread does its own bookkeeping and dispatch under the lock; the
consumer dispatches when it frees output room. The coordinator also wakes on a self-pipe, so a
resize or close never waits for its poll."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from multiprocessing.connection import wait
from pathlib import Path

import torch

from recperf.core.errors import RecperfError
from recperf.ingest.base import Allocation
from recperf.ingest.live import items
from recperf.ingest.live.batch import Batch, PipelineConfig, Snapshot, StageCounters
from recperf.ingest.live.budget import Budget
from recperf.ingest.live.dispatch import MIB, Dispatcher, Output, pss_mib, sweep_stale_items
from recperf.ingest.live.plan import Plan
from recperf.ingest.live.pool import Pool
from recperf.ingest.live.ring import Slot, SlotMaps
from recperf.ingest.live.workers import DoneMsg, FailMsg, Worker, error_of

__all__ = ["Pipeline", "sweep_stale_items"]
_RUN_IDS = itertools.count()
POLL_S = 0.1
"""The coordinator's longest sleep: only the stage-time integrals wait for it."""


class _SlotRef(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to a ``Batch`` that views a ring slot, carrying that slot."""

    __slots__ = ("slot",)
    slot: Slot


class _Batches:
    """A pipeline's batches, in order. Unlike a generator, whose frame would hold the batch it
    gave until the next one is taken, it keeps no reference to a batch once returned, so a
    dropped batch's slot goes back to the ring at the next take."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline: Pipeline | None = pipeline

    def __iter__(self) -> _Batches:
        return self

    def __next__(self) -> Batch:
        p = self._pipeline
        if p is None:
            raise StopIteration
        try:
            while True:
                batch = p._take()
                if batch is None:
                    self._pipeline = None
                    raise StopIteration
                if batch.size:
                    return batch
        except (KeyboardInterrupt, SystemExit):
            # Ctrl-C in the consumer's loop: stop the workers now, while the interpreter is
            # whole. Left to __del__, the close ran at shutdown (imports gone) or never, and
            # multiprocessing's exit hook then waited on workers that wait for work.
            p.close()
            raise


class Pipeline:
    """Criteo rows in ``data`` (a file or directory of Parquet / TSV shards) through read,
    dense, sparse, [downsample], [shuffle] and collate; iterate it for ``Batch``es.

    A batch from a worker process views a ring slot, which returns to the ring when the
    ``Batch`` is dropped: keep the Batch while using its tensors (a tensor taken out of it and
    kept after the Batch is gone sees the slot's next batch; ``batch.clone()`` or ``copy=True``
    gives batches that own their memory). Holding many batches grows the ring. A batch from a
    consumer thread owns its arrays."""

    def __init__(
        self,
        data: str | Path,
        config: PipelineConfig | None = None,
        allocation: Allocation | Sequence[int] | str = "fused",
        cores: int | None = None,
        *,
        copy: bool = False,
    ) -> None:
        self.config = config or PipelineConfig()
        self.stage_names = self.config.stage_names()
        self.cores = cores or os.cpu_count() or 1
        self.copy = copy
        self.plan = Plan(data, self.config)
        self._prefix = f"rp{os.getpid()}x{next(_RUN_IDS)}"
        self.dispatcher = Dispatcher(self.config, self.plan, self.stage_names, self._prefix)
        self.budget = Budget(self.dispatcher, self.cores)
        self.dispatcher.target = self.budget.check(self.budget.resolve(allocation))
        self._lock = threading.Condition()
        self.pool = Pool(self.dispatcher, self._on_reply, self._on_thread_reply)
        self._peak = 0.0
        self._pss: dict[int, float] = {}  # the last PSS read of each worker process, MiB
        self._error: BaseException | None = None
        self._closed = self._started = False
        self._thread: threading.Thread | None = None
        self._maps = SlotMaps(self.dispatcher.slot_bytes)
        self._dirty = True
        self._last_t = time.monotonic()
        self._wake_r = self._wake_w = -1  # the coordinator's self-pipe, made by start()
        # Slots of batches the consumer dropped: a dropped batch's weak reference lands in
        # ``_dropped`` by ``deque.append``, a C call that runs no bytecode, so a Ctrl-C that
        # arrives as the batch dies is raised in the consumer's own code. (A Python finalizer
        # would take it, and CPython only prints an exception raised in one: the consumer then
        # went on running.) The consumer and the coordinator give the slots back.
        self._dropped: deque[_SlotRef] = deque()
        self._held: dict[int, _SlotRef] = {}

    @property
    def allocation(self) -> Allocation:
        return self.dispatcher.target

    def resize(self, allocation: Allocation | Sequence[int]) -> None:
        """Change the cuts, workers, threads and in-flight requests while running; refused
        (nothing changes) if over budget. The coordinator applies it between two dispatches."""
        alloc = self.budget.check(self.budget.resolve(allocation))
        with self._lock:
            self.dispatcher.target = alloc
            self._dirty = True
            self._wake()

    @property
    def memory_budget_bytes(self) -> float:
        return self.budget.memory_budget_bytes

    def memory_bytes(self, alloc: Allocation) -> float:
        """Predicted peak memory of ``alloc`` (see ``Budget.memory_bytes``), bytes."""
        return self.budget.memory_bytes(alloc)

    def ring_limit(self, alloc: Allocation) -> int:
        return self.dispatcher.ring_limit(alloc)

    def worker_memory_mib(self) -> tuple[float, ...]:
        with self._lock:
            return self.budget.worker_memory_mib(self.dispatcher.target)

    def worker_pids(self) -> dict[str, list[int]]:
        """Pids of the worker processes serving each segment (label e.g. ``read+dense``), not
        counting retiring ones; a worker that just died is listed until the coordinator reaps
        it. Segments of consumer threads have none."""
        with self._lock:
            out: dict[str, list[int]] = {}
            for (a, b), pid in self.pool.pids():
                out.setdefault("+".join(self.stage_names[a:b]), []).append(pid)
            return out

    def workers_now(self) -> dict[str, list[int]]:
        """Threads of each worker (0: a consumer thread) serving each segment, not retiring."""
        with self._lock:
            out: dict[str, list[int]] = {}
            for w in self.pool.workers:
                if not w.retiring:
                    out.setdefault("+".join(self.stage_names[slice(*w.segment)]), []).append(
                        w.threads
                    )
            return out

    def _wake(self) -> None:
        if self._wake_w < 0:
            return  # not started: the coordinator's first step applies everything
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Pipeline:
        if self._started:
            return self
        sweep_stale_items()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._started = True
        self._last_t = time.monotonic()
        # Worker processes are forked by the coordinator thread only: it lives as long as the
        # pipeline, and the kernel's parent-death signal follows the forking thread.
        self._thread = threading.Thread(target=self._run, name="recperf-ingest", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop every worker (process or thread) and delete every shared-memory file; safe to
        call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
            self._wake()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.pool.close()
        self._maps.close()
        self.dispatcher.ring.unlink()
        for path in items.SHM_DIR.glob(f"{self._prefix}-*"):
            items.unlink_quietly(str(path))
        with self._lock:  # a late resize must not write into a reused descriptor
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._wake_r = self._wake_w = -1

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_started", False) and not getattr(self, "_closed", True):
            self.close()

    # -- the coordinator ----------------------------------------------------------------------

    def _run(self) -> None:
        d = self.dispatcher
        try:
            while True:
                t_cpu = time.thread_time()
                with self._lock:
                    if self._stopping():
                        return
                    if self._dirty:
                        self.pool.apply(d.target)
                        self._dirty = False
                    self._tick()
                    self._reclaim()
                    d.dispatch(self.pool.workers)
                    waitables = [*self.pool.waitables(), self._wake_r]
                    d.consumer_cpu_s += time.thread_time() - t_cpu
                ready = wait(waitables, timeout=POLL_S)
                t_cpu = time.thread_time()
                with self._lock:
                    if self._wake_r in ready:
                        with contextlib.suppress(BlockingIOError, OSError):
                            os.read(self._wake_r, 4096)
                    if self._stopping():
                        return
                    self.pool.handle([r for r in ready if r is not self._wake_r])
                    self._lock.notify_all()
                    d.consumer_cpu_s += time.thread_time() - t_cpu
        except BaseException as exc:  # a coordinator bug must surface in the consumer
            with self._lock:
                self._error = self._error or exc
                self._lock.notify_all()

    def _stopping(self) -> bool:
        return self._closed or self._error is not None

    def _tick(self) -> None:
        now = time.monotonic()
        dt, self._last_t = now - self._last_t, now
        self.dispatcher.tick(self.pool.workers, dt)

    def _on_reply(self, w: Worker, msg: DoneMsg | FailMsg) -> None:
        """A worker's report (under the lock): its chunk moves on, or the run stops."""
        if isinstance(msg, FailMsg):
            if w.tasks.get(msg.task_id) is not None and self._error is None:
                self._error = self._failure(msg, w)
            return
        self.dispatcher.done(w, msg)
        self.pool.discard(w)

    def _failure(self, msg: FailMsg, w: Worker) -> Exception:
        name = "+".join(self.stage_names[slice(*w.segment)])
        return error_of(msg, name, self.plan.split_of_row)

    def _on_thread_reply(self, w: Worker, msg: DoneMsg | FailMsg) -> None:
        """A worker thread's report, on its own thread: bookkeeping and dispatch here, without
        waking the coordinator (unless a retired thread's exit lets a resize go on)."""
        with self._lock:
            if self._closed:
                return
            try:
                self._on_reply(w, msg)
            except Exception as exc:  # e.g. a full /dev/shm: the run stops with it
                self._error = self._error or exc
            self._dispatch()
            self._lock.notify_all()

    def _dispatch(self) -> None:
        """Dispatch from a worker thread or the consumer (under the lock): an error (e.g. a full
        /dev/shm while handing a chunk to a process) stops the run instead of this thread."""
        if self._error is None:
            try:
                self.dispatcher.dispatch(self.pool.workers)
            except Exception as exc:
                self._error = exc

    # -- consuming ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        self.start()
        return _Batches(self)

    def _take(self) -> Batch | None:
        d = self.dispatcher
        t_cpu = time.thread_time()
        with self._lock:
            while True:
                if self._error is not None:
                    err = self._error
                    if isinstance(err, RecperfError):
                        raise err
                    raise RuntimeError(f"ingest pipeline failed: {err}") from err
                if d.next_out >= self.plan.total_items:
                    return None
                if self._closed:
                    raise RecperfError("the pipeline was closed while iterating")
                self._reclaim()
                out = d.take()
                if out is not None:
                    break
                d.consumer_cpu_s += time.thread_time() - t_cpu
                self._lock.wait(timeout=0.5)
                t_cpu = time.thread_time()
            if out.cols is not None:
                self._dispatch()  # its output room is free
        batch = self._batch(out)
        with self._lock:
            d.rows_out += batch.size
            d.batches_out += 1
            d.consumer_cpu_s += time.thread_time() - t_cpu
        return batch

    def _batch(self, out: Output) -> Batch:
        if out.cols is not None:  # a consumer thread's arrays become the tensors, no copy
            return Batch.from_tensors({k: torch.from_numpy(v if v.flags.writeable else v.copy())
                                       for k, v in out.cols.items()})  # fmt: skip
        assert out.slot is not None
        batch = Batch.from_tensors(self._maps.tensors(out.slot.path, out.layout))
        if self.copy:
            batch = batch.clone()
            with self._lock:
                self._give_back([out.slot])
        else:
            # the slot goes back to the ring once the consumer drops the batch (see _dropped)
            ref = _SlotRef(batch, self._dropped.append)
            ref.slot = out.slot
            self._held[id(ref)] = ref
        return batch

    def _reclaim(self) -> None:
        """The slots of dropped batches back to the ring, and dispatch into them (under the
        lock; the consumer calls it before each take, the coordinator on each wake)."""
        slots = []
        while self._dropped:
            ref = self._dropped.popleft()
            del self._held[id(ref)]
            slots.append(ref.slot)
        if slots:
            self._give_back(slots)

    def _give_back(self, slots: list[Slot]) -> None:
        """``slots`` back to the ring, and dispatch into them (under the lock)."""
        if not self._closed:
            self.dispatcher.ring.give_back(slots)
            self._dispatch()
            self._lock.notify_all()

    # -- metrics ------------------------------------------------------------------------------

    def snapshot(self, memory: bool = True) -> Snapshot:
        """Cumulative per-stage counters now, with current memory: each worker's PSS is read
        (about 30 ms a worker on a busy machine), or with ``memory=False`` the last value read
        for it is used (a sub-window inside a measured window needs the counters only)."""
        d = self.dispatcher
        with self._lock:
            self._tick()
            procs = self.pool.pids()
            shapes = {w.pid: w.threads for w in self.pool.workers if w.pid is not None}
        if memory:
            pss = {pid: pss_mib(pid) for _, pid in procs}
            self._pss = pss
        else:
            pss = {pid: self._pss.get(pid, 0.0) for _, pid in procs}
        with self._lock:
            est = self.config.worker_memory_mib  # a floor: PSS of a new fork understates it
            for (a, b), pid in procs:
                key = (a, b, shapes.get(pid, 1))
                self.budget.seg_mib[key] = max(self.budget.seg_mib.get(key, est), pss[pid])
            total = float(d.shm_bytes + d.ring.nbytes + sum(s for _, s in d.free))
            total += sum(pss.values()) * MIB + d.local_bytes()
            live = [w for w in self.pool.workers if not w.retiring]
            stages = []
            for s, stats in enumerate(d.stats):
                mine = [pss[pid] for (a, b), pid in procs if a <= s < b]
                buf = sum(c.ref.nbytes for c in d.waiting if c.stage == s and c.ref)
                stages.append(StageCounters(
                    rows=stats.rows, cpu_s=stats.cpu_s, busy_s=stats.busy_s,
                    worker_s=stats.worker_s, queue_fill_s=stats.queue_fill_s,
                    workers=sum(1 for w in live if w.segment[0] <= s < w.segment[1]),
                    memory_bytes=sum(mine) * MIB + buf, restarts=stats.restarts,
                    wall_s=stats.wall_s,
                ))  # fmt: skip
            self._peak = max(self._peak, total)
            return Snapshot(
                t=self._last_t, stages=tuple(stages), rows_out=d.rows_out,
                batches_out=d.batches_out, memory_bytes=total, peak_memory_bytes=self._peak,
                handoff_cpu_s=d.handoff_cpu_s, consumer_cpu_s=d.consumer_cpu_s,
            )  # fmt: skip
