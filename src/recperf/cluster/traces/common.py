"""Field parsing shared by the trace loaders."""

from __future__ import annotations

import math
from pathlib import Path

from recperf.core.errors import TraceFormatError


def number(path: Path, line: int | None, field: str, raw: object, *, positive: bool) -> float:
    """Parse one numeric field, raising a TraceFormatError that names file, line and field."""
    try:
        value = float(str(raw))
    except ValueError:
        raise TraceFormatError(path, line, field, f"not a number: {raw!r}") from None
    if not math.isfinite(value) or (value <= 0 if positive else value < 0):
        bound = "> 0" if positive else ">= 0"
        raise TraceFormatError(path, line, field, f"must be {bound}, got {raw!r}")
    return value


def integer(path: Path, line: int | None, field: str, raw: object) -> int:
    """A positive whole number (``4`` or ``4.0``)."""
    value = number(path, line, field, raw, positive=True)
    if value != int(value):
        raise TraceFormatError(path, line, field, f"must be a whole number, got {raw!r}")
    return int(value)
