"""What each Ray worker saw, gathered while a dataset streams: one ``BlockRecord`` per block per
operator, sent in small batches to a ``Meter`` actor (no CPU of its own) that the driver drains.
Records carry wall-clock stamps, so a window is the records that ended inside it."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from recperf.ingest.raydata.work import StageTimes

FLUSH_S = 0.25
"""A worker sends its records to the meter at least this often (and when it has 64)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class BlockRecord:
    """One block through one operator."""

    op: int
    """The operator (segment) index, in chain order."""
    worker: str
    """``node:pid`` of the Ray worker process that ran it."""
    node: str
    """Ray node id of that worker."""
    t0: float
    """Wall clock (``time.time``) when the worker took the block."""
    t1: float
    """Wall clock when it had produced the output block."""
    rows_out: int
    times: StageTimes


class Meter:
    """The records of every worker since the last drain (a Ray actor; see ``start_meter``)."""

    def __init__(self) -> None:
        self._records: list[BlockRecord] = []

    def add(self, records: Sequence[BlockRecord]) -> None:
        self._records.extend(records)

    def drain(self) -> list[BlockRecord]:
        out, self._records = self._records, []
        return out


def start_meter(ray: Any) -> Any:
    """A fresh Meter actor (zero CPUs, so it never takes a worker's logical CPU)."""
    return ray.remote(num_cpus=0, max_concurrency=1)(Meter).remote()


class Reporter:
    """A worker's buffer of records for one meter, flushed every FLUSH_S or 64 records."""

    def __init__(self, meter: Any, op: int) -> None:
        import ray

        self.meter = meter
        self.op = op
        self.node = ray.get_runtime_context().get_node_id()
        self.worker = f"{self.node[:8]}:{os.getpid()}"
        self._buf: list[BlockRecord] = []
        self._last = time.monotonic()

    def record(self, t0: float, t1: float, rows_out: int, times: StageTimes) -> None:
        self._buf.append(BlockRecord(op=self.op, worker=self.worker, node=self.node, t0=t0,
                                     t1=t1, rows_out=rows_out, times=times))  # fmt: skip
        now = time.monotonic()
        if len(self._buf) >= 64 or now - self._last >= FLUSH_S:
            self.meter.add.remote(self._buf)
            self._buf = []
            self._last = now
