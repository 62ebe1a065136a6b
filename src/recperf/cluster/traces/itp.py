"""Microsoft ITP cluster job traces 2021 (ElasticFlow's release): one CSV per cluster with
``job_id,submission_time,duration,num_gpu`` in seconds."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np

from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.jobs import JobTable
from recperf.cluster.topology import Cluster
from recperf.cluster.traces.common import TraceConfig, read_trace
from recperf.cluster.traces.tabular import jobs_from_columns, read_columns

COLUMNS = {"id": "job_id", "arrival": "submission_time", "duration": "duration", "gpus": "num_gpu"}


@TRACE_LOADERS.register("itp")
class ItpTrace:
    """``duration`` is the job's run time, taken as its run time at the tightest placement;
    arrivals keep the release's origin (every cluster shares it, so some start days in). The
    trace names no model or user: jobs get the default model's gradient size (about a
    ResNet-50). No cluster sizes are published: the presets ``itp-cluster01`` and
    ``itp-cluster10`` are sized for the bundled files (``--cluster`` for the others)."""

    name: ClassVar[str] = "itp"
    default_cluster: ClassVar[str] = "itp-cluster01"
    Config = TraceConfig

    def __init__(self, config: TraceConfig | None = None) -> None:
        self.config = config or TraceConfig()

    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable:
        path, text = read_trace(source, "itp/cluster01.csv")
        cols = read_columns(path, text, dict(COLUMNS))
        return jobs_from_columns(cols, cluster, dates=False, drop_invalid=self.config.drop_invalid)
