"""Philly jobs with their scheduling attempts (``jobs_pass_ge4gpu.json``, a filtered subset of
the raw ``cluster_job_log``): ``submitted_time``, ``num_gpus`` and per-attempt start/end times."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np

from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.jobs import JobTable
from recperf.cluster.limits import MAX_TRACE_S
from recperf.cluster.topology import Cluster
from recperf.cluster.traces.common import (
    Arrivals,
    Line,
    RowError,
    RowFilter,
    TraceConfig,
    from_durations,
    integer,
    json_records,
    read_trace,
    timestamp,
    unique_ids,
)


@dataclass(kw_only=True, slots=True, frozen=True)
class PhillyRawConfig(TraceConfig):
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
        arrivals = Arrivals(path, "submitted_time")
        rows = RowFilter(self.config.drop_invalid)
        jobs = [
            job
            for rec, line in json_records(path, text)
            if (job := rows.keep(self._parse, path, line, rec, arrivals)) is not None
        ]
        unique_ids(path, "id", [(j.line, j.name) for j in jobs])
        return from_durations(
            cluster,
            name=[j.name for j in jobs],
            model=["unknown"] * len(jobs),
            arrival_s=arrivals.rebase([j.arrival for j in jobs], [(j.line, j.raw) for j in jobs]),
            gpus=[j.gpus for j in jobs],
            duration_s=[j.duration_s for j in jobs],
            dropped_invalid=rows.dropped,
        )

    def _parse(self, path: Path, line: Line, rec: Mapping[str, Any], arrivals: Arrivals) -> _Job:
        for field in ("id", "num_gpus", "submitted_time", "attempts"):
            if field not in rec:
                raise RowError(path, line, field, "is missing", f"{field} missing")
        return _Job(
            line=line,
            name=str(rec["id"]),
            gpus=integer(path, line, "num_gpus", rec["num_gpus"]),
            duration_s=self._duration(path, line, rec["attempts"]),
            arrival=arrivals.parse(line, rec["submitted_time"]),
            raw=rec["submitted_time"],
        )

    def _duration(self, path: Path, line: Line, attempts: object) -> float:
        if not isinstance(attempts, list) or not attempts:
            why = "must be a non-empty list"
            raise RowError(path, line, "attempts", why, "attempts not a non-empty list")
        spans: list[tuple[float, float]] = []
        for attempt in attempts:
            if not isinstance(attempt, Mapping):
                why = "an attempt is not an object"
                raise RowError(path, line, "attempts", why, "attempts not objects")
            start, end = (_time(path, line, attempt, f) for f in ("start_time", "end_time"))
            if end < start:
                why = f"{attempt['end_time']!r} is before start_time {attempt['start_time']!r}"
                raise RowError(path, line, "end_time", why, "end_time before start_time")
            spans.append((start, end))
        if self.config.duration == "span":
            total = spans[-1][1] - spans[0][0]
        elif self.config.duration == "last":
            total = spans[-1][1] - spans[-1][0]
        else:
            total = sum(end - start for start, end in spans)
        if not 0 < total <= MAX_TRACE_S:
            why = f"give a run time of {total:g} s; it must be > 0 and at most 10 years"
            reason = "attempts' run time <= 0" if total <= 0 else "attempts' run time too large"
            raise RowError(path, line, "attempts", why, reason)
        return total


class _Job(NamedTuple):
    line: Line
    name: str
    gpus: int
    duration_s: float
    arrival: float
    raw: object


def _time(path: Path, line: Line, attempt: Mapping[str, Any], field: str) -> float:
    if field not in attempt:
        why = "is missing from an attempt"
        raise RowError(path, line, field, why, f"{field} missing from an attempt")
    return timestamp(path, line, field, attempt[field])
