"""Shortest remaining time first with oracle durations, preemptive."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from recperf.cluster.base import SCHEDULERS, Decision, SchedulerView
from recperf.cluster.jobs import JobTable
from recperf.cluster.topology import Cluster


@SCHEDULERS.register("srtf")
class ShortestRemainingFirst:
    """All active jobs by remaining time; a shorter arrival preempts a longer running job.
    Running jobs win ties so that equal jobs do not swap back and forth."""

    name: ClassVar[str] = "srtf"
    preemptive: ClassVar[bool] = True

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        pass

    def schedule(self, view: SchedulerView) -> Decision:
        order = view.active[np.lexsort((view.active, ~view.running, view.remaining_s))]
        return Decision(order=order)
