"""Every registered workload obeys the contract (synthetic and real data), real data is
deterministic and read without repeats, and broken data files are named."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from recperf.core.errors import ConfigError, ContractError, RegistryError, TraceFormatError
from recperf.stalls.base import WORKLOADS, DataSpec, check_workload, grad_bytes
from recperf.stalls.run.workloads import MlpWorkload, RecordFile

TINY: dict[str, dict[str, Any]] = {
    "dlrm": {"table_rows": 50, "embedding_dim": 4},
    "mlp": {"features": 8, "hidden": (16,)},
    "convnet": {"width": 4},
}


@pytest.mark.parametrize("name", WORKLOADS.names())
def test_every_workload_passes_the_contract(name: str, tmp_path: Path) -> None:
    check_workload(WORKLOADS.build(name, TINY[name]), data_dir=tmp_path)


@pytest.mark.parametrize("name", ["mlp", "convnet"])
def test_real_data_is_deterministic_and_sharded(name: str, tmp_path: Path) -> None:
    w = WORKLOADS.build(name, TINY[name])
    spec = DataSpec(batch_size=3, rank=1, world=2, batches=4, seed=7)
    files = w.prepare_data(tmp_path, spec)
    assert len(files) == 2 and all(f.stat().st_size > 0 for f in files)
    a = [b[0] for b in itertools.islice(w.real(tmp_path, spec), 4)]
    b = [b[0] for b in itertools.islice(w.real(tmp_path, spec), 4)]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], a[1])  # consecutive batches are different records
    other = next(w.real(tmp_path, DataSpec(batch_size=3, rank=0, world=2, batches=4, seed=7)))
    assert not torch.equal(other[0], a[0])


def test_prepare_data_reuses_matching_files(tmp_path: Path) -> None:
    w = MlpWorkload(**TINY["mlp"])
    spec = DataSpec(batch_size=4, batches=3)
    (f,) = w.prepare_data(tmp_path, spec)
    mtime = f.stat().st_mtime_ns
    w.prepare_data(tmp_path, spec)
    assert f.stat().st_mtime_ns == mtime
    w.prepare_data(tmp_path, DataSpec(batch_size=4, batches=5))
    assert f.stat().st_size == 4 * 5 * w.file.record_bytes


def test_mlp_real_batches_are_standardised(tmp_path: Path) -> None:
    w = MlpWorkload(**TINY["mlp"])
    spec = DataSpec(batch_size=64, batches=2)
    w.prepare_data(tmp_path, spec)
    x, y = next(w.real(tmp_path, spec))
    assert x.shape == (64, 8) and y.dtype == torch.int64
    assert float(x.mean().abs()) < 0.05 and float(x.abs().max()) <= 4.0
    assert set(y.tolist()) <= set(range(w.classes))


def test_truncated_record_file_is_named(tmp_path: Path) -> None:
    fmt = RecordFile(fields=3, dtype="int16")
    path = tmp_path / "bad.bin"
    path.write_bytes(np.zeros(4 * 4 + 3, dtype=np.int16).tobytes())
    with pytest.raises(TraceFormatError, match=r"bad\.bin.*whole number"):
        next(fmt.batches(path, 2))


def test_grad_bytes_counts_trainable_parameters() -> None:
    model = MlpWorkload(features=4, hidden=(3,), classes=2).build(0)
    assert grad_bytes(model) == 4 * ((4 * 3 + 3) + (3 * 2 + 2))
    model[0].weight.requires_grad_(False)
    assert grad_bytes(model) == 4 * (3 + 3 * 2 + 2)


def test_bad_options_and_names() -> None:
    with pytest.raises(ConfigError, match="table_rows"):
        WORKLOADS.build("dlrm", {"table_rows": 0})
    with pytest.raises(RegistryError, match="allowed: convnet, dlrm, mlp"):
        WORKLOADS.build("resnet")
    with pytest.raises(ConfigError, match="rank"):
        DataSpec(batch_size=1, rank=2, world=2)


class _NoGrad:
    name = "nograd"

    def build(self, seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return torch.nn.Linear(2, 1)

    def synthetic(self, spec: DataSpec) -> Any:
        return itertools.repeat(torch.ones(1, 2))

    def prepare_data(self, data_dir: Path, spec: DataSpec) -> list[Path]:
        return []

    def real(self, data_dir: Path, spec: DataSpec) -> Any:
        raise AssertionError("no real data")

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        return torch.tensor(1.0, requires_grad=True)


def test_contract_catches_a_loss_without_gradients(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="no gradient"):
        check_workload(_NoGrad(), data_dir=tmp_path)
