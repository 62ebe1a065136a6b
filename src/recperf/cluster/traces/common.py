"""What the trace loaders share: reading the file (a given path or the bundled default) with one
error naming it, parsing numeric, time and id fields, and building a job table from durations."""

from __future__ import annotations

import contextlib
import csv
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from recperf.cluster.jobs import JobTable
from recperf.cluster.limits import MAX_COUNT, MAX_TRACE_S
from recperf.cluster.models import grad_bytes_for, iter_s_for
from recperf.cluster.network import calibrate_reference
from recperf.cluster.topologies import bundled as bundled  # re-exported for the loaders
from recperf.cluster.topology import Cluster
from recperf.core.errors import RecperfError, TraceFormatError

Line = int | None
"""A 1-based line number, or None where unknown."""


def number(
    path: Path,
    line: int | None,
    field: str,
    raw: object,
    *,
    positive: bool,
    limit: float = MAX_COUNT,
    unit: str = "",
) -> float:
    """Parse one numeric field: finite, > 0 (``positive``) or >= 0, and at most ``limit`` (a
    bound on absurd values: 1e12 for counts), raising a TraceFormatError that names file, line
    and field."""
    try:
        value = float(str(raw))
    except ValueError:
        raise TraceFormatError(path, line, field, f"not a number: {raw!r}") from None
    if not math.isfinite(value) or (value <= 0 if positive else value < 0) or value > limit:
        bound = "> 0" if positive else ">= 0"
        why = f"must be {bound} and at most {limit:g}{unit}, got {raw!r}"
        raise TraceFormatError(path, line, field, why)
    return value


def seconds(path: Path, line: int | None, field: str, raw: object, *, positive: bool) -> float:
    """A time in seconds (an arrival or a duration): at most 10 years, so that sums of them and
    the utilisation stay finite."""
    return number(
        path, line, field, raw, positive=positive, limit=MAX_TRACE_S, unit=" s (10 years)"
    )


def integer(path: Path, line: int | None, field: str, raw: object) -> int:
    """A positive whole number (``4`` or ``4.0``), at most 1e12."""
    value = number(path, line, field, raw, positive=True)
    if value != int(value):
        raise TraceFormatError(path, line, field, f"must be a whole number, got {raw!r}")
    return int(value)


def timestamp(path: Path, line: Line, field: str, raw: object, time_format: str = "") -> float:
    """A date-time as POSIX seconds: ISO 8601 (``2020-03-31 20:00:34``, with ``T``, fractions or
    a zone), or ``time_format`` (strptime's codes) when given. A time without a zone is read as
    UTC: wall-clock differences, so a daylight-saving change in the trace's zone shifts by 1 h."""
    text = str(raw).strip()
    try:
        when = datetime.strptime(text, time_format) if time_format else datetime.fromisoformat(text)
    except ValueError:
        want = f"a time like {time_format!r}" if time_format else "an ISO date-time"
        example = "" if time_format else " (2020-03-31 20:00:34)"
        raise TraceFormatError(path, line, field, f"not {want}{example}: {raw!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def arrival_times(
    path: Path,
    field: str,
    values: Sequence[tuple[Line, object]],
    time_format: str = "",
    *,
    dates: bool = True,
) -> NDArray[np.float64]:
    """Arrival times from one column: seconds as given, or date-times (ISO, or ``time_format``)
    as seconds from the earliest. The first value decides which; a column mixing the two is an
    error naming the first value of the other kind. ``dates=False``: seconds only."""
    if not values:
        return np.zeros(0)
    as_dates = bool(time_format) or (dates and not _is_number(values[0][1]))
    if not as_dates:
        for line, raw in values:
            if dates and not _is_number(raw):
                why = f"not a number of seconds like the first row's: {raw!r}"
                raise TraceFormatError(path, line, field, why)
        return np.asarray([seconds(path, ln, field, raw, positive=False) for ln, raw in values])
    stamps = np.asarray([timestamp(path, ln, field, raw, time_format) for ln, raw in values])
    out: NDArray[np.float64] = stamps - stamps.min()
    late = np.flatnonzero(out > MAX_TRACE_S)
    if late.size:
        line, raw = values[int(late[0])]
        raise TraceFormatError(path, line, field, f"{raw!r} is over 10 years after the first job")
    return out


