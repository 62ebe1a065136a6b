"""What an allocation of the live pipeline may be and what it costs in memory: the checks that
refuse a bad one with one line (before anything changes), the predicted peak memory the budget
is held against, and the measured memory per worker that refines it."""

from __future__ import annotations

from collections.abc import Sequence

from recperf.core.errors import ConfigError
from recperf.ingest.base import (
    Allocation,
    AllocationRefused,
    check_inflight,
    check_threads,
    even_split,
    fused,
)
from recperf.ingest.live.dispatch import MIB, Dispatcher

MAX_WORKERS = 64


class Budget:
    """The allocation checks and memory model of one pipeline."""

    def __init__(self, dispatcher: Dispatcher, cores: int) -> None:
        self.d = dispatcher
        self.config = dispatcher.config
        self.stage_names = dispatcher.stage_names
        self.cores = cores
        self.seg_mib: dict[tuple[int, int, int], float] = {}
        """Largest PSS measured of a worker process, by (first, stop, threads), MiB."""
        self.max_workers: tuple[int | None, ...] = (None,) * len(self.stage_names)

    @property
    def memory_budget_bytes(self) -> float:
        return self.config.memory_budget_gib * 2**30

    def resolve(self, allocation: Allocation | Sequence[int] | str) -> Allocation:
        if isinstance(allocation, Allocation):
            return allocation  # check() normalises it (and refuses a bad one)
        if isinstance(allocation, str):
            if allocation not in ("even", "fused"):
                raise ConfigError(
                    f"allocation: expected 'even', 'fused' or worker counts, not {allocation!r}"
                )
            return (fused if allocation == "fused" else even_split)(self)
        return Allocation(workers=tuple(int(w) for w in allocation))

    def memory_bytes(self, alloc: Allocation) -> float:
        """Predicted peak: worker processes (measured PSS per segment and shape, or the
        estimate until measured), the chunk each further thread of a process and each consumer
        thread holds, the raw bytes of the reading workers' requests in flight, the ring at its
        limit, and at each cut the chunks waiting, in flight on both sides and the pool of
        spent buffers."""
        n = len(self.stage_names)
        alloc = alloc.normalized(n)
        segs = alloc.segments(n)
        threads = alloc.segment_threads()
        est = self.config.worker_memory_mib
        mib, chunks, requests = 0.0, 0, 0
        for (a, b), w, t in zip(segs, alloc.workers, threads, strict=True):
            if t == 0:
                chunks += w  # no process; the thread's working set is its chunk
            else:
                mib += w * self.seg_mib.get((a, b, t), est)
                chunks += w * (t - 1)  # PSS as measured covers one thread's chunk
            if a == 0 and self.config.read_latency_ms:
                requests += w * (alloc.inflight or self.config.read_concurrency)
        slots = [w * max(1, t) for w, t in zip(alloc.workers, threads, strict=True)]
        for i in range(1, len(segs)):
            chunks += slots[i] + 1 + slots[i - 1] + slots[i]
        chunks += 2 * (len(segs) - 1)  # the pool of spent buffers
        ring = self.d.ring_limit(alloc) * self.d.slot_bytes
        return mib * MIB + ring + chunks * self.d.chunk_bytes + requests * self.d.slot_bytes

    def check(self, alloc: Allocation) -> Allocation:
        """The allocation normalised, or AllocationRefused naming what is wrong."""
        n = len(self.stage_names)
        try:
            alloc = alloc.normalized(n)
            segs = alloc.segments(n)
            for t, (a, b) in zip(alloc.segment_threads(), segs, strict=True):
                check_threads(t, f"allocation threads of segment {self._name(a, b)!r}")
            if alloc.inflight:
                check_inflight(alloc.inflight, "allocation inflight")
        except ConfigError as exc:
            if isinstance(exc, AllocationRefused):
                raise
            raise AllocationRefused(f"{exc}; stages: {', '.join(self.stage_names)}") from None
        for w, (a, b) in zip(alloc.workers, segs, strict=True):
            if not 1 <= w <= MAX_WORKERS:
                raise AllocationRefused(
                    f"allocation: segment {self._name(a, b)!r} has {w} workers; 1..{MAX_WORKERS}"
                )
        need = self.memory_bytes(alloc)
        if need > self.memory_budget_bytes:
            raise AllocationRefused(
                f"allocation {alloc.label(self.stage_names)} needs {need / MIB:,.0f} MiB "
                f"(workers + buffers), over memory_budget_gib = "
                f"{self.config.memory_budget_gib:g} ({self.memory_budget_bytes / MIB:,.0f} MiB)"
            )
        return alloc

    def _name(self, a: int, b: int) -> str:
        return "+".join(self.stage_names[a:b])

    def worker_memory_mib(self, target: Allocation) -> tuple[float, ...]:
        """Memory per worker of each stage's current segment: the largest PSS measured, else
        the estimate (the chunk it holds for a thread of the consumer's process)."""
        n = len(self.stage_names)
        est = self.config.worker_memory_mib
        out = [est] * n
        for t, (a, b) in zip(target.segment_threads(), target.segments(n), strict=True):
            for i in range(a, b):
                out[i] = self.seg_mib.get((a, b, t), est) if t else self.d.chunk_bytes / MIB
        return tuple(out)
