"""Philly jobs with their scheduling attempts (``jobs_pass_ge4gpu.json``, a filtered subset of
the raw ``cluster_job_log``): ``submitted_time``, ``num_gpus`` and per-attempt start/end times."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.jobs import JobTable
from recperf.cluster.limits import MAX_TRACE_S
from recperf.cluster.topology import Cluster
from recperf.cluster.traces.common import (
    Line,
    arrival_times,
    from_durations,
    integer,
    json_records,
    read_trace,
    timestamp,
    unique_ids,
)
from recperf.core.errors import TraceFormatError


@dataclass(kw_only=True, slots=True, frozen=True)
class PhillyRawConfig:
    """How a job's attempts become its run time."""

    duration: Literal["attempts", "span", "last"] = "attempts"
    """attempts: the sum of its attempts' lengths (the time it held GPUs in Philly); span: first
    attempt's start to last attempt's end, gaps included (the release's ``runtime``); last: the
    final attempt only (as if earlier attempts were lost work)."""


@TRACE_LOADERS.register("philly-raw")
class PhillyRawTrace:
    """A job arrives at ``submitted_time`` and needs ``num_gpus`` (its first attempt's GPUs)
    for a run time made from its ``attempts`` (``duration``: their sum by default, which leaves
    out the gaps it spent re-queued). Times are ``YYYY-MM-DD HH:MM:SS`` without a zone (Philly's
    local time, most likely US Pacific): differences are taken as wall-clock, so an attempt
    across the 2017-11-05 daylight-saving change is off by an hour. The subset has no model:
    jobs get the default model's gradient size."""

    name: ClassVar[str] = "philly-raw"
    default_cluster: ClassVar[str] = "philly-raw-tenth"
    Config = PhillyRawConfig

    def __init__(self, config: PhillyRawConfig | None = None) -> None:
        self.config = config or PhillyRawConfig()

    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable:
        path, text = read_trace(source, "philly-raw/jobs_pass_ge4gpu-every10.json")
        names: list[str] = []
        gpus: list[int] = []
        durations: list[float] = []
        submitted: list[tuple[Line, object]] = []
        ids: list[tuple[Line, str]] = []
        for rec, line in json_records(path, text):
            for field in ("id", "num_gpus", "submitted_time", "attempts"):
                if field not in rec:
                    raise TraceFormatError(path, line, field, "is missing")
            ids.append((line, str(rec["id"])))
            names.append(str(rec["id"]))
            gpus.append(integer(path, line, "num_gpus", rec["num_gpus"]))
            submitted.append((line, rec["submitted_time"]))
            durations.append(self._duration(path, line, rec["attempts"]))
        unique_ids(path, "id", ids)
        return from_durations(
            cluster,
            name=names,
            model=["unknown"] * len(names),
            arrival_s=arrival_times(path, "submitted_time", submitted),
            gpus=gpus,
            duration_s=durations,
        )

    def _duration(self, path: Path, line: Line, attempts: object) -> float:
        if not isinstance(attempts, list) or not attempts:
            raise TraceFormatError(path, line, "attempts", "must be a non-empty list")
        spans: list[tuple[float, float]] = []
        for attempt in attempts:
            if not isinstance(attempt, Mapping):
                raise TraceFormatError(path, line, "attempts", "an attempt is not an object")
            start, end = (_time(path, line, attempt, f) for f in ("start_time", "end_time"))
            if end < start:
                why = f"{attempt['end_time']!r} is before start_time {attempt['start_time']!r}"
                raise TraceFormatError(path, line, "end_time", why)
            spans.append((start, end))
        if self.config.duration == "span":
            total = spans[-1][1] - spans[0][0]
        elif self.config.duration == "last":
            total = spans[-1][1] - spans[-1][0]
        else:
            total = sum(end - start for start, end in spans)
        if not 0 < total <= MAX_TRACE_S:
            why = f"give a run time of {total:g} s; it must be > 0 and at most 10 years"
            raise TraceFormatError(path, line, "attempts", why)
        return total


def _time(path: Path, line: Line, attempt: Mapping[str, Any], field: str) -> float:
    if field not in attempt:
        raise TraceFormatError(path, line, field, "is missing from an attempt")
    return timestamp(path, line, field, attempt[field])
