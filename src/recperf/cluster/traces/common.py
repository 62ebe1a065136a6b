"""What the trace loaders share: reading the file (a given path or the bundled default) with one
error naming it, and parsing numeric fields."""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path

from recperf.cluster.limits import MAX_COUNT, MAX_TRACE_S
from recperf.core.errors import RecperfError, TraceFormatError


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


def bundled(relative: str) -> Path:
    """A file under ``recperf/data/cluster/``."""
    return Path(str(resources.files("recperf") / "data" / "cluster" / relative))


def read_trace(source: Path | None, default: str) -> tuple[Path, str]:
    """The path read (``source``, or the bundled ``default``) and its text."""
    path = source or bundled(default)
    try:
        return path, path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, None, None, f"not a text file ({exc.reason})") from None
    except OSError as exc:
        raise RecperfError(f"{path}: cannot read: {exc.strerror or exc}") from None
