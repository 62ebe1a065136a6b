"""Strict consolidation: FIFO, but a job waits until it fits in the smallest span possible."""

from __future__ import annotations

from typing import ClassVar

from recperf.cluster.base import SCHEDULERS, Decision, SchedulerView
from recperf.cluster.jobs import JobTable
from recperf.cluster.topology import Cluster


@SCHEDULERS.register("consolidate")
class Consolidate:
    """One machine if the job fits in a machine, one rack if it fits in a rack; never wider.
    Jobs that cannot get their tight placement yet let later jobs go ahead."""

    name: ClassVar[str] = "consolidate"
    preemptive: ClassVar[bool] = False

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        self._min_level = cluster.min_levels(jobs.gpus)

    def schedule(self, view: SchedulerView) -> Decision:
        order = view.active[~view.running]
        return Decision(order=order, max_level=self._min_level[order])
