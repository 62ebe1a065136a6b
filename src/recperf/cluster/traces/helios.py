"""Helios (SenseTime) jobs in the Lucid JSON schema, as published or re-timed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np

from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.jobs import JobTable
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
    seconds,
    unique_ids,
)

SLOWDOWNS = {
    "cross_machine_slowdown": "measured_slowdown",
    "cross_rack_slowdown": "measured_cross_rack",
}
"""The record's speed factors and the JobTable column each becomes (as 1 / factor)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class HeliosConfig(TraceConfig):
    """How Helios records become jobs."""

    slowdowns: Literal["auto", "trace", "model"] = "auto"
    """trace: a record's cross_machine/cross_rack_slowdown is the job's measured sensitivity;
    model: ignore them and estimate it from the model's gradient size; auto: trace, unless every
    job carries the same factors (a schema default, as in the bundled extract: no measurement)."""


@TRACE_LOADERS.register("helios")
class HeliosTrace:
    """GPU demand is ``max_parallelism``; ``duration`` is the run time at the tightest placement.

    Arrivals are ``arrival_time`` (seconds) when the first record has it, else ``submit_time``
    (``2020-03-31 20:00:34``, read as seconds from the earliest job's submit). The speed
    factors ``cross_machine_slowdown`` and ``cross_rack_slowdown`` (the schema's, from the Themis
    simulator: a job spread over machines / racks runs at that fraction of its consolidated
    rate) become ``measured_slowdown`` and ``measured_cross_rack`` (1 / factor). The schema's
    ``cross_slot_slowdown`` (GPUs of one machine in different PCIe/CPU slots) has no level here
    and is not read. The bundled ``sense-500.json`` holds the schema's default 0.8 / 0.7 for every
    job, not a per-job measurement, so by default (``slowdowns = "auto"``) factors that are the
    same for every job are not used; ``--set helios.slowdowns=trace`` uses them anyway and
    ``model`` ignores them always.
    """

    name: ClassVar[str] = "helios"
    default_cluster: ClassVar[str] = "helios"
    Config = HeliosConfig

    def __init__(self, config: HeliosConfig | None = None) -> None:
        self.config = config or HeliosConfig()

    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable:
        path, text = read_trace(source, "helios/sense-500.json")
        records = json_records(path, text)
        time_field = "arrival_time" if records and "arrival_time" in records[0][0] else None
        arrivals = Arrivals(path, time_field or "submit_time")
        rows = RowFilter(self.config.drop_invalid)
        jobs = [
            job
            for rec, line in records
            if (job := rows.keep(_parse_record, path, line, rec, arrivals)) is not None
        ]
        unique_ids(path, "job_id", [(j.line, j.name) for j in jobs if j.has_id])
        factors = {f: [j.factors[f] for j in jobs] for f in SLOWDOWNS}
        measured: dict[str, Any] = {}
        if self.config.slowdowns == "trace" or (
            self.config.slowdowns == "auto" and not _one_default(factors)
        ):
            measured = {col: 1.0 / np.asarray(factors[f]) for f, col in SLOWDOWNS.items()}
        return from_durations(
            cluster,
            name=[j.name if j.has_id else str(i) for i, j in enumerate(jobs)],
            model=[j.model for j in jobs],
            arrival_s=arrivals.rebase([j.arrival for j in jobs], [(j.line, j.raw) for j in jobs]),
            gpus=[j.gpus for j in jobs],
            duration_s=[j.duration_s for j in jobs],
            user=[j.user for j in jobs],
            dropped_invalid=rows.dropped,
            **measured,
        )


class _Job(NamedTuple):
    line: Line
    name: str
    has_id: bool
    model: str
    user: str
    gpus: int
    duration_s: float
    factors: dict[str, float]
    arrival: float
    raw: object


def _parse_record(path: Path, line: Line, rec: Mapping[str, Any], arrivals: Arrivals) -> _Job:
    for field in ("max_parallelism", arrivals.field, "duration", "model"):
        if field not in rec:
            other = " (and no 'arrival_time')" if field == "submit_time" else ""
            raise RowError(path, line, field, f"is missing{other}", f"{field} missing")
    return _Job(
        line=line,
        name=str(rec.get("job_id", "")),
        has_id="job_id" in rec,
        model=str(rec["model"]),
        user=str(rec.get("user", "")),
        gpus=integer(path, line, "max_parallelism", rec["max_parallelism"]),
        duration_s=seconds(path, line, "duration", rec["duration"], positive=True),
        factors={f: _factor(path, line, f, rec.get(f)) for f in SLOWDOWNS},
        arrival=arrivals.parse(line, rec[arrivals.field]),
        raw=rec[arrivals.field],
    )


def _factor(path: Path, line: Line, field: str, raw: object) -> float:
    """A speed factor in (0, 1]; NaN (unknown) when the record lacks it or holds "" / NA."""
    if raw is None or str(raw).strip() in ("", "NA", "nan"):
        return float("nan")
    try:
        value = float(str(raw))
    except ValueError:
        raise RowError(
            path, line, field, f"not a number: {raw!r}", f"{field} not a number"
        ) from None
    if not 0 < value <= 1:
        why = f"must be a speed factor in (0, 1] (spread rate / consolidated), got {raw!r}"
        raise RowError(path, line, field, why, f"{field} not in (0, 1]")
    return value


def _one_default(factors: dict[str, list[float]]) -> bool:
    """Whether every job carries the same factors (or none): a schema default, no measurement."""
    return all(len(set(np.nan_to_num(v, nan=-1.0).tolist())) <= 1 for v in factors.values())
