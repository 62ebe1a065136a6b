"""The shared DLRM: interaction, pooling, empty bags, hashing, gradients, and the ingest batch
layout it consumes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recperf.core.errors import ConfigError
from recperf.ingest.data import decode, stages
from recperf.ingest.data.criteo import CARDINALITIES, GenerateConfig, generate, read_table
from recperf.ingest.live.batch import Batch
from recperf.models.dlrm import DLRM, DLRMConfig, TorchEmbeddingBags, dot_interaction


def kjt(ids_per_table: list[list[list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """values, lengths (feature-major) from ids[table][sample] lists."""
    values = [i for table in ids_per_table for bag in table for i in bag]
    lengths = [len(bag) for table in ids_per_table for bag in table]
    return torch.tensor(values, dtype=torch.int64), torch.tensor(lengths, dtype=torch.int32)


def test_dot_interaction_is_every_distinct_pair() -> None:
    torch.manual_seed(0)
    bottom, pooled = torch.randn(3, 4), torch.randn(3, 2, 4)
    out = dot_interaction(bottom, pooled)
    z = [bottom, pooled[:, 0], pooled[:, 1]]
    pairs = [(0, 1), (0, 2), (1, 2)]
    expected = torch.cat([bottom] + [(z[i] * z[j]).sum(1, keepdim=True) for i, j in pairs], dim=1)
    assert torch.allclose(out, expected, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    bags=st.lists(
        st.lists(st.lists(st.integers(0, 10**6), max_size=4), min_size=3, max_size=3),
        min_size=1,
        max_size=3,
    ),
    pooling=st.sampled_from(["sum", "mean"]),
)
def test_embedding_stage_equals_a_per_bag_loop(bags: list[list[list[int]]], pooling: str) -> None:
    rows = (7, 1, 50)[: len(bags)]
    stage = TorchEmbeddingBags(rows, 5, pooling)  # type: ignore[arg-type]
    values, lengths = kjt(bags)
    out = stage(values, lengths, None)
    assert out.shape == (3, len(bags), 5)
    for t, (table, bag_rows) in enumerate(zip(bags, rows, strict=True)):
        weight = stage.bags[t].weight
        for s, bag in enumerate(table):
            if not bag:
                assert torch.equal(out[s, t], torch.zeros(5))
                continue
            vecs = weight[torch.tensor(bag) % bag_rows]
            want = vecs.sum(0) if pooling == "sum" else vecs.mean(0)
            assert torch.allclose(out[s, t], want, atol=1e-5)


def test_per_sample_weights_scale_rows() -> None:
    stage = TorchEmbeddingBags((4,), 3, "sum")
    values, lengths = kjt([[[1, 2], [3]]])
    w = torch.tensor([2.0, 0.0, 0.5])
    out = stage(values, lengths, w)
    weight = stage.bags[0].weight
    assert torch.allclose(out[0, 0], 2 * weight[1], atol=1e-6)
    assert torch.allclose(out[1, 0], 0.5 * weight[3], atol=1e-6)


def test_dlrm_forward_backward_and_learning() -> None:
    torch.manual_seed(0)
    cfg = DLRMConfig(dense_features=4, table_rows=(10, 20), embedding_dim=8)
    model = DLRM(cfg)
    assert cfg.interaction_dim == 8 + 3
    g = torch.Generator().manual_seed(1)
    dense = torch.randn(64, 4, generator=g)
    values = torch.randint(0, 1000, (128,), generator=g)
    lengths = torch.ones(128, dtype=torch.int32)
    labels = (dense[:, 0] > 0).float()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    first = last = 0.0
    for step in range(60):
        logits = model(dense, values, lengths)
        assert logits.shape == (64,)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if step == 0 else first
        last = loss.item()
    assert last < 0.5 * first
    assert all(p.grad is not None for p in model.parameters())


def test_bad_shapes_and_configs_are_clear_errors() -> None:
    stage = TorchEmbeddingBags((4, 4), 3, "sum")
    with pytest.raises(ConfigError, match="multiple of 2"):
        stage(torch.tensor([1]), torch.tensor([1, 0, 0]), None)
    with pytest.raises(ConfigError, match="lengths sum to 2"):
        stage(torch.tensor([1]), torch.tensor([1, 0, 1, 0]), None)
    with pytest.raises(ConfigError, match="table_rows"):
        DLRMConfig(table_rows=())
    with pytest.raises(ConfigError, match="pooling"):
        DLRMConfig(pooling="max")  # type: ignore[arg-type]


def test_dlrm_consumes_an_ingest_batch(tmp_path: Path) -> None:
    generate(GenerateConfig(rows=300, seed=0), tmp_path)
    batch_rb = read_table(tmp_path).combine_chunks().to_batches()[0]
    block = stages.Block(decode.arrow_columns(batch_rb, 0, "<table>"), (300,))
    (cols,) = stages.collate(stages.sparse_transform(stages.dense_transform(block)))
    batch = Batch.from_columns(cols)
    cfg = DLRMConfig(table_rows=tuple(min(c, 1000) for c in CARDINALITIES), embedding_dim=4)
    logits = DLRM(cfg)(batch.dense, batch.values, batch.lengths)
    assert logits.shape == (300,) and torch.isfinite(logits).all()
