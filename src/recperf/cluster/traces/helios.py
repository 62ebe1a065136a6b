"""Helios (SenseTime) jobs in the Lucid JSON schema, as published or re-timed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.jobs import JobTable
from recperf.cluster.topology import Cluster
from recperf.cluster.traces.common import (
    Line,
    arrival_times,
    from_durations,
    integer,
    json_records,
    read_trace,
    seconds,
    unique_ids,
)
from recperf.core.errors import TraceFormatError

SLOWDOWNS = {
    "cross_machine_slowdown": "measured_slowdown",
    "cross_rack_slowdown": "measured_cross_rack",
}
"""The record's speed factors and the JobTable column each becomes (as 1 / factor)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class HeliosConfig:
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
        time_field = time_field or "submit_time"
        cols: dict[str, list[Any]] = {k: [] for k in ("name", "model", "user", "gpus", "dur")}
        times: list[tuple[Line, object]] = []
        ids: list[tuple[Line, str]] = []
        factors: dict[str, list[float]] = {f: [] for f in SLOWDOWNS}
        for rec, line in records:
            for field in ("max_parallelism", time_field, "duration", "model"):
                if field not in rec:
                    other = " (and no 'arrival_time')" if field == "submit_time" else ""
                    raise TraceFormatError(path, line, field, f"is missing{other}")
            cols["gpus"].append(integer(path, line, "max_parallelism", rec["max_parallelism"]))
            times.append((line, rec[time_field]))
            cols["dur"].append(seconds(path, line, "duration", rec["duration"], positive=True))
            if "job_id" in rec:
                ids.append((line, str(rec["job_id"])))
            cols["name"].append(str(rec.get("job_id", len(cols["name"]))))
            cols["model"].append(str(rec["model"]))
            cols["user"].append(str(rec.get("user", "")))
            for f in SLOWDOWNS:
                factors[f].append(_factor(path, line, f, rec.get(f)))
        unique_ids(path, "job_id", ids)
        measured: dict[str, Any] = {}
        if self.config.slowdowns == "trace" or (
            self.config.slowdowns == "auto" and not _one_default(factors)
        ):
            measured = {col: 1.0 / np.asarray(factors[f]) for f, col in SLOWDOWNS.items()}
        return from_durations(
            cluster,
            name=cols["name"],
            model=cols["model"],
            arrival_s=arrival_times(path, time_field, times),
            gpus=cols["gpus"],
            duration_s=cols["dur"],
            user=cols["user"],
            **measured,
        )


def _factor(path: Path, line: Line, field: str, raw: object) -> float:
    """A speed factor in (0, 1]; NaN (unknown) when the record lacks it or holds "" / NA."""
    if raw is None or str(raw).strip() in ("", "NA", "nan"):
        return float("nan")
    try:
        value = float(str(raw))
    except ValueError:
        raise TraceFormatError(path, line, field, f"not a number: {raw!r}") from None
    if not 0 < value <= 1:
        why = f"must be a speed factor in (0, 1] (spread rate / consolidated), got {raw!r}"
        raise TraceFormatError(path, line, field, why)
    return value


def _one_default(factors: dict[str, list[float]]) -> bool:
    """Whether every job carries the same factors (or none): a schema default, no measurement."""
    return all(len(set(np.nan_to_num(v, nan=-1.0).tolist())) <= 1 for v in factors.values())
