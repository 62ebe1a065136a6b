"""recperf's own rank trace files: ``load_trace`` reads one and checks every field the
analysis reads (``check_trace``), ``_iterations`` cuts it into timed iterations' spans and
``_iteration_figures`` turns one into its figures; ``RankRun`` is what the run statistics take
from a rank (``read_rank_run`` reads it from a checked document)."""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recperf.core.errors import ConfigError
from recperf.core.files import TRACE_MAX_BYTES, check_input
from recperf.core.text import read_utf8
from recperf.stalls.run.hook import ANNOTATION, TRACE_FORMAT, TRACE_FORMATS
from recperf.stalls.trace.intervals import length, merge


@dataclass(kw_only=True, slots=True, frozen=True)
class RunMeta:
    """The run metadata every rank trace's ``recperf`` object holds (``check_trace`` checks
    these fields' types; ``RunStats.meta`` carries them on)."""

    grad_bytes: int
    param_bytes: int
    num_param_tensors: int
    flops_per_iter: float
    device_name: str
    instrumented: bool


META_KEYS: dict[str, type] = typing.get_type_hints(RunMeta)
"""``RunMeta``'s fields and their types, as a rank trace must hold them."""


@dataclass(kw_only=True, slots=True, frozen=True)
class RankRun:
    """One rank's trace as the run statistics take it: each timed iteration's figures, the
    run's metadata and the all-reduce microbenchmark the rank timed."""

    iterations: tuple[Mapping[str, float], ...]
    """Each timed iteration's figures by name (``_iteration_figures``), warm-up dropped."""
    meta: RunMeta
    microbench: tuple[tuple[int, float], ...] = ()
    """(bytes, seconds) of each all-reduce size timed, in the order timed."""


def read_rank_run(trace: Mapping[str, Any]) -> RankRun:
    """The ``RankRun`` of a rank trace document (``load_trace`` reads and checks one)."""
    meta = trace["recperf"]
    return RankRun(
        iterations=tuple(_iteration_figures(it) for it in _iterations(trace)),
        meta=RunMeta(**{k: kind(meta[k]) for k, kind in META_KEYS.items()}),
        microbench=tuple(
            (int(m["bytes"]), float(m["seconds"])) for m in meta.get("microbench", [])
        ),
    )


def load_rank_run(path: Path) -> RankRun:
    """``read_rank_run`` of the rank trace file ``path``, checked by ``load_trace``."""
    return read_rank_run(load_trace(path))


