"""Result writers: write to a temporary name and rename, so a failed run never looks complete."""

from __future__ import annotations

import fcntl
import json
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from recperf.core.errors import OutputError
from recperf.core.files import why


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` if the block succeeds.
    The temporary name holds this process's id and a random part, so runs never share one;
    an OSError (a full disk, a read-only file system) is one OutputError naming ``path``."""
    target = Path(path)
    tmp_path: Path | None = None
    try:  # also on KeyboardInterrupt (Ctrl-C, or SIGTERM as the CLI turns it into one)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target.name), suffix=".tmp",
                                   dir=target.parent)  # fmt: skip
        tmp_path = Path(tmp)
        os.close(fd)
        yield tmp_path
        # mkstemp makes the file private; give the result the mode a plain open() would.
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, target)
    except OSError as exc:
        raise OutputError(f"{target}: cannot write: {_write_why(exc)}") from None
    finally:
        if tmp_path is not None:
            tmp_path.unlink(missing_ok=True)


def temp_prefix(name: str) -> str:
    """The start of a temporary file's name for result ``name``: ``.NAME.PID.``."""
    return f".{name}.{os.getpid()}."


@contextmanager
def exclusive_dir(directory: str | Path, what: str = "--out") -> Iterator[None]:
    """Hold ``directory`` (an advisory lock on the directory itself, so nothing is left in it)
    while the block writes there; a second run into the same directory meanwhile is refused
    with one line instead of each removing the other's files."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(
                f"{what} {directory}: another run is writing into this directory; wait for it "
                "to finish or choose another"
            ) from None
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _write_why(exc: OSError) -> str:
    """The errno's text (pyarrow's write errors carry the errno but a long message)."""
    return os.strerror(exc.errno).lower() if exc.errno else why(exc)


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
    staged: list[tuple[Path, Path]] = []
    current = out
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            current = out / name
            fd, tmp = tempfile.mkstemp(prefix=temp_prefix(name), suffix=".tmp", dir=out)
            staged.append((Path(tmp), out / name))
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
        umask = _umask()
        for tmp_path, target in staged:
            os.chmod(tmp_path, 0o666 & ~umask)
            os.replace(tmp_path, target)
    except OSError as exc:
        raise OutputError(f"{current}: cannot write: {_write_why(exc)}") from None
    finally:
        for tmp_path, _ in staged:
            tmp_path.unlink(missing_ok=True)
    return [target for _, target in staged]


def write_parquet(path: str | Path, columns: Mapping[str, Any]) -> Path:
    """Write a column mapping (numpy arrays or lists) as one Parquet table."""
    import pyarrow as pa  # here, not at the top: a command that writes no Parquet needs none
    import pyarrow.parquet as pq

    table = pa.table(dict(columns))
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return Path(path)
