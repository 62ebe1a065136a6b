"""What one task does, wherever it runs (a thread of a worker process or a thread of the
consumer's own process): the messages between the coordinator and a worker, the stages of a
segment run on one chunk of batches, and the storage requests a reading worker keeps in flight.

Protocol: the coordinator sends a ``TaskMsg`` (run stages ``start .. stop`` on one chunk); the
worker answers one ``DoneMsg`` (the chunk's output and what each stage cost) or one ``FailMsg``
(the error, as data the coordinator turns into the exception the consumer raises). A chunk's
input and output are either packed into one shared-memory file (``ItemRef``), written into ring
slots (a process ending the chain), or, between threads of the consumer's process, the Python
objects themselves (``local``), never copied. The messages are small frozen dataclasses."""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from recperf.core.errors import RecperfError, TraceFormatError
from recperf.ingest.data import stages as st
from recperf.ingest.live import items
from recperf.ingest.live.items import Columns, ItemRef, Layout
from recperf.ingest.live.ring import Slot, SlotMaps


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
    inflight: int = 1
    """Storage requests the worker keeps in flight (its I/O threads)."""
    threads: int = 1
    """Compute threads of a worker process (0: a thread of the consumer's process)."""
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
    """The chunk's packed batches in shared memory (None: read the splits, or ``local``)."""
    out_path: str = ""
    """Where the packed output goes ("" at the end of the chain or when kept ``local``)."""
    reuse: str | None = None
    """A spent buffer file to write the packed output into (saves allocating pages)."""
    slots: tuple[str, ...] = ()
    """Ring slot files, one per batch (a worker process ending the chain)."""
    local: tuple[Columns, ...] | None = None
    """The chunk's batches as Python objects (consumer threads only; never pickled)."""


@dataclass(slots=True, frozen=True)
class DoneMsg:
    task_id: int
    attempt: int
    out: ItemRef | None
    """The packed chunk in shared memory, else None."""
    layouts: tuple[Layout, ...]
    """Each batch's layout in its ring slot (a process ending the chain), else ()."""
    rows_out: tuple[int, ...]
    """Rows of each output batch."""
    stage_cpu_s: tuple[float, ...]
    """CPU per stage of the chain, this thread's (0 for stages the task did not run)."""
    stage_rows: tuple[int, ...]
    """Rows each stage consumed (a read stage's: the rows it produced)."""
    busy_s: float
    handoff_cpu_s: float
    """CPU spent mapping the input and writing the output."""
    stage_wall_s: tuple[float, ...] = ()
    """Wall time per stage, storage waits and waits for a CPU (other load) excluded."""
    local: tuple[Columns, ...] = ()
    """The output batches as Python objects (consumer threads only; never pickled)."""


@dataclass(slots=True, frozen=True)
class FailMsg:
    task_id: int
    attempt: int
    kind: str
    """badrow (row_id, field, why), traceformat (file, line, field, why), recperf (message) or
    error (a traceback)."""
    payload: tuple[Any, ...]


@dataclass(slots=True, eq=False)
class Chunk:
    """Consecutive batches moving down the chain together; ``stage`` is the next stage to run
    (0: not read yet); after stage ``stage - 1`` the batches are in ``ref`` (shared memory) or
    ``local`` (Python objects, when a consumer thread made them)."""

    seqs: tuple[int, ...]
    splits: tuple[st.Split, ...]
    stage: int = 0
    ref: ItemRef | None = None
    local: tuple[Columns, ...] | None = None
    attempt: int = 0
    task_id: int = -1
    lent: tuple[str, int] | None = None
    slots: list[Slot] = field(default_factory=list)
    held_out: int = 0
    """Output batches it counts against the output limit (a consumer thread ends the chain)."""

    @property
    def first(self) -> int:
        return self.seqs[0]


