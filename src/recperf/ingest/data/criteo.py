"""Criteo-format training data: a seeded synthetic generator (Parquet or TSV shards plus a
manifest) and streaming readers for those shards and for real Criteo Kaggle/Terabyte day files."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from recperf.core import exact
from recperf.core.config import check_range, check_seed
from recperf.core.errors import ConfigError, TraceFormatError
from recperf.core.files import DATA_MAX_BYTES, check_input, check_name
from recperf.core.progress import ProgressFn
from recperf.core.results import atomic_path, exclusive_dir, write_json
from recperf.ingest.data.limits import FORMATS, MAX_ROWS

INT_FEATURES = tuple(f"I{i}" for i in range(1, 14))
CAT_FEATURES = tuple(f"C{i}" for i in range(1, 27))
COLUMNS = ("label", *INT_FEATURES, *CAT_FEATURES)
SCHEMA = pa.schema(
    [pa.field("label", pa.int8())]
    + [pa.field(n, pa.int64()) for n in INT_FEATURES]
    + [pa.field(n, pa.string()) for n in CAT_FEATURES]
)
"""The one schema every reader yields: label int8 (0/1), I1..I13 int64, C1..C26 string."""

# Distinct values per categorical feature in the Criteo Kaggle display-advertising set.
CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
    14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
LABEL_RATE = 0.256
"""Share of positive (clicked) rows in Criteo Kaggle."""

# Missing-value rates, approximations of the public Criteo Kaggle train.txt statistics. In the
# real data these features go missing together (e.g. C19/C20/C25/C26 are empty on the same
# ~44% of rows), so each group shares one draw; features not listed are never empty.
MISSING_GROUPS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("I1", "I10"), 0.454),
    (("I3",), 0.215),
    (("I4", "I6", "I13"), 0.224),
    (("I5",), 0.026),
    (("I7", "I9", "I11"), 0.043),
    (("I8",), 0.0005),
    (("I12",), 0.765),
    (("C3", "C4", "C12", "C16", "C21", "C24"), 0.034),
    (("C6",), 0.121),
    (("C19", "C20", "C25", "C26"), 0.440),
    (("C22",), 0.762),
)
# Integer counts: floor(expm1(Normal(mu, sigma))) clipped at 0, a heavy tail with many zeros;
# (mu, sigma) chosen so medians roughly match Criteo's (I5 in the thousands, I10-I12 near 0).
INT_LOGNORMAL = (
    (0.7, 1.0), (1.5, 1.6), (2.2, 1.4), (1.8, 0.9), (7.5, 2.0), (3.3, 1.7), (1.6, 1.3),
    (2.4, 0.9), (3.8, 1.4), (0.5, 0.6), (1.0, 0.9), (0.3, 0.9), (1.8, 0.9),
)  # fmt: skip
I2_OFFSET = -1
"""I2 is the one integer feature with negative values in Criteo (-1 is common)."""
BLOCK_ROWS = 65_536
"""Rows drawn per RNG block; block b uses rng([seed, b]), so row i never depends on shards."""
_M32 = np.uint64(0xFFFFFFFF)
_HEX = np.frombuffer(b"".join(f"{i:02x}".encode() for i in range(256)), np.uint16)
MAX_SHARDS = 100_000
MIN_BYTES_PER_ROW = {"parquet": 12, "tsv": 200, "tsv.gz": 12}
"""Fewest bytes a generated row takes on disk per format (measured: 16, 243, 16 at the most
skewed ids, zipf_exponent 10; 70-95, 243 at the default): the free-space check's lower bound."""
_SHARD_RE = re.compile(r"^part-\d{5}\.(parquet|tsv|tsv\.gz)$")
_TMP_SHARD_RE = re.compile(r"^\.part-\d{5}\.(parquet|tsv|tsv\.gz)\.(\d+\.)?\w+\.tmp$")
"""A shard being written (atomic_path's name, with the writer's pid); one left by a killed run
is removed (a live run holds ``out`` with ``exclusive_dir``, so none is another's)."""


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class GenerateConfig:
    """What ``generate`` writes."""

    rows: int
    """Total rows over all shards (1..MAX_ROWS, 10**10)."""
    shards: int = 1
    """Number of output files; rows are split as evenly as possible, in order."""
    seed: int = 0
    """Same seed, rows and shards give byte-identical files."""
    format: str = "parquet"
    """parquet or tsv (Criteo's own layout: 40 tab-separated fields, no header)."""
    gzip: bool = False
    """TSV only: gzip each shard (part-00000.tsv.gz)."""
    zipf_exponent: float = 1.1
    """Exponent of the bounded power law over each categorical feature's ids."""

    def __post_init__(self) -> None:
        check_range("rows", self.rows, 1, MAX_ROWS)
        check_range("shards", self.shards, 1, min(self.rows, MAX_SHARDS))
        check_seed(self.seed)
        check_range("zipf_exponent", self.zipf_exponent, 0.0, 10.0, lo_open=True)
        if self.format not in FORMATS:
            raise ConfigError(f"format = {self.format!r} is not one of {', '.join(FORMATS)}")
        if self.gzip and self.format != "tsv":
            raise ConfigError("gzip only applies to format tsv")

    def shard_name(self, k: int) -> str:
        ext = "parquet" if self.format == "parquet" else "tsv.gz" if self.gzip else "tsv"
        return f"part-{k:05d}.{ext}"

    def shard_bounds(self, k: int) -> tuple[int, int]:
        """Rows [start, stop) of the stream that shard k holds."""
        return k * self.rows // self.shards, (k + 1) * self.rows // self.shards


