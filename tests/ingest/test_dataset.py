"""Drop-in use: the pipeline as a torch IterableDataset and as a plain iterator."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import recperf.ingest as ri
from recperf.core.errors import ConfigError
from recperf.ingest.data.criteo import GenerateConfig, generate


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ds")
    generate(GenerateConfig(rows=5_000, shards=2, seed=2), out)
    return out


@pytest.mark.parametrize("copy", [False, True])
def test_a_dataloader_over_the_dataset_sees_every_row_once(data: Path, copy: bool) -> None:
    ds = ri.PipelineDataset(data, ri.PipelineConfig(batch_size=500, seed=1), cores=2, copy=copy)
    ids = [b.row_ids.clone() for b in DataLoader(ds, batch_size=None, num_workers=0)]
    assert torch.cat(ids).sort().values.tolist() == list(range(5_000))
    plain = [b.row_ids.clone() for b in ri.batches(data, ri.PipelineConfig(batch_size=500, seed=1))]
    assert all(torch.equal(a, b) for a, b in zip(ids, plain, strict=True))


def test_dataloader_workers_and_bad_allocations_are_refused(data: Path) -> None:
    ds = ri.PipelineDataset(data, ri.PipelineConfig(batch_size=500))
    with pytest.raises(ConfigError, match="num_workers=0"):
        next(iter(DataLoader(ds, batch_size=None, num_workers=1)))
    with pytest.raises(ConfigError, match="expected fused, even, auto"):
        ri.PipelineDataset(data, allocation="fastest")
