"""The live pipeline's workers: the one small interface both kinds share (``Worker``: a
process of T threads, ``procs.ProcWorker``, or a thread of the consumer's process,
``threads.ThreadWorker``) and the pool that starts and retires them to match the allocation and
reads what worker processes report. A death redoes the process's tasks (their inputs are still
there) and replaces it, counting a restart (also for a worker that dies while being retired: its
death is counted, not replaced). Its methods run under the pipeline's lock, on the coordinator
thread where they start processes (a fork follows the forking thread's lifetime)."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
from collections.abc import Callable
from typing import Any

from recperf.ingest.base import Allocation
from recperf.ingest.live.dispatch import Dispatcher
from recperf.ingest.live.procs import ProcWorker, worker_main
from recperf.ingest.live.threads import ThreadWorker
from recperf.ingest.live.workers import DoneMsg, FailMsg, SegmentWork, Worker

Key = tuple[int, int, int, int]
"""What makes two workers interchangeable: segment first and stop, threads, in-flight."""


Reply = Callable[[Worker, DoneMsg | FailMsg], None]


class Pool:
    """The workers of one pipeline."""

    def __init__(self, dispatcher: Dispatcher, reply: Reply, thread_reply: Reply) -> None:
        self.d = dispatcher
        self.workers: list[Worker] = []
        self._keys: dict[int, Key] = {}
        self._reply = reply
        self._thread_reply = thread_reply
        self._names = itertools.count()
        # fork: a worker starts in milliseconds sharing the parent's imported modules (the
        # forkserver would re-import the user's __main__, seconds with torch); the child only
        # runs worker_main, which touches no lock another parent thread may hold.
        self._ctx: Any = mp.get_context("fork")

    def _key(self, seg: tuple[int, int], threads: int) -> Key:
        return (*seg, threads, self.d.inflight() if seg[0] == 0 else 0)

    def _work(self, seg: tuple[int, int], threads: int) -> SegmentWork:
        c = self.d.config
        return SegmentWork(
            stages=self.d.stage_names,
            first=seg[0],
            stop=seg[1],
            seed=c.seed,
            downsample_rate=c.downsample_rate or 1.0,
            shuffle_window=c.shuffle_window,
            slot_bytes=self.d.slot_bytes,
            prefix=self.d.prefix,
            read_latency_s=c.read_latency_ms / 1e3,
            inflight=self.d.inflight(),
            threads=threads,
            parent_pid=os.getpid(),
        )

    def spawn(self, seg: tuple[int, int], threads: int) -> None:
        capacity = max(1, threads) + (self.d.read_ahead() if seg[0] == 0 else 0)
        work = self._work(seg, threads)
        w: Worker
        if threads == 0:
            name = f"recperf-worker-{next(self._names)}"
            w = ThreadWorker(seg, capacity, work, self._thread_reply, name)
        else:
            parent, child = self._ctx.Pipe(duplex=True)
            proc = self._ctx.Process(target=worker_main, args=(work, child), daemon=True)
            proc.start()
            child.close()
            w = ProcWorker(seg, threads, capacity, proc, parent)
        self._keys[id(w)] = self._key(seg, threads)
        self.workers.append(w)

    def apply(self, target: Allocation) -> None:
        """Start and retire workers until every segment has its workers of its shape."""
        want = {self._key(seg, t): n for seg, (n, t) in self.d.shapes(target).items()}
        for w in list(self.workers):
            if self._keys[id(w)] not in want and not w.retiring:
                self.retire(w)
        for key, n in want.items():
            active = [w for w in self.workers if self._keys[id(w)] == key and not w.retiring]
            for _ in range(n - len(active)):
                self.spawn((key[0], key[1]), key[2])
            for w in sorted(active, key=lambda w: len(w.tasks))[: max(0, len(active) - n)]:
                self.retire(w)

    def retire(self, w: Worker) -> None:
        w.retiring = True
        if not w.tasks:
            w.stop()
            self.discard(w)

    def discard(self, w: Worker) -> None:
        """Forget a stopped thread worker (it exits by itself; a process is forgotten when the
        coordinator reaps it)."""
        if w.retiring and not w.tasks and w.pid is None and w in self.workers:
            self.workers.remove(w)
            del self._keys[id(w)]

    def waitables(self) -> list[Any]:
        return [x for w in self.workers for x in w.waitables()]

    def handle(self, ready: list[Any]) -> None:
        """Read what worker processes reported; reap the dead."""
        procs = [w for w in self.workers if isinstance(w, ProcWorker)]
        by_conn = {id(w.conn): w for w in procs}
        by_sentinel = {w.proc.sentinel: w for w in procs}
        dead: list[ProcWorker] = []
        for obj in ready:
            w = by_conn.get(id(obj))
            if w is not None:
                try:
                    while w.conn.poll():
                        self._reply(w, w.conn.recv())
                except (EOFError, OSError):
                    dead.append(w)
            elif obj in by_sentinel:
                dead.append(by_sentinel[obj])
        for w in dict.fromkeys(dead):
            if w in self.workers:
                self._reap(w)

    def _reap(self, w: ProcWorker) -> None:
        """A worker exited: redo its tasks; count a death (any exit not asked for: a retiring
        worker is asked once its tasks are done, and exits 0) and replace it unless retiring."""
        w.proc.join(timeout=1)
        self.workers.remove(w)
        key = self._keys.pop(id(w))
        w.conn.close()
        died = not w.retiring or bool(w.tasks) or w.proc.exitcode != 0
        for chunk in sorted(w.tasks.values(), key=lambda c: c.first):
            self.d.requeue(chunk)
        w.tasks.clear()
        if died:
            self.d.stats[w.segment[0]].restarts += 1
        want = {self._key(seg, t) for seg, (_, t) in self.d.shapes(self.d.target).items()}
        if not w.retiring and key in want:
            self.spawn(w.segment, w.threads)

    def close(self) -> None:
        """Stop every worker: threads drop queued tasks, processes are asked, then killed."""
        for w in self.workers:
            w.close()
        for w in self.workers:
            w.join()
        self.workers.clear()
        self._keys.clear()

    def pids(self) -> list[tuple[tuple[int, int], int]]:
        """(segment, pid) of every worker process not retiring."""
        return [(w.segment, w.pid) for w in self.workers
                if w.pid is not None and not w.retiring]  # fmt: skip
