"""What one Ray Data operator's worker does: the stages of one fused segment over one block.

A ``SegmentWork`` is a picklable description (stage names plus whatever the stages need);
``open()`` runs once in each Ray worker (an actor's constructor, or the first task of a worker
process) and returns the callable that turns an input block into an output block, timing each
of its stages. Blocks are Ray Data's numpy batches: a dict of equal-length column arrays.

Two kinds exist: ``raydata.spec.SpecWork`` (a simulator spec's stages as sleeps) and
``raydata.criteo.CriteoWork`` (the live pipeline's Criteo stage functions)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

Block = dict[str, np.ndarray]


@dataclass(kw_only=True, slots=True, frozen=True)
class StageTimes:
    """What one block cost each stage of a segment, in the segment's stage order."""

    rows: tuple[int, ...]
    """Rows each stage took in."""
    cpu_s: tuple[float, ...]
    """CPU seconds each stage spent (a spec stage's sleep stands for CPU work and counts)."""
    wall_s: tuple[float, ...]
    """Wall seconds each stage took, storage waits excluded."""
    rows_out: int
    """Rows the segment handed on (a block may carry a chunk of several batches as objects)."""
    handoff_s: float = 0.0
    """CPU seconds spent handing the output on, outside every stage."""


SegmentFn = Callable[[Block], tuple[Block, StageTimes]]
"""An opened segment: one input block to one output block and its stages' times."""


class SegmentWork(Protocol):
    """A picklable recipe for one segment's worker."""

    @property
    def stages(self) -> tuple[str, ...]:
        """The segment's stages, in chain order."""
        ...

    @property
    def start_s(self) -> float:
        """Seconds a new worker sleeps before its first block (0: none): a stand-in for a slow
        start (a model load) on top of the Ray worker's own."""
        ...

    def open(self) -> SegmentFn:
        """Set up this worker's state (readers, buffers) and return its block function."""
        ...


def rows_of(block: Block) -> int:
    """Rows of a block (the length of its columns; 0 for a block without columns)."""
    for v in block.values():
        return len(v)
    return 0


class RayPipeline(Protocol):
    """A chain of stages the Ray engine can run: a simulator spec's (``spec.SpecPipeline``)
    or the Criteo data's (``criteo.CriteoPipeline``)."""

    @property
    def stage_names(self) -> tuple[str, ...]: ...

    @property
    def max_workers(self) -> tuple[int | None, ...]:
        """Per-stage worker cap (None: none)."""
        ...

    @property
    def memory_budget_bytes(self) -> float: ...

    def memory_bytes(
        self, workers: tuple[int, ...], segments: tuple[tuple[int, int], ...]
    ) -> float:
        """Predicted memory of ``workers`` per segment of ``segments``, bytes."""
        ...

    def works(
        self, segments: tuple[tuple[int, int], ...], slowdown: float = 1.0
    ) -> Sequence[SegmentWork]:
        """The work of each segment ``(first, stop)`` of the chain; ``slowdown`` (>= 1) is how
        much slower each worker runs when more workers than logical CPUs share them (real work
        slows by itself and ignores it; a spec's sleeps are stretched by it)."""
        ...

    def items(self) -> int:
        """Source items of one dataset (enough for the run or window it serves)."""
        ...

    def consume(self, block: Block) -> int:
        """The trainer's side: take one output block; the rows it held."""
        ...
