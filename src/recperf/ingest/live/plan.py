"""The order in which the live pipeline reads the data: splits grouped by Parquet row group (or
TSV file), a seeded group order per epoch, and the chunks (runs of consecutive splits of one
group, the unit every segment works on) with their sequence numbers."""

from __future__ import annotations

import bisect
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recperf.core.errors import ConfigError
from recperf.ingest.data.stages import Split, plan_splits
from recperf.ingest.live.batch import PipelineConfig


@dataclass(slots=True, frozen=True)
class ReadTask:
    """Consecutive splits of one group, read by one worker; item ``seqs[i]`` is split ``i``."""

    seqs: tuple[int, ...]
    splits: tuple[Split, ...]
    group: tuple[str, int]


class Plan:
    """Every split of the data and, epoch after epoch, the read tasks over them."""

    def __init__(self, data: str | Path, config: PipelineConfig) -> None:
        self.config = config
        self.splits, self.counts = plan_splits(data, config.batch_size)
        if not self.splits:
            raise ConfigError(f"{data}: no rows to read")
        self.groups: dict[tuple[str, int], list[int]] = {}
        for i, s in enumerate(self.splits):
            self.groups.setdefault((s.file, s.group), []).append(i)
        # A chunk is chunk_rows rows (by default a whole row group of the generated data, so no
        # group is decoded twice), at least one shuffle window, at most 16 batches; TSV files
        # are cut into runs of that many splits. Shuffle windows lie inside chunks, so the rows
        # of every batch depend on the seed and the data only, never on the allocation.
        want = max(config.shuffle_window, -(-config.chunk_rows // config.batch_size))
        self.read_task_splits = max(1, min(16, want, max(len(g) for g in self.groups.values())))
        self.items_per_epoch = len(self.splits)
        epochs = config.epochs
        self.total_items = sys.maxsize if epochs is None else epochs * self.items_per_epoch
        self._first_rows = [s.first_row for s in self.splits]
        self._epoch = -1
        self._queue: deque[ReadTask] = deque()

    def group_order(self, epoch: int) -> list[tuple[str, int]]:
        keys = list(self.groups)
        if not self.config.shuffle_splits:
            return keys
        perm = np.random.default_rng([self.config.seed, epoch]).permutation(len(keys))
        return [keys[int(i)] for i in perm]

    def split_order(self, epoch: int) -> list[int]:
        """Split indices in the order epoch ``epoch`` reads them (item seq = epoch*N + pos)."""
        return [i for g in self.group_order(epoch) for i in self.groups[g]]

    def next_read_task(self) -> ReadTask | None:
        if not self._queue:
            nxt = self._epoch + 1
            if self.config.epochs is not None and nxt >= self.config.epochs:
                return None
            self._epoch = nxt
            seq = nxt * self.items_per_epoch
            for g in self.group_order(nxt):
                idx = self.groups[g]
                for a in range(0, len(idx), self.read_task_splits):
                    run = idx[a : a + self.read_task_splits]
                    seqs = tuple(range(seq, seq + len(run)))
                    self._queue.append(ReadTask(seqs, tuple(self.splits[i] for i in run), g))
                    seq += len(run)
        return self._queue.popleft()

    def split_of_row(self, row_id: int) -> Split:
        return self.splits[bisect.bisect_right(self._first_rows, row_id) - 1]
