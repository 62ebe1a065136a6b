"""A worker that is a thread of the consumer's own process (an allocation's T = 0), as a
DataLoader with ``num_workers=0`` or torchdata.nodes' thread mapper runs its work.

It takes tasks from its own queue and, when one is done, does the bookkeeping itself (``reply``
takes the pipeline's lock, moves the chunk on and dispatches what that made possible) instead of
waking the coordinator. Its input and output stay Python objects: a chunk between two thread
segments is passed as is, and a collated batch becomes the consumer's tensors without a copy;
only a hand-off to or from a worker process goes through shared memory. A thread cannot die like
a process: an exception in a task becomes a ``FailMsg`` and stops the run with that one error."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recperf.ingest.data import stages as st
from recperf.ingest.live.workers import (
    Chunk,
    DoneMsg,
    FailMsg,
    Fetched,
    Fetcher,
    SegmentWork,
    TaskMsg,
    serve,
)

Reply = Callable[["ThreadWorker", DoneMsg | FailMsg], None]


@dataclass(slots=True, eq=False)
class ThreadWorker:
    """One consumer thread serving a segment."""

    segment: tuple[int, int]
    capacity: int
    work: SegmentWork
    reply: Reply
    """Called on the worker's thread with each reply (it takes the pipeline's lock)."""
    name: str
    threads: int = 0
    tasks: dict[int, Chunk] = field(default_factory=dict)
    retiring: bool = False
    _queue: deque[tuple[TaskMsg, Fetched | None] | None] = field(default_factory=deque)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None
    _fetcher: Fetcher | None = None

    def __post_init__(self) -> None:
        if self.work.read_latency_s and self.segment[0] == 0:
            self._fetcher = Fetcher(self.work.read_latency_s, self.work.inflight)
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    @property
    def pid(self) -> int | None:
        return None

    def send(self, msg: TaskMsg) -> None:
        """Queue a task; a reading task's storage requests start now."""
        fetched = None if self._fetcher is None else self._fetcher.start(msg)
        with self._cond:
            self._queue.append((msg, fetched))
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._queue.append(None)
            self._cond.notify()

    def waitables(self) -> list[Any]:
        return []  # it reports by calling ``reply`` itself

    def close(self) -> None:
        """Drop queued tasks and stop after the one running (if any)."""
        with self._cond:
            self._queue.clear()
            self._queue.append(None)
            self._cond.notify()
        if self._fetcher is not None:
            self._fetcher.close()

    def join(self) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        reader = st.SplitReader()
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                item = self._queue.popleft()
            if item is None:
                if self._fetcher is not None:
                    self._fetcher.close()
                return
            msg, fetched = item
            self.reply(self, serve(self.work, msg, reader, None, fetched))
