"""Any CSV of jobs by a column mapping (``--format csv --columns arrival=submit,...``), and the
column reader that the fixed-schema CSV formats (ITP) share with it."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np

from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.jobs import JobTable
from recperf.cluster.limits import MAX_TRACE_S
from recperf.cluster.topology import Cluster
from recperf.cluster.traces.common import (
    Line,
    arrival_times,
    csv_errors,
    from_durations,
    number,
    read_trace,
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
class CsvConfig:
    """Which columns of a CSV file hold what, and in which units."""

    columns: str = ""
    """KEY=COLUMN pairs: arrival, duration, gpus (required), model, user, id (optional), e.g.
    'arrival=submit,duration=runtime,gpus=num_gpus'; empty: columns named like the keys."""
    time_format: str = ""
    """strptime format of the arrival column (e.g. '%d/%m/%Y %H:%M'); empty: seconds, or ISO
    date-times ('2020-03-31 20:00:34') recognised as such."""
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
    """The mapped columns of a CSV file: per key, its header name and its cells."""

    path: Path
    header: dict[str, str]
    """Key -> the column's name in the file (errors name the file's field)."""
    cells: dict[str, list[Cell]] = field(default_factory=dict)


def read_columns(path: Path, text: str, mapping: dict[str, str] | None) -> Columns:
    """Read the mapped columns (every field trimmed of spaces). A mapped column the header lacks
    is one error listing the header's columns; so is a row too short to hold one."""
    reader = csv.reader(io.StringIO(text, newline=""))
    with csv_errors(path, reader):
        header = [h.strip() for h in next(reader, [])]
        if header:  # a byte-order mark, as spreadsheet programs write
            header[0] = header[0].removeprefix("\ufeff").strip()
        if not header:
            return Columns(path, {})
        if mapping is None:  # columns named like the keys
            mapping = {k: k for k in REQUIRED} | {k: k for k in OPTIONAL if k in header}
        index = {name: i for i, name in reversed(list(enumerate(header)))}
        for key, column in mapping.items():
            if column not in index:
                why = f"is not a column (for {key}); the header has: {', '.join(header)}"
                raise TraceFormatError(path, 1, column, why)
        cols = Columns(path, dict(mapping), {k: [] for k in mapping})
        need = max(index[c] for c in mapping.values())
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            line = reader.line_num
            if len(row) <= need:
                why = f"has {len(row)} fields; the header has {len(header)}"
                raise TraceFormatError(path, line, None, why)
            for key, column in mapping.items():
                cols.cells[key].append((line, row[index[column]].strip()))
        return cols


def jobs_from_columns(
    cols: Columns,
    cluster: Cluster,
    *,
    time_format: str = "",
    duration_unit: str = "s",
    dates: bool = True,
) -> JobTable:
    """Jobs from mapped columns: rows with 0 GPUs are skipped and counted (``cpu_only_skipped``);
    without an id column a job is named ``FILE-LINE``; ``dates=False``: arrivals in seconds only."""
    path, col = cols.path, cols.header
    if not col:
        return from_durations(cluster, name=[], model=[], arrival_s=[], gpus=[], duration_s=[])
    factor = UNITS[duration_unit]
    keep: list[int] = []
    gpus: list[int] = []
    for i, (line, raw) in enumerate(cols.cells["gpus"]):
        g = number(path, line, col["gpus"], raw, positive=False)
        if g != int(g):
            raise TraceFormatError(path, line, col["gpus"], f"must be a whole number, got {raw!r}")
        if g > 0:
            keep.append(i)
            gpus.append(int(g))

    def kept(key: str) -> list[Cell]:
        return [cols.cells[key][i] for i in keep]

    limit = MAX_TRACE_S / factor
    unit = f" {duration_unit} (10 years)"
    dur = [
        factor * number(path, ln, col["duration"], raw, positive=True, limit=limit, unit=unit)
        for ln, raw in kept("duration")
    ]
    arrival = arrival_times(path, col["arrival"], kept("arrival"), time_format, dates=dates)
    if "id" in col:
        unique_ids(path, col["id"], kept("id"))
        names = [raw for _, raw in kept("id")]
    else:
        names = [f"{path.stem}-{line}" for line, _ in kept("arrival")]
    models = [raw or "unknown" for _, raw in kept("model")] if "model" in col else None
    skipped = len(cols.cells["gpus"]) - len(keep)
    return from_durations(
        cluster,
        name=names,
        model=models or ["unknown"] * len(keep),
        arrival_s=arrival,
        gpus=gpus,
        duration_s=dur,
        user=[raw for _, raw in kept("user")] if "user" in col else None,
        trace_notes={"cpu_only_skipped": skipped} if skipped else None,
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
            cols, cluster, time_format=cfg.time_format, duration_unit=cfg.duration_unit
        )
