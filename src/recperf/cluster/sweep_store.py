"""Where a sweep keeps each run as it finishes: one Parquet file per run under ``OUT/runs/``,
named by a hash of the run's keys and written atomically (a temporary name, fsync, rename), next
to the sweep's definition and its digest. An interrupted sweep so keeps its finished runs, a
resumed one runs only the rest, and the final tables are always built from these files."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from recperf.cluster.sweep_backends import RUN_KEYS, RunOutcome, SweepRun
from recperf.core.errors import ConfigError
from recperf.core.results import atomic_path, dumps_json, write_json

RUNS_DIR = "runs"
SPEC_FILE = "sweep-spec.json"
ROW_KEY = b"recperf.sweep.row"
"""Schema metadata of a run file: the run's row as JSON (NaN kept, floats exact)."""
DIGEST_KEY = b"recperf.sweep.digest"
"""Schema metadata of a run file: the digest of the sweep it belongs to."""
SHOWN_CHARS = 60


def spec_digest(spec: Mapping[str, Any]) -> str:
    """The SHA-256 of a sweep's definition in its canonical JSON."""
    return hashlib.sha256(dumps_json(spec).encode()).hexdigest()


def run_file_name(run: SweepRun) -> str:
    """``<hash of the run's keys>.parquet``: the same run keeps its name across invocations."""
    keys = json.dumps(run.keys(), sort_keys=True)
    return f"{hashlib.sha256(keys.encode()).hexdigest()[:20]}.parquet"


@dataclass(frozen=True)
class RunStore:
    """The finished runs of one sweep in ``out/runs``; ``spec`` is the sweep's definition (what
    decides its results: traces, schedulers, options, seeds, whether jobs are kept)."""

    out: Path
    spec: Mapping[str, Any]

    @property
    def root(self) -> Path:
        return self.out / RUNS_DIR

    @property
    def digest(self) -> str:
        return spec_digest(self.spec)

    def begin(self, runs: Sequence[SweepRun], resume: bool) -> dict[int, dict[str, Any]]:
        """Check that ``out`` may take this sweep and return the rows of its finished runs by
        index in ``runs``. Runs of another sweep are refused (naming what differs); finished
        runs of this one are refused without ``resume`` (naming it), never overwritten."""
        stored = self._stored_spec()
        if stored is not None and stored.get("digest") != self.digest:
            differs = _first_difference(stored, self.spec)
            raise ConfigError(
                f"--out {self.out} holds runs of another sweep ({differs}); choose another "
                f"--out, or delete {self.root} to start over"
            )
        kept = {i: row for i, run in enumerate(runs) if (row := self._row(run)) is not None}
        if kept and not resume:
            rest = len(runs) - len(kept)
            todo = f"run the other {rest}" if rest else "rebuild the tables from them"
            raise ConfigError(
                f"--out {self.out} already holds {len(kept)} of the {len(runs)} runs of this "
                f"sweep; add --resume to keep them and {todo}, or choose another --out"
            )
        return kept

    def save(self, run: SweepRun, outcome: RunOutcome) -> None:
        """Write one finished run: its jobs (none: no columns) with its row as metadata; the
        first also writes the sweep's definition (so bad input found later leaves nothing)."""
        if not (self.root / SPEC_FILE).is_file():
            write_json(self.root / SPEC_FILE, {"digest": self.digest, "sweep": self.spec})
        table = pa.table(outcome.jobs) if outcome.jobs is not None else pa.table({})
        meta = {ROW_KEY: json.dumps(_plain(outcome.row)).encode(), DIGEST_KEY: self.digest.encode()}
        with atomic_path(self.root / run_file_name(run)) as tmp:
            pq.write_table(table.replace_schema_metadata(meta), tmp)
            fd = os.open(tmp, os.O_RDONLY)
            try:  # on disk before the rename makes it count as finished
                os.fsync(fd)
            finally:
                os.close(fd)

    def load(self, run: SweepRun) -> RunOutcome:
        """A finished run as it was saved."""
        path = self.root / run_file_name(run)
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise self._bad(path, exc) from None
        row = self._check(run, path, table.schema.metadata)
        jobs = {c: table.column(c) for c in table.column_names} if table.num_columns else None
        return RunOutcome(row, jobs)

    def kept(self, runs: Sequence[SweepRun]) -> int:
        """How many of ``runs`` are finished on disk."""
        return sum((self.root / run_file_name(r)).is_file() for r in runs)

    def _row(self, run: SweepRun) -> dict[str, Any] | None:
        path = self.root / run_file_name(run)
        if not path.is_file():
            return None
        try:
            meta = pq.read_schema(path).metadata
        except (OSError, pa.ArrowException) as exc:
            raise self._bad(path, exc) from None
        return self._check(run, path, meta)

    def _check(
        self, run: SweepRun, path: Path, meta: Mapping[bytes, bytes] | None
    ) -> dict[str, Any]:
        meta = meta or {}
        if meta.get(DIGEST_KEY) != self.digest.encode() or ROW_KEY not in meta:
            raise self._bad(path, "written by another sweep")
        row = json.loads(meta[ROW_KEY])
        if not isinstance(row, dict) or {k: row.get(k) for k in RUN_KEYS} != run.keys():
            raise self._bad(path, "its keys are not this run's")
        return {str(k): v for k, v in row.items()}

    def _bad(self, path: Path, why: object) -> ConfigError:
        return ConfigError(f"{path}: not a finished run of this sweep ({why}); delete it to rerun")

    def _stored_spec(self) -> dict[str, Any] | None:
        path = self.root / SPEC_FILE
        if not path.is_file():
            if self.root.is_dir() and any(p.suffix == ".parquet" for p in self.root.iterdir()):
                raise ConfigError(f"{self.root} holds runs but no {SPEC_FILE}; delete it")
            return None
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"{path}: unreadable ({exc}); delete {self.root}") from None
        if not isinstance(stored, dict):
            raise ConfigError(f"{path}: not a sweep definition; delete {self.root}")
        return stored


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    """numpy scalars as Python ones, for json (which keeps NaN and every float's bits)."""
    return {k: v.item() if hasattr(v, "item") and callable(v.item) else v for k, v in row.items()}


def _first_difference(stored: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    """``seeds: [0, 1, 2] there, [0, 1] here``: the first field that differs."""
    there, here = json.loads(dumps_json(stored.get("sweep", {}))), json.loads(dumps_json(spec))
    path: list[str] = []
    while isinstance(there, dict) and isinstance(here, dict):
        key = next((k for k in sorted({*there, *here}) if there.get(k) != here.get(k)), None)
        if key is None:
            return "its definition file differs"
        path.append(key)
        there, here = there.get(key), here.get(key)
    return f"{'.'.join(path)}: {_short(there)} there, {_short(here)} here"


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."
