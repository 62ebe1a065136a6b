"""Fair peers for the ingestion benchmark, and one harness that measures any of them the same way.

Every peer does the work of recperf's live pipeline on Criteo shards, written the way a careful
user of that framework would write it for speed (pyarrow parsing with every column's type given,
the 8 hex digits of an id decoded as one 64-bit word by vectorised numpy, the framework's own
parallelism; checked equal to a plain-Python reference):
batches of 4096 rows; dense = log1p(max(x, 0)) in float64 with missing -> 0, cast to float32
[n, 13]; sparse id = int(hex, 16) % CARDINALITIES[j], missing -> empty bag; labels float32 [n];
values int64 (feature-major), lengths int32 [26n], offsets int32 [26n + 1]. ``--shuffle``
permutes the rows within windows of 8 consecutive batches (seeded) and the task order per epoch;
``--read-latency-ms`` sleeps that long per 4096-row chunk requested from storage.

Peers (the PEERS registry below; add one there, e.g. recperf's own pipeline):

* ``dataloader``: torch DataLoader over an IterableDataset, the workers run the per-task work;
* ``torchdata_nodes``: torchdata.nodes ParallelMapper (variant ``process`` or ``thread``);
* ``tfdata``: tf.data with AUTOTUNE, the transforms in TensorFlow ops (exact hex decode by byte
  arithmetic on ``tf.io.decode_raw``), converted to torch tensors at the end;
* ``spdl``: SPDL PipelineBuilder (variant ``thread``: stages on threads; ``process``: a
  ``.to(ProcessPoolExecutorConfig)`` region).

The per-task work of the DataLoader, torchdata.nodes and SPDL peers parses with pyarrow (engine
``arrow``, the default and the faster on both formats: read, transform, collate and wrap as torch
on one core, 1.4-1.7 us/row against polars' 1.9-2.2 on TSV and 0.8-0.9 against 1.5-2.0 on
Parquet, interleaved on a loaded 2-core machine); the polars version stays as an engine a variant
names (``thread-polars``, ``process-polars``, the DataLoader's ``polars``), outside the sweep's
grid.

    python benchmarks/ingest_peers.py --check                       # every peer vs a reference
    python benchmarks/ingest_peers.py run --peer dataloader --workers 2 \\
        --data /tmp/peers-data/tsv --format tsv --seconds 10 --warmup-s 3  # one JSON line
    python benchmarks/ingest_peers.py sweep --data-root /tmp/peers-data   # table + JSON

The harness: ``from ingest_peers import measure`` (benchmarks/ on sys.path) measures any iterator
factory: rows/s over a timed window after a warm-up, the CPU cores the process tree used, and its
peak PSS. Each measurement of ``run``/``sweep`` is a fresh subprocess; ``tfdata`` runs under an
interpreter that has TensorFlow (this one, $INGEST_PEERS_TF_PYTHON or /tmp/peers-venv-tf).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from recperf.ingest.data.criteo import CARDINALITIES, COLUMNS

BATCH_ROWS = 4096
WINDOW = 8
"""Batches whose rows the shuffle permutes among themselves; also the TSV task size."""
SEED = 0
IO_CONCURRENCY = 16
"""Storage requests in flight (I/O threads) in the peers that have a separate I/O stage, when a
read latency is emulated: enough that 2 cores, not the waits, are the limit."""
INT_COLS = COLUMNS[1:14]
CAT_COLS = COLUMNS[14:]
CARD = np.asarray(CARDINALITIES, np.int64)
NCPU = len(os.sched_getaffinity(0))
REPO = Path(__file__).resolve().parent.parent
TF_VENV_DEFAULT = Path("/tmp/peers-venv-tf/bin/python")

# ----------------------------------------------------------------------------------- harness

_CLK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, CPU seconds of the process and of its reaped children), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    rest = raw[raw.rindex(b")") + 2 :].split()
    # fields after the comm: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17)
    ticks = int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
    return int(rest[1]), ticks / _CLK


def _tree(root: int) -> dict[int, float]:
    """CPU seconds (own + reaped children) of ``root`` and every live descendant."""
    info: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            info[int(name)] = st
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in info.items():
        kids.setdefault(ppid, []).append(pid)
    out: dict[int, float] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in info and pid not in out:
            out[pid] = info[pid][1]
            todo.extend(kids.get(pid, ()))
    return out


def tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds the process tree of ``root`` (default: this process) has used so far. A child
    that exited and was reaped by a tree member counts through that member's cutime/cstime (the
    same sum RUSAGE_CHILDREN gives), so children that exit inside a window are not lost."""
    return sum(_tree(os.getpid() if root is None else root).values())


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            for line in fh:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def tree_pss_mib(root: int | None = None) -> float:
    """Proportional set size summed over the process tree, MiB."""
    return sum(_pss_kib(p) for p in _tree(os.getpid() if root is None else root)) / 1024.0


class _Sampler(threading.Thread):
    """Samples the tree's PSS every ``period_s`` and keeps the peak and the process count."""

    def __init__(self, period_s: float = 0.2) -> None:
        super().__init__(daemon=True, name="pss-sampler")
        self.period_s = period_s
        self.peak_mib = 0.0
        self.max_procs = 0
        self._stop_ev = threading.Event()

    def sample(self) -> None:
        pids = _tree(os.getpid())
        self.max_procs = max(self.max_procs, len(pids))
        self.peak_mib = max(self.peak_mib, sum(_pss_kib(p) for p in pids) / 1024.0)

    def run(self) -> None:
        while not self._stop_ev.is_set():
            self.sample()
            self._stop_ev.wait(self.period_s)

    def stop(self) -> None:
        self._stop_ev.set()
        self.join()
        self.sample()


def measure(
    make_iter: Callable[[], Iterator[Any]],
    rows_of: Callable[[Any], int],
    seconds: float,
    warmup_s: float,
) -> dict[str, Any]:
    """Build the iterator, consume it for ``warmup_s`` after its first item, then for a timed
    window of ``seconds``; the iterator must not run out (let the data repeat).

    Returns throughput_rows_per_s, rows, batches and wall_s of the window; cores_used (CPU
    seconds of this process and all its descendants during the window / wall, from
    /proc/<pid>/stat utime+stime+cutime+cstime); cores_main (this process alone); peak_pss_mib
    (PSS summed over the process tree, sampled every 0.2 s from the start to the window's end);
    processes (most tree members seen) and startup_s (time to the first item)."""
    sampler = _Sampler()
    sampler.start()
    t_start = time.monotonic()
    it = make_iter()
    next(it)
    startup_s = time.monotonic() - t_start
    end = time.monotonic() + warmup_s
    while time.monotonic() < end:
        next(it)
    main0, cpu0, t0 = time.process_time(), tree_cpu_s(), time.monotonic()
    rows = batches = 0
    while time.monotonic() - t0 < seconds:
        rows += rows_of(next(it))
        batches += 1
    t1 = time.monotonic()
    cpu1, main1 = tree_cpu_s(), time.process_time()
    sampler.stop()
    wall = t1 - t0
    return {
        "throughput_rows_per_s": rows / wall,
        "rows": rows,
        "batches": batches,
        "wall_s": wall,
        "cores_used": (cpu1 - cpu0) / wall,
        "cores_main": (main1 - main0) / wall,
        "peak_pss_mib": sampler.peak_mib,
        "processes": sampler.max_procs,
        "startup_s": startup_s,
    }


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def end_descendants() -> None:
    """SIGKILL every descendant worker of this process (forkserver-started workers outlive an
    ``os._exit`` of their parent). multiprocessing's resource tracker is spared: it exits and
    cleans up by itself once this process is gone (the parent's session clean-up ends it if
    not)."""
    me = os.getpid()
    for p in _tree(me):
        if p != me and b"resource_tracker" not in _cmdline(p):
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)


