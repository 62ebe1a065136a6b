"""The stall capability's results: the figure names in the one order every summary, table and
figure uses; ``StallBreakdown``, one rank's one iteration; and ``StallSummary``, a run's
summary.json, which ``profile``, ``analyze`` and ``launch`` all build (one place derives the
fractions and lays out the keys users' documents have)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from recperf.core.errors import ConfigError

STALLS = ("data_fetch_stall_s", "data_prep_stall_s", "interconnect_stall_s", "network_stall_s")
"""The sources of stall, in the order the differential runs add them."""
FIGURES = ("compute_s", *STALLS)
"""An iteration's time split: compute without stalls, then each stall."""


@dataclass(kw_only=True, slots=True, frozen=True)
class StallBreakdown:
    """One rank's one iteration, from its trace (definitions: ``trace.breakdown``)."""

    rank: int
    """The rank (not in ``to_json``: the summary files iterations under their rank)."""
    step: int
    """The iteration's number (ProfilerStep#N, or recperf's iteration)."""
    iteration_s: float
    data_wait_s: float
    compute_s: float
    """Iteration less data wait and exposed communication."""
    exposed_comm_s: float
    overlapped_comm_s: float
    comm_busy_s: float
    collectives: int
    allreduces: int
    comm_bytes: int | None
    """Bytes of the iteration's collectives (None: a size was not recorded)."""
    allreduce_bytes: int | None
    flops: float | None
    """Sum of the ops' flops (None: not recorded)."""
    gpu_compute_s: float | None = None
    """GPU compute-kernel time (GPU traces only)."""
    backward_s: float | None = None
    """Backward less the communication wait in it (when the trace marks backward)."""

    def to_json(self) -> dict[str, Any]:
        """The iteration's object in summary.json's ``iterations`` (optional figures only when
        measured)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "rank"}
        for key in ("gpu_compute_s", "backward_s"):
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], rank: int) -> StallBreakdown:
        """Read ``to_json``'s object back (``rank``: the key it was filed under)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"rank"}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"iterations[{rank}]: unknown key {unknown[0]!r}")
        try:
            return cls(rank=rank, **data)
        except TypeError as exc:
            raise ConfigError(f"iterations[{rank}]: {exc}") from None


SUMMARY_FIELDS = ("iteration_s", *FIGURES)
OWN_KEYS = frozenset({"created_utc", "source", *SUMMARY_FIELDS, "contention_s", "unexplained_s",
                      "method", "direct", "cross_check", "skipped", "half_width_s"})  # fmt: skip
"""Keys StallSummary holds itself; the ``*_frac`` keys are derived; the rest is ``details``."""


def fraction_key(figure: str) -> str:
    """``compute_s`` -> ``compute_frac``."""
    return figure.removesuffix("_s") + "_frac"


@dataclass(kw_only=True, slots=True, frozen=True)
class StallSummary:
    """One run's stall summary: per-iteration means of the time split, how each was measured,
    and what the run's kind adds (``details``: runs, per-rank rows, comm samples ...)."""

    created_utc: str
    source: str | None = None
    """``traces`` (analyze), ``launch``; None for ``profile`` (its documents never had one)."""
    iteration_s: float
    compute_s: float
    data_fetch_stall_s: float
    data_prep_stall_s: float
    interconnect_stall_s: float
    network_stall_s: float
    contention_s: float | None = None
    """Slow-down of compute when ranks share the machine (profile only)."""
    unexplained_s: float | None = None
    """Iteration less compute and every stall (profile and launch)."""
    method: Mapping[str, str] = field(default_factory=dict)
    """How each figure was obtained, by figure name."""
    direct: Mapping[str, Any] = field(default_factory=dict)
    """The figures measured directly from the traces, for the cross-check."""
    cross_check: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    """Runs not made, and why."""
    half_width_s: Mapping[str, float] = field(default_factory=dict)
    """Half-width of each figure's 95% interval from its runs' per-iteration spread, by figure
    name (profile only; empty in documents from before it was kept)."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """The keys each kind of run adds, as they appear in summary.json."""

    def fractions(self) -> dict[str, float]:
        """Each of FIGURES over the iteration time (NaN for an empty iteration)."""
        it = self.iteration_s
        return {fraction_key(k): getattr(self, k) / it if it > 0 else math.nan for k in FIGURES}

    def to_json(self) -> dict[str, Any]:
        """summary.json's object, with the keys users' documents already have."""
        out: dict[str, Any] = {"created_utc": self.created_utc}
        if self.source is not None:
            out["source"] = self.source
        out |= dict(self.details)
        out |= {k: getattr(self, k) for k in SUMMARY_FIELDS} | self.fractions()
        for key in ("contention_s", "unexplained_s"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out |= {"method": dict(self.method), "direct": dict(self.direct),
                "cross_check": dict(self.cross_check), "skipped": dict(self.skipped)}  # fmt: skip
        if self.half_width_s:
            out["half_width_s"] = dict(self.half_width_s)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "summary.json") -> StallSummary:
        """Read a summary.json object (``source`` names it in errors); keys this class does not
        hold itself go to ``details`` unchanged."""
        values: dict[str, Any] = {}
        for key in SUMMARY_FIELDS:
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{source}: {key}: expected a number, got {value!r}")
            values[key] = float(value)
        for key in ("method", "direct", "cross_check", "skipped", "half_width_s"):
            value = data.get(key, {})
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: {key}: expected an object, got {value!r}")
            values[key] = value
        frac = {fraction_key(k) for k in FIGURES}
        return cls(
            created_utc=str(data.get("created_utc", "")),
            source=data.get("source"),
            contention_s=data.get("contention_s"),
            unexplained_s=data.get("unexplained_s"),
            details={k: v for k, v in data.items() if k not in OWN_KEYS and k not in frac},
            **values,
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class RankMeans:
    """One rank's means over its iterations (a row of summary.json's ``per_rank``); a mean is
    None when some iteration did not record its figure."""

    rank: int
    source: str
    host: str | None
    iterations: int
    iteration_median_s: float
    iteration_s: float | None
    data_wait_s: float | None
    compute_s: float | None
    exposed_comm_s: float | None
    overlapped_comm_s: float | None
    comm_busy_s: float | None
    collectives: float | None
    allreduces: float | None
    comm_bytes: float | None
    allreduce_bytes: float | None
    flops: float | None
    backward_s: float | None
    gpu_compute_s: float | None

    def to_json(self) -> dict[str, Any]:
        """The row as summary.json has it (every key, in field order)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(kw_only=True, slots=True, frozen=True)
class SlowestRank:
    """The rank with the largest median iteration time and its margin over the median of the
    others' medians (summary.json's ``slowest_rank``)."""

    rank: int
    iteration_median_s: float
    others_median_s: float
    margin_s: float
    margin_frac: float
    """``margin_s`` over ``others_median_s`` (NaN when that is 0)."""

    def to_json(self) -> dict[str, Any]:
        """The object as summary.json has it."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
