"""The built-in stall workloads: a DLRM fed by recperf's ingestion pipeline, an MLP and a small
convolutional net, the last two reading a fixed-record binary file per rank (CIFAR-style) and
preparing each batch on the training thread, as a ``DataLoader`` with no workers does."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recperf.core.config import check_range
from recperf.core.errors import TraceFormatError
from recperf.models.dlrm import DLRM, DLRMConfig
from recperf.stalls.base import WORKLOADS, DataSpec

SYNTHETIC_BATCHES = 4
"""Distinct in-memory batches a synthetic iterator cycles through."""


def _cycle(batches: list[Any]) -> Iterator[Any]:
    while True:
        yield from batches


def _generator(spec: DataSpec) -> torch.Generator:
    """Each rank's own seeded stream."""
    return torch.Generator().manual_seed(spec.seed * 1000 + spec.rank)


def _labelled(spec: DataSpec, shape: tuple[int, ...], classes: int) -> Iterator[Any]:
    """Synthetic (inputs, class labels) batches, in memory."""
    g = _generator(spec)
    return _cycle(
        [
            (
                torch.randn(spec.batch_size, *shape, generator=g),
                torch.randint(0, classes, (spec.batch_size,), generator=g),
            )
            for _ in range(SYNTHETIC_BATCHES)
        ]
    )


# ------------------------------------------------------------------------------------ DLRM


@WORKLOADS.register("dlrm")
@dataclass(kw_only=True, slots=True, frozen=True)
class DlrmWorkload:
    """Click-through DLRM on Criteo-format rows: dense embedding gradients (all-reduced)."""

    table_rows: int = 4000
    """Rows of each of the 26 tables (ids are taken modulo this)."""
    embedding_dim: int = 16
    """Embedding width."""
    name: str = "dlrm"

    def __post_init__(self) -> None:
        check_range("table_rows", self.table_rows, 1, None)
        check_range("embedding_dim", self.embedding_dim, 1, None)

    @property
    def config(self) -> DLRMConfig:
        return DLRMConfig(
            dense_features=13,
            table_rows=(self.table_rows,) * 26,
            embedding_dim=self.embedding_dim,
            bottom_mlp=(512, 256),
            top_mlp=(512, 256),
        )

    def build(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return DLRM(self.config)

    def synthetic(self, spec: DataSpec) -> Iterator[Any]:
        g = _generator(spec)
        b = spec.batch_size
        batches = [
            (
                torch.rand(b, 13, generator=g),
                torch.randint(0, 2**31 - 1, (26 * b,), generator=g),
                torch.ones(26 * b, dtype=torch.int32),
                torch.randint(0, 2, (b,), generator=g).float(),
            )
            for _ in range(SYNTHETIC_BATCHES)
        ]
        return _cycle(batches)

    def prepare_data(self, data_dir: Path, spec: DataSpec) -> list[Path]:
        from recperf.ingest.data.criteo import GenerateConfig, generate

        out = data_dir / "criteo"
        config = GenerateConfig(
            rows=spec.batch_size * spec.batches * spec.world, shards=spec.world, seed=spec.seed
        )
        files = [out / config.shard_name(k) for k in range(spec.world)]
        manifest = out / "manifest.json"
        if manifest.is_file() and all(f.is_file() for f in files):
            m = json.loads(manifest.read_text())
            if (m.get("rows"), m.get("seed"), len(m.get("shards", []))) == (
                config.rows,
                config.seed,
                config.shards,
            ):
                return files
        generate(config, out)
        return files

    def real(self, data_dir: Path, spec: DataSpec) -> Iterator[Any]:
        from recperf.ingest import Pipeline, PipelineConfig

        files = self.prepare_data(data_dir, spec)
        cfg = PipelineConfig(
            batch_size=spec.batch_size, shuffle_window=0, epochs=None, seed=spec.seed
        )
        pipeline = Pipeline(files[spec.rank], cfg, allocation=[1] * len(cfg.stage_names()))
        return _pipeline_batches(pipeline)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        dense, values, lengths, labels = batch
        logits = model(dense, values, lengths)
        return F.binary_cross_entropy_with_logits(logits, labels)


def _pipeline_batches(pipeline: Any) -> Iterator[Any]:
    with pipeline:
        for b in pipeline:
            yield b.dense, b.values, b.lengths, b.labels


# ---------------------------------------------------------------------- fixed-record files


@dataclass(kw_only=True, slots=True, frozen=True)
class RecordFile:
    """A binary file of fixed-size records: ``fields`` values of ``dtype`` then a label."""

    fields: int
    dtype: str

    @property
    def record_bytes(self) -> int:
        return (self.fields + 1) * np.dtype(self.dtype).itemsize

    def path(self, data_dir: Path, name: str, rank: int, world: int) -> Path:
        return data_dir / f"{name}-rank{rank}of{world}.bin"

    def write(self, path: Path, records: int, seed: int, classes: int) -> None:
        """Seeded records (features and a label in the last field), written then renamed."""
        rng = np.random.default_rng(seed)
        info = np.iinfo(self.dtype)
        block = 4096
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as fh:
            for start in range(0, records, block):
                n = min(block, records - start)
                rec = rng.integers(info.min, info.max, size=(n, self.fields + 1), dtype=self.dtype)
                rec[:, -1] = rng.integers(0, classes, size=n)
                fh.write(rec.tobytes())
            fh.flush()
            os.fsync(fh.fileno())  # the pages must be clean for a cold-cache run to evict them
        tmp.replace(path)

    def batches(self, path: Path, batch_size: int) -> Iterator[np.ndarray]:
        """Consecutive batches read with ``pread`` (wrapping at the end of the file)."""
        size = path.stat().st_size
        nbytes = batch_size * self.record_bytes
        if size < nbytes or size % self.record_bytes:
            why = f"{size} bytes is not a whole number of {self.record_bytes}-byte records"
            raise TraceFormatError(path, None, None, why if size >= nbytes else "too small")
        fd = os.open(path, os.O_RDONLY)
        try:
            offset = 0
            while True:
                if offset + nbytes > size:
                    offset = 0
                raw = os.pread(fd, nbytes, offset)
                offset += nbytes
                yield np.frombuffer(raw, dtype=self.dtype).reshape(batch_size, self.fields + 1)
        finally:
            os.close(fd)


def _prepare_records(
    fmt: RecordFile, name: str, data_dir: Path, spec: DataSpec, classes: int
) -> list[Path]:
    data_dir.mkdir(parents=True, exist_ok=True)
    records = spec.batch_size * spec.batches
    files = []
    for r in range(spec.world):
        path = fmt.path(data_dir, name, r, spec.world)
        if not path.is_file() or path.stat().st_size != records * fmt.record_bytes:
            fmt.write(path, records, seed=spec.seed * 1000 + r, classes=classes)
        files.append(path)
    return files


# ------------------------------------------------------------------------------------- MLP


@WORKLOADS.register("mlp")
@dataclass(kw_only=True, slots=True, frozen=True)
class MlpWorkload:
    """A multi-layer perceptron classifier on quantised tabular features (int16 on disk,
    standardised and clipped on load)."""

    features: int = 256
    """Input features."""
    hidden: tuple[int, ...] = (1024, 1024, 512)
    """Hidden widths."""
    classes: int = 10
    """Output classes."""
    name: str = "mlp"

    def __post_init__(self) -> None:
        check_range("features", self.features, 1, None)
        check_range("classes", self.classes, 2, None)

    @property
    def file(self) -> RecordFile:
        return RecordFile(fields=self.features, dtype="int16")

    def build(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        widths = (self.features, *self.hidden)
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(widths[-1], self.classes))

    def synthetic(self, spec: DataSpec) -> Iterator[Any]:
        return _labelled(spec, (self.features,), self.classes)

    def prepare_data(self, data_dir: Path, spec: DataSpec) -> list[Path]:
        return _prepare_records(self.file, self.name, data_dir, spec, self.classes)

    def real(self, data_dir: Path, spec: DataSpec) -> Iterator[Any]:
        path = self.file.path(data_dir, self.name, spec.rank, spec.world)
        for rec in self.file.batches(path, spec.batch_size):
            x = torch.from_numpy(rec[:, :-1].astype(np.float32))
            x = ((x - x.mean(dim=0)) / (x.std(dim=0) + 1e-6)).clamp_(-4.0, 4.0)
            yield x, torch.from_numpy(rec[:, -1].astype(np.int64))

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)


