"""Reading the text files users hand us (traces, cluster and config TOML, JSON): UTF-8, with the
byte-order mark that spreadsheet exports write at the start dropped here, in one place."""

from __future__ import annotations

from pathlib import Path

BOM = "\ufeff"
UTF8_BOM_OPTIONAL = "utf-8-sig"
"""The codec for a text stream (``open(path, encoding=UTF8_BOM_OPTIONAL)``): UTF-8 that drops one
leading byte-order mark, for readers that stream (csv) rather than take the whole text."""


def read_utf8(path: Path) -> str:
    """The file's text, decoded as UTF-8 without a leading byte-order mark. Raises what
    ``Path.read_text`` raises (OSError, UnicodeDecodeError): each caller words its own error."""
    return path.read_text(encoding="utf-8").removeprefix(BOM)