class Worker(Protocol):
    """A worker serving one segment: it holds up to ``capacity`` tasks (its compute threads,
    and tasks ahead for a reading worker), runs them and reports each once."""

    segment: tuple[int, int]
    threads: int
    """Compute threads of its process; 0: a thread of the consumer's process."""
    capacity: int
    tasks: dict[int, Chunk]
    """The chunks it holds, by task id."""
    retiring: bool

    @property
    def pid(self) -> int | None: ...

    def send(self, msg: TaskMsg) -> None:
        """Hand it a task (it starts the task's storage requests at once)."""
        ...

    def stop(self) -> None:
        """Ask it to exit (sent once it holds no task)."""
        ...

    def waitables(self) -> list[Any]:
        """What the coordinator waits on for its reports and its death ([] for a thread, which
        reports by itself)."""
        ...

    def close(self) -> None:
        """Ask it to exit now, dropping what it has not started."""
        ...

    def join(self) -> None: ...


class Fetcher:
    """The storage requests of a reading worker: each split is one request (an emulated wait of
    ``read_latency_s``, and for TSV the bytes themselves), issued as soon as a task reaches the
    worker and overlapped by ``inflight`` I/O threads. A Parquet split's bytes are read by the
    decoder (pyarrow reads and decodes a row group in one call); its request is the wait only."""

    def __init__(self, latency_s: float, inflight: int) -> None:
        self.latency_s = latency_s
        self._pool = ThreadPoolExecutor(max(1, inflight), thread_name_prefix="recperf-io")

    def start(self, msg: TaskMsg) -> list[Future[tuple[bytes | None, float]]] | None:
        """The task's requests, now in flight (None: the task does not read)."""
        if msg.start != 0:
            return None
        return [self._pool.submit(_fetch, s, self.latency_s) for s in msg.splits]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _fetch(split: st.Split, latency_s: float) -> tuple[bytes | None, float]:
    """One request: its wait, then the split's raw TSV bytes (None for other kinds), and the
    CPU it took."""
    time.sleep(latency_s)
    t = time.thread_time()
    raw = None
    if split.kind == "tsv":
        raw = st.read_range(split.file, split.a, split.b)
    return raw, time.thread_time() - t


Fetched = list[Future[tuple[bytes | None, float]]]


