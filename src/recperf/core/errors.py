"""The error hierarchy: anything a user can cause raises a RecperfError with a one-line message."""

from __future__ import annotations

from pathlib import Path


class RecperfError(Exception):
    """An error caused by input or environment; the CLI prints it on one line and exits 2."""


class ConfigError(RecperfError):
    """A configuration value is missing, of the wrong type or out of range."""


class InputFileError(ConfigError):
    """An input path that is not a readable regular file (or directory) of a sensible size."""


class OutputError(RecperfError):
    """A result cannot be written (a full disk, a read-only file system) or its directory is
    being written by another run."""


class RegistryError(RecperfError):
    """A name or ``module:attr`` reference that does not resolve to a registered plug-in."""


class TraceFormatError(RecperfError):
    """A malformed input trace; names the file, the line (1-based) and the field."""

    def __init__(self, file: str | Path, line: int | None, field: str | None, why: str) -> None:
        self.file = str(file)
        self.line = line
        self.field = field
        self.why = why
        where = self.file if line is None else f"{self.file}:{line}"
        what = f" field {field!r}" if field else ""
        super().__init__(f"{where}:{what} {why}")


class SimulationError(RecperfError):
    """A simulation cannot go on (e.g. jobs wait but no policy will ever start them)."""


class ContractError(RecperfError):
    """A plug-in broke its Protocol's contract (raised by the conformance checks)."""
