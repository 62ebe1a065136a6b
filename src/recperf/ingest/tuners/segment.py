"""``SegmentTarget``: a target's chain cut at fixed cuts, seen as a chain whose stages are the
segments, so that a tuner written for per-stage worker counts (the intune DQN) tunes the workers
of fused segments; and ``lift``, which turns its log back into a result on the real target."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from recperf.core.errors import ConfigError, ContractError
from recperf.ingest.base import Allocation, Measurement, Target, segment_caps
from recperf.ingest.tuners.base import TuneLog, TuneResult
from recperf.ingest.tuners.model import inflight_options, thread_options


class SegmentTarget:
    """A ``Target`` over ``target`` cut at ``cuts`` (None: every stage its own segment) whose
    stages are the segments: a segment's name joins its stages' (``read+dense``), its cap is its
    stages' least, its per-row cost the sum of its stages' measured costs plus the measured
    hand-off (so the view reports a hand-off of 0), its busy fraction and queue fill those of
    its first stage. Allocations of the view (one worker count per segment; cuts of the view
    fuse segments further) map to the target's by ``base``; memory and measurements are the
    target's."""

    def __init__(self, target: Target, cuts: Sequence[int] | None) -> None:
        n = len(target.stage_names)
        probe = Allocation(workers=(1,) * (n if cuts is None else len(cuts) + 1),
                           cuts=None if cuts is None else tuple(cuts))  # fmt: skip
        self.target = target
        self.cuts = probe.normalized(n).cuts
        self.points = probe.cut_points(n)
        self.segments = probe.segments(n)
        names = target.stage_names
        self._names = tuple("+".join(names[a:b]) for a, b in self.segments)
        self._caps = segment_caps(target.max_workers, self.segments)

    @property
    def stage_names(self) -> tuple[str, ...]:
        return self._names

    @property
    def cores(self) -> int:
        return self.target.cores

    @property
    def max_workers(self) -> tuple[int | None, ...]:
        return self._caps

    @property
    def thread_options(self) -> tuple[int, ...]:
        return thread_options(self.target)

    @property
    def inflight_options(self) -> tuple[int, ...]:
        return inflight_options(self.target)

    @property
    def memory_budget_bytes(self) -> float:
        return self.target.memory_budget_bytes

    def elapsed_s(self) -> float:
        return self.target.elapsed_s()

    def base(self, alloc: Allocation) -> Allocation:
        """The target's allocation (normalized) for an allocation of this view."""
        k = len(self.segments)
        view_cuts = alloc.cut_points(k)
        if len(alloc.workers) != len(view_cuts) + 1:
            raise ConfigError(
                f"allocation has {len(alloc.workers)} worker counts for {len(view_cuts) + 1} "
                f"segments of the view"
            )
        cuts = tuple(self.points[c - 1] for c in view_cuts)
        return Allocation(workers=alloc.workers, cuts=cuts).normalized(len(self.target.stage_names))

    def view(self, alloc: Allocation) -> Allocation:
        """This view's allocation for a target allocation cut exactly at this view's cuts."""
        n = len(self.target.stage_names)
        if alloc.cut_points(n) != self.points:
            raise ConfigError(f"allocation cut at {list(alloc.cut_points(n))}, not at the view's")
        return Allocation(workers=alloc.workers)

    def memory_bytes(self, alloc: Allocation) -> float:
        return self.target.memory_bytes(self.base(alloc))

    def measure(self, alloc: Allocation, window_s: float) -> Measurement:
        """Measure on the target (AllocationRefused passes through) and fold per segment."""
        return self.fold(self.target.measure(self.base(alloc), window_s), alloc)

    def fold(self, m: Measurement, alloc: Allocation | None = None) -> Measurement:
        """A target measurement of an allocation at this view's cuts, one entry per segment
        (``alloc``: the view's allocation it measured, default ``view(m.allocation)``)."""
        handoff = m.handoff_us_per_row if math.isfinite(m.handoff_us_per_row) else 0.0
        rows = m.throughput_rows_per_s * m.window_s
        segs = self.segments
        return dataclasses.replace(
            m,
            allocation=self.view(m.allocation) if alloc is None else alloc,
            stage_rows_per_s=tuple(m.stage_rows_per_s[b - 1] for _, b in segs),
            busy_frac=tuple(m.busy_frac[a] for a, _ in segs),
            queue_fill=tuple(m.queue_fill[a] for a, _ in segs),
            cpu_s=tuple(sum(m.cpu_s[a:b]) + handoff * rows / 1e6 for a, b in segs),
            cost_us_per_row=tuple(sum(m.cost_us_per_row[a:b]) + handoff for a, b in segs),
            handoff_us_per_row=0.0,
        )


def lift(
    tuner: str, view: SegmentTarget, before: TuneLog, after: TuneLog, chosen: Allocation
) -> TuneResult:
    """One TuneResult on the real target from the log ``before`` (on it) and the log ``after``
    (on ``view``, taken later), choosing the view's allocation ``chosen``."""
    steps = list(before.history)
    steps += [dataclasses.replace(s, allocation=view.base(s.allocation)) for s in after.history]
    alloc = view.base(chosen)
    last = [s for s in steps if s.allocation == alloc]
    if not last:
        raise ContractError(f"tuner {tuner!r}: chose an allocation it never measured")
    return TuneResult(
        tuner=tuner,
        allocation=alloc,
        throughput_rows_per_s=last[-1].throughput_rows_per_s,
        history=tuple(steps),
        refused=before.refused + after.refused,
        tuning_s=before.spent_s(),
    )
