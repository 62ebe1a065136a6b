"""What the trace loaders share: reading the file (a given path or the bundled default) with one
error naming it, parsing numeric, time and id fields row by row (a row that cannot be simulated
is the error, or with ``drop_invalid`` dropped and counted), and building a job table."""

from __future__ import annotations

import contextlib
import csv
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import numpy as np
from numpy.typing import NDArray

from recperf.cluster.jobs import JobTable
from recperf.cluster.limits import MAX_COUNT, MAX_TRACE_S
from recperf.cluster.models import grad_bytes_for, iter_s_for
from recperf.cluster.network import calibrate_reference
from recperf.cluster.topologies import bundled as bundled  # re-exported for the loaders
from recperf.cluster.topology import Cluster
from recperf.core.errors import RecperfError, TraceFormatError
from recperf.core.text import read_utf8

T = TypeVar("T")
P = ParamSpec("P")
Line = int | None
"""A 1-based line number, or None where unknown."""
MAX_EPOCH_S = 4_102_444_800.0
"""2100-01-01 as Unix-epoch seconds: the latest absolute arrival time read as one."""
DROP_HINT = "--drop-invalid drops such rows and counts them"


@dataclass(kw_only=True, slots=True, frozen=True)
class TraceConfig:
    """What every trace format's Config has."""

    drop_invalid: bool = False
    """Drop the rows that cannot be simulated (a duration <= 0, no GPUs, a missing or unreadable
    field) and count them by reason (``dropped_invalid`` in the summary) instead of failing on
    the first."""


class RowError(TraceFormatError):
    """A row that cannot be simulated; ``reason`` (the field and what is wrong, without the
    value: ``run-time <= 0``) is what dropped rows are counted by."""

    def __init__(self, file: str | Path, line: Line, field: str | None, why: str, reason: str):
        super().__init__(file, line, field, why)
        self.reason = reason


