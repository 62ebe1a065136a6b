"""Any CSV of jobs by a column mapping (``--format csv --columns arrival=submit,...``), and the
column reader that the fixed-schema CSV formats (ITP) share with it."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal, NamedTuple

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
    csv_errors,
    from_durations,
    number,
    read_trace,
    too_many_fields,
    unique_ids,
)
from recperf.core.errors import ConfigError, TraceFormatError

REQUIRED = ("arrival", "duration", "gpus")
OPTIONAL = ("model", "user", "id")
UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
Cell = tuple[Line, str]
"""A field's line and its text (spaces trimmed)."""


def parse_columns(spec: str) -> dict[str, str] | None:
    """``key=column`` pairs -> {key: column}; None for an empty spec (columns named as the keys).
    A missing required key, an unknown or repeated key or an empty column is a ConfigError."""
    if not spec.strip():
        return None
    keys = f"required keys: {', '.join(REQUIRED)} (optional: {', '.join(OPTIONAL)})"
    out: dict[str, str] = {}
    for pair in spec.split(","):
        key, sep, column = (part.strip() for part in pair.partition("="))
        if not sep or not key or not column:
            raise ConfigError(f"columns: expected KEY=COLUMN, got {pair.strip()!r}; {keys}")
        if key not in (*REQUIRED, *OPTIONAL):
            raise ConfigError(f"columns: unknown key {key!r}; {keys}")
        if key in out:
            raise ConfigError(f"columns: key {key!r} is mapped twice")
        out[key] = column
    missing = [k for k in REQUIRED if k not in out]
    if missing:
        raise ConfigError(f"columns = {spec!r} maps no {missing[0]!r}; {keys}")
    return out


@dataclass(kw_only=True, slots=True, frozen=True)
class CsvConfig(TraceConfig):
    """Which columns of a CSV file hold what, and in which units."""

    columns: str = ""
    """KEY=COLUMN pairs: arrival, duration, gpus (required), model, user, id (optional), e.g.
    'arrival=submit,duration=runtime,gpus=num_gpus'; empty: columns named like the keys."""
    time_format: str = ""
    """strptime format of the arrival column (e.g. '%d/%m/%Y %H:%M'); empty: seconds (Unix-epoch
    seconds where they reach past 10 years), or ISO date-times ('2020-03-31 20:00:34')
    recognised as such."""
    duration_unit: Literal["s", "min", "h"] = "s"
    """Unit of the duration column."""

    def __post_init__(self) -> None:
        parse_columns(self.columns)
        if self.time_format and "%" not in self.time_format:
            raise ConfigError(
                f"time_format = {self.time_format!r}: expected strptime codes like '%d/%m/%Y %H:%M'"
            )


@dataclass(frozen=True, slots=True)
class Columns:
    """The mapped columns of a CSV file: per key, its header name and its place in a row."""

    path: Path
    header: dict[str, str]
    """Key -> the column's name in the file (errors name the file's field)."""
    index: dict[str, int] = field(default_factory=dict)
    """Key -> the column's place in a row."""
    width: int = 0
    """How many fields the header has."""
    rows: list[tuple[int, list[str]]] = field(default_factory=list)
    """The rows that are not blank, each with its line."""


def read_columns(path: Path, text: str, mapping: dict[str, str] | None) -> Columns:
    """The header's mapped columns and the rows that are not blank. A mapped column the header
    lacks is one error listing the header's columns."""
    reader = csv.reader(io.StringIO(text, newline=""))
    with csv_errors(path, reader):
        header = [h.strip() for h in next(reader, [])]
        if not header:
            return Columns(path, {})
        if mapping is None:  # columns named like the keys
            mapping = {k: k for k in REQUIRED} | {k: k for k in OPTIONAL if k in header}
        index = {name: i for i, name in reversed(list(enumerate(header)))}
        for key, column in mapping.items():
            if column not in index:
                why = f"is not a column (for {key}); the header has: {', '.join(header)}"
                raise TraceFormatError(path, 1, column, why)
        rows = [(reader.line_num, row) for row in reader if any(cell.strip() for cell in row)]
    where = {key: index[column] for key, column in mapping.items()}
    return Columns(path, dict(mapping), where, len(header), rows)


