"""The live ingestion pipeline: the stage chain cut into segments, a pool of worker processes
per segment (each worker runs its segment's stages fused), fed by one coordinator thread over
per-worker pipes; chunks cross a cut as one packed shared-memory buffer and leave the chain
through a reused ring of slots that the consumer reads as tensor views.

Exactly-once: every task (one chunk through one segment) has an attempt number; its input stays
until a worker of the current attempt reports its output, so a worker that dies (or is killed)
mid-task only costs a redo, and the outputs of a stale attempt are dropped. Resizing or re-cutting
starts workers or lets surplus ones finish their task and exit; a chunk waiting before stage s is
taken by whichever segment now holds s. Batches leave in sequence order, so a seed fixes every
batch whatever the allocation or crashes.

This file holds the pipeline's state, allocation and memory, lifecycle, coordinator loop and
consumer side; ``pool`` (workers and what they report) and ``dispatch`` (which chunk goes where,
and the metrics snapshot) are mixed in.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from recperf.core.errors import ConfigError, RecperfError
from recperf.ingest.base import Allocation, AllocationRefused
from recperf.ingest.live import items
from recperf.ingest.live.batch import Batch, PipelineConfig
from recperf.ingest.live.dispatch import (
    MIB,
    Chunk,
    Output,
    StageStats,
    WorkerProc,
    sweep_stale_items,
)
from recperf.ingest.live.plan import Plan
from recperf.ingest.live.pool import WorkerPool
from recperf.ingest.live.ring import Ring, Slot, SlotMaps

__all__ = ["Pipeline", "sweep_stale_items"]
_RUN_IDS = itertools.count()


class Pipeline(WorkerPool):
    """Criteo rows in ``data`` (a file or directory of Parquet / TSV shards) through read,
    dense, sparse, [downsample], [shuffle] and collate; iterate it for ``Batch``es.

    A batch's tensors are views into a ring slot, which returns to the ring when the ``Batch``
    is dropped: keep the Batch while using its tensors (a tensor taken out of it and kept after
    the Batch is gone sees the slot's next batch; ``batch.clone()`` or ``copy=True`` gives
    batches that own their memory). Holding many batches grows the ring."""

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
        self._seg_mib: dict[tuple[int, int], float] = {}
        self._target = Allocation(workers=(1,))  # replaced below, once _check can run
        self._target = self._check(self._resolve(allocation))
        self._lock = threading.Condition()
        self._workers: list[WorkerProc] = []
        self._waiting: list[Chunk] = []
        self._out: dict[int, Output] = {}
        self._stats = [StageStats() for _ in self.stage_names]
        self._task_ids = itertools.count()
        self._next_out = self._rows_out = self._batches_out = self._shm_bytes = 0
        self._handoff_cpu_s = self._consumer_cpu_s = 0.0
        self._free: list[tuple[str, int]] = []  # spent chunk buffers (path, size) to reuse
        self._free_ids = itertools.count()
        self._peak = 0.0
        self._error: BaseException | None = None
        self._closed = self._started = False
        self._thread: threading.Thread | None = None
        self._prefix = f"rp{os.getpid()}x{next(_RUN_IDS)}"
        self._ring = Ring(self._prefix, self.slot_bytes)
        self._maps = SlotMaps(self.slot_bytes)
        self._ctx: Any = None
        self._dirty = True
        self._last_t = time.monotonic()

    # -- allocation and memory ------------------------------------------------------------

    def _resolve(self, allocation: Allocation | Sequence[int] | str) -> Allocation:
        if isinstance(allocation, Allocation):
            return allocation  # _check normalises it (and refuses a bad one)
        if isinstance(allocation, str):
            from recperf.ingest.base import even_split, fused

            if allocation not in ("even", "fused"):
                raise ConfigError(
                    f"allocation: expected 'even', 'fused' or worker counts, not {allocation!r}"
                )
            return (fused if allocation == "fused" else even_split)(_Shape(self))
        return Allocation(workers=tuple(int(w) for w in allocation))

    @property
    def memory_budget_bytes(self) -> float:
        return self.config.memory_budget_gib * 2**30

    def memory_bytes(self, alloc: Allocation) -> float:
        """Predicted peak: workers (measured PSS per segment, or the estimate until measured),
        the ring at its limit, and at each cut the chunks waiting, in flight on both sides and
        the pool of spent buffers."""
        n = len(self.stage_names)
        alloc = alloc.normalized(n)
        segs = alloc.segments(n)
        est = self.config.worker_memory_mib
        workers = sum(w * self._seg_mib.get(s, est) for s, w in zip(segs, alloc.workers,
                                                                     strict=True))  # fmt: skip
        chunks = 0
        for i in range(1, len(segs)):
            chunks += alloc.workers[i] + 1 + alloc.workers[i - 1] + alloc.workers[i]
        chunks += 2 * (len(segs) - 1)  # the pool of spent buffers
        ring = self.ring_limit(alloc) * self.slot_bytes
        return workers * MIB + ring + chunks * self.chunk_bytes

    def _check(self, alloc: Allocation) -> Allocation:
        n = len(self.stage_names)
        try:
            alloc = alloc.normalized(n)
        except ConfigError as exc:
            raise AllocationRefused(f"{exc}; stages: {', '.join(self.stage_names)}") from None
        for w, (a, b) in zip(alloc.workers, alloc.segments(n), strict=True):
            if not 1 <= w <= 64:
                name = "+".join(self.stage_names[a:b])
                raise AllocationRefused(f"allocation: segment {name!r} has {w} workers; 1..64")
        need = self.memory_bytes(alloc)
        if need > self.memory_budget_bytes:
            raise AllocationRefused(
                f"allocation {alloc.label(self.stage_names)} needs {need / MIB:,.0f} MiB "
                f"(workers + buffers), over memory_budget_gib = "
                f"{self.config.memory_budget_gib:g} ({self.memory_budget_bytes / MIB:,.0f} MiB)"
            )
        return alloc

    def worker_memory_mib(self) -> tuple[float, ...]:
        """Memory per worker of each stage's current segment: the largest PSS measured, else
        the estimate."""
        with self._lock:
            n = len(self.stage_names)
            est = self.config.worker_memory_mib
            out = [est] * n
            for a, b in self._target.segments(n):
                for i in range(a, b):
                    out[i] = self._seg_mib.get((a, b), est)
            return tuple(out)

    @property
    def allocation(self) -> Allocation:
        return self._target

    def resize(self, allocation: Allocation | Sequence[int]) -> None:
        """Change the cuts and workers while running; refused (nothing changes) if over
        budget. The coordinator applies it between two dispatches."""
        alloc = self._check(self._resolve(allocation))
        with self._lock:
            self._target = alloc
            self._dirty = True
            self._lock.notify_all()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Pipeline:
        if self._started:
            return self
        sweep_stale_items()
        # fork: a worker starts in milliseconds sharing the parent's imported modules (the
        # forkserver would re-import the user's __main__, seconds with torch); the child only
        # runs worker_main, which touches no lock another parent thread may hold. Workers are
        # forked by the coordinator thread only: it lives as long as the pipeline, and the
        # kernel's parent-death signal follows the forking thread.
        self._ctx = mp.get_context("fork")
        self._started = True
        self._last_t = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="recperf-ingest", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop every worker and delete every shared-memory file; safe to call twice."""
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
        self._maps.close()
        self._ring.unlink()
        for path in items.SHM_DIR.glob(f"{self._prefix}-*"):
            items.unlink_quietly(str(path))

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_started", False) and not getattr(self, "_closed", True):
            self.close()

    # -- the coordinator ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                t_cpu = time.thread_time()
                with self._lock:
                    if self._closed or self._error is not None:
                        return
                    if self._dirty:
                        self._apply_target()
                    self._tick()
                    self._dispatch()
                    waitables = [w.conn for w in self._workers] + [
                        w.proc.sentinel for w in self._workers
                    ]
                    self._consumer_cpu_s += time.thread_time() - t_cpu
                ready = wait(waitables, timeout=0.02)
                t_cpu = time.thread_time()
                with self._lock:
                    self._handle(ready)
                    self._consumer_cpu_s += time.thread_time() - t_cpu
        except BaseException as exc:  # a coordinator bug must surface in the consumer
            with self._lock:
                self._error = exc
                self._lock.notify_all()

    def _tick(self) -> None:
        now = time.monotonic()
        dt, self._last_t = now - self._last_t, now
        cuts = {a for a, _ in self._target.segments(len(self.stage_names))} - {0}
        for w in self._workers:
            if not w.retiring:
                for s in range(*w.segment):
                    self._stats[s].worker_s += dt
        for s in cuts:
            queued = sum(1 for c in self._waiting if c.stage == s)
            self._stats[s].queue_fill_s += min(1.0, queued / self.cut_cap(s)) * dt

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
        t_cpu = time.thread_time()
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
                out = self._out.pop(self._next_out, None)
                if out is not None:
                    break
                self._consumer_cpu_s += time.thread_time() - t_cpu
                self._lock.wait(timeout=0.5)
                t_cpu = time.thread_time()
            self._next_out += 1
        batch = Batch.from_tensors(self._maps.tensors(out.slot.path, out.layout))
        if self.copy:
            batch = batch.clone()
            self._release(out.slot)
        else:
            # the slot goes back to the ring when the consumer drops the batch
            weakref.finalize(batch, self._release, out.slot)
        with self._lock:
            self._rows_out += batch.size
            self._batches_out += 1
            self._consumer_cpu_s += time.thread_time() - t_cpu
        return batch

    def _release(self, slot: Slot) -> None:
        with self._lock:
            if not self._closed:
                self._ring.give_back([slot])
                self._lock.notify_all()


class _Shape:
    """The Target-shaped view of a not yet started pipeline that the even and fused splits
    need (stage names, cores, no caps, memory)."""

    def __init__(self, p: Pipeline) -> None:
        self.stage_names = p.stage_names
        self.cores = p.cores
        self.max_workers: tuple[int | None, ...] = (None,) * len(p.stage_names)
        self.memory_budget_bytes = p.memory_budget_bytes
        self.memory_bytes = p.memory_bytes
