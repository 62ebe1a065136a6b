"""The live ingestion pipeline: a pool of worker processes per stage, fed by one coordinator
thread over per-worker pipes, with bounded buffers of shared-memory items between stages.

Exactly-once: every task (a run of splits for ``read``, one item, or a shuffle window) has an
attempt number; its inputs stay until a worker of the current attempt reports its outputs, so a
worker that dies (or is killed) mid-task only costs a redo, and the outputs of a stale attempt
are deleted unread. Resizing starts workers or lets surplus ones finish their task and exit.
Items leave in sequence order, so a seed fixes every batch whatever the allocation or crashes.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Iterator, Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from recperf.core.errors import ConfigError, RecperfError, TraceFormatError
from recperf.ingest.base import Allocation, AllocationRefused
from recperf.ingest.live import items
from recperf.ingest.live.batch import Batch, PipelineConfig
from recperf.ingest.live.dispatch import (
    MIB,
    Dispatcher,
    StageStats,
    Task,
    WorkerProc,
    even_split,
    sweep_stale_items,
)
from recperf.ingest.live.plan import Plan
from recperf.ingest.live.workers import StageWork, TaskMsg, worker_main

__all__ = ["Pipeline", "even_split", "sweep_stale_items"]
_RUN_IDS = itertools.count()


class Pipeline(Dispatcher):
    """Criteo rows in ``data`` (a file or directory of Parquet / TSV shards) through read,
    dense, sparse, [downsample], [shuffle] and collate stages; iterate it for ``Batch``es."""

    def __init__(
        self,
        data: str | Path,
        config: PipelineConfig | None = None,
        allocation: Allocation | Sequence[int] | str = "even",
        cores: int | None = None,
    ) -> None:
        self.config = config or PipelineConfig()
        self.stage_names = self.config.stage_names()
        self.cores = cores or os.cpu_count() or 1
        self.plan = Plan(data, self.config)
        self._caps = self._buffer_caps()
        self._pool_cap = 2 * len(self.stage_names) + self.plan.read_task_splits
        self._est_mib = [self.config.worker_memory_mib] * len(self.stage_names)
        self._target = self._check(self._resolve(allocation))
        self._lock = threading.Condition()
        self._workers: list[WorkerProc] = []
        self._bufs: list[dict[int, items.ItemRef]] = [{} for _ in range(len(self.stage_names) + 1)]
        self._ready_read: list[tuple[int, int, Task]] = []  # heap of (first seq, id, task)
        self._stats = [StageStats() for _ in self.stage_names]
        self._task_ids = itertools.count()
        self._next_out = 0
        self._rows_out = 0
        self._batches_out = 0
        self._shm_bytes = 0
        self._free: list[tuple[str, int]] = []  # spent item files (path, size) to write into
        self._free_ids = itertools.count()
        self._peak = 0.0
        self._error: BaseException | None = None
        self._closed = False
        self._started = False
        self._thread: threading.Thread | None = None
        self._prefix = f"rp{os.getpid()}x{next(_RUN_IDS)}"
        self._ctx: Any = None
        self._last_t = time.monotonic()

    # -- allocation and memory ------------------------------------------------------------

    def _resolve(self, allocation: Allocation | Sequence[int] | str) -> Allocation:
        if isinstance(allocation, Allocation):
            return allocation
        if isinstance(allocation, str):
            if allocation != "even":
                raise ConfigError(
                    f"allocation: expected 'even' or worker counts, not {allocation!r}"
                )
            return even_split(len(self.stage_names), self.cores)
        return Allocation(workers=tuple(int(w) for w in allocation))

    def _buffer_caps(self) -> list[int]:
        """Items each buffer may hold: before stage s (s >= 1) and at the output (last)."""
        q, k = self.config.queue_batches, self.config.shuffle_window
        caps = [0] + [q] * len(self.stage_names)
        if k and "shuffle" in self.stage_names:
            caps[self.stage_names.index("shuffle")] = max(q, k)
        return caps

    @property
    def memory_budget_bytes(self) -> float:
        return self.config.memory_budget_gib * 2**30

    def memory_bytes(self, alloc: Allocation) -> float:
        """Predicted peak: workers (measured PSS, or the estimate until measured) plus every
        buffer full and a head window of slack per stage, the items each worker may hold (a
        read task's outputs, a shuffle window in and out, else one in and one out) and the pool
        of spent files."""
        item = self.config.batch_size * items.ITEM_BYTES_PER_ROW
        k = max(1, self.config.shuffle_window)
        per_worker = {"read": self.plan.read_task_splits, "shuffle": 2 * k}
        in_flight = sum(
            w * per_worker.get(name, 2)
            for name, w in zip(self.stage_names, alloc.workers, strict=True)
        )
        n_items = sum(self._caps[1:]) + k * len(self.stage_names) + in_flight  # + head window
        n_items += self._pool_cap
        workers = sum(w * m for w, m in zip(alloc.workers, self._est_mib, strict=True))
        return workers * MIB + n_items * item

    def _check(self, alloc: Allocation) -> Allocation:
        n = len(self.stage_names)
        if len(alloc.workers) != n:
            names = ", ".join(self.stage_names)
            raise AllocationRefused(f"allocation has {len(alloc.workers)} entries; stages: {names}")
        for name, w in zip(self.stage_names, alloc.workers, strict=True):
            if not 1 <= w <= 64:
                raise AllocationRefused(
                    f"allocation: stage {name!r} has {w} workers; allowed 1..64"
                )
        need = self.memory_bytes(alloc)
        if need > self.memory_budget_bytes:
            raise AllocationRefused(
                f"allocation {list(alloc.workers)} needs {need / MIB:,.0f} MiB (workers + "
                f"buffers), over memory_budget_gib = {self.config.memory_budget_gib:g} "
                f"({self.memory_budget_bytes / MIB:,.0f} MiB)"
            )
        return alloc

    def worker_memory_mib(self) -> tuple[float, ...]:
        """Memory per worker of each stage: the largest PSS measured, else the estimate."""
        with self._lock:
            return tuple(self._est_mib)

    @property
    def allocation(self) -> Allocation:
        return self._target

    def resize(self, allocation: Allocation | Sequence[int]) -> None:
        """Change workers per stage while running; refused (nothing changes) if over budget."""
        alloc = self._check(self._resolve(allocation))
        with self._lock:
            self._target = alloc
            if self._started:
                self._apply_target()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Pipeline:
        if self._started:
            return self
        sweep_stale_items()
        # fork: a worker starts in milliseconds sharing the parent's imported modules (the
        # forkserver would re-import the user's __main__, seconds with torch); the child only
        # runs worker_main, which touches no lock another parent thread may hold.
        self._ctx = mp.get_context("fork")
        with self._lock:
            self._started = True
            self._last_t = time.monotonic()
            self._apply_target()
        self._thread = threading.Thread(target=self._run, name="recperf-ingest", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop every worker and delete every shared-memory item; safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for w in self._workers:
            with contextlib.suppress(OSError):
                w.conn.send(None)
        for w in self._workers:
            w.proc.join(timeout=2)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(timeout=2)
            w.conn.close()
        self._workers.clear()
        for path in items.SHM_DIR.glob(f"{self._prefix}-*"):
            items.unlink_quietly(str(path))

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_started", False) and not getattr(self, "_closed", True):
            self.close()

    def worker_pids(self) -> dict[str, list[int]]:
        with self._lock:
            out: dict[str, list[int]] = {n: [] for n in self.stage_names}
            for w in self._workers:
                if not w.retiring:
                    out[self.stage_names[w.stage]].append(w.proc.pid)
            return out

    # -- workers ------------------------------------------------------------------------------

    def _spawn(self, stage: int) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        work = StageWork(
            stage=self.stage_names[stage],
            seed=self.config.seed,
            downsample_rate=self.config.downsample_rate or 1.0,
            read_latency_s=self.config.read_latency_ms / 1e3,
        )
        proc = self._ctx.Process(target=worker_main, args=(work, child), daemon=True)
        proc.start()
        child.close()
        self._workers.append(WorkerProc(stage=stage, proc=proc, conn=parent))

    def _apply_target(self) -> None:
        for s, want in enumerate(self._target.workers):
            active = [w for w in self._workers if w.stage == s and not w.retiring]
            for _ in range(want - len(active)):
                self._spawn(s)
            surplus = len(active) - want
            for w in sorted(active, key=lambda w: w.task is not None)[: max(0, surplus)]:
                w.retiring = True
                if w.task is None:
                    self._send(w, None)

    def _send(self, w: WorkerProc, msg: TaskMsg | None) -> None:
        with contextlib.suppress(OSError):  # a dead worker's sentinel reports it; task redone
            w.conn.send(msg)

    def _reap(self, w: WorkerProc) -> None:
        """A worker exited: redo its task (deleting any outputs it wrote), replace it unless
        it was retiring."""
        w.proc.join(timeout=1)
        self._workers.remove(w)
        w.conn.close()
        if w.task is not None:
            self._requeue(w.task)
        if not w.retiring:
            self._stats[w.stage].restarts += 1
            self._spawn(w.stage)

    def _requeue(self, task: Task) -> None:
        for path in items.SHM_DIR.glob(f"{Path(self._out_prefix(task)).name}-*"):
            items.unlink_quietly(str(path))
        self._take_back(task)
        task.attempt += 1
        if task.stage == 0:
            heapq.heappush(self._ready_read, (task.seqs[0], task.task_id, task))
            return
        for seq, ref in zip(task.seqs, task.inputs, strict=True):
            self._bufs[task.stage][seq] = ref

    def _take_back(self, task: Task) -> None:
        """Lent spent files the task did not write into return to the pool."""
        for path, size in task.lent:
            if os.path.exists(path):
                self._free.append((path, size))
        task.lent = ()

    def _spend(self, ref: items.ItemRef) -> None:
        """A consumed item's file joins the pool of files outputs are written into."""
        self._shm_bytes -= ref.nbytes
        if len(self._free) >= self._pool_cap:
            items.unlink_quietly(ref.path)
            return
        path = str(items.SHM_DIR / f"{self._prefix}-free-{next(self._free_ids)}")
        try:
            os.rename(ref.path, path)
            size = os.stat(path).st_size  # a reused file may be larger than its last item
        except FileNotFoundError:
            return
        self._free.append((path, size))

    def _out_prefix(self, task: Task) -> str:
        return str(items.SHM_DIR / f"{self._prefix}-{task.stage}-{task.task_id}-{task.attempt}")

    def _shuffle_stage(self) -> int:
        return self.stage_names.index("shuffle") if "shuffle" in self.stage_names else -1

    # -- the coordinator ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closed or self._error is not None:
                        return
                    self._tick()
                    self._dispatch()
                    waitables = [w.conn for w in self._workers] + [
                        w.proc.sentinel for w in self._workers
                    ]
                ready = wait(waitables, timeout=0.02)
                with self._lock:
                    self._handle(ready)
        except BaseException as exc:  # a coordinator bug must surface in the consumer
            with self._lock:
                self._error = exc
                self._lock.notify_all()

    def _tick(self) -> None:
        now = time.monotonic()
        dt, self._last_t = now - self._last_t, now
        for s, stats in enumerate(self._stats):
            active = sum(1 for w in self._workers if w.stage == s and not w.retiring)
            stats.worker_s += active * dt
            if s > 0:
                stats.queue_fill_s += min(1.0, len(self._bufs[s]) / self._caps[s]) * dt

    def _handle(self, ready: list[Any]) -> None:
        by_conn = {id(w.conn): w for w in self._workers}
        by_sentinel = {w.proc.sentinel: w for w in self._workers}
        dead: list[WorkerProc] = []
        for obj in ready:
            w = by_conn.get(id(obj))
            if w is not None:
                try:
                    while w.conn.poll():
                        self._on_message(w, w.conn.recv())
                except (EOFError, OSError):
                    dead.append(w)
            elif obj in by_sentinel:
                dead.append(by_sentinel[obj])
        for w in dict.fromkeys(dead):
            if w in self._workers:
                self._reap(w)
        self._lock.notify_all()

    def _on_message(self, w: WorkerProc, msg: tuple[Any, ...]) -> None:
        kind, task_id, attempt = msg[0], msg[1], msg[2]
        task = w.task
        if task is None or task.task_id != task_id or task.attempt != attempt:
            if kind == "done":  # a stale attempt's outputs: delete unread
                for ref in msg[3]:
                    items.unlink_quietly(ref.path)
            return
        if kind == "traceformat":
            self._error = TraceFormatError(*msg[3])
            return
        if kind == "badrow":
            self._error = self._bad_row(*msg[3])
            return
        if kind == "error":
            err = msg[3]
            self._error = (
                err
                if isinstance(err, BaseException)
                else RuntimeError(
                    f"ingest worker of stage {self.stage_names[w.stage]!r} failed:\n{err}"
                )
            )
            return
        refs, cpu, wall, rows_in = msg[3], msg[4], msg[5], msg[6]
        w.task = None
        stats = self._stats[w.stage]
        stats.cpu_s += cpu
        stats.busy_s += wall
        stats.rows += rows_in
        self._take_back(task)
        if w.stage > 0:
            for ref in task.inputs:
                self._spend(ref)
        for seq, ref in zip(task.seqs, refs, strict=True):
            self._bufs[w.stage + 1][seq] = ref
            self._shm_bytes += ref.nbytes
        if w.retiring:
            self._send(w, None)

    def _bad_row(self, row_id: int, fieldname: str, why: str) -> TraceFormatError:
        split = self.plan.split_of_row(row_id)
        offset = row_id - split.first_row
        if split.kind == "parquet":
            return TraceFormatError(
                split.file, None, fieldname, f"row {split.first_line + offset}: {why}"
            )
        return TraceFormatError(split.file, split.first_line + offset, fieldname, why)

    # -- consuming ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        self.start()
        while True:
            batch = self._take()
            if batch is None:
                return
            if batch.size:
                yield batch

    def _take(self) -> Batch | None:
        last = len(self.stage_names)
        with self._lock:
            while True:
                if self._error is not None:
                    err = self._error
                    if isinstance(err, RecperfError):
                        raise err
                    raise RuntimeError(f"ingest pipeline failed: {err}") from err
                if self._next_out >= self.plan.total_items:
                    return None
                if self._closed:
                    raise RecperfError("the pipeline was closed while iterating")
                ref = self._bufs[last].pop(self._next_out, None)
                if ref is not None:
                    break
                self._lock.wait(timeout=0.5)
            self._next_out += 1
        batch = Batch.from_columns(items.read_item(ref))
        with self._lock:
            self._spend(ref)
            self._rows_out += batch.size
            self._batches_out += 1
        return batch
