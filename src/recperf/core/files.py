"""Every input path is checked here before anything opens it: it must be a regular file (or a
directory where one is asked for) no larger than its kind's limit, so a FIFO, a device such as
``/dev/zero``, an overlong name or an unreadable path is one line instead of a hang, a read until
the machine runs out of memory, or a traceback."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal

from recperf.core.errors import InputFileError

MiB = 1 << 20
GiB = 1 << 30
NAME_MAX = 255
"""The longest file-name component (in bytes) the usual Linux file systems accept."""

CONFIG_MAX_BYTES = 64 * MiB
"""TOML and JSON configs, specs, fitted models, cluster descriptions, cloud catalogs."""
TRACE_MAX_BYTES = 8 * GiB
"""Job traces, Kineto traces and embedding traces, which are read whole into memory."""
DATA_MAX_BYTES: int | None = None
"""Dataset shards, which are streamed: any size."""

Want = Literal["file", "dir", "any"]

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def check_name(path: str | Path, what: str) -> Path:
    """``path`` as a Path, refused when one of its components is longer than the file system
    takes (the kernel's ENAMETOOLONG, caught before any system call sees it)."""
    p = Path(path)
    for part in p.parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            raise InputFileError(
                f"{what} {_short(p)}: a path component is {size} bytes, over the file "
                f"system's limit of {NAME_MAX}"
            )
    return p


def check_input(
    path: str | Path, what: str, *, max_bytes: int | None = CONFIG_MAX_BYTES, want: Want = "file"
) -> Path:
    """``path`` checked without opening it (``os.stat`` follows symlinks to what they name):
    a regular file of at most ``max_bytes`` (``want="file"``), a directory (``"dir"``) or
    either (``"any"``). Anything else (a FIFO, a device, a socket, a missing or unreadable
    path) is one :class:`InputFileError` naming ``what`` (the flag), the path and why."""
    p = check_name(path, what)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise InputFileError(f"{what} {_short(p)}: {why(exc)}") from None
    if stat.S_ISDIR(st.st_mode) and want != "file":
        return p
    expected = {"file": "a regular file", "dir": "a directory", "any": "a file or directory"}
    if not stat.S_ISREG(st.st_mode) or want == "dir":
        raise InputFileError(f"{what} {_short(p)}: is {kind_of(st.st_mode)}, not {expected[want]}")
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputFileError(
            f"{what} {_short(p)}: {_size(st.st_size)} is over the {_size(max_bytes)} limit "
            "for this kind of input"
        )
    return p


def check_present(
    path: str | Path, what: str, *, max_bytes: int | None = CONFIG_MAX_BYTES, want: Want = "file"
) -> Path:
    """``check_input`` for a path that exists (or is a dangling link); a missing one is left to
    the caller, whose own message for it (often a format-specific error) stands."""
    p = check_name(path, what)
    return check_input(p, what, max_bytes=max_bytes, want=want) if os.path.lexists(p) else p


def read_input_bytes(path: str | Path, what: str, *, max_bytes: int = CONFIG_MAX_BYTES) -> bytes:
    """The bytes of a checked input file; an OSError while reading is one line too."""
    p = check_input(path, what, max_bytes=max_bytes)
    try:
        return p.read_bytes()
    except OSError as exc:
        raise InputFileError(f"{what} {_short(p)}: cannot read: {why(exc)}") from None


def why(exc: OSError) -> str:
    """An OSError in words for a one-line message: ``no such file or directory``."""
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def kind_of(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words (``a FIFO (named pipe)``)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _size(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def _short(p: Path) -> str:
    """The path for a message: an overlong one cut in the middle, so the line stays a line."""
    text = str(p)
    return text if len(text) <= 120 else f"{text[:50]}...{text[-50:]}"
