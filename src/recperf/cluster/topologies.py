"""Where a cluster's switch tree comes from: a host list (CSV, one row per host, one column per
switch tier, e.g. Lingjun's ``topo.csv``) or a GPU count (Helios' daily VC sizes), bundled by
name or read from a path. Trees are cached: presets and sweeps build them once."""

from __future__ import annotations

import csv
import functools
import io
import os
from importlib import resources
from pathlib import Path

from recperf.cluster.tree import Tree, from_paths
from recperf.core.errors import ConfigError, RecperfError, TraceFormatError
from recperf.core.files import check_input, check_name
from recperf.core.text import read_utf8

HOST_LISTS: dict[str, tuple[str, tuple[str, ...]]] = {
    # Alibaba Lingjun 2023 (Crux, SIGCOMM '24; Apache-2.0): 847 hosts under 119 ToRs (a ToR is
    # the pair PSW, ASW: ASW names repeat across PSWs) under 3 aggregation switches (PSW); one
    # core group (DSW) above them all.
    "lingjun": ("lingjun/topo.csv", ("ASW", "PSW")),
}
"""Bundled host lists: name -> (file under data/cluster, default tier columns from the ToR up)."""

GPU_COUNTS: dict[str, str] = {
    "helios-venus": "helios-vc-sizes/Venus_cluster_gpu_number.csv",
    "helios-earth": "helios-vc-sizes/Earth_cluster_gpu_number.csv",
}
"""Bundled cluster sizes (SenseTime Helios, CC BY 4.0): the ``total`` GPUs of one day."""


def bundled(relative: str) -> Path:
    """A file under ``recperf/data/cluster/``."""
    return Path(str(resources.files("recperf") / "data" / "cluster" / relative))


def default_tiers(topology: str) -> tuple[str, ...]:
    return HOST_LISTS[topology][1] if topology in HOST_LISTS else ()


def _host_file(topology: str) -> Path:
    if topology in HOST_LISTS:
        return bundled(HOST_LISTS[topology][0])
    path = check_name(topology, "topology")
    if not os.path.lexists(path):
        allowed = ", ".join([*HOST_LISTS, *GPU_COUNTS])
        raise ConfigError(
            f"topology {topology!r} is neither a bundled topology nor a file; allowed: "
            f"{allowed} or a CSV with one row per host"
        )
    return check_input(path, "topology")


def _read(path: Path) -> str:
    try:
        return read_utf8(path)
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, None, None, f"not a text file ({exc.reason})") from None
    except OSError as exc:
        raise RecperfError(f"{path}: cannot read: {exc.strerror or exc}") from None


@functools.lru_cache(maxsize=16)
def host_tree(topology: str, tiers: tuple[str, ...], gpus_per_machine: int) -> Tree:
    """The tree of a host list: its first column names the host, ``tiers`` name the switch
    columns from the ToR up. A host listed twice is an error naming both lines (it would sit
    under two ToRs, or be counted twice)."""
    path = _host_file(topology)
    rows = csv.reader(io.StringIO(_read(path)))
    header = [h.strip() for h in next(rows, [])]
    if not header:
        raise TraceFormatError(path, 1, None, "is empty; expected a header naming the columns")
    if not tiers:
        raise ConfigError(f"topology {path}: set tiers, the switch columns from the ToR up")
    missing = [t for t in tiers if t not in header]
    if missing:
        raise TraceFormatError(
            path, 1, missing[0], f"no such column; the header has {', '.join(header)}"
        )
    if len(set(tiers)) != len(tiers):
        raise ConfigError(f"topology {path}: tiers {list(tiers)} repeat a column")
    cols = [header.index(t) for t in tiers]
    host_col = next(i for i in range(len(header)) if i not in cols)
    paths: list[tuple[str, ...]] = []
    where: dict[str, int] = {}
    for lineno, row in enumerate(rows, 2):
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise TraceFormatError(
                path, lineno, None, f"expected {len(header)} fields, got {len(row)}"
            )
        cells = [c.strip() for c in row]
        host = cells[host_col]
        for name, i in ((header[host_col], host_col), *zip(tiers, cols, strict=True)):
            if not cells[i]:
                raise TraceFormatError(path, lineno, name, "is empty")
        if host in where:
            raise TraceFormatError(
                path,
                lineno,
                header[host_col],
                f"host {host[:16]!r} is listed again (first on line {where[host]}): a host "
                "sits under one ToR",
            )
        where[host] = lineno
        paths.append(tuple(cells[i] for i in cols))
    if not paths:
        raise TraceFormatError(path, None, None, "lists no hosts")
    return from_paths(tiers, paths, gpus_per_machine)[0]


@functools.lru_cache(maxsize=16)
def helios_gpus(name: str, date: str) -> int:
    """The ``total`` GPUs of a bundled Helios cluster on ``date`` (YYYY-MM-DD; "" = the first
    day in the file)."""
    path = bundled(GPU_COUNTS[name])
    rows = list(csv.DictReader(io.StringIO(_read(path))))
    for row in rows:
        if not date or row["date"] == date:
            return int(row["total"])
    raise ConfigError(
        f"{name}: no day {date!r}; the file covers {rows[0]['date']} to {rows[-1]['date']}"
    )
