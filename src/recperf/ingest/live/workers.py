"""What runs inside a live-pipeline worker process: receive a task over its pipe, run the stages
of its segment on the task's chunk of batches, hand the result on (one packed shared-memory
buffer at a cut, ring slots at the end of the chain), report back. The messages are small frozen
dataclasses."""

from __future__ import annotations

import ctypes
import os
import signal
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from recperf.core.errors import RecperfError, TraceFormatError
from recperf.ingest.data import stages as st
from recperf.ingest.live import items
from recperf.ingest.live.items import ItemRef, Layout
from recperf.ingest.live.ring import SlotMaps


@dataclass(slots=True, frozen=True)
class SegmentWork:
    """Everything a worker of one segment needs besides its tasks."""

    stages: tuple[str, ...]
    """The whole chain, e.g. (read, dense, sparse, shuffle, collate)."""
    first: int
    """This worker's segment is stages[first:stop]."""
    stop: int
    seed: int
    downsample_rate: float
    shuffle_window: int
    slot_bytes: int
    prefix: str
    """The pipeline's shared-memory file prefix (what a worker deletes if the parent dies)."""
    read_latency_s: float = 0.0
    """Emulated remote-storage latency of one request (0: local files)."""
    read_concurrency: int = 1
    """Requests in flight at once: a wait covers that many splits."""
    parent_pid: int = 0
    """The coordinator's pid (0: unknown): a worker whose parent is another has lost it."""


@dataclass(slots=True, frozen=True)
class TaskMsg:
    """Run stages ``start .. work.stop`` on one chunk of consecutive batches."""

    task_id: int
    attempt: int
    start: int
    """First stage to run (the chunk has been through the stages before it)."""
    seqs: tuple[int, ...]
    splits: tuple[st.Split, ...]
    source: ItemRef | None
    """The chunk's packed batches (None when ``start`` is 0: read the splits)."""
    out_path: str = ""
    """Where a cut's packed output goes (the segment does not end the chain)."""
    reuse: str | None = None
    """A spent buffer file to write the packed output into (saves allocating pages)."""
    slots: tuple[str, ...] = ()
    """Ring slot files, one per batch (the segment ends the chain)."""


@dataclass(slots=True, frozen=True)
class DoneMsg:
    task_id: int
    attempt: int
    out: ItemRef | None
    """The packed chunk at a cut, else None."""
    layouts: tuple[Layout, ...]
    """Each batch's layout in its ring slot (the segment ends the chain), else ()."""
    rows_out: tuple[int, ...]
    """Rows of each output batch."""
    stage_cpu_s: tuple[float, ...]
    """CPU per stage of the chain (0 for stages the task did not run)."""
    stage_rows: tuple[int, ...]
    """Rows each stage consumed (a read stage's: the rows it produced)."""
    busy_s: float
    handoff_cpu_s: float
    """CPU spent mapping the input and writing the output."""


@dataclass(slots=True, frozen=True)
class FailMsg:
    task_id: int
    attempt: int
    kind: str
    """badrow (row_id, field, why), traceformat (file, line, field, why), recperf (message) or
    error (a traceback)."""
    payload: tuple[Any, ...]


def _apply(
    work: SegmentWork, name: str, cols: list[st.Columns], seqs: tuple[int, ...]
) -> list[st.Columns]:
    if name == "dense":
        return [st.dense_transform(c) for c in cols]
    if name == "sparse":
        return [st.sparse_transform(c) for c in cols]
    if name == "downsample":
        return [st.downsample(c, work.downsample_rate, work.seed) for c in cols]
    if name == "collate":
        return [st.collate(c) for c in cols]
    if name == "shuffle":
        k = work.shuffle_window
        out: list[st.Columns] = []
        for a in range(0, len(cols), k):  # windows of k batches, seeded by their first seq
            out += st.shuffle(cols[a : a + k], work.seed, seqs[a])
        return out
    raise ValueError(f"unknown stage {name!r}")


def run_task(work: SegmentWork, msg: TaskMsg, reader: st.SplitReader, maps: SlotMaps) -> DoneMsg:
    """Run the task's stages and hand the chunk on."""
    n = len(work.stages)
    cpu, rows = [0.0] * n, [0] * n
    wall0 = time.perf_counter()
    t = time.process_time()
    cols = [] if msg.source is None else items.unpack(items.read_item(msg.source))
    handoff = time.process_time() - t
    for i in range(msg.start, work.stop):
        t = time.process_time()
        if work.stages[i] == "read":
            cols = []
            for j, split in enumerate(msg.splits):
                if work.read_latency_s and j % work.read_concurrency == 0:
                    # the next read_concurrency requests go out together; one latency for all
                    time.sleep(work.read_latency_s)
                cols.append(reader.read(split))
            rows[i] = sum(len(c["row_id"]) for c in cols)
        else:
            rows[i] = sum(len(c["row_id"]) for c in cols)
            cols = _apply(work, work.stages[i], cols, msg.seqs)
        cpu[i] = time.process_time() - t
    t = time.process_time()
    out: ItemRef | None = None
    layouts: tuple[Layout, ...] = ()
    if work.stop == n:
        layouts = tuple(maps.write(p, c) for p, c in zip(msg.slots, cols, strict=True))
    else:
        out = items.write_item(msg.out_path, items.pack(cols), msg.reuse)
    handoff += time.process_time() - t
    return DoneMsg(
        task_id=msg.task_id,
        attempt=msg.attempt,
        out=out,
        layouts=layouts,
        rows_out=tuple(len(c["row_id"]) for c in cols),
        stage_cpu_s=tuple(cpu),
        stage_rows=tuple(rows),
        busy_s=time.perf_counter() - wall0,
        handoff_cpu_s=handoff,
    )


def _failure(msg: TaskMsg) -> FailMsg:
    import sys

    exc = sys.exc_info()[1]
    if isinstance(exc, st.BadRow):
        return FailMsg(msg.task_id, msg.attempt, "badrow", (exc.row_id, exc.field, exc.why))
    if isinstance(exc, TraceFormatError):  # its constructor takes four arguments: send them
        fields = (str(exc.file), exc.line, exc.field, exc.why)
        return FailMsg(msg.task_id, msg.attempt, "traceformat", fields)
    if isinstance(exc, RecperfError):
        return FailMsg(msg.task_id, msg.attempt, "recperf", (str(exc),))
    return FailMsg(msg.task_id, msg.attempt, "error", (traceback.format_exc(),))


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


def worker_main(work: SegmentWork, conn: Connection) -> None:
    """Serve tasks until told to stop (None) or the coordinator goes away."""
    _die_with_parent(work.prefix, work.parent_pid)
    reader = st.SplitReader()
    maps = SlotMaps(work.slot_bytes)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        reply: DoneMsg | FailMsg
        try:
            reply = run_task(work, msg, reader, maps)
        except Exception:
            reply = _failure(msg)
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return
