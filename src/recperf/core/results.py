"""Result writers: write to a temporary name and rename, so a failed run never looks complete."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp_path = Path(tmp)
    try:  # also on KeyboardInterrupt (Ctrl-C, or SIGTERM as the CLI turns it into one)
        os.close(fd)
        yield tmp_path
        # mkstemp makes the file private; give the result the mode a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        os.replace(tmp_path, target)
    finally:
        tmp_path.unlink(missing_ok=True)


def _clean(obj: Any) -> Any:
    """Make values JSON-safe and stable: NaN/inf become null, numpy scalars become Python."""
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def dumps_json(data: Mapping[str, Any]) -> str:
    """Deterministic JSON: sorted keys, fixed indentation, trailing newline."""
    return json.dumps(_clean(data), indent=2, sort_keys=True) + "\n"


def write_json(path: str | Path, data: Mapping[str, Any]) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(dumps_json(data), encoding="utf-8")
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_files(directory: str | Path, texts: Mapping[str, str]) -> list[Path]:
    """Write several text files as a set: every one goes to a temporary name first and only
    when all are written (a full disk fails here) are they renamed into place, so a failure
    leaves the previous set or none, never a part of the new one."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []
    try:
        for name, text in texts.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out)
            staged.append((Path(tmp), out / name))
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
        umask = os.umask(0)
        os.umask(umask)
        for tmp_path, target in staged:
            os.chmod(tmp_path, 0o666 & ~umask)
            os.replace(tmp_path, target)
    finally:
        for tmp_path, _ in staged:
            tmp_path.unlink(missing_ok=True)
    return [target for _, target in staged]


def write_parquet(path: str | Path, columns: Mapping[str, Any]) -> Path:
    """Write a column mapping (numpy arrays or lists) as one Parquet table."""
    table = pa.table(dict(columns))
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return Path(path)
