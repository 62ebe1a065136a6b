"""The live pipeline's Criteo stages on Ray Data: ``CriteoWork`` runs one segment of
``PipelineConfig.stage_names()`` exactly as a native worker does (the same read tasks, stage
functions and shuffle windows, so the rows of every batch match the native engine's), and
``CriteoPipeline`` is the chain as a ``RayPipeline``.

Source item ``i`` is read task ``i`` of the native engine's order (``Plan.next_read_task``):
epoch ``i // tasks_per_epoch``, that epoch's task ``i % tasks_per_epoch``. Between operators a
block has one row per chunk: column ``chunk`` an object array holding the chunk as a list of
column dicts (its packed ``stages.Block``; after collate, its batches. Ray Data stores it as a
pickled-object Arrow column, pickle's default protocol 4: each numpy array is copied into the
pickle and out of it, and comes out writable) and column
``seq`` the item sequence number of its first batch (the shuffle seeds its windows by it). The
last segment's chunks hold collated dicts, which ``consume`` turns into ``Batch``es without a
further copy.

The workers' side imports neither torch nor the native engine's plan (about 2 s of CPU per
actor on the 2-core test machine): the driver hands the first segment its read tasks."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from recperf.core.errors import RecperfError
from recperf.ingest.data import stages as st
from recperf.ingest.live import items
from recperf.ingest.raydata.engine import ITEM
from recperf.ingest.raydata.work import Block, SegmentFn, StageTimes
from recperf.ingest.sim.model import MIB

if TYPE_CHECKING:
    from recperf.ingest.live.batch import Batch, PipelineConfig
    from recperf.ingest.live.plan import Plan

CHUNK = "chunk"
"""A block's column of chunks: each element is a list of column dicts (consecutive batches)."""
SEQ = "seq"
"""A block's column of each chunk's first item sequence number."""
PREFETCH_BLOCKS = 2
"""Output blocks the driver's iterator fetches ahead (``iter_batches``' prefetch_batches)."""


@dataclass(slots=True, frozen=True)
class ReadChunk:
    """One read task of the native order: the item sequence number of its first split (its
    splits' are consecutive) and the splits."""

    seq: int
    splits: tuple[st.Split, ...]


@dataclass(kw_only=True, slots=True, frozen=True)
class CriteoWork:
    """Segment ``stages`` of the chain, beginning at stage index ``first``."""

    stages: tuple[str, ...]
    first: int
    reads: tuple[ReadChunk, ...]
    """Source item i's read task (the first segment only; () for the others)."""
    seed: int
    downsample_rate: float
    shuffle_window: int
    read_latency_s: float = 0.0
    """Emulated storage latency per split request (0: local files)."""
    read_concurrency: int = 1
    """Split requests overlapped at a time (their latencies overlap this many at once)."""
    start_s: float = 0.0

    def open(self) -> SegmentFn:
        return _CriteoRunner(self)


