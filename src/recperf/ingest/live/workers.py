"""What runs inside a live-pipeline worker process: receive a task over its pipe, run its stage's
work on shared-memory items, write the outputs as new items, report back. Kept small because
the forkserver preloads it into every worker."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from recperf.core.errors import RecperfError, TraceFormatError
from recperf.ingest.data import stages as st
from recperf.ingest.live import items


@dataclass(slots=True, frozen=True)
class StageWork:
    """Everything a worker of one stage needs besides its tasks."""

    stage: str
    """One of read, dense, sparse, downsample, shuffle, collate."""
    seed: int
    downsample_rate: float
    read_latency_s: float = 0.0
    """Emulated remote-storage latency the read stage waits per split (0: local files)."""


@dataclass(slots=True, frozen=True)
class TaskMsg:
    """One task: its inputs (Splits for read, ItemRefs otherwise) and where its outputs go."""

    task_id: int
    attempt: int
    inputs: tuple[Any, ...]
    out_prefix: str
    window: int = 0
    reuse: tuple[str, ...] = ()
    """Spent item files the outputs may be written into (output k into reuse[k])."""


def run_task(work: StageWork, msg: TaskMsg, reader: st.SplitReader) -> list[st.Columns]:
    """The stage's transformation of one task's inputs into its output column dicts."""
    if work.stage == "read":
        out = []
        for split in msg.inputs:
            if work.read_latency_s:
                time.sleep(work.read_latency_s)  # one request to remote storage per split
            out.append(st.decode(reader.read(split), split.first_row))
        return out
    cols = [items.read_item(ref) for ref in msg.inputs]
    if work.stage == "shuffle":
        return st.shuffle(cols, work.seed, msg.window)
    (one,) = cols
    fn = {
        "dense": st.dense_transform,
        "sparse": st.sparse_transform,
        "collate": st.collate,
    }.get(work.stage)
    if fn is not None:
        return [fn(one)]
    if work.stage == "downsample":
        return [st.downsample(one, work.downsample_rate, work.seed)]
    raise ValueError(f"unknown stage {work.stage!r}")


def worker_main(work: StageWork, conn: Connection) -> None:
    """Serve tasks until told to stop (None) or the coordinator goes away."""
    reader = st.SplitReader()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        cpu0, wall0 = time.process_time(), time.perf_counter()
        try:
            outs = run_task(work, msg, reader)
            refs = [
                items.write_item(
                    f"{msg.out_prefix}-{k}", o, msg.reuse[k] if k < len(msg.reuse) else None
                )
                for k, o in enumerate(outs)
            ]
            del outs
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            # rows the stage consumed (a read task's are the rows it produced)
            rows_in = sum(r.rows for r in (refs if work.stage == "read" else msg.inputs))
            reply: tuple[Any, ...] = ("done", msg.task_id, msg.attempt, refs, cpu, wall, rows_in)
        except st.BadRow as exc:
            reply = ("badrow", msg.task_id, msg.attempt, (exc.row_id, exc.field, exc.why))
        except TraceFormatError as exc:  # its constructor takes four arguments: send them
            fields = (str(exc.file), exc.line, exc.field, exc.why)
            reply = ("traceformat", msg.task_id, msg.attempt, fields)
        except RecperfError as exc:
            reply = ("error", msg.task_id, msg.attempt, exc)
        except Exception:
            reply = ("error", msg.task_id, msg.attempt, traceback.format_exc())
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return