# -------------------------------------------------------------------------------- data plan


@dataclass(frozen=True, slots=True)
class Task:
    """Consecutive 4096-row chunks of one file, read and parsed together: a TSV byte range of
    (at most) one shuffle window, or one whole Parquet row group (up to two windows)."""

    index: int
    file: str
    kind: str  # "tsv" | "parquet"
    a: int  # TSV: first byte; Parquet: row group
    b: int  # TSV: end byte; Parquet: unused
    sizes: tuple[int, ...]  # rows of each chunk (= one batch each)


def data_files(data: str | Path, fmt: str) -> list[Path]:
    ext = ".parquet" if fmt == "parquet" else ".tsv"
    files = sorted(p for p in Path(data).iterdir() if p.name.endswith(ext))
    if not files:
        raise SystemExit(f"{data}: no *{ext} files")
    return files


def _line_ends(path: Path) -> np.ndarray:
    ends: list[np.ndarray] = []
    pos = 0
    with open(path, "rb") as fh:
        while block := fh.read(16 << 20):
            ends.append(np.flatnonzero(np.frombuffer(block, np.uint8) == 10) + (pos + 1))
            pos += len(block)
    out = np.concatenate(ends) if ends else np.zeros(0, np.int64)
    if pos and (out.size == 0 or out[-1] != pos):
        out = np.append(out, pos)  # last line without a newline
    return out


def _chunk_sizes(n: int) -> list[int]:
    return [min(BATCH_ROWS, n - a) for a in range(0, n, BATCH_ROWS)]


def plan_tasks(data: str | Path, fmt: str) -> list[Task]:
    """The tasks of one epoch in file order (a user's one-off index of the files: line ends of
    the TSV files, row groups of the Parquet files)."""
    tasks: list[Task] = []
    for path in data_files(data, fmt):
        if fmt == "parquet":
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(path).metadata
            for g in range(meta.num_row_groups):
                sizes = tuple(_chunk_sizes(meta.row_group(g).num_rows))
                tasks.append(Task(len(tasks), str(path), "parquet", g, 0, sizes))
            continue
        ends = _line_ends(path)
        start = 0
        step = WINDOW * BATCH_ROWS
        for i in range(0, len(ends), step):
            lines = ends[i : i + step]
            sizes = tuple(_chunk_sizes(len(lines)))
            tasks.append(Task(len(tasks), str(path), "tsv", start, int(lines[-1]), sizes))
            start = int(lines[-1])
    return tasks


def epoch_order(tasks: list[Task], epoch: int, shuffle: bool) -> list[Task]:
    if not shuffle:
        return tasks
    perm = np.random.default_rng([SEED, epoch]).permutation(len(tasks))
    return [tasks[int(i)] for i in perm]


@dataclass(frozen=True, slots=True)
class TaskStream:
    """(task, epoch) pairs, epoch after epoch (``epochs`` None: forever); re-iterable."""

    tasks: tuple[Task, ...]
    shuffle: bool
    epochs: int | None
    worker: int = 0
    workers: int = 1

    def __iter__(self) -> Iterator[tuple[Task, int]]:
        epoch = 0
        while self.epochs is None or epoch < self.epochs:
            order = epoch_order(list(self.tasks), epoch, self.shuffle)
            for t in order[self.worker :: self.workers]:
                yield t, epoch
            epoch += 1


# ---------------------------------------------------------------------- the per-task work
# What a careful user writes once for speed and hands to whichever framework runs it. The
# default engine, "arrow": pyarrow parses (csv.read_csv with every column's type given and the
# categoricals as 8-byte fixed-size binary; a Parquet row group with the categoricals read as
# dictionaries), numpy decodes the 8 hex digits of an id as one 64-bit word (ASCII digit ->
# nibble, then the nibbles joined by shifts), all of it outside the GIL for the most part. The
# "polars" engine (variant suffix ``-polars``) is the earlier version: polars parses.

ENGINES = ("arrow", "polars")
_local = threading.local()
_lib_threads_set = False


def _lib_threads() -> int:
    """Threads each polars/pyarrow call may use here (set per worker by the peers)."""
    return int(os.environ.get("INGEST_PEERS_LIB_THREADS", "0")) or NCPU


def _configure_threads() -> None:
    global _lib_threads_set
    if not _lib_threads_set:
        _lib_threads_set = True
        if "INGEST_PEERS_LIB_THREADS" in os.environ:
            import pyarrow as pa

            pa.set_cpu_count(_lib_threads())


