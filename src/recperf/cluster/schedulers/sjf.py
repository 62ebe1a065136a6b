"""Shortest job first with oracle durations, non-preemptive."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from recperf.cluster.base import SCHEDULERS, Decision, SchedulerView
from recperf.cluster.jobs import JobTable
from recperf.cluster.topology import Cluster


@SCHEDULERS.register("sjf")
class ShortestJobFirst:
    """Waiting jobs by their whole duration (known in advance); ties by arrival."""

    name: ClassVar[str] = "sjf"
    preemptive: ClassVar[bool] = False

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        pass

    def schedule(self, view: SchedulerView) -> Decision:
        waiting = ~view.running
        ids = view.active[waiting]
        total = view.jobs.total_iters[ids] * view.ref_iter_s[waiting]
        order = ids[np.lexsort((ids, total))]
        return Decision(order=order)
