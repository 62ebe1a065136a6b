"""The live pipeline's worker pool as its coordinator sees it: starting and retiring worker
processes to match the allocation, and handling what they report. A finished task adds to the
stage counters and moves its chunk on; a failure becomes the error the consumer raises; a death
redoes the task (its input is still there) and replaces the worker, counting a restart (also
for a worker that dies while being retired: its death is counted, not replaced).
``Pipeline`` mixes ``WorkerPool`` in; the state it reads is declared here and in ``Dispatcher``
and initialised there."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from recperf.core.errors import RecperfError, TraceFormatError
from recperf.ingest.live import items
from recperf.ingest.live.dispatch import Chunk, Dispatcher, Output, WorkerProc
from recperf.ingest.live.items import ItemRef
from recperf.ingest.live.workers import DoneMsg, FailMsg, SegmentWork, TaskMsg, worker_main


class WorkerPool(Dispatcher):
    """Worker processes of a ``Pipeline``: spawn, retire, reap, and their messages."""

    _ctx: Any
    _prefix: str
    _error: BaseException | None
    _dirty: bool
    _free_ids: Iterator[int]

    def worker_pids(self) -> dict[str, list[int]]:
        """Pids of the workers serving each segment (label e.g. ``read+dense``), not counting
        retiring ones; a worker that just died is listed until the coordinator reaps it."""
        with self._lock:
            out: dict[str, list[int]] = {}
            for w in self._workers:
                if not w.retiring:
                    a, b = w.segment
                    out.setdefault("+".join(self.stage_names[a:b]), []).append(w.proc.pid)
            return out

    # -- starting and stopping workers ------------------------------------------------------

    def _spawn(self, segment: tuple[int, int]) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        work = SegmentWork(
            stages=self.stage_names,
            first=segment[0],
            stop=segment[1],
            seed=self.config.seed,
            downsample_rate=self.config.downsample_rate or 1.0,
            shuffle_window=self.config.shuffle_window,
            slot_bytes=self.slot_bytes,
            prefix=self._prefix,
            read_latency_s=self.config.read_latency_ms / 1e3,
            read_concurrency=self.config.read_concurrency,
            parent_pid=os.getpid(),
        )
        proc = self._ctx.Process(target=worker_main, args=(work, child), daemon=True)
        proc.start()
        child.close()
        self._workers.append(WorkerProc(segment=segment, proc=proc, conn=parent))

    def _apply_target(self) -> None:
        want = self._segment_workers(self._target)
        for w in self._workers:
            if w.segment not in want and not w.retiring:
                self._retire(w)
        for seg, n in want.items():
            active = [w for w in self._workers if w.segment == seg and not w.retiring]
            for _ in range(n - len(active)):
                self._spawn(seg)
            for w in sorted(active, key=lambda w: w.task is not None)[: max(0, len(active) - n)]:
                self._retire(w)
        self._dirty = False

    def _retire(self, w: WorkerProc) -> None:
        w.retiring = True
        if w.task is None:
            self._send(w, None)

    def _send(self, w: WorkerProc, msg: TaskMsg | None) -> None:
        with contextlib.suppress(OSError):  # a dead worker's sentinel reports it; task redone
            w.conn.send(msg)

    def _reap(self, w: WorkerProc) -> None:
        """A worker exited: redo its task; count a death (any exit not asked for: a retiring
        worker is asked once its task is done, and exits 0) and replace it unless retiring."""
        w.proc.join(timeout=1)
        self._workers.remove(w)
        w.conn.close()
        died = not w.retiring or w.task is not None or w.proc.exitcode != 0
        if w.task is not None:
            self._requeue(w.task)
        if died:
            self._stats[w.segment[0]].restarts += 1
        if not w.retiring and w.segment in self._segment_workers(self._target):
            self._spawn(w.segment)

    def _requeue(self, chunk: Chunk) -> None:
        """The chunk goes back where it was; what its dead attempt wrote is dropped."""
        items.unlink_quietly(self._out_path(chunk))
        if chunk.lent is not None and os.path.exists(chunk.lent[0]):
            self._free.append(chunk.lent)
        chunk.lent = None
        self._ring.give_back(chunk.slots)
        chunk.slots = []
        chunk.attempt += 1
        self._waiting.append(chunk)

    def _spend(self, ref: ItemRef) -> None:
        """A consumed chunk buffer joins the pool of files outputs are written into."""
        self._shm_bytes -= ref.nbytes
        if len(self._free) >= 2 * len(self.stage_names):
            items.unlink_quietly(ref.path)
            return
        path = str(items.SHM_DIR / f"{self._prefix}-free-{next(self._free_ids)}")
        try:
            os.rename(ref.path, path)
            size = os.stat(path).st_size  # a reused file may be larger than its last chunk
        except FileNotFoundError:
            return
        self._free.append((path, size))

    def _out_path(self, chunk: Chunk) -> str:
        return str(items.SHM_DIR / f"{self._prefix}-c{chunk.first}-s{chunk.stage}-{chunk.attempt}")

    # -- what workers report ----------------------------------------------------------------

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

    def _on_message(self, w: WorkerProc, msg: DoneMsg | FailMsg) -> None:
        chunk = w.task
        if chunk is None or chunk.task_id != msg.task_id or chunk.attempt != msg.attempt:
            if isinstance(msg, DoneMsg) and msg.out is not None:  # a stale attempt's output
                items.unlink_quietly(msg.out.path)
            return
        if isinstance(msg, FailMsg):
            self._error = self._failure(msg, w)
            return
        w.task = None
        self._account(w, msg)
        if chunk.ref is not None:
            self._spend(chunk.ref)
        if chunk.lent is not None and os.path.exists(chunk.lent[0]):
            self._free.append(chunk.lent)  # lent but not written into
        chunk.lent = None
        if w.segment[1] == len(self.stage_names):
            for seq, slot, layout, rows in zip(chunk.seqs, chunk.slots, msg.layouts,
                                               msg.rows_out, strict=True):  # fmt: skip
                self._out[seq] = Output(slot, layout, rows)
            chunk.slots = []
        else:
            assert msg.out is not None
            chunk.ref, chunk.stage = msg.out, w.segment[1]
            self._shm_bytes += msg.out.nbytes
            self._waiting.append(chunk)
        if w.retiring:
            self._send(w, None)

    def _account(self, w: WorkerProc, msg: DoneMsg) -> None:
        a, b = w.segment
        for s in range(a, b):
            st_ = self._stats[s]
            st_.cpu_s += msg.stage_cpu_s[s]
            st_.rows += msg.stage_rows[s]
            st_.busy_s += msg.busy_s
        self._handoff_cpu_s += msg.handoff_cpu_s

    def _failure(self, msg: FailMsg, w: WorkerProc) -> BaseException:
        if msg.kind == "traceformat":
            return TraceFormatError(*msg.payload)
        if msg.kind == "badrow":
            return self._bad_row(*msg.payload)
        if msg.kind == "recperf":
            return RecperfError(msg.payload[0])
        a, b = w.segment
        return RuntimeError(
            f"ingest worker of segment {'+'.join(self.stage_names[a:b])!r} failed:\n"
            f"{msg.payload[0]}"
        )

    def _bad_row(self, row_id: int, fieldname: str, why: str) -> TraceFormatError:
        split = self.plan.split_of_row(row_id)
        offset = row_id - split.first_row
        if split.kind == "parquet":
            return TraceFormatError(
                split.file, None, fieldname, f"row {split.first_line + offset}: {why}"
            )
        return TraceFormatError(split.file, split.first_line + offset, fieldname, why)