def worker_env(workers: int) -> None:
    """Before starting worker processes: give each an equal share of the cores for polars (whose
    pool size is fixed at import, hence the environment) and pyarrow."""
    share = str(max(1, NCPU // max(1, workers)))
    os.environ["POLARS_MAX_THREADS"] = share
    os.environ["INGEST_PEERS_LIB_THREADS"] = share


def thread_env() -> None:
    """Before a peer runs the tasks on threads of this process: the tasks are the parallelism,
    so each library call stays on its calling thread (no second pool to hand work to)."""
    os.environ["POLARS_MAX_THREADS"] = "1"
    os.environ["INGEST_PEERS_LIB_THREADS"] = "1"


def split_variant(variant: str, default: str) -> tuple[str, str]:
    """(mode, engine): ``"thread-polars"`` -> ("thread", "polars"), ``""`` -> (default, "arrow");
    the DataLoader's variants name only the engine (``"polars"``)."""
    mode, _, engine = variant.partition("-")
    if mode in ENGINES and not engine:
        mode, engine = "", mode
    engine = engine or "arrow"
    if engine not in ENGINES:
        raise SystemExit(f"variant {variant!r}: the engine must be one of {', '.join(ENGINES)}")
    return mode or default, engine


def wait_for_storage(item: tuple[Task, int], latency_s: float) -> tuple[Task, int]:
    """The emulated remote read: one request (``latency_s``) per 4096-row chunk of the task."""
    for _ in item[0].sizes:
        time.sleep(latency_s)
    return item


def _parquet_file(path: str, dictionary: bool = False) -> Any:
    """This thread's open ParquetFile (``dictionary``: the categoricals read as dictionaries)."""
    cache = getattr(_local, "pq", None)
    if cache is None:
        cache = _local.pq = {}
    if (path, dictionary) not in cache:
        import pyarrow.parquet as pq

        cats = list(CAT_COLS) if dictionary else None
        cache[(path, dictionary)] = pq.ParquetFile(path, read_dictionary=cats)
    return cache[(path, dictionary)]


def _read_bytes(task: Task) -> bytes:
    with open(task.file, "rb") as fh:
        fh.seek(task.a)
        return fh.read(task.b - task.a)


Columns = tuple[np.ndarray, np.ndarray, np.ndarray]
"""labels float32 [N], dense float32 [N, 13], ids int64 [26, N] (modulo the table size; -1 where
missing)."""


def load_columns(task: Task, engine: str = "arrow") -> Columns:
    """Read the task's rows and transform them (see Columns)."""
    _configure_threads()
    if engine == "arrow":
        try:
            return _load_arrow(task)
        except ValueError:  # a categorical that is not 8 hex digits: the general parser
            pass
    return _load_polars(task)


# --- the arrow engine

_M0F, _M01 = np.uint64(0x0F0F0F0F0F0F0F0F), np.uint64(0x0101010101010101)
_JOIN = (  # (shift, mask): nibbles -> bytes -> 16-bit halves -> the 32-bit value
    (np.uint64(4), np.uint64(0x00FF00FF00FF00FF)),
    (np.uint64(8), np.uint64(0x0000FFFF0000FFFF)),
    (np.uint64(16), np.uint64(0x00000000FFFFFFFF)),
)


def hex8_words(w: np.ndarray) -> np.ndarray:
    """uint64 words, each the 8 ASCII hex digits of one id (either case; first digit in the low
    byte) -> the ids' values, in place: digit & 0xF, plus 9 where bit 6 is set (a-f, A-F), then
    adjacent fields joined, most significant first."""
    t = w >> np.uint64(6)
    t &= _M01
    t *= np.uint64(9)
    w &= _M0F
    w += t
    for shift, mask in _JOIN:
        np.right_shift(w, shift + shift, out=t)  # the next field, down beside this one
        w <<= shift
        w |= t
        w &= mask
    return w


def _mod(ids: np.ndarray, card: int) -> None:
    """ids %= card in place, for ids >= 0 (numpy divides an int64 array by a scalar with
    libdivide, about twice as fast as its remainder)."""
    q = ids // card
    q *= card
    ids -= q


def _valid(buf: Any, offset: int, n: int) -> np.ndarray:
    """An Arrow validity bitmap -> bool [n]."""
    bits = np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little", count=offset + n)
    return bits[offset:].view(bool)


def _fsb_ids(chunk: Any, card: int, out: np.ndarray) -> None:
    """One fixed_size_binary(8) chunk -> ids % card, into ``out`` (-1 where null)."""
    n, off = len(chunk), chunk.offset
    validity, data = chunk.buffers()
    w = out.view(np.uint64)
    np.copyto(w, np.frombuffer(data, np.uint64, count=off + n)[off:])
    hex8_words(w)
    _mod(out, card)
    if chunk.null_count:
        np.putmask(out, ~_valid(validity, off, n), -1)


def _dict_ids(chunk: Any, card: int, out: np.ndarray) -> None:
    """One dictionary<string> chunk -> ids % card, into ``out``: only the dictionary is decoded
    (and -1 appended for the nulls), then gathered by the indices."""
    d = chunk.dictionary
    ends = np.frombuffer(d.buffers()[1], np.int32, count=d.offset + len(d) + 1)[d.offset :]
    if d.null_count or not (np.diff(ends) == 8).all():
        raise ValueError("a categorical is not 8 hex digits")
    table = np.full(len(d) + 1, -1, np.int64)
    if len(d):
        data = np.frombuffer(d.buffers()[2], np.uint64, count=len(d), offset=int(ends[0]))
        np.copyto(table[:-1].view(np.uint64), data)
        hex8_words(table[:-1].view(np.uint64))
        _mod(table[:-1], card)
    idx = chunk.indices
    n, off = len(idx), idx.offset
    pos = np.frombuffer(idx.buffers()[1], idx.type.to_pandas_dtype(), count=off + n)[off:]
    if chunk.null_count:
        pos = np.where(_valid(idx.buffers()[0], off, n), pos, len(d))
    np.take(table, pos, out=out)


def _arrow_tsv(raw: bytes) -> Any:
    import pyarrow as pa
    import pyarrow.csv as pv

    opts = getattr(_local, "csv", None)
    if opts is None:
        types = {"label": pa.int8(), **dict.fromkeys(INT_COLS, pa.int64())}
        types.update(dict.fromkeys(CAT_COLS, pa.binary(8)))  # 8 hex digits, or null if empty
        opts = _local.csv = (
            pv.ParseOptions(delimiter="\t", quote_char=False),
            pv.ConvertOptions(column_types=types, strings_can_be_null=True, null_values=[""]),
        )
    ro = pv.ReadOptions(  # one block: one chunk per column
        column_names=list(COLUMNS), use_threads=_lib_threads() > 1, block_size=len(raw) + 1
    )
    return pv.read_csv(pa.py_buffer(raw), read_options=ro, parse_options=opts[0],
                       convert_options=opts[1])  # fmt: skip


def _load_arrow(task: Task) -> Columns:
    import pyarrow.compute as pc

    if task.kind == "tsv":
        table, cat_ids = _arrow_tsv(_read_bytes(task)), _fsb_ids
    else:
        pf = _parquet_file(task.file, dictionary=True)
        table = pf.read_row_group(task.a, columns=list(COLUMNS), use_threads=_lib_threads() > 1)
        cat_ids = _dict_ids
    n = table.num_rows
    labels = table.column("label").to_numpy().astype(np.float32)
    x = np.empty((n, 13), np.float64)
    for j, c in enumerate(INT_COLS):
        x[:, j] = pc.fill_null(table.column(c), 0).to_numpy()
    np.maximum(x, 0.0, out=x)
    dense = np.log1p(x, out=x).astype(np.float32)
    ids = np.empty((26, n), np.int64)
    for j, c in enumerate(CAT_COLS):
        a = 0
        for chunk in table.column(c).chunks:
            cat_ids(chunk, int(CARD[j]), ids[j, a : a + len(chunk)])
            a += len(chunk)
    return labels, dense, ids


# --- the polars engine

_PL_SCHEMA: Any = None


def _polars() -> Any:
    global _PL_SCHEMA
    import polars as pl

    if _PL_SCHEMA is None:
        _PL_SCHEMA = {
            "label": pl.Int8,
            **dict.fromkeys(INT_COLS, pl.Int64),
            **dict.fromkeys(CAT_COLS, pl.String),
        }
    return pl


def _load_polars(task: Task) -> Columns:
    """polars parses (read_csv for TSV, from_arrow over a pyarrow row group for Parquet; both
    release the GIL), numpy finishes the arithmetic."""
    pl = _polars()
    if task.kind == "tsv":
        df = pl.read_csv(
            _read_bytes(task), has_header=False, separator="\t", schema=_PL_SCHEMA, quote_char=None
        )
    else:
        table = _parquet_file(task.file).read_row_group(
            task.a, columns=list(COLUMNS), use_threads=_lib_threads() > 1
        )
        df = pl.from_arrow(table)
    labels = df.get_column("label").to_numpy().astype(np.float32)
    x = np.asarray(df.select(INT_COLS).to_numpy(), np.float64)  # NaN where missing
    np.nan_to_num(x, copy=False, nan=0.0)
    np.maximum(x, 0.0, out=x)
    dense = np.log1p(x, out=x).astype(np.float32)
    hexes = df.select([pl.col(c).str.to_integer(base=16).fill_null(-1) for c in CAT_COLS])
    ids = np.stack([hexes.get_column(c).to_numpy() for c in CAT_COLS])
    present = ids >= 0
    ids = np.where(present, ids % CARD[:, None], -1)
    return labels, dense, ids


def collate(labels: np.ndarray, dense: np.ndarray, ids: np.ndarray) -> dict[str, np.ndarray]:
    """One batch in the training layout (ids [26, n] with -1 for missing)."""
    present = ids >= 0
    lengths = present.reshape(-1).astype(np.int32)
    offsets = np.zeros(lengths.size + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return {
        "dense": np.ascontiguousarray(dense),
        "labels": np.ascontiguousarray(labels),
        "values": ids[present],  # row-major over [26, n]: C1's ids, then C2's, ...
        "lengths": lengths,
        "offsets": offsets,
    }


def parse_task(
    item: tuple[Task, int], shuffle: bool, engine: str = "arrow"
) -> list[dict[str, np.ndarray]]:
    """The task's batches; with ``shuffle`` the rows of each window of WINDOW consecutive
    batches are permuted among themselves (seeded by task and epoch)."""
    task, epoch = item
    labels, dense, ids = load_columns(task, engine)
    cuts = np.concatenate([[0], np.cumsum(task.sizes)])
    if shuffle:
        order = np.empty(int(cuts[-1]), np.int64)
        for w in range(0, len(task.sizes), WINDOW):
            lo, hi = int(cuts[w]), int(cuts[min(w + WINDOW, len(task.sizes))])
            rng = np.random.default_rng([SEED, epoch, task.index, w])
            order[lo:hi] = lo + rng.permutation(hi - lo)
        labels, dense, ids = labels[order], dense[order], ids[:, order]
    return [
        collate(labels[lo:hi], dense[lo:hi], ids[:, lo:hi])
        for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True)
    ]


def to_torch(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    return {k: torch.from_numpy(v) for k, v in batch.items()}


def parse_task_torch(
    item: tuple[Task, int], shuffle: bool, engine: str = "arrow"
) -> list[dict[str, Any]]:
    return [to_torch(b) for b in parse_task(item, shuffle, engine)]


def read_parse_torch(
    item: tuple[Task, int], shuffle: bool, latency_s: float, engine: str = "arrow"
) -> list[dict[str, Any]]:
    if latency_s:
        wait_for_storage(item, latency_s)
    return parse_task_torch(item, shuffle, engine)


# ----------------------------------------------------------------------------------- peers


@dataclass(frozen=True, slots=True)
class RunConfig:
    """One measurement's setting and peer configuration."""

    data: str
    fmt: str
    shuffle: bool = False
    latency_ms: float = 0.0
    workers: int = 1
    variant: str = ""
    epochs: int | None = None  # None: repeat forever


def _rows_of(batch: Any) -> int:
    return int(batch["labels"].shape[0])


# --- 1. torch DataLoader


class CriteoStream(IterableDataset):  # type: ignore[type-arg]
    """The DataLoader peer's dataset: worker w of n reads every n-th task of each epoch and
    yields its batches."""

    def __init__(self, tasks: tuple[Task, ...], cfg: RunConfig) -> None:
        self.tasks, self.cfg = tasks, cfg

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        lat = self.cfg.latency_ms / 1e3
        engine = split_variant(self.cfg.variant, "")[1]
        for item in TaskStream(self.tasks, self.cfg.shuffle, self.cfg.epochs, w, n):
            yield from read_parse_torch(item, self.cfg.shuffle, lat, engine)


def make_dataloader(cfg: RunConfig) -> Iterator[Any]:
    from torch.utils.data import DataLoader

    tasks = tuple(plan_tasks(cfg.data, cfg.fmt))
    k = cfg.workers
    if k > 0:
        worker_env(k)
    ds = CriteoStream(tasks, cfg)
    loader = DataLoader(
        ds,
        batch_size=None,  # every item is already a collated batch
        num_workers=k,
        persistent_workers=k > 0,
        prefetch_factor=2 * WINDOW if k > 0 else None,
        pin_memory=False,
        # forkserver: polars' and pyarrow's thread pools are not fork-safe once used
        multiprocessing_context="forkserver" if k > 0 else None,
    )
    return iter(loader)


# --- 2. torchdata.nodes


def make_torchdata(cfg: RunConfig) -> Iterator[Any]:
    import torchdata.nodes as tn

    method, engine = split_variant(cfg.variant, "process")
    tasks = tuple(plan_tasks(cfg.data, cfg.fmt))
    if method == "process":
        worker_env(cfg.workers)
    else:
        thread_env()
    ctx = "forkserver" if method == "process" else None
    node: Any = tn.IterableWrapper(TaskStream(tasks, cfg.shuffle, cfg.epochs))
    lat = cfg.latency_ms / 1e3
    if lat:  # an I/O stage of threads waiting on storage, then the CPU stage
        node = tn.ParallelMapper(
            node,
            partial(wait_for_storage, latency_s=lat),
            num_workers=IO_CONCURRENCY,
            method="thread",
            in_order=False,
        )
    node = tn.ParallelMapper(
        node,
        partial(parse_task_torch, shuffle=cfg.shuffle, engine=engine),
        num_workers=cfg.workers,
        method=method,
        in_order=False,
        multiprocessing_context=ctx,
    )
    node = tn.Unbatcher(node)
    node = tn.Prefetcher(node, prefetch_factor=2 * WINDOW)
    return iter(tn.Loader(node))


# --- 3. tf.data


def make_tfdata(cfg: RunConfig) -> Iterator[Any]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    autotune = tf.data.AUTOTUNE
    par = autotune if cfg.workers <= 0 else cfg.workers
    files = [str(p) for p in data_files(cfg.data, cfg.fmt)]
    card = tf.constant(CARDINALITIES, tf.int64)
    nibble = np.zeros(256, np.int32)  # ASCII hex digit -> its value
    for v, ch in enumerate(b"0123456789abcdef"):
        nibble[ch] = v
    for v, ch in enumerate(b"ABCDEF", start=10):
        nibble[ch] = v
    nibble_t = tf.constant(nibble)
    pow16 = tf.constant([16**3, 16**2, 16, 1], tf.int32)
    lat = cfg.latency_ms / 1e3
    window_rows = WINDOW * BATCH_ROWS

    def hex_ids(raw: Any) -> Any:
        """[N, 26, 8] ASCII bytes (zeros = missing) -> ids % card, -1 where missing: a table
        lookup per digit, then the two 16-bit halves in int32 (exact), joined in int64."""
        nib = tf.gather(nibble_t, tf.cast(raw, tf.int32))
        hi = tf.cast(tf.reduce_sum(nib[..., :4] * pow16, -1), tf.int64)
        lo = tf.cast(tf.reduce_sum(nib[..., 4:] * pow16, -1), tf.int64)
        ids = tf.math.floormod(hi * 65536 + lo, card)
        return tf.where(raw[:, :, 0] > 0, ids, tf.constant(-1, tf.int64))

    def finish(idx: Any, label: Any, ints: Any, raw: Any) -> dict[str, Any]:
        dense = tf.math.log1p(tf.maximum(tf.cast(ints, tf.float64), 0.0))
        out = {
            "labels": tf.cast(label, tf.float32),
            "dense": tf.cast(dense, tf.float32),
            "ids": hex_ids(raw),
        }
        if cfg.shuffle:  # permute within each window: sort by window number + U(0, 1)
            n = tf.shape(out["labels"])[0]
            win = tf.cast(tf.range(n) // window_rows, tf.float64)
            seed = tf.stack([tf.constant(SEED, tf.int64), idx])
            keys = win + tf.random.stateless_uniform([n], seed=seed, dtype=tf.float64)
            perm = tf.argsort(keys)
            out = {k: tf.gather(v, perm) for k, v in out.items()}
        return out

    def sleep_chunks(rows: Any) -> Any:
        time.sleep(lat * math.ceil(int(rows) / BATCH_ROWS))
        return rows

    def wait(idx: Any, x: Any) -> Any:
        n = tf.shape(x if not isinstance(x, dict) else x["label"])[0]
        done = tf.py_function(sleep_chunks, [n], tf.int32)
        with tf.control_dependencies([done]):
            return idx, tf.nest.map_structure(tf.identity, x)

    files_ds = tf.data.Dataset.from_tensor_slices(files)
    if cfg.shuffle:
        files_ds = files_ds.shuffle(len(files), seed=SEED, reshuffle_each_iteration=True)
    files_ds = files_ds.repeat(cfg.epochs)  # None: forever
    if cfg.fmt == "tsv":
        defaults = (
            [tf.constant([0], tf.int32)]
            + [tf.constant([0], tf.int64)] * 13  # missing -> 0 -> log1p(0) = 0, exact
            + [tf.constant([""], tf.string)] * 26
        )
        ds = files_ds.interleave(
            lambda f: tf.data.TextLineDataset(f).batch(window_rows),
            num_parallel_calls=autotune,
            deterministic=False,
        ).enumerate()
        if lat:
            ds = ds.map(wait, num_parallel_calls=IO_CONCURRENCY, deterministic=False)

        def parse(idx: Any, lines: Any) -> dict[str, Any]:
            f = tf.io.decode_csv(lines, defaults, field_delim="\t", use_quote_delim=False)
            raw = tf.io.decode_raw(tf.stack(f[14:], axis=1), tf.uint8, fixed_length=8)
            return finish(idx, f[0], tf.stack(f[1:14], axis=1), raw)

        ds = ds.map(parse, num_parallel_calls=par, deterministic=False)
    else:
        import pyarrow.compute as pc

        def groups(path: bytes) -> Iterator[dict[str, np.ndarray]]:
            pf = _parquet_file(path.decode())
            for g in range(pf.metadata.num_row_groups):
                t = pf.read_row_group(g, columns=list(COLUMNS))
                n = t.num_rows
                ints = np.stack([pc.fill_null(t.column(c), 0).to_numpy() for c in INT_COLS], axis=1)
                raw = np.zeros((n, 26, 8), np.uint8)  # the strings' bytes, zeros = missing
                for j, c in enumerate(CAT_COLS):
                    col = t.column(c).combine_chunks()
                    off = np.frombuffer(col.buffers()[1], np.int32)[col.offset :][: n + 1]
                    full = np.flatnonzero(np.diff(off) == 8)
                    if full.size:
                        data = np.frombuffer(col.buffers()[2], np.uint8)
                        raw[full, j, :] = data[off[full, None] + np.arange(8)]
                yield {"label": t.column("label").to_numpy(), "ints": ints, "raw": raw}

        sig = {
            "label": tf.TensorSpec([None], tf.int8),
            "ints": tf.TensorSpec([None, 13], tf.int64),
            "raw": tf.TensorSpec([None, 26, 8], tf.uint8),
        }
        ds = files_ds.interleave(
            lambda f: tf.data.Dataset.from_generator(groups, args=(f,), output_signature=sig),
            cycle_length=len(files),
            num_parallel_calls=autotune,
            deterministic=False,
        ).enumerate()
        if lat:  # the requests wait in a map of their own, as for TSV
            ds = ds.map(wait, num_parallel_calls=IO_CONCURRENCY, deterministic=False)
        ds = ds.map(
            lambda i, d: finish(i, d["label"], d["ints"], d["raw"]),
            num_parallel_calls=par,
            deterministic=False,
        )

    def collate_tf(d: dict[str, Any]) -> dict[str, Any]:
        ids_t = tf.transpose(d["ids"])
        mask = ids_t >= 0
        lengths = tf.reshape(tf.cast(mask, tf.int32), [-1])
        return {
            "dense": d["dense"],
            "labels": d["labels"],
            "values": tf.boolean_mask(ids_t, mask),
            "lengths": lengths,
            "offsets": tf.concat([tf.zeros([1], tf.int32), tf.cumsum(lengths)], 0),
        }

    ds = ds.rebatch(BATCH_ROWS)  # windows -> 4096-row batches (a remainder joins the next)
    ds = ds.map(collate_tf, num_parallel_calls=par, deterministic=False)
    ds = ds.prefetch(autotune)

    def gen() -> Iterator[dict[str, Any]]:
        for d in ds:  # what a torch training loop pays: tf tensor -> numpy -> torch
            yield {k: torch.from_numpy(v.numpy()) for k, v in d.items()}

    return gen()


# --- 4. SPDL


def make_spdl(cfg: RunConfig) -> Iterator[Any]:
    from spdl.pipeline import PipelineBuilder

    mode, engine = split_variant(cfg.variant, "thread")
    tasks = tuple(plan_tasks(cfg.data, cfg.fmt))
    lat = cfg.latency_ms / 1e3
    b: Any = PipelineBuilder().add_source(TaskStream(tasks, cfg.shuffle, cfg.epochs))
    if lat:  # an I/O stage on threads waiting on storage, then the CPU stage
        b = b.pipe(partial(wait_for_storage, latency_s=lat), concurrency=IO_CONCURRENCY)
    if mode == "thread":
        thread_env()
        parse = partial(parse_task_torch, shuffle=cfg.shuffle, engine=engine)
        b = b.pipe(parse, concurrency=cfg.workers)
        b = b.disaggregate()
        threads = cfg.workers + (IO_CONCURRENCY if lat else 0)
    else:
        from spdl.pipeline.defs import MAIN_PROCESS, ProcessPoolExecutorConfig

        worker_env(cfg.workers)
        b = b.to(ProcessPoolExecutorConfig(max_workers=cfg.workers, mp_context="forkserver"))
        b = b.pipe(partial(parse_task, shuffle=cfg.shuffle, engine=engine), concurrency=1)
        b = b.disaggregate()
        b = b.to(MAIN_PROCESS, buffer_size=WINDOW)
        b = b.pipe(to_torch)
        threads = 2 + (IO_CONCURRENCY if lat else 0)
    pipeline = b.add_sink(2 * WINDOW).build(num_threads=threads)
    pipeline.start()

    def gen() -> Iterator[Any]:
        try:
            while True:
                try:
                    yield pipeline.get_item()
                except EOFError:
                    return
        finally:
            pipeline.stop()

    return gen()


# --- 5. recperf's own live pipeline, through its drop-in iterator (what the peers are against)


def make_recperf(cfg: RunConfig) -> Iterator[Any]:
    """variant = the allocation: ``auto`` (plumber tunes 8 s live first, as ``ingest run
    --alloc auto``), ``intune`` (intune for 30 s), or a fixed one: ``fused`` (the chain in one
    segment of ``workers`` single-threaded processes), ``threads`` (``workers`` threads of the
    consumer's process), ``proc-threads`` (one process of ``workers`` threads) or ``even``
    (every stage its own segment, the cores dealt round-robin); auto and even get ``workers``
    cores."""
    from recperf.ingest.base import Allocation
    from recperf.ingest.live.batch import PipelineConfig
    from recperf.ingest.live.dataset import PipelineDataset

    pc = PipelineConfig(
        batch_size=BATCH_ROWS,
        shuffle_window=WINDOW if cfg.shuffle else 0,
        shuffle_splits=cfg.shuffle,
        epochs=None,
        read_latency_ms=cfg.latency_ms,
    )
    tuner, tune_s = ("intune", 30.0) if cfg.variant == "intune" else ("plumber", 8.0)
    fixed = {
        "fused": Allocation(workers=(cfg.workers,), cuts=()),
        "threads": Allocation(workers=(cfg.workers,), cuts=(), threads=(0,)),
        "proc-threads": Allocation(workers=(1,), cuts=(), threads=(cfg.workers,)),
    }
    alloc: Any = "auto" if cfg.variant in ("auto", "intune") else cfg.variant
    alloc = fixed.get(alloc, alloc)
    cores = cfg.workers if alloc in ("auto", "even") else None
    ds = PipelineDataset(cfg.data, pc, alloc, cores=cores, tuner=tuner, tune_s=tune_s)
    return iter(ds)


def _recperf_rows(batch: Any) -> int:
    return int(batch.size)


@dataclass(frozen=True, slots=True)
class Peer:
    """A peer: its iterator factory, the configurations a sweep tries, where it runs."""

    make: Callable[[RunConfig], Iterator[Any]]
    variants: tuple[str, ...] = ("",)
    workers: tuple[int, ...] = (1, 2, 3, 4)
    workers_latency: tuple[int, ...] | None = None  # the grid when a read latency is emulated
    rows_of: Callable[[Any], int] = _rows_of
    interpreter: str = "main"  # "tf": an interpreter with TensorFlow
    note: str = ""
    check_configs: tuple[tuple[str, int], ...] = ()  # (variant, workers) that --check runs
    extra: dict[str, Any] = field(default_factory=dict)

    def grid(self, latency_ms: float) -> list[tuple[str, int]]:
        ws = self.workers_latency if latency_ms and self.workers_latency else self.workers
        return [(v, k) for v in self.variants for k in ws]


# ======================= PEERS: name -> Peer. Add a peer (e.g. "recperf") here. ===============
PEERS: dict[str, Peer] = {
    "recperf": Peer(
        make_recperf,
        variants=("auto",),
        workers=(2,),
        rows_of=_recperf_rows,
        note="recperf.ingest.PipelineDataset, --alloc auto (8 s of live plumber tuning first)",
    ),
    "recperf_fixed": Peer(
        make_recperf,
        variants=("fused", "threads", "proc-threads", "even"),
        workers=(2, 3),
        rows_of=_recperf_rows,
        note="recperf's own fixed allocations (the best of them is what --alloc auto must find)",
    ),
    "dataloader": Peer(
        make_dataloader,
        workers=(0, 1, 2, 3, 4),
        workers_latency=(2, 4, 6, 8),
        note="IterableDataset, batch_size=None, persistent forkserver workers, prefetch 16",
        check_configs=(("", 0), ("", 2), ("polars", 2)),
    ),
    "torchdata_nodes": Peer(
        make_torchdata,
        variants=("process", "thread"),
        workers=(1, 2, 3, 4),
        note="IterableWrapper -> [thread I/O mapper] -> ParallelMapper -> Unbatcher -> "
        "Prefetcher(16)",
        check_configs=(("process", 2), ("thread", 2), ("thread-polars", 2)),
    ),
    "tfdata": Peer(
        make_tfdata,
        workers=(0, 2, 4),
        interpreter="tf",
        note="workers = num_parallel_calls of the transform maps (0: AUTOTUNE)",
        check_configs=(("", 0),),
    ),
    "spdl": Peer(
        make_spdl,
        variants=("thread", "process"),
        workers=(1, 2, 3, 4),
        note="source -> [I/O pipe x16] -> parse pipe (threads or a process region) -> "
        "disaggregate -> sink(16)",
        check_configs=(("thread", 2), ("process", 2), ("process-polars", 2)),
    ),
}
# ==================================================================================================


# ------------------------------------------------------------------------ subprocess plumbing


def _has_tf(python: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec("tensorflow") is not None
    r = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('tensorflow') is not None)"],
        capture_output=True,
        text=True,
        check=False,
    )
    return r.stdout.strip() == "True"


def interpreter_for(peer: Peer) -> str | None:
    """The Python that runs the peer (None: none found)."""
    if peer.interpreter != "tf":
        return sys.executable
    for cand in (os.environ.get("INGEST_PEERS_TF_PYTHON"), sys.executable, str(TF_VENV_DEFAULT)):
        if cand and Path(cand).exists() and _has_tf(cand):
            return cand
    return None


def _child_env(python: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if python != sys.executable:  # another venv: let it import recperf's constants from source
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p
        )
    return env


def run_child(
    peer_name: str, args: list[str], timeout_s: float
) -> tuple[dict[str, Any] | None, str]:
    """Run this script with ``args`` in a fresh interpreter for the peer; its last JSON line."""
    python = interpreter_for(PEERS[peer_name])
    if python is None:
        return None, "no interpreter with tensorflow (set INGEST_PEERS_TF_PYTHON)"
    cmd = [python, str(Path(__file__).resolve()), *args]
    # Output to files and a session of its own: a worker left behind cannot hold a pipe open,
    # and whatever is left of the session once the child has exited is killed.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=err, env=_child_env(python), start_new_session=True, text=True
        )
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        _end_session(proc.pid)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if rc is None:
        return None, f"timed out after {timeout_s:.0f} s"
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line), ""
    tail = "\n".join(stderr.strip().splitlines()[-6:])
    return None, f"exit {rc}: {tail}"


def _end_session(sid: int, grace_s: float = 3.0) -> None:
    """Kill the child's session (its process group): after ``grace_s`` for stragglers."""

    def alive() -> bool:
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    with open(f"/proc/{name}/stat", "rb") as fh:
                        raw = fh.read()
                    f = raw[raw.rindex(b")") + 2 :].split()
                    if int(f[3]) == sid and f[0] != b"Z":  # field 6: session id
                        return True
        return False

    end = time.monotonic() + grace_s
    while alive() and time.monotonic() < end:
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        os.killpg(sid, signal.SIGKILL)


# ------------------------------------------------------------------------------------ check


def reference(tsv_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A slow pure-Python parse of every row (file order): labels, dense [R, 13], ids [R, 26]
    (-1 missing)."""
    labels: list[float] = []
    dense: list[list[float]] = []
    ids: list[list[int]] = []
    for path in data_files(tsv_dir, "tsv"):
        with open(path) as fh:
            for line in fh:
                f = line.rstrip("\n").split("\t")
                labels.append(float(int(f[0])))
                dense.append([math.log1p(max(int(x), 0)) if x else 0.0 for x in f[1:14]])
                ids.append(
                    [
                        int(h, 16) % c if h else -1
                        for h, c in zip(f[14:], CARDINALITIES, strict=True)
                    ]
                )
    return (
        np.asarray(labels, np.float32),
        np.asarray(dense, np.float64).astype(np.float32),
        np.asarray(ids, np.int64),
    )


def _row_keys(labels: np.ndarray, dense: np.ndarray, ids: np.ndarray) -> list[bytes]:
    n = len(labels)
    rows = np.concatenate(
        [
            np.ascontiguousarray(labels, np.float32).view(np.uint8).reshape(n, 4),
            np.ascontiguousarray(dense, np.float32).view(np.uint8).reshape(n, 52),
            np.ascontiguousarray(ids, np.int64).view(np.uint8).reshape(n, 208),
        ],
        axis=1,
    )
    return [r.tobytes() for r in rows]


def check_batches(
    batches: list[dict[str, np.ndarray]], ref_dir: Path, shuffle: bool
) -> dict[str, Any]:
    """Structure of every batch, then the rows against the reference (as a multiset; without
    shuffle also that every batch is runs of consecutive reference rows)."""
    problems: list[str] = []
    all_keys: list[bytes] = []
    per_batch: list[list[bytes]] = []
    for i, b in enumerate(batches):
        n = b["labels"].shape[0]
        want = {
            "dense": (np.float32, (n, 13)),
            "labels": (np.float32, (n,)),
            "lengths": (np.int32, (26 * n,)),
            "offsets": (np.int32, (26 * n + 1,)),
        }
        for k, (dt, shape) in want.items():
            if b[k].dtype != dt or b[k].shape != shape:
                problems.append(f"batch {i}: {k} is {b[k].dtype}{b[k].shape}, want {shape}")
        if b["values"].dtype != np.int64:
            problems.append(f"batch {i}: values dtype {b['values'].dtype}")
        lengths, offsets = b["lengths"].astype(np.int64), b["offsets"].astype(np.int64)
        if not np.isin(lengths, (0, 1)).all() or offsets[0] != 0:
            problems.append(f"batch {i}: lengths not 0/1 or offsets[0] != 0")
        if not np.array_equal(np.diff(offsets), lengths) or offsets[-1] != b["values"].size:
            problems.append(f"batch {i}: offsets are not the prefix sum of lengths")
        if problems:
            break
        mask = lengths.reshape(26, n).astype(bool)
        ids = np.full((26, n), -1, np.int64)
        ids[mask] = b["values"]
        keys = _row_keys(b["labels"], b["dense"], ids.T)
        per_batch.append(keys)
        all_keys.extend(keys)
    out: dict[str, Any] = {"batches": len(batches), "rows": len(all_keys)}
    if problems:
        return {**out, "ok": False, "problems": problems[:5]}
    ref = _row_keys(*reference(ref_dir))
    if sorted(all_keys) != sorted(ref):
        mine, theirs = set(all_keys), set(ref)
        problems.append(
            f"rows differ from the reference: {len(all_keys)} rows vs {len(ref)}, "
            f"{len(mine - theirs)} not in the reference, {len(theirs - mine)} missing"
        )
    where = {k: i for i, k in enumerate(ref)}
    runs = spans = 0
    in_order = 0
    sizes = [len(k) for k in per_batch]
    for keys in per_batch:
        idx = np.asarray([where.get(k, -1) for k in keys])
        r = 1 + int(np.count_nonzero(np.diff(idx) != 1))
        runs = max(runs, r)
        in_order += r == 1
        spans = max(spans, int(idx.max() - idx.min()) + 1 if idx.size else 0)
    out.update(
        batch_rows_max=max(sizes, default=0),
        batches_in_order=in_order,
        max_runs_per_batch=runs,
        max_row_span_per_batch=spans,
    )
    if max(sizes, default=0) > BATCH_ROWS:
        problems.append(f"a batch has {max(sizes)} rows > {BATCH_ROWS}")
    if not shuffle and runs > 2:
        problems.append(f"without shuffle a batch holds {runs} runs of reference rows")
    if shuffle and in_order == len(per_batch):
        problems.append("shuffle on but every batch is in file order")
    if shuffle and spans > 2 * WINDOW * BATCH_ROWS:
        problems.append(f"shuffle moved rows {spans} apart (> two windows)")
    return {**out, "ok": not problems, "problems": problems}


def cmd_check_one(args: argparse.Namespace) -> None:
    """(child) One peer configuration over one epoch of the small data, against the reference."""
    cfg = RunConfig(
        data=str(Path(args.check_data) / args.format),
        fmt=args.format,
        shuffle=args.shuffle,
        latency_ms=args.read_latency_ms,
        workers=args.workers,
        variant=args.variant,
        epochs=1,
    )
    t0 = time.monotonic()
    try:
        batches = [
            {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in b.items()}
            for b in PEERS[args.peer].make(cfg)
        ]
        res = check_batches(batches, Path(args.check_data) / "tsv", args.shuffle)
    except Exception as exc:
        res = {"ok": False, "problems": [f"{type(exc).__name__}: {exc}"]}
    res.update(peer=args.peer, **{k: v for k, v in asdict(cfg).items() if k != "data"})
    res["wall_s"] = time.monotonic() - t0
    print(json.dumps(res), flush=True)
    sys.stdout.flush()
    end_descendants()
    os._exit(0)


def cmd_check(args: argparse.Namespace) -> int:
    from recperf.ingest.data.criteo import GenerateConfig, generate

    tmp = tempfile.TemporaryDirectory(prefix="ingest-peers-check-")
    root = Path(tmp.name)
    for fmt in ("tsv", "parquet"):
        generate(GenerateConfig(rows=args.rows, shards=args.shards, format=fmt, seed=7), root / fmt)
    failures = 0
    peers = args.peers.split(",") if args.peers else list(PEERS)
    for name in peers:
        for variant, k in PEERS[name].check_configs:
            for fmt in ("tsv", "parquet"):
                for shuffle, lat in ((False, 0.0), (True, 1.0)):
                    cmd = [
                        "check-one",
                        "--peer",
                        name,
                        "--variant",
                        variant,
                        "--workers",
                        str(k),
                        "--format",
                        fmt,
                        "--check-data",
                        str(root),
                        "--read-latency-ms",
                        str(lat),
                    ] + (["--shuffle"] if shuffle else [])
                    res, err = run_child(name, cmd, timeout_s=300)
                    ok = bool(res and res.get("ok"))
                    failures += not ok
                    what = f"{name}:{variant or '-'}:{k} {fmt}{'+shuffle+1ms' if shuffle else ''}"
                    if res is None:
                        print(f"FAIL {what}: {err}")
                        continue
                    detail = (
                        f"{res.get('rows')} rows in {res.get('batches')} batches, "
                        f"in-order batches {res.get('batches_in_order')}, "
                        f"max span {res.get('max_row_span_per_batch')}"
                    )
                    print(
                        f"{'ok  ' if ok else 'FAIL'} {what}: {detail}"
                        + ("" if ok else f" -- {res.get('problems')}"),
                        flush=True,
                    )
    tmp.cleanup()
    print(f"{'all peers match the reference' if not failures else f'{failures} FAILED'}")
    return 1 if failures else 0


# ------------------------------------------------------------------------------- run, sweep


def cmd_run(args: argparse.Namespace) -> None:
    peer = PEERS[args.peer]
    if peer.interpreter == "tf" and importlib.util.find_spec("tensorflow") is None:
        argv = sys.argv[1:]  # re-run under an interpreter that has TensorFlow
        res, err = run_child(args.peer, argv, args.seconds + args.warmup_s + 300)
        print(json.dumps(res if res is not None else {"error": err}), flush=True)
        sys.exit(0 if res is not None else 1)
    cfg = RunConfig(
        data=args.data,
        fmt=args.format,
        shuffle=args.shuffle,
        latency_ms=args.read_latency_ms,
        workers=args.workers,
        variant=args.variant,
        epochs=None,
    )
    res = measure(lambda: peer.make(cfg), peer.rows_of, args.seconds, args.warmup_s)
    out = {"peer": args.peer, **asdict(cfg), **res, "python": sys.executable}
    print(json.dumps(out), flush=True)
    sys.stdout.flush()
    end_descendants()  # workers and pipelines are killed, not joined (a join can hang)
    os._exit(0)


SETTINGS: dict[str, dict[str, Any]] = {
    "tsv": {"fmt": "tsv", "shuffle": False, "latency_ms": 0.0},
    "tsv+shuffle": {"fmt": "tsv", "shuffle": True, "latency_ms": 0.0},
    "parquet": {"fmt": "parquet", "shuffle": False, "latency_ms": 0.0},
    "parquet+shuffle": {"fmt": "parquet", "shuffle": True, "latency_ms": 0.0},
    "tsv+20ms": {"fmt": "tsv", "shuffle": False, "latency_ms": 20.0},
    "parquet+20ms": {"fmt": "parquet", "shuffle": False, "latency_ms": 20.0},
}


def _run_args(
    setting: dict[str, Any],
    data_root: str,
    peer: str,
    variant: str,
    k: int,
    seconds: float,
    warmup_s: float,
) -> list[str]:
    a = [
        "run",
        "--peer",
        peer,
        "--variant",
        variant,
        "--workers",
        str(k),
        "--data",
        str(Path(data_root) / setting["fmt"]),
        "--format",
        setting["fmt"],
        "--read-latency-ms",
        str(setting["latency_ms"]),
        "--seconds",
        str(seconds),
        "--warmup-s",
        str(warmup_s),
    ]
    return a + (["--shuffle"] if setting["shuffle"] else [])


def _base_of(name: str) -> str:
    """The setting whose screening picks a shuffle setting's finalists."""
    return name.replace("+shuffle", "")


def cmd_sweep(args: argparse.Namespace) -> None:
    settings = args.settings.split(",")
    peers = args.peers.split(",")
    rnd = random.Random(args.seed)
    log: list[dict[str, Any]] = []
    t_start = time.monotonic()

    def one(
        sname: str,
        peer: str,
        variant: str,
        k: int,
        seconds: float,
        warm: float,
        phase: str,
        rep: int,
    ) -> dict[str, Any]:
        cmd = _run_args(SETTINGS[sname], args.data_root, peer, variant, k, seconds, warm)
        res, err = run_child(peer, cmd, timeout_s=seconds + warm + 180)
        rec = {
            "setting": sname,
            "peer": peer,
            "variant": variant,
            "workers": k,
            "phase": phase,
            "rep": rep,
            **(res or {"error": err}),
        }
        log.append(rec)
        el = time.monotonic() - t_start
        rate = rec.get("throughput_rows_per_s")
        print(
            f"[{el:6.0f}s] {phase} {sname:16s} {peer}:{variant or '-'}:{k} -> "
            + (
                f"{rate:,.0f} rows/s, {rec['cores_used']:.2f} cores, {rec['peak_pss_mib']:.0f} MiB"
                if rate
                else f"ERROR {err}"
            ),
            file=sys.stderr,
            flush=True,
        )
        return rec

    # Phase 1: screen every configuration once per base setting; keep the best per peer.
    finalists: dict[tuple[str, str], list[tuple[str, int]]] = {}
    prior = json.loads(Path(args.screen_from).read_text())["runs"] if args.screen_from else []
    if args.screen_s > 0:
        for sname in dict.fromkeys(_base_of(s) for s in settings):
            grid = [
                (p, v, k) for p in peers for v, k in PEERS[p].grid(SETTINGS[sname]["latency_ms"])
            ]
            rnd.shuffle(grid)
            recs = [
                r
                for r in prior
                if r.get("setting") == sname and r.get("phase") == "screen" and r["peer"] in peers
            ]
            if {r["peer"] for r in recs} < set(peers):  # not (fully) screened before: screen now
                recs = [
                    one(sname, p, v, k, args.screen_s, args.screen_warmup_s, "screen", 0)
                    for p, v, k in grid
                ]
            else:
                log.extend({**r, "reused_from": args.screen_from} for r in recs)
            for p in peers:
                mine = [r for r in recs if r["peer"] == p and "throughput_rows_per_s" in r]
                mine.sort(key=lambda r: -r["throughput_rows_per_s"])
                finalists[(sname, p)] = [
                    (r["variant"], r["workers"]) for r in mine[: args.finalists]
                ]
    # Phase 2: the finalists, interleaved, ``reps`` times each.
    jobs: list[tuple[str, str, str, int]] = []
    for sname in settings:
        for p in peers:
            cands = finalists.get((_base_of(sname), p)) if args.screen_s > 0 else None
            if cands is None:
                cands = PEERS[p].grid(SETTINGS[sname]["latency_ms"])
            jobs += [(sname, p, v, k) for v, k in cands]
    for rep in range(args.reps):
        order = list(jobs)
        rnd.shuffle(order)
        for sname, p, v, k in order:
            one(sname, p, v, k, args.seconds, args.warmup_s, "final", rep)
    summary = summarize(log, settings, peers)
    print_table(summary)
    result = {
        "machine": {"cpus": NCPU, "python": sys.version.split()[0]},
        "batch_rows": BATCH_ROWS,
        "window": WINDOW,
        "seconds": args.seconds,
        "warmup_s": args.warmup_s,
        "reps": args.reps,
        "screen_s": args.screen_s,
        "wall_s": time.monotonic() - t_start,
        "best": summary,
        "runs": log,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"best": summary}, indent=1))


