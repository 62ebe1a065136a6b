"""Finding trace files (a directory, a recperf run directory, files as given) and reading one
(plain or gzipped JSON with a ``traceEvents`` list), one ConfigError naming the path otherwise."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recperf.core.errors import ConfigError
from recperf.core.files import TRACE_MAX_BYTES, check_input

SUFFIXES = (".json", ".json.gz")
NOT_TRACES = ("summary.json", "spec.json", "analysis.json", "advice.json", "prediction.json")
"""recperf's own result files, skipped when a directory is expanded."""


def find_traces(sources: Sequence[Path]) -> list[Path]:
    """The trace files among ``sources``: files as given; directories expanded to their
    ``*.json`` / ``*.json.gz`` files (or, when none, those one level down); a recperf run
    directory (with ``spec.json``) to its ``rank*.json`` traces. One ConfigError when a path
    is missing or nothing is found."""
    found: list[Path] = []
    for src in sources:
        check_input(src, "--traces", want="any")
        if src.is_dir():
            files = _dir_traces(src)
            if not files:
                files = [p for d in sorted(src.iterdir()) if d.is_dir() for p in _dir_traces(d)]
            found += files
        elif src.is_file():
            found.append(src)
        else:
            raise ConfigError(f"--traces {src}: no such file or directory")
    if not found:
        where = ", ".join(map(str, sources)) or "(none given)"
        raise ConfigError(f"--traces {where}: no trace files (*.json, *.json.gz) found")
    return list(dict.fromkeys(found))


def _dir_traces(d: Path) -> list[Path]:
    def natural(p: Path) -> list[Any]:
        return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", p.name)]

    files = [p for p in d.iterdir() if p.is_file() and p.name.endswith(SUFFIXES)]
    if (d / "spec.json").is_file():  # a recperf run: its own rank traces
        files = [p for p in files if re.fullmatch(r"rank\d+\.json", p.name)]
    return sorted((p for p in files if p.name not in NOT_TRACES), key=natural)


def read_trace(path: Path) -> dict[str, Any]:
    """One trace file as a JSON object (gzip recognised by its magic bytes)."""
    check_input(path, "trace", max_bytes=TRACE_MAX_BYTES)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except (OSError, ValueError, EOFError) as exc:  # bad gzip, bad UTF-8, bad JSON
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"{path}: not a torch.profiler trace: {why}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ConfigError(f"{path}: not a torch.profiler trace: no 'traceEvents' list")
    return data