@dataclass(slots=True)
class RowFilter:
    """Parses rows one at a time: a row that raises a RowError is the error (naming the flag
    that drops such rows) or, with ``drop``, dropped and counted by reason."""

    drop: bool
    counts: dict[str, int] = field(default_factory=dict)

    def keep(self, parse: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
        """``parse(*args, **kwargs)``, or None for a row dropped as invalid."""
        try:
            return parse(*args, **kwargs)
        except RowError as exc:
            if not self.drop:
                why = f"{exc.why} ({DROP_HINT})"
                raise TraceFormatError(exc.file, exc.line, exc.field, why) from None
            self.counts[exc.reason] = self.counts.get(exc.reason, 0) + 1
            return None

    @property
    def dropped(self) -> dict[str, int] | None:
        """Rows dropped, by reason (sorted); None when not dropping."""
        return dict(sorted(self.counts.items())) if self.drop else None


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
        raise RowError(
            path, line, field, f"not a number: {raw!r}", f"{field} not a number"
        ) from None
    if not math.isfinite(value) or (value <= 0 if positive else value < 0) or value > limit:
        bound = "> 0" if positive else ">= 0"
        why = f"must be {bound} and at most {limit:g}{unit}, got {raw!r}"
        raise RowError(path, line, field, why, f"{field} {_out_of_range(value, positive)}")
    return value


def _out_of_range(value: float, positive: bool) -> str:
    """The reason a value out of its range is counted under (NaN, too small, too large)."""
    if math.isnan(value):
        return "not a number"
    if value <= 0 if positive else value < 0:
        return "<= 0" if positive else "< 0"
    return "too large"


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
        why = f"must be a whole number, got {raw!r}"
        raise RowError(path, line, field, why, f"{field} not a whole number")
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
        why = f"not {want}{example}: {raw!r}"
        raise RowError(path, line, field, why, f"{field} not a time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


class Arrivals:
    """One arrival column read row by row, as seconds or as date-times (ISO, or ``time_format``):
    the first row read decides which, and a row of the other kind is invalid. ``dates=False``:
    seconds only. ``rebase`` turns the kept rows' values into seconds from a common origin."""

    def __init__(self, path: Path, field: str, time_format: str = "", *, dates: bool = True):
        self.path = path
        self.field = field
        self.time_format = time_format
        self.dates = dates
        self.as_dates: bool | None = True if time_format else None

    def parse(self, line: Line, raw: object) -> float:
        """The row's time: seconds as given (``rebase`` takes a column reaching past 10 years as
        Unix-epoch seconds), or a date-time as POSIX seconds."""
        is_number = _is_number(raw)
        if self.as_dates is None:
            self.as_dates = self.dates and not is_number
        if self.as_dates:
            return timestamp(self.path, line, self.field, raw, self.time_format)
        if not is_number and self.dates:
            why = f"not a number of seconds like the first row's: {raw!r}"
            raise RowError(self.path, line, self.field, why, f"{self.field} not a number")
        value = float(str(raw)) if is_number else math.nan
        if not value >= 0:  # not a number, NaN or negative: the error of seconds
            seconds(self.path, line, self.field, raw, positive=False)
        if not value <= MAX_EPOCH_S:
            why = (
                f"must be >= 0 and at most {MAX_TRACE_S:g} s (10 years), or Unix-epoch seconds "
                f"before 2100, got {raw!r}"
            )
            raise RowError(self.path, line, self.field, why, f"{self.field} too large")
        return value

    def rebase(
        self, values: Sequence[float], rows: Sequence[tuple[Line, object]]
    ) -> NDArray[np.float64]:
        """Seconds from the earliest for date-times and for seconds that reach past 10 years
        (Unix-epoch times); other seconds as given. ``rows`` (line, raw) name an error's row:
        a time over 10 years after the earliest."""
        stamps = np.asarray(values, dtype=np.float64)
        if stamps.size == 0 or not (self.as_dates or stamps.max() > MAX_TRACE_S):
            return stamps
        out: NDArray[np.float64] = stamps - stamps.min()
        late = np.flatnonzero(out > MAX_TRACE_S)
        if late.size:
            line, raw = rows[int(late[0])]
            why = f"{raw!r} is over 10 years after the first job"
            raise TraceFormatError(self.path, line, self.field, why)
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
        records = json.loads(text, object_pairs_hook=_Object.of)
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
        key = _Object.repeated_in(rec)
        if key is not None:  # json.loads would keep the last value silently
            why = "appears twice in one object of this record; which value is meant?"
            raise TraceFormatError(path, start or None, key, why)
        out.append((rec, start or None))
    return out


class _Object(dict[str, Any]):
    """A JSON object that remembers the first key it held twice (``repeated``)."""

    repeated: str | None = None

    @classmethod
    def of(cls, pairs: list[tuple[str, Any]]) -> _Object:
        obj = cls(pairs)
        if len(obj) < len(pairs):
            keys = [k for k, _ in pairs]
            obj.repeated = next(k for i, k in enumerate(keys) if k in keys[:i])
        return obj

    @staticmethod
    def repeated_in(value: object) -> str | None:
        """The first repeated key in ``value`` or in an object or list inside it."""
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, _Object) and item.repeated is not None:
                return item.repeated
            if isinstance(item, dict | list):
                stack.extend(reversed(list(item.values() if isinstance(item, dict) else item)))
        return None


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


def too_many_fields(path: Path, line: int, fields: int, width: int) -> RowError:
    """The error of a CSV row with more fields than its header's ``width``."""
    why = f"has {fields} fields; the header has {width} (an unquoted comma?)"
    return RowError(path, line, None, why, "too many fields")


def check_width(path: Path, line: int, row: Mapping[Any, Any]) -> None:
    """A ``csv.DictReader`` row holding fields beyond the header's (under the key None) is
    invalid: a value would have moved to the wrong column."""
    extra = row.get(None)
    if extra:
        raise too_many_fields(path, line, len(row) - 1 + len(extra), len(row) - 1)


@contextlib.contextmanager
def csv_errors(path: Path, reader: Any) -> Iterator[None]:
    """A ``csv.Error`` (a NUL byte, an overlong field ...) inside the block, as one
    TraceFormatError at the line ``reader`` (a csv reader) had reached."""
    try:
        yield
    except csv.Error as exc:
        raise TraceFormatError(path, reader.line_num or None, None, f"bad CSV: {exc}") from None


def read_trace(source: Path | None, default: str) -> tuple[Path, str]:
    """The path read (``source``, or the bundled ``default``) and its text (without a leading
    byte-order mark); a NUL byte, which no text trace holds, is an error naming its line."""
    path = source or bundled(default)
    try:
        text = read_utf8(path)
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, None, None, f"not a text file ({exc.reason})") from None
    except OSError as exc:
        raise RecperfError(f"{path}: cannot read: {exc.strerror or exc}") from None
    nul = text.find("\0")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise TraceFormatError(path, line, None, "holds a NUL byte: not a text trace")
    return path, text