class _CriteoRunner:
    """A worker of a Criteo segment, with its SplitReader (a Parquet row group is decoded once
    for all of its splits)."""

    def __init__(self, work: CriteoWork) -> None:
        self.work = work
        self.reader = st.SplitReader()

    def task(self, item: int) -> ReadChunk:
        if not 0 <= item < len(self.work.reads):
            raise RecperfError(f"ray source item {item}: the plan has {len(self.work.reads)}")
        return self.work.reads[item]

    def __call__(self, block: Block) -> tuple[Block, StageTimes]:
        w = self.work
        n = len(w.stages)
        cpu, wall, rows = [0.0] * n, [0.0] * n, [0] * n
        inputs: list[tuple[ReadChunk | None, int, list[st.Columns]]]
        if w.first == 0:
            inputs = [(t, t.seq, []) for t in map(self.task, map(int, block[ITEM]))]
        else:
            inputs = [(None, int(s), list(c)) for s, c in zip(block[SEQ], block[CHUNK],
                                                              strict=True)]  # fmt: skip
        chunks = [self._stages(t, s, c, cpu, wall, rows) for t, s, c in inputs]
        seqs = [s for _, s, _ in inputs]
        t = time.thread_time()
        out = np.empty(len(chunks), dtype=object)
        for k, c in enumerate(chunks):
            out[k] = c
        result: Block = {CHUNK: out, SEQ: np.asarray(seqs, np.int64)}
        handoff = time.thread_time() - t
        rows_out = sum(len(c["row_id"]) for chunk in chunks for c in chunk)  # a packed
        # block's row_id holds all of its rows, as the collated batches' do together
        times = StageTimes(rows=tuple(rows), cpu_s=tuple(cpu), wall_s=tuple(wall),
                           rows_out=rows_out, handoff_s=handoff)  # fmt: skip
        return result, times

    def _stages(
        self,
        task: ReadChunk | None,
        seq0: int,
        cols: list[st.Columns],
        cpu: list[float],
        wall: list[float],
        rows: list[int],
    ) -> list[st.Columns]:
        """The segment's stages on one chunk, as the native worker runs them (each once over
        the whole chunk), each timed; the chunk comes and goes as a list of column dicts: its
        packed block (before collate) or its collated batches."""
        w = self.work
        block = None if task is not None else st.Block.unpack(cols[0])
        for i, name in enumerate(w.stages):
            t, w0, waited = time.thread_time(), time.perf_counter(), 0.0
            if name == "read":
                assert task is not None
                waited = self._wait_storage(len(task.splits))
                block = self.reader.read_chunk(task.splits)
                rows[i] += block.rows
            else:
                assert block is not None
                rows[i] += block.rows
                if name == "collate":
                    cols = st.collate(block)
                else:
                    seqs = range(seq0, seq0 + len(block.batch_rows))
                    block = st.apply_stage(
                        name, block, seqs, w.seed, w.downsample_rate, w.shuffle_window
                    )
            cpu[i] += time.thread_time() - t
            wall[i] += max(0.0, time.perf_counter() - w0 - waited)
        if w.stages[-1] == "collate":
            return cols
        assert block is not None
        return [block.pack()]

    def _wait_storage(self, splits: int) -> float:
        """The emulated storage wait of a chunk's requests, overlapped ``read_concurrency`` at
        a time (as the native reader's I/O threads overlap them); seconds waited."""
        w = self.work
        if not w.read_latency_s:
            return 0.0
        t = time.perf_counter()
        time.sleep(w.read_latency_s * -(-splits // w.read_concurrency))
        return time.perf_counter() - t


class CriteoPipeline:
    """The live pipeline over ``data`` as a RayPipeline. ``items()`` covers ``config.epochs``
    (``repeat_epochs`` when it is None: a repeating pipeline's dataset is that many epochs).
    ``consume`` hands every batch to ``on_batch``."""

    def __init__(
        self,
        data: str | Path,
        config: PipelineConfig,
        *,
        repeat_epochs: int = 1,
        on_batch: Callable[[Batch], None] | None = None,
        read_concurrency: int | None = None,
    ) -> None:
        from recperf.ingest.live.plan import Plan

        self.config = config
        self.plan = plan = Plan(data, config)
        """The read plan (its tasks already dealt into ``reads``; ``counts`` rows per split)."""
        self._names = config.stage_names()
        self.epochs = config.epochs if config.epochs is not None else max(1, repeat_epochs)
        k = plan.read_task_splits
        self.tasks_per_epoch = sum(-(-len(g) // k) for g in plan.groups.values())
        self.reads = tuple(_reads(plan, self.tasks_per_epoch * self.epochs))
        """Every source item's read task, in the native engine's order."""
        self.chunk_bytes = k * items.item_bytes(config.batch_size)
        """Upper bound on the bytes of one chunk (a block between operators)."""
        self.on_batch = on_batch
        self.read_concurrency = read_concurrency or config.read_concurrency

    @property
    def stage_names(self) -> tuple[str, ...]:
        return self._names

    @property
    def max_workers(self) -> tuple[int | None, ...]:
        return (None,) * len(self._names)

    @property
    def memory_budget_bytes(self) -> float:
        return self.config.memory_budget_gib * 2**30

    def memory_bytes(
        self, workers: tuple[int, ...], segments: tuple[tuple[int, int], ...]
    ) -> float:
        """Each worker at ``worker_memory_mib``, plus the chunks in flight: at each cut one per
        worker on either side (the block an upstream worker has produced or is producing, the
        one a downstream worker holds), and at the end one per last-segment worker plus the
        blocks the driver prefetches. Ray Data's backpressure keeps the queues near this."""
        del segments  # every segment's worker is costed alike until one is measured
        chunks = workers[-1] + PREFETCH_BLOCKS
        chunks += sum(a + b for a, b in itertools.pairwise(workers))
        return sum(workers) * self.config.worker_memory_mib * MIB + chunks * self.chunk_bytes

    def works(
        self, segments: tuple[tuple[int, int], ...], slowdown: float = 1.0
    ) -> list[CriteoWork]:
        del slowdown  # real work slows by itself when workers share the CPUs
        c = self.config
        return [
            CriteoWork(
                stages=self._names[a:b],
                first=a,
                reads=self.reads if a == 0 else (),
                seed=c.seed,
                downsample_rate=c.downsample_rate or 1.0,
                shuffle_window=c.shuffle_window,
                read_latency_s=c.read_latency_ms / 1e3,
                read_concurrency=self.read_concurrency,
            )
            for a, b in segments
        ]

    def items(self) -> int:
        return len(self.reads)

    def consume(self, block: Block) -> int:
        """Each collated dict of the block as a Batch (tensors over the block's arrays) to
        ``on_batch``; the rows taken."""
        n = 0
        for chunk in block[CHUNK]:
            for cols in chunk:
                batch = batch_of(cols)
                n += batch.size
                if self.on_batch is not None:
                    self.on_batch(batch)
        return n


def _reads(plan: Plan, n: int) -> list[ReadChunk]:
    """The first ``n`` read tasks ``plan`` deals (epoch after epoch), as the native engine."""
    out = []
    for _ in range(n):
        task = plan.next_read_task()
        if task is None:
            raise RecperfError(f"the read plan has fewer than {n} tasks")
        out.append(ReadChunk(task.seqs[0], task.splits))
    return out


def batch_of(cols: st.Columns) -> Batch:
    """A Batch over collated numpy columns, sharing their memory."""
    import torch

    from recperf.ingest.live.batch import Batch

    return Batch.from_tensors({k: torch.from_numpy(_writable(v)) for k, v in cols.items()})


def _writable(a: np.ndarray) -> np.ndarray:
    """``a`` itself when it owns writable memory; a read-only view (an unpickled buffer) is
    copied once, as torch tensors over read-only memory are undefined behaviour on write."""
    return a if a.flags.writeable else np.array(a, copy=True)