def summarize(
    log: list[dict[str, Any]], settings: list[str], peers: list[str]
) -> list[dict[str, Any]]:
    """Per setting and peer: the configuration with the best median final throughput."""
    out = []
    for s in settings:
        for p in peers:
            recs = [
                r for r in log if r["setting"] == s and r["peer"] == p and r["phase"] == "final"
            ]
            by_cfg: dict[tuple[str, int], list[dict[str, Any]]] = {}
            for r in recs:
                by_cfg.setdefault((r["variant"], r["workers"]), []).append(r)
            best = None
            for (v, k), rs in by_cfg.items():
                ok = [r for r in rs if "throughput_rows_per_s" in r]
                if not ok:
                    continue
                med = statistics.median(r["throughput_rows_per_s"] for r in ok)
                row = {
                    "setting": s,
                    "peer": p,
                    "variant": v,
                    "workers": k,
                    "runs": len(ok),
                    "rows_per_s": med,
                    "rows_per_s_min": min(r["throughput_rows_per_s"] for r in ok),
                    "rows_per_s_max": max(r["throughput_rows_per_s"] for r in ok),
                    "cores_used": statistics.median(r["cores_used"] for r in ok),
                    "cores_main": statistics.median(r["cores_main"] for r in ok),
                    "peak_pss_mib": statistics.median(r["peak_pss_mib"] for r in ok),
                    "processes": max(r["processes"] for r in ok),
                }
                row["rows_per_core_s"] = med / row["cores_used"] if row["cores_used"] else None
                if best is None or med > best["rows_per_s"]:
                    best = row
            errors = [r.get("error") for r in recs if "error" in r]
            if best is not None:
                out.append(best)
            elif errors:
                out.append({"setting": s, "peer": p, "error": errors[0]})
    return out


