"""First in, first out, non-preemptive: the classic YARN-style queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from recperf.cluster.base import SCHEDULERS, Decision, SchedulerView
from recperf.cluster.jobs import JobTable
from recperf.cluster.topology import Cluster


@dataclass(kw_only=True, slots=True, frozen=True)
class FifoConfig:
    """Options of the FIFO scheduler."""

    backfill: bool = False
    """Let later jobs start when the head of the queue does not fit (False: strict order)."""


@SCHEDULERS.register("fifo")
class Fifo:
    """Jobs start in arrival order; a job that does not fit blocks those behind it."""

    name: ClassVar[str] = "fifo"
    preemptive: ClassVar[bool] = False
    Config = FifoConfig

    def __init__(self, config: FifoConfig | None = None) -> None:
        self.config = config or FifoConfig()

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        pass

    def schedule(self, view: SchedulerView) -> Decision:
        return Decision(order=view.active[~view.running], blocking=not self.config.backfill)