def check_free_space(config: GenerateConfig, out: str | Path) -> None:
    """Refuse up front when ``out``'s file system cannot hold the shards even at their smallest
    (``MIN_BYTES_PER_ROW``), rather than fill the disk hours later."""
    where = Path(out).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    ext = config.shard_name(0).partition(".")[2]
    need = config.rows * MIN_BYTES_PER_ROW[ext]
    free = shutil.disk_usage(where).free
    if need > free:
        raise ConfigError(
            f"rows = {config.rows:,} needs at least {need / 2**30:,.1f} GiB of {ext} shards in "
            f"{out}, which has {free / 2**30:,.1f} GiB free"
        )


def zipf_ids(rng: np.random.Generator, n: int, cardinality: int, exponent: float) -> np.ndarray:
    """``n`` ids in [0, cardinality), id 0 the most frequent: inverse CDF of the continuous
    density ~ (x + 1) ** -exponent on [0, cardinality), floored (a bounded Zipf-like law)."""
    u = rng.random(n)
    s = 1.0 - exponent
    if abs(s) < 1e-9:
        x = exact.exp(u * exact.log1(cardinality + 1.0)) - 1.0
    else:
        top = float(exact.power(cardinality + 1.0, s)) - 1.0
        x = exact.power(u * top + 1.0, 1.0 / s) - 1.0
    ids: np.ndarray = np.minimum(x.astype(np.int64), cardinality - 1)
    return ids


def scramble(ids: np.ndarray, feature: int) -> np.ndarray:
    """A fixed bijection on 32-bit values, different per feature (xor, odd multiply, xorshift
    steps are each invertible), so ids map to distinct, unrelated-looking values."""
    x = ids.astype(np.uint64) & _M32
    x ^= np.uint64((0x85EBCA6B * (feature + 1)) & 0xFFFFFFFF)
    x = (x * np.uint64((0x9E3779B1 + 2 * feature) | 1)) & _M32
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x2C1B3C6D)) & _M32
    x ^= x >> np.uint64(12)
    return x.astype(np.uint32)


