"""Allocation files (TOML) that ``ingest run --alloc`` reads and ``ingest tune`` writes: one
``[[segment]]`` table per segment (its stages, workers and optionally threads), or the per-stage
``[allocation]`` table, either after an optional top-level ``inflight``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from recperf.core.config import load_toml
from recperf.core.errors import ConfigError
from recperf.core.results import atomic_path
from recperf.ingest.base import (
    Allocation,
    check_inflight,
    check_threads,
)


def write_allocation(path: Path, stage_names: Sequence[str], alloc: Allocation, note: str) -> None:
    """One ``[[segment]]`` table (its stages, its workers, its threads when set) per segment,
    after the top-level ``inflight`` when set, atomically."""
    lines = [f"# {line}" for line in note.splitlines()]
    if alloc.inflight:
        lines.append(f"inflight = {alloc.inflight}")
    n = len(stage_names)
    for w, t, (a, b) in zip(alloc.workers, alloc.segment_threads(), alloc.segments(n),
                            strict=True):  # fmt: skip
        names = ", ".join(f'"{x}"' for x in stage_names[a:b])
        lines += ["", "[[segment]]", f"stages = [{names}]", f"workers = {w}"]
        if alloc.threads is not None:
            lines.append(f"threads = {t}")
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")


def read_allocation(path: Path, stage_names: Sequence[str]) -> Allocation:
    """The segments of an allocation file: ``[[segment]]`` tables whose ``stages`` cover the
    chain in order, each with ``workers`` and optionally ``threads`` (0..MAX_THREADS); or the
    per-stage ``[allocation]`` table of ``stage = workers`` (every stage its own segment).
    Either may start with ``inflight = N`` (1..MAX_INFLIGHT storage requests in flight)."""
    data = dict(load_toml(path))
    inflight = 0
    if "inflight" in data:
        inflight = data.pop("inflight")
        check_inflight(inflight, f"{path}: inflight")
    if set(data) == {"allocation"}:
        alloc = _per_stage(path, data["allocation"], stage_names)
        return alloc.with_shape(inflight=inflight)
    tables = data.get("segment")
    if set(data) != {"segment"} or not isinstance(tables, list):
        raise ConfigError(
            f"{path}: expected [[segment]] tables (stages = [...], workers = N, optionally "
            "threads = T) and optionally inflight = N before them"
        )
    workers, threads, cuts, pos = [], [], [], 0
    for i, t in enumerate(tables):
        where = f"{path}: segment[{i}]"
        if not isinstance(t, Mapping) or not {"stages", "workers"} <= set(t) <= _SEGMENT_KEYS:
            raise ConfigError(
                f"{where}: expected the keys stages and workers, and optionally threads"
            )
        names, w = t["stages"], t["workers"]
        check_threads(t.get("threads", 1), f"{where}.threads")
        threads.append(t.get("threads", 1))
        want = list(stage_names[pos : pos + len(names)]) if isinstance(names, list) else None
        if not names or names != want:
            raise ConfigError(
                f"{where}.stages = {names!r}: expected the next stages of the chain in order, "
                f"starting at {stage_names[pos] if pos < len(stage_names) else 'the end'!r} "
                f"(chain: {', '.join(stage_names)})"
            )
        if not isinstance(w, int) or isinstance(w, bool) or w < 1:
            raise ConfigError(f"{where}.workers = {w!r}: expected an integer >= 1")
        if pos:
            cuts.append(pos)
        workers.append(w)
        pos += len(names)
    if pos != len(stage_names):
        raise ConfigError(f"{path}: the segments stop before {stage_names[pos]!r}")
    alloc = Allocation(workers=tuple(workers), cuts=tuple(cuts), threads=tuple(threads),
                       inflight=inflight)  # fmt: skip
    return alloc.normalized(len(stage_names))


_SEGMENT_KEYS = {"stages", "workers", "threads"}


def _per_stage(path: Path, table: object, stage_names: Sequence[str]) -> Allocation:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{path}: expected one [allocation] table of stage = workers")
    unknown = sorted(set(table) - set(stage_names))
    if unknown:
        raise ConfigError(
            f"{path}: allocation.{unknown[0]}: unknown stage; this pipeline has "
            f"{', '.join(stage_names)}"
        )
    out = []
    for name in stage_names:
        if name not in table:
            raise ConfigError(f"{path}: allocation.{name}: missing (workers for every stage)")
        w = table[name]
        if not isinstance(w, int) or isinstance(w, bool) or w < 1:
            raise ConfigError(f"{path}: allocation.{name} = {w!r}: expected an integer >= 1")
        out.append(w)
    return Allocation(workers=tuple(out))