# --------------------------------------------------------------------------------- convnet


@WORKLOADS.register("convnet")
@dataclass(kw_only=True, slots=True, frozen=True)
class ConvNetWorkload:
    """A small convolutional net on 32x32 RGB images stored as uint8 records (CIFAR's binary
    layout), prepared with per-channel normalisation, a padded random crop and a random flip."""

    width: int = 32
    """Channels of the first convolution (the second has twice as many)."""
    classes: int = 10
    """Output classes."""
    name: str = "convnet"

    def __post_init__(self) -> None:
        check_range("width", self.width, 1, None)
        check_range("classes", self.classes, 2, None)

    @property
    def file(self) -> RecordFile:
        return RecordFile(fields=3 * 32 * 32, dtype="uint8")

    def build(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        w = self.width
        return nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(w, 2 * w, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * w * 8 * 8, 256),
            nn.ReLU(),
            nn.Linear(256, self.classes),
        )

    def synthetic(self, spec: DataSpec) -> Iterator[Any]:
        return _labelled(spec, (3, 32, 32), self.classes)

    def prepare_data(self, data_dir: Path, spec: DataSpec) -> list[Path]:
        return _prepare_records(self.file, self.name, data_dir, spec, self.classes)

    def real(self, data_dir: Path, spec: DataSpec) -> Iterator[Any]:
        path = self.file.path(data_dir, self.name, spec.rank, spec.world)
        g = _generator(spec)
        mean = torch.tensor([0.49, 0.48, 0.45]).view(1, 3, 1, 1)
        std = torch.tensor([0.25, 0.24, 0.26]).view(1, 3, 1, 1)
        for rec in self.file.batches(path, spec.batch_size):
            b = spec.batch_size
            img = torch.from_numpy(rec[:, :-1].copy()).view(b, 3, 32, 32).float().div_(255.0)
            img = F.pad((img - mean) / std, (4, 4, 4, 4), mode="reflect")
            dx, dy = torch.randint(0, 9, (2,), generator=g).tolist()
            img = img[:, :, dy : dy + 32, dx : dx + 32]
            flip = torch.rand(b, generator=g) < 0.5
            img = torch.where(flip.view(b, 1, 1, 1), img.flip(3), img).contiguous()
            yield img, torch.from_numpy(rec[:, -1].astype(np.int64))

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)