def print_table(summary: list[dict[str, Any]]) -> None:
    head = (
        f"{'setting':16s} {'peer':16s} {'variant':8s} {'K':>2s} {'rows/s (median)':>16s} "
        f"{'min..max':>19s} {'cores':>5s} {'main':>5s} {'PSS MiB':>8s} {'rows/core-s':>11s}"
    )
    print(head)
    print("-" * len(head))
    for r in summary:
        if "error" in r:
            print(f"{r['setting']:16s} {r['peer']:16s} ERROR {r['error']}")
            continue
        print(
            f"{r['setting']:16s} {r['peer']:16s} {r['variant'] or '-':8s} {r['workers']:>2d} "
            f"{r['rows_per_s']:>16,.0f} {r['rows_per_s_min']:>9,.0f}..{r['rows_per_s_max']:<9,.0f}"
            f" {r['cores_used']:>5.2f} {r['cores_main']:>5.2f} {r['peak_pss_mib']:>8.0f} "
            f"{r['rows_per_core_s'] or 0:>11,.0f}"
        )


# ------------------------------------------------------------------------------------- main


def _peer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--peer", required=True, choices=sorted(PEERS))
    p.add_argument(
        "--variant",
        default="",
        help="torchdata_nodes: process|thread; spdl: thread|process; either with -polars, or "
        "dataloader: polars, for the polars engine (default: the arrow engine)",
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--format", choices=("tsv", "parquet"), default="tsv")
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--read-latency-ms", type=float, default=0.0)


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--check",
        action="store_true",
        help="run every peer on ~20k generated rows against a pure-Python reference",
    )
    ap.add_argument("--rows", type=int, default=20_000, help="--check: rows to generate")
    ap.add_argument("--shards", type=int, default=2, help="--check: shards to generate")
    ap.add_argument("--peers", default="", help="--check: comma-separated peers (default all)")
    sub = ap.add_subparsers(dest="cmd")
    run = sub.add_parser("run", help="measure one peer configuration; one JSON object on stdout")
    _peer_args(run)
    run.add_argument("--data", required=True)
    run.add_argument("--seconds", type=float, default=10.0)
    run.add_argument("--warmup-s", type=float, default=3.0)
    one = sub.add_parser("check-one", help=argparse.SUPPRESS)
    _peer_args(one)
    one.add_argument("--check-data", required=True)
    sw = sub.add_parser("sweep", help="every peer x worker count, fresh process each; table + JSON")
    sw.add_argument("--data-root", default="/tmp/peers-data", help="holds tsv/ and parquet/")
    sw.add_argument("--settings", default=",".join(SETTINGS))
    sw.add_argument("--peers", default=",".join(PEERS))
    sw.add_argument("--seconds", type=float, default=10.0)
    sw.add_argument("--warmup-s", type=float, default=3.0)
    sw.add_argument("--reps", type=int, default=3)
    sw.add_argument(
        "--screen-s",
        type=float,
        default=3.0,
        help="screen every configuration once with this window (0: no screening, "
        "every configuration gets --reps full runs)",
    )
    sw.add_argument("--screen-warmup-s", type=float, default=1.5)
    sw.add_argument("--finalists", type=int, default=1, help="configurations per peer kept")
    sw.add_argument("--seed", type=int, default=0, help="order of the interleaved runs")
    sw.add_argument(
        "--screen-from",
        default="",
        help="a sweep's JSON whose screening runs to reuse for the settings it has",
    )
    sw.add_argument("--out", default="out/bench/ingest_peers.json")
    args = ap.parse_args(list(argv) if argv is not None else None)
    if args.check:
        return cmd_check(args)
    if args.cmd == "run":
        cmd_run(args)
    elif args.cmd == "check-one":
        cmd_check_one(args)
    elif args.cmd == "sweep":
        cmd_sweep(args)
    else:
        ap.print_help()
        return 2
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