class _Job(NamedTuple):
    line: int
    gpus: int
    duration_s: float
    arrival: float
    cells: dict[str, str]


def _parse_row(
    cols: Columns, line: int, row: list[str], arrivals: Arrivals, duration_unit: str
) -> _Job:
    """One row's job (``gpus`` 0: a CPU-only row, its other fields unread); a row that cannot
    be simulated raises a RowError."""
    path, col = cols.path, cols.header
    if len(row) > cols.width:
        raise too_many_fields(path, line, len(row), cols.width)
    if len(row) <= max(cols.index.values()):
        why = f"has {len(row)} fields; the header has {cols.width}"
        raise RowError(path, line, None, why, "too few fields")
    cells = {key: row[i].strip() for key, i in cols.index.items()}
    g = number(path, line, col["gpus"], cells["gpus"], positive=False)
    if g != int(g):
        why = f"must be a whole number, got {cells['gpus']!r}"
        raise RowError(path, line, col["gpus"], why, f"{col['gpus']} not a whole number")
    if g == 0:
        return _Job(line, 0, 0.0, 0.0, cells)
    factor = UNITS[duration_unit]
    unit = f" {duration_unit} (10 years)"
    raw = cells["duration"]
    dur = number(
        path, line, col["duration"], raw, positive=True, limit=MAX_TRACE_S / factor, unit=unit
    )
    return _Job(line, int(g), factor * dur, arrivals.parse(line, cells["arrival"]), cells)


def jobs_from_columns(
    cols: Columns,
    cluster: Cluster,
    *,
    time_format: str = "",
    duration_unit: str = "s",
    dates: bool = True,
    drop_invalid: bool = False,
) -> JobTable:
    """Jobs from mapped columns: rows with 0 GPUs are skipped and counted (``cpu_only_skipped``);
    rows that cannot be simulated fail, or with ``drop_invalid`` are dropped and counted; without
    an id column a job is named ``FILE-LINE``; ``dates=False``: arrivals in seconds only."""
    path, col = cols.path, cols.header
    if not col:
        return from_durations(cluster, name=[], model=[], arrival_s=[], gpus=[], duration_s=[])
    rows = RowFilter(drop_invalid)
    arrivals = Arrivals(path, col["arrival"], time_format, dates=dates)
    jobs: list[_Job] = []
    skipped = 0
    for line, row in cols.rows:
        job = rows.keep(_parse_row, cols, line, row, arrivals, duration_unit)
        if job is not None and job.gpus == 0:
            skipped += 1
        elif job is not None:
            jobs.append(job)
    if "id" in col:
        unique_ids(path, col["id"], [(j.line, j.cells["id"]) for j in jobs])
    names = [j.cells["id"] if "id" in col else f"{path.stem}-{j.line}" for j in jobs]
    return from_durations(
        cluster,
        name=names,
        model=[j.cells.get("model") or "unknown" for j in jobs],
        arrival_s=arrivals.rebase(
            [j.arrival for j in jobs], [(j.line, j.cells["arrival"]) for j in jobs]
        ),
        gpus=[j.gpus for j in jobs],
        duration_s=[j.duration_s for j in jobs],
        user=[j.cells["user"] for j in jobs] if "user" in col else None,
        trace_notes={"cpu_only_skipped": skipped} if skipped else None,
        dropped_invalid=rows.dropped,
    )


@TRACE_LOADERS.register("csv")
class CsvTrace:
    """Any CSV of jobs: ``columns`` maps arrival, duration and GPUs (and optionally model, user
    and id) to the file's column names. Durations are run times at the tightest placement."""

    name: ClassVar[str] = "csv"
    default_cluster: ClassVar[str] = "synthetic-1024"
    Config = CsvConfig

    def __init__(self, config: CsvConfig | None = None) -> None:
        self.config = config or CsvConfig()

    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable:
        cfg = self.config
        path, text = read_trace(source, "csv/itp-cluster10.csv")
        cols = read_columns(path, text, parse_columns(cfg.columns))
        return jobs_from_columns(
            cols,
            cluster,
            time_format=cfg.time_format,
            duration_unit=cfg.duration_unit,
            drop_invalid=cfg.drop_invalid,
        )
