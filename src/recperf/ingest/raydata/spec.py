"""A simulator spec (``ingest simulate``'s TOML, bundled names and files alike) as a synthetic
pipeline on Ray: each stage's work on a block is a sleep of ``cost_us_per_row x rows`` (so tens
of logical CPUs can be measured on a small machine), a segment pays the spec's hand-off once,
and the consumer its per-row cost. A worker reserves its stages' memory as Ray's logical
``memory`` resource (the engine's OperatorPlan.memory_bytes), so Ray will not start workers
past the budget; it does not touch that memory (4 nodes x 16 workers of criteo-16 would hold
tens of GiB on a machine that may have less).

Blocks are ``block_rows`` rows: the spec's ``batch_rows`` raised until the cheapest segment's
block takes at least ``MIN_BLOCK_S`` (Ray's own guidance is that tasks much shorter than that
gain nothing; per-row costs, and so the bound, are unchanged)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from recperf.ingest.base import Allocation
from recperf.ingest.raydata.engine import ITEM
from recperf.ingest.raydata.work import Block, SegmentFn, StageTimes, rows_of
from recperf.ingest.sim.model import PipelineSpec
from recperf.ingest.sim.solve import lp_bound

MIN_BLOCK_S = 0.05
"""The shortest block of the cheapest stage a spec pipeline runs, seconds."""
ROW = "row"
MAX_ITEMS = 20_000
"""The most source items one dataset of a spec pipeline holds (the driver keeps them)."""


def block_rows(spec: PipelineSpec, min_block_s: float = MIN_BLOCK_S) -> int:
    """Rows per block: whole multiples of ``batch_rows`` until the cheapest stage's block
    sleeps at least ``min_block_s``."""
    cheapest = min(s.cost_us_per_row for s in spec.stages)
    k = max(1, math.ceil(min_block_s * 1e6 / (cheapest * spec.batch_rows)))
    return k * spec.batch_rows


@dataclass(kw_only=True, slots=True, frozen=True)
class SpecWork:
    """One segment of a spec: its stages' costs, memory, slow start and output bytes."""

    stages: tuple[str, ...]
    costs_us: tuple[float, ...]
    """µs per row of each stage."""
    handoff_us: float
    """µs per row of handing the segment's output on (the spec's ``transfer_us_per_row``)."""
    start_s: float
    """The slowest start of the segment's stages (its actors sleep it first)."""
    memory_mib: float
    """Memory a worker reserves (the stages' ``memory_mib_per_worker``)."""
    rows: int
    """Rows a source item becomes (first segment)."""
    first: bool
    """The segment makes its blocks from source items."""
    out_bytes: int
    """Bytes per row of the output block (at least the 8-byte row id)."""

    def open(self) -> SegmentFn:
        return _SpecRunner(self)


class _SpecRunner:
    """A worker of a spec segment: it sleeps each stage's cost per block."""

    def __init__(self, work: SpecWork) -> None:
        self.work = work

    def __call__(self, block: Block) -> tuple[Block, StageTimes]:
        w = self.work
        if w.first:
            items = np.asarray(block[ITEM], np.int64)
            ids = (items[:, None] * w.rows + np.arange(w.rows)).reshape(-1)
        else:
            ids = np.asarray(block[ROW], np.int64)
        n = len(ids)
        walls = tuple(_sleep(c * n / 1e6) for c in w.costs_us)
        handoff = _sleep(w.handoff_us * n / 1e6)
        out: Block = {ROW: ids}
        if w.out_bytes > 8:
            out["pad"] = np.zeros((n, w.out_bytes - 8), np.uint8)
        return out, StageTimes(rows=(n,) * len(walls), cpu_s=walls, wall_s=walls, rows_out=n,
                               handoff_s=handoff)  # fmt: skip


def _sleep(seconds: float) -> float:
    """Sleep ``seconds`` (the stand-in for that much CPU work); the seconds it took."""
    t = time.perf_counter()
    if seconds > 0:
        time.sleep(seconds)
    return time.perf_counter() - t


def spec_works(
    spec: PipelineSpec, segments: tuple[tuple[int, int], ...], rows: int, slowdown: float = 1.0
) -> list[SpecWork]:
    """The SpecWork of each segment ``(first, stop)`` of ``spec``'s chain, its costs stretched
    by ``slowdown`` (more workers than logical CPUs time-share them, as the model says)."""
    out = []
    for j, (a, b) in enumerate(segments):
        st = spec.stages[a:b]
        out.append(
            SpecWork(
                stages=tuple(s.name for s in st),
                costs_us=tuple(s.cost_us_per_row * slowdown for s in st),
                handoff_us=spec.transfer_us_per_row * slowdown,
                start_s=max(s.start_s for s in st),
                memory_mib=sum(s.memory_mib_per_worker for s in st),
                rows=rows,
                first=j == 0,
                out_bytes=max(8, round(st[-1].out_bytes_per_row)),
            )
        )
    return out


class SpecPipeline:
    """A simulator spec as a RayPipeline on ``cpus`` logical CPUs: the spec's stages, caps,
    memory model and budget; ``items`` sized for ``horizon_s`` seconds at the LP bound."""

    def __init__(self, spec: PipelineSpec, cpus: int, horizon_s: float = 600.0) -> None:
        self.spec = spec.with_(cores=cpus, thread_options=(1,))
        self.rows = block_rows(self.spec)
        self.horizon_s = horizon_s

    @property
    def stage_names(self) -> tuple[str, ...]:
        return self.spec.stage_names

    @property
    def max_workers(self) -> tuple[int | None, ...]:
        return tuple(s.max_workers for s in self.spec.stages)

    @property
    def memory_budget_bytes(self) -> float:
        return self.spec.memory_budget_gib * 2**30

    def memory_bytes(
        self, workers: tuple[int, ...], segments: tuple[tuple[int, int], ...]
    ) -> float:
        cuts = tuple(a for a, _ in segments[1:])
        return self.spec.memory_bytes(Allocation(workers=workers, cuts=cuts))

    def works(self, segments: tuple[tuple[int, int], ...], slowdown: float = 1.0) -> list[SpecWork]:
        return spec_works(self.spec, segments, self.rows, slowdown)

    @property
    def block_s(self) -> float:
        """Seconds the slowest stage takes over one block (a window should hold several)."""
        return self.rows * max(s.cost_us_per_row for s in self.spec.stages) / 1e6

    def items(self) -> int:
        """Blocks for ``horizon_s`` at the bound, and at least 8 per logical CPU (a pool is
        ready once each of its workers has finished a block, and blocks of slow stages are
        few per second)."""
        bound = lp_bound(self.spec).throughput_rows_per_s
        want = max(8 * self.spec.cores, math.ceil(bound * self.horizon_s / self.rows))
        return min(MAX_ITEMS, want)

    def consume(self, block: Block) -> int:
        n = rows_of(block)
        if self.spec.consumer_us_per_row:
            time.sleep(self.spec.consumer_us_per_row * n / 1e6)
        return n