def _is_number(raw: object) -> bool:
    try:
        float(str(raw))
    except ValueError:
        return False
    return True


def unique_ids(path: Path, field: str, ids: Sequence[tuple[Line, str]]) -> None:
    """Each id once: a repeat is one error naming its line and the first one's."""
    first: dict[str, Line] = {}
    for line, job_id in ids:
        if job_id in first:
            where = f" (first on line {first[job_id]})" if first[job_id] else ""
            raise TraceFormatError(path, line, field, f"duplicate job id {job_id!r}{where}")
        first[job_id] = line


def json_records(path: Path, text: str) -> list[tuple[Mapping[str, Any], Line]]:
    """The records of a JSON array of objects, each with the line its ``{`` is on."""
    try:
        records = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, exc.lineno, None, f"invalid JSON: {exc.msg}") from None
    except RecursionError:
        raise TraceFormatError(path, None, None, "invalid JSON: nested too deeply") from None
    if not isinstance(records, list):
        raise TraceFormatError(path, 1, None, "expected a JSON array of job records")
    starts = _record_lines(text, len(records))
    out: list[tuple[Mapping[str, Any], Line]] = []
    for rec, start in zip(records, starts, strict=True):
        if not isinstance(rec, dict):
            raise TraceFormatError(path, start or None, None, "a record is not a JSON object")
        out.append((rec, start or None))
    return out


def _record_lines(text: str, count: int) -> list[int]:
    """Line (1-based) on which each top-level record of a JSON array starts, for error messages."""
    lines: list[int] = []
    depth = 0
    line = 1
    in_str = esc = False
    for ch in text:
        if ch == "\n":
            line += 1
        elif in_str:
            esc, in_str = (False, in_str) if esc else (ch == "\\", ch != '"')
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth == 2 and ch == "{":
                lines.append(line)
        elif ch in "]}":
            depth -= 1
    return lines + [0] * (count - len(lines))  # 0: unknown


def from_durations(
    cluster: Cluster,
    *,
    name: Sequence[str],
    model: Sequence[str],
    arrival_s: Sequence[float] | NDArray[np.float64],
    gpus: Sequence[int],
    duration_s: Sequence[float] | NDArray[np.float64],
    **extra: Any,
) -> JobTable:
    """Jobs that run ``duration_s`` at their tightest placement: the run time is cut into
    iterations of the model's typical length (a model recperf does not know: about a
    ResNet-50), whose all-reduce of the model's gradients is calibrated into that time.
    ``extra`` passes on to ``JobTable.build`` (measured slowdowns, users, trace notes)."""
    dur = np.asarray(duration_s, dtype=np.float64)
    gpus_arr = np.asarray(gpus, dtype=np.int64)
    iter_s = np.minimum(np.asarray([iter_s_for(m) for m in model], dtype=np.float64), dur)
    grad = np.asarray([grad_bytes_for(m) for m in model], dtype=np.float64)
    compute, grad = calibrate_reference(cluster, gpus_arr, iter_s, grad)
    return JobTable.build(
        name=name,
        model=model,
        arrival_s=np.asarray(arrival_s, dtype=np.float64),
        gpus=gpus_arr,
        total_iters=dur / iter_s,
        compute_s=compute,
        grad_bytes=grad,
        **extra,
    )


@contextlib.contextmanager
def csv_errors(path: Path, reader: Any) -> Iterator[None]:
    """A ``csv.Error`` (a NUL byte, an overlong field ...) inside the block, as one
    TraceFormatError at the line ``reader`` (a csv reader) had reached."""
    try:
        yield
    except csv.Error as exc:
        raise TraceFormatError(path, reader.line_num or None, None, f"bad CSV: {exc}") from None


def read_trace(source: Path | None, default: str) -> tuple[Path, str]:
    """The path read (``source``, or the bundled ``default``) and its text."""
    path = source or bundled(default)
    try:
        return path, path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, None, None, f"not a text file ({exc.reason})") from None
    except OSError as exc:
        raise RecperfError(f"{path}: cannot read: {exc.strerror or exc}") from None
