"""The stall-workload plug-in contract: a ``Workload`` builds a model, yields synthetic in-memory
batches (pure compute) and, when it has any, batches read and prepared from files (real data),
and computes a loss; ``WORKLOADS`` names them and ``check_workload`` proves one obeys the
contract."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from recperf.core.config import check_range
from recperf.core.errors import ContractError
from recperf.core.registry import Registry


@dataclass(kw_only=True, slots=True, frozen=True)
class DataSpec:
    """Which slice of the data one rank reads, and how much."""

    batch_size: int
    """Samples per rank per iteration (>= 1)."""
    rank: int = 0
    """This rank (0..world-1)."""
    world: int = 1
    """Ranks in the job (>= 1)."""
    batches: int = 64
    """Batches each rank will draw at most (>= 1); real data holds at least this many, unread."""
    seed: int = 0
    """Seed of generated data and of any random augmentation."""

    def __post_init__(self) -> None:
        check_range("batch_size", self.batch_size, 1, None)
        check_range("world", self.world, 1, None)
        check_range("rank", self.rank, 0, self.world - 1)
        check_range("batches", self.batches, 1, None)


@runtime_checkable
class Workload(Protocol):
    """A training workload the profiler can run on any number of ranks."""

    @property
    def name(self) -> str:
        """The workload's name (as registered)."""
        ...

    def build(self, seed: int) -> nn.Module:
        """The model, initialised from ``seed`` (every rank passes the same seed)."""
        ...

    def synthetic(self, spec: DataSpec) -> Iterator[Any]:
        """An endless iterator of batches held in memory: no I/O, no preparation."""
        ...

    def prepare_data(self, data_dir: Path, spec: DataSpec) -> list[Path]:
        """Write (or reuse) the files ``real`` reads for every rank; return them all. A workload
        without real data returns []."""
        ...

    def real(self, data_dir: Path, spec: DataSpec) -> Iterator[Any]:
        """An endless iterator of batches read from ``prepare_data``'s files and prepared."""
        ...

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The scalar training loss of ``batch`` (forward pass only)."""
        ...


WORKLOADS: Registry[Workload] = Registry("stall workload", "recperf.stalls.run.workloads")


def grad_bytes(model: nn.Module) -> int:
    """Bytes of the gradients data-parallel training all-reduces (trainable parameters)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def check_workload(workload: Workload, data_dir: Path | None = None, batches: int = 2) -> None:
    """Run ``workload`` through its contract: a finite loss with gradients on synthetic data,
    identical models from one seed, and the same for real data when it has any."""
    if not isinstance(workload, Workload):
        raise ContractError(f"{workload!r} does not implement the Workload protocol")
    a, b = workload.build(seed=3), workload.build(seed=3)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        if not torch.equal(pa, pb):
            raise ContractError(f"{workload.name}: build(seed) is not deterministic")
    spec = DataSpec(batch_size=4, batches=batches)
    _check_batches(workload, a, workload.synthetic(spec), batches, "synthetic")
    if data_dir is not None:
        files: Sequence[Path] = workload.prepare_data(data_dir, spec)
        if files:
            missing = [f for f in files if not f.is_file()]
            if missing:
                raise ContractError(f"{workload.name}: prepare_data did not write {missing[0]}")
            _check_batches(workload, a, workload.real(data_dir, spec), batches, "real")


def _check_batches(
    workload: Workload, model: nn.Module, it: Iterator[Any], n: int, kind: str
) -> None:
    for _ in range(n):
        model.zero_grad()
        loss = workload.loss(model, next(it))
        if loss.dim() != 0 or not math.isfinite(float(loss.detach())):
            raise ContractError(f"{workload.name}: {kind} loss is not a finite scalar: {loss}")
        loss.backward()  # type: ignore[no-untyped-call]
        if all(p.grad is None for p in model.parameters()):
            raise ContractError(f"{workload.name}: {kind} loss has no gradient")
    close = getattr(it, "close", None)
    if close is not None:
        close()
