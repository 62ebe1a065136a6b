"""The job table: one row per training job, stored as columns (numpy arrays) for speed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from recperf.core.errors import RecperfError

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class JobTable:
    """Jobs sorted by arrival; a job's id is its row index.

    A job needs ``gpus`` GPUs at once for ``total_iters`` iterations; one iteration costs
    ``compute_s`` plus an all-reduce of ``grad_bytes`` over the placement's widest link.
    """

    name: tuple[str, ...]
    """Job label from the trace (escaped wherever it is shown)."""
    model: tuple[str, ...]
    """Model or job type."""
    arrival_s: F64
    gpus: I64
    total_iters: F64
    compute_s: F64
    """Per-iteration time with no communication beyond what the reference placement hides."""
    grad_bytes: F64
    """Bytes all-reduced per iteration (0 for a job insensitive to placement)."""
    measured_slowdown: F64 | None = None
    """Measured per-iteration time spread over several machines under one switch / consolidated
    on one machine (>= 1), where the trace has it (Philly throughputs, Helios
    ``cross_machine_slowdown``); NaN where unknown. None: unknown for every job."""
    measured_cross_rack: F64 | None = None
    """Measured per-iteration time spread over racks / consolidated on one machine (>= 1), where
    the trace has it (Helios ``cross_rack_slowdown``); NaN where unknown. None: unknown for
    every job."""
    user: tuple[str, ...] | None = None
    """Who submitted each job, where the trace says ("" where unknown). None: unknown for all."""
    trace_notes: Mapping[str, int] = field(default_factory=dict)
    """Counts of what loading did to the trace (``fractional_rounded_up``, ``cpu_only_skipped``,
    ``dropped_oversized`` ...); they appear in the run's summary."""
    dropped_invalid: Mapping[str, int] | None = None
    """Rows the loader dropped as impossible to simulate, by reason (``run-time <= 0``), when
    asked to (``drop_invalid``); None when not asked. The summary has their total as
    ``dropped_invalid`` and this as ``dropped_invalid_by_reason``."""

    def __post_init__(self) -> None:
        n = len(self.name)
        for col in ("measured_slowdown", "measured_cross_rack"):
            if getattr(self, col) is None:
                object.__setattr__(self, col, np.full(n, np.nan))
        if self.user is None:
            object.__setattr__(self, "user", ("",) * n)
        object.__setattr__(self, "trace_notes", dict(self.trace_notes))
        if self.dropped_invalid is not None:
            object.__setattr__(self, "dropped_invalid", dict(self.dropped_invalid))
        cols = {
            "model": len(self.model),
            "arrival_s": len(self.arrival_s),
            "gpus": len(self.gpus),
            "total_iters": len(self.total_iters),
            "compute_s": len(self.compute_s),
            "grad_bytes": len(self.grad_bytes),
            "measured_slowdown": len(self.slowdown_measured),
            "measured_cross_rack": len(self.cross_rack_measured),
            "user": len(self.users),
        }
        for col, size in cols.items():
            if size != n:
                raise RecperfError(f"job table: column {col!r} has {size} rows, expected {n}")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise RecperfError("job table: jobs must be sorted by arrival_s")
        self._check_values()
        for arr in (
            self.arrival_s,
            self.gpus,
            self.total_iters,
            self.compute_s,
            self.grad_bytes,
            self.slowdown_measured,
            self.cross_rack_measured,
        ):
            arr.setflags(write=False)

    def _check_values(self) -> None:
        measured, rack = self.slowdown_measured, self.cross_rack_measured
        checks = (
            ("arrival_s", self.arrival_s >= 0),
            ("gpus", self.gpus >= 1),
            ("total_iters", self.total_iters > 0),
            ("compute_s", self.compute_s > 0),
            ("grad_bytes", self.grad_bytes >= 0),
            ("measured_slowdown", np.isnan(measured) | (measured >= 1)),
            ("measured_cross_rack", np.isnan(rack) | (rack >= 1)),
        )
        for col, ok in checks:
            if not np.all(ok):
                bad = int(np.flatnonzero(~ok)[0])
                raise RecperfError(f"job table: job {self.name[bad]!r} has an invalid {col}")

    @property
    def slowdown_measured(self) -> F64:
        """``measured_slowdown`` as an array (NaN where unknown)."""
        assert self.measured_slowdown is not None  # filled in by __post_init__
        return self.measured_slowdown

    @property
    def cross_rack_measured(self) -> F64:
        """``measured_cross_rack`` as an array (NaN where unknown)."""
        assert self.measured_cross_rack is not None  # filled in by __post_init__
        return self.measured_cross_rack

    @property
    def users(self) -> tuple[str, ...]:
        """``user`` as a tuple ("" where unknown)."""
        assert self.user is not None  # filled in by __post_init__
        return self.user

    def __len__(self) -> int:
        return len(self.name)

    @classmethod
    def build(
        cls,
        *,
        name: Sequence[str],
        model: Sequence[str],
        arrival_s: list[float] | F64,
        gpus: list[int] | I64,
        total_iters: list[float] | F64,
        compute_s: list[float] | F64,
        grad_bytes: list[float] | F64,
        measured_slowdown: list[float] | F64 | None = None,
        measured_cross_rack: list[float] | F64 | None = None,
        user: Sequence[str] | None = None,
        trace_notes: Mapping[str, int] | None = None,
        dropped_invalid: Mapping[str, int] | None = None,
    ) -> JobTable:
        """Build from unsorted columns: rows are stably sorted by arrival."""
        arr = np.asarray(arrival_s, dtype=np.float64)
        order = np.argsort(arr, kind="stable")

        def floats(col: list[float] | F64 | None) -> F64 | None:
            return None if col is None else np.asarray(col, dtype=np.float64)[order].copy()

        return cls(
            name=tuple(name[i] for i in order),
            model=tuple(model[i] for i in order),
            arrival_s=arr[order].copy(),
            gpus=np.asarray(gpus, dtype=np.int64)[order].copy(),
            total_iters=np.asarray(total_iters, dtype=np.float64)[order].copy(),
            compute_s=np.asarray(compute_s, dtype=np.float64)[order].copy(),
            grad_bytes=np.asarray(grad_bytes, dtype=np.float64)[order].copy(),
            measured_slowdown=floats(measured_slowdown),
            measured_cross_rack=floats(measured_cross_rack),
            user=None if user is None else tuple(user[i] for i in order),
            trace_notes=trace_notes or {},
            dropped_invalid=dropped_invalid,
        )

    def subset(self, rows: I64) -> JobTable:
        """The jobs at ``rows`` (in arrival order), renumbered from 0."""
        rows = np.sort(np.asarray(rows, dtype=np.int64))
        return JobTable(
            name=tuple(self.name[i] for i in rows),
            model=tuple(self.model[i] for i in rows),
            arrival_s=self.arrival_s[rows].copy(),
            gpus=self.gpus[rows].copy(),
            total_iters=self.total_iters[rows].copy(),
            compute_s=self.compute_s[rows].copy(),
            grad_bytes=self.grad_bytes[rows].copy(),
            measured_slowdown=self.slowdown_measured[rows].copy(),
            measured_cross_rack=self.cross_rack_measured[rows].copy(),
            user=tuple(self.users[i] for i in rows),
            trace_notes=self.trace_notes,
            dropped_invalid=self.dropped_invalid,
        )

    def with_arrivals(self, arrival_s: F64) -> JobTable:
        """The same jobs at new arrival times, re-sorted (ids follow the new order)."""
        return JobTable.build(
            name=self.name,
            model=self.model,
            arrival_s=arrival_s,
            gpus=self.gpus,
            total_iters=self.total_iters,
            compute_s=self.compute_s,
            grad_bytes=self.grad_bytes,
            measured_slowdown=self.slowdown_measured,
            measured_cross_rack=self.cross_rack_measured,
            user=self.users,
            trace_notes=self.trace_notes,
            dropped_invalid=self.dropped_invalid,
        )

    def with_notes(self, **notes: int) -> JobTable:
        """The same jobs with more ``trace_notes`` (a later count of a key replaces it)."""
        return dataclasses.replace(self, trace_notes={**self.trace_notes, **notes})
