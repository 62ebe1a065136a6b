"""What the live pipeline hands a training loop (``Batch``), its configuration and the metrics
counters it keeps per stage."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from recperf.core.config import check_range, check_seed
from recperf.core.errors import ConfigError
from recperf.ingest.data.criteo import CAT_FEATURES


@dataclass(kw_only=True, slots=True, frozen=True)
class PipelineConfig:
    """How the live pipeline reads, transforms and buffers the data."""

    batch_size: int = 4096
    """Rows read per batch (>= 1); with downsampling a batch keeps the survivors of that many."""
    downsample_rate: float | None = None
    """Share of negative rows kept (0 < rate <= 1); None leaves the downsample stage out."""
    shuffle_window: int = 8
    """Batches whose rows a shuffle task permutes among themselves (>= 1); 0 leaves the shuffle
    stage out."""
    queue_batches: int = 4
    """Batches buffered at the output beyond what the workers are filling (>= 1)."""
    chunk_rows: int = 65_536
    """Rows a worker takes at once, rounded to whole batches: at least one shuffle window, at
    most 16 batches and one Parquet row group (>= 1)."""
    seed: int = 0
    """Seeds the split order, the shuffle and the downsampling."""
    epochs: int | None = 1
    """Passes over the data (>= 1); None repeats until closed."""
    memory_budget_gib: float = 4.0
    """Workers plus buffers may not exceed this, GiB (> 0)."""
    worker_memory_mib: float = 120.0
    """Memory assumed per worker until one has been measured, MiB (> 0)."""
    shuffle_splits: bool = True
    """Visit the file's row groups / chunks in a seeded order that changes every epoch."""
    read_concurrency: int = 16
    """Storage requests a read worker keeps in flight (1..256): the chunk's splits are requested
    together, as an object-store client issues concurrent range reads, so emulated latencies
    overlap this many at a time."""
    read_latency_ms: float = 0.0
    """Emulated remote-storage latency per batch read, ms (>= 0): the read stage waits this
    long per split, as when each batch is a request to an object store; 0 for local files."""

    def __post_init__(self) -> None:
        check_range("batch_size", self.batch_size, 1, None)
        if self.downsample_rate is not None:
            check_range("downsample_rate", self.downsample_rate, 0.0, 1.0, lo_open=True)
        check_range("shuffle_window", self.shuffle_window, 0, None)
        check_range("queue_batches", self.queue_batches, 1, None)
        check_range("chunk_rows", self.chunk_rows, 1, None)
        check_seed(self.seed)
        if self.epochs is not None:
            check_range("epochs", self.epochs, 1, None)
        check_range("memory_budget_gib", self.memory_budget_gib, 0.0, None, lo_open=True)
        check_range("worker_memory_mib", self.worker_memory_mib, 0.0, None, lo_open=True)
        check_range("read_latency_ms", self.read_latency_ms, 0.0, 60_000.0)
        check_range("read_concurrency", self.read_concurrency, 1, 256)

    def stage_names(self) -> tuple[str, ...]:
        names = ["read", "dense", "sparse"]
        if self.downsample_rate is not None:
            names.append("downsample")
        if self.shuffle_window:
            names.append("shuffle")
        return (*names, "collate")


@dataclass(slots=True, frozen=True, weakref_slot=True)
class Batch:
    """One training batch: dense features, labels, and the 26 sparse features as the values,
    lengths and offsets of a KeyedJaggedTensor (feature-major; a missing value is an empty bag)."""

    dense: torch.Tensor
    """float32 [n, 13], log1p of the clipped counts."""
    labels: torch.Tensor
    """float32 [n]."""
    values: torch.Tensor
    """int64 ids, feature C1's for all samples first, then C2's, ..."""
    lengths: torch.Tensor
    """int32 [26 * n]: ids per (feature, sample), 0 or 1."""
    offsets: torch.Tensor
    """int32 [26 * n + 1]: exclusive prefix sum of ``lengths``."""
    row_ids: torch.Tensor
    """int64 [n]: each row's index in the dataset (file order), for auditing."""
    keys: tuple[str, ...] = CAT_FEATURES

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    @staticmethod
    def from_tensors(t: dict[str, torch.Tensor]) -> Batch:
        """A batch over collated tensors (e.g. views into a ring slot; nothing is copied)."""
        return Batch(
            dense=t["dense"],
            labels=t["labels"],
            values=t["values"],
            lengths=t["lengths"],
            offsets=t["offsets"],
            row_ids=t["row_id"],
        )

    def clone(self) -> Batch:
        """A copy that owns its memory (a pipeline's batches view a reused ring slot)."""
        return Batch(
            dense=self.dense.clone(),
            labels=self.labels.clone(),
            values=self.values.clone(),
            lengths=self.lengths.clone(),
            offsets=self.offsets.clone(),
            row_ids=self.row_ids.clone(),
            keys=self.keys,
        )

    @staticmethod
    def from_columns(cols: dict[str, np.ndarray]) -> Batch:
        """Copy collated numpy columns into torch tensors (one memcpy each)."""
        return Batch.from_tensors({k: torch.from_numpy(np.array(v, copy=True))
                                   for k, v in cols.items()})  # fmt: skip

    def kjt(self) -> Any:
        """The sparse features as a torchrec KeyedJaggedTensor (needs torchrec installed)."""
        try:
            from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
        except ImportError as exc:
            raise ConfigError(f"Batch.kjt needs torchrec: {exc}") from None
        return KeyedJaggedTensor(
            keys=list(self.keys), values=self.values, lengths=self.lengths, offsets=self.offsets
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class StageCounters:
    """Cumulative counters of one stage since the pipeline started."""

    rows: int
    """Rows the stage finished."""
    cpu_s: float
    """CPU seconds its workers spent on tasks."""
    busy_s: float
    """Wall seconds its workers spent on tasks."""
    worker_s: float
    """Integral of its worker count over time (worker-seconds)."""
    queue_fill_s: float
    """Integral of its input buffer's fill (0..1) over time."""
    workers: int
    """Workers now (not counting ones retiring)."""
    memory_bytes: float
    """Its workers' proportional memory (PSS) plus its input buffer, bytes, now."""
    wall_s: float = 0.0
    """Wall seconds its tasks spent in it, storage waits and waits for a CPU excluded (what is
    left beyond ``cpu_s`` is time blocked, e.g. waiting for the GIL)."""
    restarts: int
    """Workers that died unasked (killed or crashed; their task is redone), each replaced
    unless it was being retired."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Snapshot:
    """All counters at one instant; two snapshots give a measurement window."""

    t: float
    stages: tuple[StageCounters, ...]
    rows_out: int
    """Rows handed to the consumer."""
    batches_out: int
    memory_bytes: float
    """Workers plus buffers now, bytes."""
    peak_memory_bytes: float
    """Highest memory_bytes seen at any snapshot so far."""
    handoff_cpu_s: float = 0.0
    """CPU the workers spent handing chunks over (mapping inputs, writing outputs and slots)."""
    consumer_cpu_s: float = 0.0
    """CPU of the consumer's process: taking batches and the coordinator thread."""


def rate(a: float, b: float, dt: float) -> float:
    return (b - a) / dt if dt > 0 else math.nan
