"""What the engine keeps track of between decision points: the event queue, whose per-job
cancellation lets a rate change or preemption supersede a pending finish, and the open waits
for locality."""

from __future__ import annotations

import heapq
import math

import numpy as np

from recperf.cluster.base import F64, I64

FINISH, CKPT_DONE, WAKE = 0, 1, 2  # same-time events: finishes free GPUs first


class EventQueue:
    """Events ``(time, kind, job)``; ties at one time go by kind, then by push order."""

    def __init__(self, n_jobs: int) -> None:
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        # A job's events carry the version they were pushed at; bumping it cancels them all
        # lazily: they stay in the heap and are dropped when they come up.
        # A list, not an array: it is read or bumped at every push, pop and cancel.
        self._version: list[int] = [0] * n_jobs

    def next_time(self) -> float:
        """Time of the earliest event still in the queue (it may be cancelled); inf if none."""
        return self._heap[0][0] if self._heap else math.inf

    def push(self, t: float, kind: int, job: int = -1) -> None:
        """Schedule an event at ``t``; ``job = -1`` for one that concerns no job (a wake-up)."""
        self._seq += 1
        version = self._version[job] if job >= 0 else 0
        heapq.heappush(self._heap, (t, kind, self._seq, job, version))

    def cancel(self, job: int) -> None:
        """Cancel every event of ``job`` pushed so far."""
        self._version[job] += 1

    def pop_due(self, now: float) -> tuple[int, int] | None:
        """Remove and return ``(kind, job)`` of the next event at or before ``now`` that was not
        cancelled; None when there is none."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, kind, _, job, version = heapq.heappop(heap)
            if job < 0 or version == self._version[job]:
                return kind, job
        return None


class LocalityWaits:
    """Per-job time spent held back for locality: waiting while the free GPUs could take the
    job, but not within the level its scheduler allows it. Intervals open and close only at
    decision points, where the engine knows which jobs are held."""

    def __init__(self, n_jobs: int) -> None:
        self.total_s: F64 = np.zeros(n_jobs)
        """Seconds each job has been held back, over its closed intervals."""
        self._since: F64 = np.full(n_jobs, np.nan)
        self._held: I64 = np.zeros(0, dtype=np.int64)

    def update(self, held: I64, now: float) -> None:
        """``held`` (unique job ids) are the jobs held back as of ``now``: close the intervals
        of jobs no longer among them, and open one for each job newly among them."""
        prev = self._held
        if not prev.size and not held.size:
            return
        closed = np.setdiff1d(prev, held, assume_unique=True)
        opened = np.setdiff1d(held, prev, assume_unique=True)
        self.total_s[closed] += now - self._since[closed]
        self._since[closed] = np.nan
        self._since[opened] = now
        self._held = np.sort(held)