def hex_strings(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """uint32 values as 8-digit lowercase hex strings, built as Arrow buffers (no Python loop)."""
    n = len(values)
    chars = np.take(_HEX, values.astype(">u4").view(np.uint8))  # two hex digits per byte
    offsets = np.arange(0, 8 * n + 1, 8, dtype=np.int32)
    bitmap, nulls = None, 0
    if valid is not None:
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
        nulls = int(n - np.count_nonzero(valid))
    buffers = [bitmap, pa.py_buffer(offsets), pa.py_buffer(chars)]
    return pa.Array.from_buffers(pa.string(), n, buffers, null_count=nulls)


def _block(seed: int, index: int, exponent: float) -> pa.RecordBatch:
    """The BLOCK_ROWS rows of RNG block ``index``; draws happen in a fixed order."""
    rng = np.random.default_rng([seed, index])
    n = BLOCK_ROWS
    label = (rng.random(n) < LABEL_RATE).astype(np.int8)
    present: dict[str, np.ndarray] = {}
    for names, rate in MISSING_GROUPS:
        keep = rng.random(n) >= rate
        present.update(dict.fromkeys(names, keep))
    arrays: list[pa.Array] = [pa.array(label)]
    for i, (name, (mu, sigma)) in enumerate(zip(INT_FEATURES, INT_LOGNORMAL, strict=True)):
        vals = np.floor(exact.exp(np.minimum(exact.normal(rng, mu, sigma, n), 40.0)) - 1.0)
        vals = np.clip(vals, 0, 2**40).astype(np.int64) + (I2_OFFSET if i == 1 else 0)
        mask = present.get(name)
        arrays.append(pa.array(vals, mask=None if mask is None else ~mask))
    for f, (name, card) in enumerate(zip(CAT_FEATURES, CARDINALITIES, strict=True)):
        ids = zipf_ids(rng, n, card, exponent)
        arrays.append(hex_strings(scramble(ids, f), present.get(name)))
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


def generate_batches(config: GenerateConfig, start: int, stop: int) -> Iterator[pa.RecordBatch]:
    """Rows [start, stop) of the seeded stream, in batches of at most BLOCK_ROWS rows."""
    pos = start
    while pos < stop:
        index, offset = divmod(pos, BLOCK_ROWS)
        take = min(BLOCK_ROWS - offset, stop - pos)
        yield _block(config.seed, index, config.zipf_exponent).slice(offset, take)
        pos += take


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _write_shard(config: GenerateConfig, batches: Iterable[pa.RecordBatch], tmp: Path) -> None:
    if config.format == "parquet":
        with pq.ParquetWriter(tmp, SCHEMA) as writer:
            for batch in batches:
                writer.write_batch(batch)
        return
    options = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    with pa.OSFile(str(tmp), "wb") as raw:
        sink = pa.CompressedOutputStream(raw, "gzip") if config.gzip else raw
        with pcsv.CSVWriter(sink, SCHEMA, write_options=options) as writer:
            for batch in batches:
                writer.write_batch(batch)
        if config.gzip:
            sink.close()


def manifest_base(config: GenerateConfig) -> dict[str, Any]:
    """Everything in manifest.json except the per-shard entries."""
    return {
        "format": config.format,
        "gzip": config.gzip,
        "rows": config.rows,
        "seed": config.seed,
        "zipf_exponent": config.zipf_exponent,
        "label_rate": LABEL_RATE,
        "schema": [{"name": f.name, "type": str(f.type)} for f in SCHEMA],
        "cardinalities": dict(zip(CAT_FEATURES, CARDINALITIES, strict=True)),
        "missing_rates": {n: rate for names, rate in MISSING_GROUPS for n in names},
        "generator": "recperf.ingest.data.criteo",
    }


def generate(
    config: GenerateConfig, out: str | Path, progress: ProgressFn | None = None
) -> dict[str, Any]:
    """Write the shards, then manifest.json last; returns the manifest. Any manifest and shards
    (``part-NNNNN.*``) already in ``out`` are removed first so a crash never looks complete."""
    out = Path(out)
    check_free_space(config, out)
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_dir(out):
        return _generate(config, out, progress)


def _generate(config: GenerateConfig, out: Path, progress: ProgressFn | None) -> dict[str, Any]:
    (out / "manifest.json").unlink(missing_ok=True)
    for old in out.iterdir():
        if _SHARD_RE.match(old.name) or _TMP_SHARD_RE.match(old.name):
            old.unlink()
    shards: list[dict[str, Any]] = []
    done = 0
    for k in range(config.shards):
        start, stop = config.shard_bounds(k)

        def counted(start: int = start, stop: int = stop) -> Iterator[pa.RecordBatch]:
            nonlocal done
            for batch in generate_batches(config, start, stop):
                yield batch
                done += batch.num_rows
                if progress is not None:
                    progress(done / config.rows)

        path = out / config.shard_name(k)
        with atomic_path(path) as tmp:
            _write_shard(config, counted(), tmp)
        shards.append(
            {"file": path.name, "rows": stop - start, "bytes": path.stat().st_size,
             "sha256": _sha256(path)}
        )  # fmt: skip
    manifest = {**manifest_base(config), "shards": shards}
    write_json(out / "manifest.json", manifest)
    return manifest


# ----------------------------------------------------------------------------------- readers


def _files(path: Path) -> list[Path]:
    if not os.path.lexists(check_name(path, "--data")):
        raise TraceFormatError(path, None, None, "no such file or directory")
    check_input(path, "--data", max_bytes=DATA_MAX_BYTES, want="any")
    if not path.is_dir():
        return [path]
    return _shards(path)


_SHARD_SUFFIXES = (".parquet", ".tsv", ".tsv.gz", ".txt", ".txt.gz")


def _shards(directory: Path) -> list[Path]:
    """The data files of ``directory``, one format: a shard name that is a dangling link, or
    Parquet mixed with text shards (often the same rows twice), is one error naming the files."""
    named = sorted(
        p for p in directory.iterdir()
        if not p.name.startswith(".") and p.name.endswith(_SHARD_SUFFIXES)
    )  # fmt: skip
    dangling = [p for p in named if p.is_symlink() and not p.exists()]
    if dangling:
        why = f"a symbolic link to {str(dangling[0].readlink())!r}, which does not exist"
        raise TraceFormatError(dangling[0], None, None, why)
    files = [p for p in named if p.is_file()]
    if not files:
        why = "no .parquet, .tsv or .txt files in directory"
        raise TraceFormatError(directory, None, None, why)
    parquet = [p for p in files if p.name.endswith(".parquet")]
    text = [p for p in files if not p.name.endswith(".parquet")]
    if parquet and text:
        why = (
            f"mixes Parquet shards ({parquet[0].name}) and text shards ({text[0].name}); "
            "keep one format per directory"
        )
        raise TraceFormatError(directory, None, None, why)
    return files


def _open_binary(path: Path) -> IO[bytes]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]  # GzipFile is an IO[bytes]
    return path.open("rb")


