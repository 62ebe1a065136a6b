"""A sweep's progress: runs done of the total, and the time left, estimated from the finished
runs' wall times per trace and scheduler (their costs differ by orders of magnitude: a FIFO run
is over before a NetSens run has placed its first jobs), over the workers that run the rest."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

from recperf.cluster.sweep_backends import SweepRun
from recperf.core.progress import Count, CountFn, ProgressFn

Group = tuple[str, ...]


class SweepTally:
    """Counts finished runs (``kept``: those a resumed sweep found, with their wall times) and
    reports each one to ``progress`` (the fraction done) and ``counts`` (done, left, ETA)."""

    def __init__(
        self,
        runs: Sequence[SweepRun],
        kept: Mapping[int, float | None],
        workers: int,
        progress: ProgressFn | None = None,
        counts: CountFn | None = None,
    ) -> None:
        self.groups: list[Group] = [(r.trace, r.scheduler) for r in runs]
        self.total, self.done, self.workers = len(runs), 0, workers
        self.left = Counter(self.groups)
        self.walls: dict[Group, tuple[float, int]] = {}
        self.progress, self.counts = progress, counts
        for i, wall_s in kept.items():
            self._count(i, wall_s)

    def start(self) -> None:
        """The runs begin (every check passed)."""
        self._report()

    def finished(self, i: int, wall_s: float | None) -> None:
        """Run ``i`` (an index into the sweep's runs) finished after ``wall_s`` seconds."""
        self._count(i, wall_s)
        self._report()

    def eta_s(self) -> float | None:
        """Seconds left: each unfinished run costs the mean wall time of the finished runs of
        its trace and scheduler (else of its trace, else of all), shared by the workers; None
        before any run has finished."""
        left = self.total - self.done
        if left == 0:
            return 0.0
        work = 0.0
        for group, n in self.left.items():
            mean = self._mean(group)
            if n and mean is None:
                return None
            work += n * (mean or 0.0)
        return work / min(self.workers, left)

    def _count(self, i: int, wall_s: float | None) -> None:
        self.done += 1
        group = self.groups[i]
        self.left[group] -= 1
        if wall_s is None or not math.isfinite(wall_s):  # a failed run without a wall time
            return
        for level in (group, group[:1], ()):
            total, n = self.walls.get(level, (0.0, 0))
            self.walls[level] = (total + wall_s, n + 1)

    def partial(self) -> bool:
        """Whether runs are left of a trace and scheduler none of whose runs has finished."""
        return any(n and group not in self.walls for group, n in self.left.items())

    def _mean(self, group: Group) -> float | None:
        for level in (group, group[:1], ()):
            total, n = self.walls.get(level, (0.0, 0))
            if n:
                return total / n
        return None

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(self.done / self.total)
        if self.counts is not None:
            self.counts(Count(self.done, self.total, self.eta_s(), self.partial()))
