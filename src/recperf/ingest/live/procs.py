"""A worker that is a process of T threads: the coordinator's handle on it (``ProcWorker``) and
what runs inside it (``worker_main``).

Inside, the main thread receives tasks over the pipe, starts each reading task's storage
requests at once (``Fetcher``) and queues the task; T compute threads take tasks from the queue,
each with its own split reader, and send their replies under one lock. The coordinator counts
the process as T task slots (and, for a reading segment with storage latency, a few tasks ahead
so that their requests are in flight while the current ones decode). ``None`` on the pipe asks
the worker to exit; it is only sent once the worker holds no task."""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from recperf.ingest.data import stages as st
from recperf.ingest.live import items
from recperf.ingest.live.ring import SlotMaps
from recperf.ingest.live.workers import (
    Chunk,
    Fetched,
    Fetcher,
    SegmentWork,
    TaskMsg,
    serve,
)


@dataclass(slots=True, eq=False)
class ProcWorker:
    """The coordinator's handle on one worker process."""

    segment: tuple[int, int]
    threads: int
    capacity: int
    """Tasks it may hold: its threads, and the tasks ahead a reading worker gets."""
    proc: Any
    conn: Connection
    tasks: dict[int, Chunk] = field(default_factory=dict)
    retiring: bool = False

    @property
    def pid(self) -> int | None:
        return int(self.proc.pid)

    def send(self, msg: TaskMsg) -> None:
        with contextlib.suppress(OSError):  # a dead worker's sentinel reports it; task redone
            self.conn.send(msg)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)

    def waitables(self) -> list[Any]:
        return [self.conn, self.proc.sentinel]

    def close(self) -> None:
        self.stop()

    def join(self) -> None:
        self.proc.join(timeout=2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=2)
        self.conn.close()


def _die_with_parent(prefix: str, parent_pid: int) -> None:
    """When the coordinator's process dies (even by SIGKILL) the kernel sends this worker
    SIGTERM; it then deletes the pipeline's shared-memory files and exits quietly, so nothing
    is left behind. Ctrl-C and a hang-up (which a terminal sends the whole process group) are
    ignored: the coordinator owns shutdown and stops the workers itself."""

    def on_term(signum: int, frame: object) -> None:
        for path in items.SHM_DIR.glob(f"{prefix}-*"):
            items.unlink_quietly(str(path))
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pipe's EOF still ends the worker
        pass
    # the parent died before prctl took effect (the orphan went to init or a subreaper)
    if os.getppid() == 1 or (parent_pid and os.getppid() != parent_pid):
        on_term(signal.SIGTERM, None)


def _compute(
    work: SegmentWork,
    tasks: queue.SimpleQueue[tuple[TaskMsg, Fetched | None] | None],
    maps: SlotMaps,
    conn: Connection,
    send_lock: threading.Lock,
) -> None:
    """One compute thread: run queued tasks until told to stop (None)."""
    reader = st.SplitReader()
    while (item := tasks.get()) is not None:
        msg, fetched = item
        reply = serve(work, msg, reader, maps, fetched)
        try:
            with send_lock:
                conn.send(reply)
        except (BrokenPipeError, OSError):
            os._exit(0)  # the coordinator is gone


def worker_main(work: SegmentWork, conn: Connection) -> None:
    """Serve tasks until told to stop (None) or the coordinator goes away."""
    _die_with_parent(work.prefix, work.parent_pid)
    maps = SlotMaps(work.slot_bytes)
    fetcher = Fetcher(work.read_latency_s, work.inflight) if work.read_latency_s else None
    tasks: queue.SimpleQueue[tuple[TaskMsg, Fetched | None] | None] = queue.SimpleQueue()
    send_lock = threading.Lock()
    threads = [
        threading.Thread(target=_compute, args=(work, tasks, maps, conn, send_lock), daemon=True)
        for _ in range(max(1, work.threads))
    ]
    for t in threads:
        t.start()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        tasks.put((msg, None if fetcher is None else fetcher.start(msg)))
    for _ in threads:
        tasks.put(None)
    for t in threads:
        t.join(timeout=5)
    if fetcher is not None:
        fetcher.close()