_INT_RE = re.compile(rb"^[+-]?\d+$")


def _check_line(parts: list[bytes]) -> tuple[str | None, str] | None:
    """(field, why) for a malformed Criteo row, or None if it is well formed."""
    if len(parts) != len(COLUMNS):
        field = COLUMNS[len(parts)] if len(parts) < len(COLUMNS) else None
        return field, f"expected {len(COLUMNS)} tab-separated fields, got {len(parts)}"
    if parts[0] not in (b"0", b"1"):
        return "label", f"label must be 0 or 1, got {parts[0].decode(errors='replace')!r}"
    for name, raw in zip(INT_FEATURES, parts[1:14], strict=True):
        if raw and (not _INT_RE.match(raw) or abs(int(raw)) >= 2**63):
            return name, f"not an integer: {raw.decode(errors='replace')!r}"
    return None


def _locate_error(path: Path, skip_rows: int, arrow_msg: str) -> TraceFormatError:
    """Scan the file for the first malformed row after ``skip_rows`` good ones; pyarrow's
    streaming reader does not always report the line."""
    rows = 0
    with _open_binary(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.rstrip(b"\r\n")
            if not line:
                continue  # pyarrow skips empty lines too
            rows += 1
            if rows <= skip_rows:
                continue
            bad = _check_line(line.split(b"\t"))
            if bad is not None:
                return TraceFormatError(path, lineno, bad[0], bad[1])
    first = arrow_msg.strip().splitlines()[0] if arrow_msg.strip() else "unreadable"
    return TraceFormatError(path, None, None, first)


def _check_labels(batch: pa.RecordBatch) -> bool:
    label = batch.column(0)
    if label.null_count:
        return False
    lo_hi = pc.min_max(label)
    return batch.num_rows == 0 or bool(lo_hi["min"].as_py() >= 0 and lo_hi["max"].as_py() <= 1)


def _tsv_batches(path: Path, block_bytes: int) -> Iterator[pa.RecordBatch]:
    read = pcsv.ReadOptions(column_names=list(COLUMNS), block_size=block_bytes)
    parse = pcsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False)
    convert = pcsv.ConvertOptions(
        column_types=SCHEMA, null_values=[""], strings_can_be_null=True, check_utf8=False
    )
    seen = 0
    try:
        stream = pa.input_stream(str(path), compression="detect")
        with pcsv.open_csv(stream, read, parse, convert) as reader:
            for batch in reader:
                if not _check_labels(batch):
                    raise _locate_error(path, seen, "label must be 0 or 1")
                seen += batch.num_rows
                yield batch
    except pa.ArrowInvalid as exc:
        raise _locate_error(path, seen, str(exc)) from None


