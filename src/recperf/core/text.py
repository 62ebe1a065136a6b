"""Reading the text files users hand us (traces, cluster and config TOML, JSON): UTF-8, with the
byte-order mark that spreadsheet exports write at the start dropped here, in one place."""

from __future__ import annotations

from pathlib import Path

BOM = "\ufeff"


def read_utf8(path: Path) -> str:
    """The file's text, decoded as UTF-8 without a leading byte-order mark. Raises what
    ``Path.read_text`` raises (OSError, UnicodeDecodeError): each caller words its own error."""
    return path.read_text(encoding="utf-8").removeprefix(BOM)