def run_delay_s() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (Linux schedstat; 0 where
    unknown): on a machine shared with other load, wall time minus this is the time a thread ran
    or was blocked (e.g. waiting for the GIL), which the GIL estimate needs."""
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:
        return 0.0
    try:
        return int(os.read(fd, 128).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0
    finally:
        os.close(fd)


def _read(
    msg: TaskMsg, reader: st.SplitReader, fetched: Fetched | None
) -> tuple[st.Block, float, float]:
    """The chunk's splits as one block; also the wall time spent waiting for storage and the
    CPU its requests took on I/O threads."""
    if fetched is None:
        return reader.read_chunk(msg.splits), 0.0, 0.0
    raw: list[bytes] = []
    waited, io_cpu = 0.0, 0.0
    for fut in fetched:
        t = time.perf_counter()
        data, cpu = fut.result()
        waited += time.perf_counter() - t
        io_cpu += cpu
        if data is not None:
            raw.append(data)
    return reader.read_chunk(msg.splits, raw or None), waited, io_cpu


def run_task(
    work: SegmentWork,
    msg: TaskMsg,
    reader: st.SplitReader,
    maps: SlotMaps | None,
    fetched: Fetched | None = None,
) -> DoneMsg:
    """Run the task's stages on this thread, each once over the whole chunk, and hand the
    chunk on as the message says: cut into batches into ring slots, packed into one
    shared-memory file, or as the Python objects themselves. CPU is this thread's
    (``thread_time``), so threads of one process are timed apart."""
    n = len(work.stages)
    cpu, wall, rows = [0.0] * n, [0.0] * n, [0] * n
    wall0 = time.perf_counter()
    t = time.thread_time()
    block: st.Block | None = None
    if msg.local is not None:
        block = st.Block.unpack(msg.local[0])
    elif msg.source is not None:
        block = st.Block.unpack(items.unpack(items.read_item(msg.source))[0])
    handoff = time.thread_time() - t
    batches: list[Columns] = []
    delay = run_delay_s()
    for i in range(msg.start, work.stop):
        t, w0, waited = time.thread_time(), time.perf_counter(), 0.0
        name = work.stages[i]
        if name == "read":
            block, waited, io_cpu = _read(msg, reader, fetched)
            cpu[i] += io_cpu
            rows[i] = block.rows
        else:
            assert block is not None
            rows[i] = block.rows
            if name == "collate":
                batches = st.collate(block)
            else:
                block = st.apply_stage(
                    name, block, msg.seqs, work.seed, work.downsample_rate, work.shuffle_window
                )
        cpu[i] += time.thread_time() - t
        delay, before = run_delay_s(), delay
        wall[i] = max(0.0, time.perf_counter() - w0 - waited - (delay - before))
    t = time.thread_time()
    out: ItemRef | None = None
    layouts: tuple[Layout, ...] = ()
    local: tuple[Columns, ...] = ()
    if work.stages[work.stop - 1] == "collate":
        rows_out = tuple(len(c["row_id"]) for c in batches)
        if msg.slots:
            assert maps is not None
            layouts = tuple(maps.write(p, c) for p, c in zip(msg.slots, batches, strict=True))
        else:
            local = tuple(batches)
    else:
        assert block is not None
        rows_out = block.batch_rows
        if msg.out_path:
            out = items.write_item(msg.out_path, items.pack([block.pack()]), msg.reuse)
        else:
            local = (block.pack(),)
    handoff += time.thread_time() - t
    return DoneMsg(
        task_id=msg.task_id,
        attempt=msg.attempt,
        out=out,
        layouts=layouts,
        rows_out=rows_out,
        stage_cpu_s=tuple(cpu),
        stage_rows=tuple(rows),
        busy_s=time.perf_counter() - wall0,
        handoff_cpu_s=handoff,
        stage_wall_s=tuple(wall),
        local=local,
    )


def serve(
    work: SegmentWork,
    msg: TaskMsg,
    reader: st.SplitReader,
    maps: SlotMaps | None,
    fetched: Fetched | None,
) -> DoneMsg | FailMsg:
    """Run one task; an exception becomes the FailMsg the coordinator turns into the error."""
    try:
        return run_task(work, msg, reader, maps, fetched)
    except Exception as exc:
        return failure(exc, msg)


def failure(exc: BaseException, msg: TaskMsg) -> FailMsg:
    """The error a task raised, as data (a process sends it; a thread hands it over)."""
    if isinstance(exc, st.BadRow):
        return FailMsg(msg.task_id, msg.attempt, "badrow", (exc.row_id, exc.field, exc.why))
    if isinstance(exc, TraceFormatError):  # its constructor takes four arguments: send them
        fields = (str(exc.file), exc.line, exc.field, exc.why)
        return FailMsg(msg.task_id, msg.attempt, "traceformat", fields)
    if isinstance(exc, RecperfError):
        return FailMsg(msg.task_id, msg.attempt, "recperf", (str(exc),))
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return FailMsg(msg.task_id, msg.attempt, "error", (text,))


def error_of(msg: FailMsg, segment: str, split_of_row: Callable[[int], st.Split]) -> Exception:
    """The exception a failed task stops the run with: a bad row names its file, line (row
    of a Parquet file) and field; anything unexpected keeps its traceback."""
    if msg.kind == "traceformat":
        return TraceFormatError(*msg.payload)
    if msg.kind == "badrow":
        row_id, fieldname, why = msg.payload
        split = split_of_row(row_id)
        line = split.first_line + row_id - split.first_row
        if split.kind == "parquet":
            return TraceFormatError(split.file, None, fieldname, f"row {line}: {why}")
        return TraceFormatError(split.file, line, fieldname, why)
    if msg.kind == "recperf":
        return RecperfError(msg.payload[0])
    return RuntimeError(f"ingest worker of segment {segment!r} failed:\n{msg.payload[0]}")