def open_parquet(path: Path) -> pq.ParquetFile:
    """A Parquet file that has every Criteo column (else a TraceFormatError naming it)."""
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceFormatError(path, None, None, f"not a Parquet file: {exc}") from None
    missing = [c for c in COLUMNS if c not in pf.schema_arrow.names]
    if missing:
        raise TraceFormatError(path, None, missing[0], "column missing from the Parquet file")
    return pf


def _parquet_batches(path: Path, batch_rows: int) -> Iterator[pa.RecordBatch]:
    pf = open_parquet(path)
    for batch in pf.iter_batches(batch_size=batch_rows, columns=list(COLUMNS)):
        try:
            cast = pa.RecordBatch.from_arrays(
                [batch.column(i).cast(f.type) for i, f in enumerate(SCHEMA)], schema=SCHEMA
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            why = f"cannot cast to the Criteo schema: {exc}"
            raise TraceFormatError(path, None, None, why) from None
        if not _check_labels(cast):
            raise TraceFormatError(path, None, "label", "label must be 0 or 1")
        yield cast


def _rebatch(batches: Iterable[pa.RecordBatch], n: int) -> Iterator[pa.RecordBatch]:
    """Exactly ``n`` rows per batch (the last may be shorter), across file boundaries."""
    pending: list[pa.RecordBatch] = []
    have = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if not pending and batch.num_rows == n:
            yield batch
            continue
        pending.append(batch)
        have += batch.num_rows
        if have >= n:
            merged = pa.Table.from_batches(pending, schema=SCHEMA).combine_chunks().to_batches()[0]
            full = have - have % n
            for off in range(0, full, n):
                yield merged.slice(off, n)
            pending = [merged.slice(full)] if have > full else []
            have -= full
    if have:
        yield pa.Table.from_batches(pending, schema=SCHEMA).combine_chunks().to_batches()[0]


def read_batches(path: str | Path, batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """Stream Criteo rows as RecordBatches with ``SCHEMA``, ``batch_rows`` rows each (the last
    may be shorter), from a Parquet file, a Criteo TSV file (``.gz`` too) or a directory of
    shards (read in name order). A malformed TSV row raises TraceFormatError with file and line."""
    if batch_rows < 1:
        raise ConfigError(f"batch_rows = {batch_rows} is outside the allowed range [1, inf]")

    def raw() -> Iterator[pa.RecordBatch]:
        for f in _files(Path(path)):
            if f.name.endswith(".parquet"):
                yield from _parquet_batches(f, batch_rows)
            else:
                yield from _tsv_batches(f, max(1 << 20, min(batch_rows * 256, 64 << 20)))

    return _rebatch(raw(), batch_rows)


def read_table(path: str | Path) -> pa.Table:
    """All rows of ``path`` as one Table (for small data; stream big data with read_batches)."""
    return pa.Table.from_batches(list(read_batches(path)), schema=SCHEMA)


def count_rows(path: str | Path) -> int:
    """Rows in a file or directory: Parquet from its metadata, TSV by counting lines (Criteo
    files have no blank lines; a last line without a newline counts)."""
    total = 0
    for f in _files(Path(path)):
        if f.name.endswith(".parquet"):
            total += pq.ParquetFile(f).metadata.num_rows
            continue
        last = b"\n"
        with _open_binary(f) as fh:
            while chunk := fh.read(1 << 22):
                total += chunk.count(b"\n")
                last = chunk[-1:]
        total += last != b"\n"
    return total