def _iterations(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per-iteration spans of one rank's trace (either format), warmup dropped."""
    meta = trace.get("recperf", {})
    if meta.get("format") not in TRACE_FORMATS:
        raise ConfigError(f"not a recperf stall trace (format {meta.get('format')!r})")
    its: dict[int, dict[str, Any]] = {}
    for ev in trace["traceEvents"]:
        if ev.get("ph", "X") != "X" or str(ev["name"]).startswith("ProfilerStep#"):
            continue  # names of threads, and the span that holds data_wait + step
        name = str(ev["name"]).removeprefix(ANNOTATION)  # format 1 had bare names
        i = int(ev["args"]["iteration"])
        it = its.setdefault(i, {"phases": {}, "comm": []})
        a, b = ev["ts"] / 1e6, (ev["ts"] + ev["dur"]) / 1e6
        if name in ("data_wait", "step"):
            it[name] = (a, b)
        elif name == "allreduce":  # (start, end, last launch, buckets): a bucket or a window
            last, n = ev["args"].get("last_launch"), int(ev["args"].get("buckets", 1))
            it["comm"].append((a, b, a if last is None else last / 1e6, n))
        else:
            it["phases"][name] = (a, b)
    warmup = int(meta.get("warmup", 0))
    return [its[i] for i in sorted(its) if i >= warmup]


def _iteration_figures(it: dict[str, Any]) -> dict[str, float]:
    (d0, d1), (s0, s1) = it["data_wait"], it["step"]
    comm = it["comm"]
    exposed = 0.0
    if comm:
        last_launch = max(c[2] for c in comm)
        exposed = min(max(0.0, max(c[1] for c in comm) - last_launch), max(0.0, s1 - last_launch))
    busy = length(merge(c[:2] for c in comm))
    bwd = it["phases"].get("backward")
    backward = (bwd[1] - bwd[0]) if bwd else float("nan")
    return {
        "iteration_s": s1 - d0,
        "data_wait_s": d1 - d0,
        "compute_s": (s1 - s0) - exposed,
        "backward_s": max(0.0, backward - exposed),
        "exposed_comm_s": exposed,
        "overlapped_comm_s": max(0.0, busy - exposed),
        "comm_busy_s": busy,
        "buckets": float(sum(c[3] for c in comm)),
    }


EVENT_KEYS = {"name": str, "ts": float, "dur": float}
ARG_KEYS = {"bytes": int, "buckets": int, "last_launch": float}
"""An all-reduce span's args the analysis reads where present (a window has the last two)."""


def _kind_ok(value: Any, kind: type) -> bool:
    if kind is bool or kind is str:
        return isinstance(value, kind)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return kind is float or float(value).is_integer()


def check_trace(trace: Any, source: str) -> dict[str, Any]:
    """``trace`` if it is a recperf rank trace with every field the analysis reads, else one
    ConfigError naming ``source`` and the field."""

    def bad(field: str, why: str) -> ConfigError:
        return ConfigError(f"{source}: not a recperf stall trace: {field} {why}")

    if not isinstance(trace, dict):
        raise bad("the document", f"is a JSON {type(trace).__name__}, expected an object")
    meta = trace.get("recperf")
    if not isinstance(meta, dict) or meta.get("format") not in TRACE_FORMATS:
        got = meta.get("format") if isinstance(meta, dict) else None
        old = " or ".join(repr(f) for f in TRACE_FORMATS if f != TRACE_FORMAT)
        raise bad("'recperf.format'", f"is {got!r}, expected {TRACE_FORMAT!r} (or {old})")
    for key, kind in (*META_KEYS.items(), ("warmup", int)):
        if (key != "warmup" or key in meta) and not _kind_ok(meta.get(key), kind):
            raise bad(f"'recperf.{key}'", f"= {meta.get(key)!r}, expected {kind.__name__}")
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise bad("'traceEvents'", "is missing or not a list")
    for i, ev in enumerate(events):
        where = f"'traceEvents[{i}]"
        if not isinstance(ev, dict):
            raise bad(f"{where}'", "is not an object")
        if ev.get("ph", "X") not in ("X", "M"):
            raise bad(f"{where}.ph'", f"= {ev.get('ph')!r}, expected 'X' or 'M'")
        if ev.get("ph") == "M":  # thread and process names: nothing the analysis reads
            continue
        for key, kind in EVENT_KEYS.items():
            if not _kind_ok(ev.get(key), kind):
                raise bad(f"{where}.{key}'", f"= {ev.get(key)!r}, expected {kind.__name__}")
        args = ev.get("args")
        if not isinstance(args, dict) or not _kind_ok(args.get("iteration"), int):
            raise bad(f"{where}.args.iteration'", "is missing or not an integer")
        for key, kind in ARG_KEYS.items():
            if key in args and not _kind_ok(args[key], kind):
                raise bad(f"{where}.args.{key}'", f"= {args[key]!r}, expected {kind.__name__}")
    for it in _iterations(trace):
        if "data_wait" not in it or "step" not in it:
            raise bad("an iteration", "lacks its data_wait or step event")
    return trace


def load_trace(path: Path) -> dict[str, Any]:
    """One rank's trace file, checked by ``check_trace``; unreadable JSON is one ConfigError."""
    check_input(path, "stall trace", max_bytes=TRACE_MAX_BYTES)
    try:
        data = json.loads(read_utf8(path))
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"{path}: not a recperf stall trace: {why}") from None
    return check_trace(data, str(path))
