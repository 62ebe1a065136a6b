"""Quantized tables in the drop-in: a ``torchrec.quant.EmbeddingBagCollection`` read in place
(int8, int4, fp16 rows as FBGEMM keeps them) pools as the collection does, and
``EmbeddingBags.quantize`` converts float tables all or nothing, with the pooled-output error."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from recperf.core.errors import ConfigError
from recperf.embed import DropInConfig, EmbeddingBags
from recperf.embed.kernels.base import KERNELS
from recperf.embed.kernels.formats import dequantize, quantize, row_bytes
from recperf.embed.quantize import (
    QuantizationReport,
    QuantizedTable,
    pooled_error,
    quantize_tables,
    trace_bags,
)
from recperf.embed.traces import Trace

torchrec = pytest.importorskip("torchrec")
from torchrec import KeyedJaggedTensor, PoolingType  # noqa: E402
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig  # noqa: E402
from torchrec.quant.embedding_modules import (  # noqa: E402
    EmbeddingBagCollection as QuantEBC,
)

SHAPES = [
    ("q0", 8, 12, ["f0", "f2"], DataType.INT8, PoolingType.SUM),
    ("q1", 6, 7, ["f1"], DataType.INT4, PoolingType.MEAN),
    ("q2", 4, 9, ["f3"], DataType.FP16, PoolingType.SUM),
]
ROWS = {"f0": 12, "f1": 7, "f2": 12, "f3": 9}


def _fill(ebc: Any, seed: int) -> None:
    """Seeded codes, scales and biases (or fp16 values) into the collection's TBE buffers."""
    g = torch.Generator().manual_seed(seed)
    for tbe in ebc._emb_modules:
        for w, sb in tbe.split_embedding_weights():
            if sb is None:  # fp16 rows, as bytes
                values = torch.randn(w.shape[0], w.shape[1] // 2, generator=g).half()
                w.copy_(values.view(torch.uint8))
                continue
            w.copy_(torch.randint(0, 256, tuple(w.shape), generator=g, dtype=torch.uint8))
            scale = (torch.rand(w.shape[0], generator=g) * 0.02 + 1e-3).half()
            bias = (torch.rand(w.shape[0], generator=g) - 0.5).half()
            sb.copy_(torch.stack([scale, bias], dim=1).contiguous().view(torch.uint8))


def _quant_ebc(weighted: bool, out: torch.dtype = torch.float32, seed: int = 0) -> Any:
    tables = [
        EmbeddingBagConfig(
            name=n, embedding_dim=d, num_embeddings=r, feature_names=f, data_type=t, pooling=p
        )
        for n, d, r, f, t, p in SHAPES
    ]
    ebc = QuantEBC(tables, is_weighted=weighted, device=torch.device("cpu"), output_dtype=out)
    _fill(ebc, seed)
    return ebc


def _kjt(batch: int, seed: int, weighted: bool) -> Any:
    g = torch.Generator().manual_seed(seed)
    keys = ["f3", "f1", "f0", "f2"]
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=g)
    lengths[1] = 0
    values = torch.cat(
        [
            torch.randint(
                0, ROWS[k], (int(lengths[i * batch : (i + 1) * batch].sum()),), generator=g
            )
            for i, k in enumerate(keys)
        ]
    )
    w = torch.rand(values.numel(), generator=g) - 0.3 if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths, weights=w)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("kernel", ["torch", "torch-hot", "fbgemm-tbe"])
def test_quant_collection_pools_as_itself(kernel: str, weighted: bool) -> None:
    from recperf.embed.kernels.base import KERNELS

    if kernel not in KERNELS:
        pytest.skip(f"{kernel} is not registered here")
    ebc = _quant_ebc(weighted)
    hot = {"q0": torch.tensor([3, 1]), "q1": torch.tensor([6])} if kernel == "torch-hot" else None
    module = EmbeddingBags.from_torchrec(ebc, kernel=kernel, hot_rows=hot)
    assert [(g["inputs"], g["row_format"], g["pooling"]) for g in module.describe()] == [
        (["f0", "f2"], "int8", "sum"),
        (["f3"], "fp16", "sum"),
        (["f1"], "int4", "mean"),
    ]
    for seed in range(2):
        kjt = _kjt(batch=3, seed=seed, weighted=weighted)
        got = module(kjt)
        want = ebc(kjt)
        assert got.keys() == want.keys() == ["f0", "f2", "f3", "f1"]
        assert got.length_per_key() == want.length_per_key() == [8, 8, 4, 6]
        assert got.values().dtype == want.values().dtype == torch.float32
        torch.testing.assert_close(got.values(), want.values(), rtol=1e-5, atol=1e-5)


def test_quant_collection_output_dtype_is_kept() -> None:
    ebc = _quant_ebc(False, out=torch.float16)
    kjt = _kjt(batch=2, seed=4, weighted=False)
    got, want = EmbeddingBags.from_torchrec(ebc)(kjt), ebc(kjt)
    assert got.values().dtype == want.values().dtype == torch.float16
    torch.testing.assert_close(got.values(), want.values(), rtol=2e-3, atol=2e-3)


def test_quant_collection_rows_are_read_in_place() -> None:
    ebc = _quant_ebc(False)
    module = EmbeddingBags.from_torchrec(ebc)
    buffers = [tbe.weights_host for tbe in ebc._emb_modules]

    def inside(x: torch.Tensor) -> bool:
        return any(
            b.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            and b.data_ptr() <= x.data_ptr() < b.data_ptr() + b.numel()
            for b in buffers
        )

    sbs = [getattr(module, f"scale_bias{t}") for t in range(3)]
    weights = [getattr(module, f"weight{t}") for t in range(3)]
    assert all(inside(w) for w in weights)
    assert [sb is not None and inside(sb) for sb in sbs] == [True, False, True]  # fp16: none
    # Shared, not copied: a change to the collection's rows shows after rebuild().
    kjt = _kjt(batch=2, seed=1, weighted=False)
    _fill(ebc, seed=9)
    module.rebuild()
    torch.testing.assert_close(module(kjt).values(), ebc(kjt).values(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("alignment", [16, 1])
def test_a_float_collection_quantized_by_torchrec(alignment: int) -> None:
    """TorchRec's rows used where they lie, 16-byte aligned (``from_float``'s default, 16 B
    apart for 12 B of row: ``describe()`` says how to have them unpadded) or unpadded."""
    from torch import quantization as tq
    from torchrec import EmbeddingBagCollection
    from torchrec.modules.embedding_configs import QuantConfig
    from torchrec.quant.embedding_modules import quant_prep_customize_row_alignment

    torch.manual_seed(2)
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=8, num_embeddings=10, feature_names=[f"f{i}"]
        )
        for i in range(2)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    ebc.qconfig = QuantConfig(
        activation=tq.PlaceholderObserver.with_args(dtype=torch.float),
        weight=tq.PlaceholderObserver.with_args(dtype=torch.quint8),
    )
    quant_prep_customize_row_alignment(ebc, [EmbeddingBagCollection], alignment)
    qebc = QuantEBC.from_float(ebc)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1"], values=torch.tensor([1, 2, 9, 0, 4]), lengths=torch.tensor([2, 1, 1, 1])
    )
    got = EmbeddingBags.from_torchrec(qebc)(kjt)
    torch.testing.assert_close(got.values(), qebc(kjt).values(), rtol=1e-5, atol=1e-6)
    assert [g["row_format"] for g in EmbeddingBags.from_torchrec(qebc).describe()] == ["int8"]
    if "fbgemm-tbe" not in KERNELS:
        return
    tbe = EmbeddingBags.from_torchrec(qebc, "fbgemm-tbe")
    torch.testing.assert_close(tbe(kjt).values(), qebc(kjt).values(), rtol=1e-5, atol=1e-6)
    flat = tbe(kjt.values(), kjt.offsets())  # the TBE layout, as FBGEMM's module takes it
    assert flat.keys() == ["f0", "f1"] and torch.equal(flat.values(), tbe(kjt).values())
    (group,) = tbe.describe()
    padded = "16 B apart for 12 B of row" in group["note"]
    assert padded is (alignment == 16)
    assert padded is ("quant_prep_customize_row_alignment" in group["note"])


def _bags(
    dims: tuple[int, ...] = (8, 6), dtype: torch.dtype = torch.float32
) -> list[nn.EmbeddingBag]:
    torch.manual_seed(3)
    return [nn.EmbeddingBag(40 + 10 * i, d, mode="sum", dtype=dtype) for i, d in enumerate(dims)]


TRACE = Trace(name="t", ids=(torch.arange(600) % 37,), rows=(37,))


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp8", "int8", "int4"])
def test_quantize_converts_float_tables_and_reports_the_error(fmt: str) -> None:
    bags = _bags()
    before = [b.weight.detach().clone() for b in bags]
    module = EmbeddingBags.from_torch(bags)
    quant = module.quantize(fmt, trace=TRACE, bags=32, pooling_factor=5)
    assert module.quantization is None and quant is not module
    assert [g["row_format"] for g in quant.describe()] == [fmt, fmt]
    assert all(torch.equal(b.weight.detach(), w) for b, w in zip(bags, before, strict=True))
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, b.num_embeddings, (6,), generator=g) for b in bags]
    offs = [torch.tensor([0, 2, 2, 5])] * 2
    got = quant(ids, offs)
    for i, bag in enumerate(bags):
        q, sb = quantize(bag.weight.detach(), fmt)
        rows = dequantize(q, sb, fmt)
        want = nn.functional.embedding_bag(ids[i], rows, offs[i], mode="sum")
        assert got[i].dtype == torch.float32  # what the float bags return
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-6)
    report = quant.quantization
    assert isinstance(report, QuantizationReport)
    assert (report.row_format, report.trace, report.pooling_factor) == (fmt, "t", (5, 5))
    assert [(t.table, t.dim, t.bags) for t in report.tables] == [
        ("bags[0]", 8, 32),
        ("bags[1]", 6, 32),
    ]
    for t in report.tables:
        assert t.bytes_per_row_before == 4 * t.dim
        assert t.bytes_per_row_after == row_bytes(fmt, t.dim)
        assert 0 < t.mean_rel_err <= t.max_rel_err < {"fp16": 1e-3, "bf16": 8e-3}.get(fmt, 0.2)
    assert QuantizationReport.from_json(report.to_json()) == report


def test_pooled_error_is_the_relative_l2_error_of_each_bag() -> None:
    weight = torch.tensor([[0.0, 1.0], [0.5, -0.25], [2.0, 3.0]])
    q, sb = quantize(weight, "int8")
    table = QuantizedTable(q, sb, "int8")
    ids = torch.tensor([[0, 1], [2, 2]])
    rows = dequantize(q, sb, "int8").double()
    ref = weight.double()
    want = [
        float((rows[0] + rows[1] - ref[0] - ref[1]).norm() / (ref[0] + ref[1]).norm()),
        float((2 * rows[2] - 2 * ref[2]).norm() / (2 * ref[2]).norm()),
    ]
    assert pooled_error(weight, table, ids).tolist() == pytest.approx(want, rel=1e-12)
    same = QuantizedTable(weight, None, "fp32")
    assert pooled_error(weight, same, ids).tolist() == [0.0, 0.0]


def test_trace_bags_cycle_the_stream_modulo_the_rows() -> None:
    trace = Trace(name="s", ids=(torch.tensor([5, 1, 7]),), rows=(8,))
    (ids,) = trace_bags(trace, [4], bags=2, pooling_factor=[2])
    assert ids.tolist() == [[1, 1], [3, 1]]


def test_quantize_is_all_or_nothing() -> None:
    bags = _bags(dims=(8, 3))
    module = EmbeddingBags.from_torch(bags)
    with pytest.raises(ConfigError) as err:
        module.quantize("int4", trace=TRACE, bags=4)
    assert str(err.value) == "bags[1] dim: int4 packs two columns per byte; 3 is odd"
    assert module.quantization is None and [g["row_format"] for g in module.describe()] == [
        "fp32",
        "fp32",
    ]
    with pytest.raises(ConfigError, match=r"^bags\[0\]: already int8 rows; quantize converts"):
        module.quantize("int8", trace=TRACE, bags=4).quantize("int4", trace=TRACE, bags=4)
    with pytest.raises(ConfigError, match=r"^dtype: 'int3' is not a row format; allowed: fp32"):
        module.quantize("int3", trace=TRACE)
    nan = torch.tensor([[1.0, float("nan")]])
    with pytest.raises(ConfigError, match=r"^tables\[1\] weight: holds NaN or infinite values"):
        quantize_tables([torch.ones(1, 2), nan], "int8", ["tables[0]", "tables[1]"])


def test_quantize_keeps_a_collections_keys_and_float32_output() -> None:
    from torchrec import EmbeddingBagCollection

    torch.manual_seed(6)
    tables = [
        EmbeddingBagConfig(name="a", embedding_dim=4, num_embeddings=10, feature_names=["x"]),
        EmbeddingBagConfig(name="b", embedding_dim=4, num_embeddings=5, feature_names=["y"]),
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    quant = EmbeddingBags.from_torchrec(ebc).quantize("int8", trace=TRACE, bags=8)
    assert [t.table for t in quant.quantization.tables] == ["table 'a'", "table 'b'"]  # type: ignore[union-attr]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["x", "y"], values=torch.tensor([1, 9, 4]), lengths=torch.tensor([2, 1])
    )
    got, want = quant(kjt), ebc(kjt)
    assert got.keys() == ["x", "y"] and got.values().dtype == torch.float32
    torch.testing.assert_close(got.values(), want.values().detach(), rtol=0.05, atol=0.02)


def test_hot_rows_and_train_mode_are_explicit() -> None:
    bags = _bags()
    with pytest.raises(ConfigError, match=r"^kernel 'torch-hot' remaps hot rows: give hot_rows"):
        EmbeddingBags.from_torch(bags, kernel="torch-hot")
    counted = EmbeddingBags.from_torch(
        bags, kernel="torch-hot", config=DropInConfig(count_hot_rows=True)
    )
    assert counted.choices[0].kernel == "torch-hot"
    wrong = Trace(name="w", ids=(torch.tensor([1]), torch.tensor([2])), rows=(40, 51))
    with pytest.raises(ConfigError, match=r"^sample: stream 1 is over 51 rows, bags\[1\] has 50"):
        EmbeddingBags.from_torch(bags, kernel="torch-hot", sample=wrong)
    module = EmbeddingBags.from_torch(bags)
    assert not module.training  # starts in eval mode
    ids, offs = [torch.tensor([1])] * 2, [torch.tensor([0])] * 2
    module.train()
    with pytest.raises(ConfigError, match=r"^train\(\): EmbeddingBags is inference only"):
        module(ids, offs)
    with torch.no_grad():  # no gradient wanted: runs
        assert len(module(ids, offs)) == 2
    assert len(module.eval()(ids, offs)) == 2


def _split(ebc: Any, table: int) -> tuple[Any, int]:
    """The TBE holding table ``table`` of SHAPES and its index there."""
    name = SHAPES[table][0]
    for tbe in ebc._emb_modules:
        names = [spec[0] for spec in tbe.embedding_specs]
        if name in names:
            return tbe, names.index(name)
    raise AssertionError(name)


def test_bad_quantized_tables_name_the_table_and_field(monkeypatch: pytest.MonkeyPatch) -> None:
    from recperf.embed.kernels.base import KERNELS, KernelTraits
    from recperf.embed.kernels.reference import TorchReference

    ebc = _quant_ebc(False)
    tbe, i = _split(ebc, 1)
    _, sb = tbe.split_embedding_weights()[i]
    sb[2] = torch.tensor([float("nan"), 0.0]).half().view(torch.uint8)
    with pytest.raises(ConfigError) as err:
        EmbeddingBags.from_torchrec(ebc)
    assert str(err.value) == "table 'q1' scale_bias: row 2 has a NaN or infinite scale or bias"

    ebc = _quant_ebc(False)
    tbe, i = _split(ebc, 0)
    splits = tbe.split_embedding_weights()
    narrow = [(w, s[:, :2] if j == i else s) for j, (w, s) in enumerate(splits)]
    monkeypatch.setattr(tbe, "split_embedding_weights", lambda: narrow)
    with pytest.raises(ConfigError) as err:
        EmbeddingBags.from_torchrec(ebc)
    assert str(err.value) == (
        "table 'q0' scale_bias: expected uint8 [12, 4] (float16 scale, bias), "
        "got (12, 2) torch.uint8"
    )

    ebc = _quant_ebc(False)
    tbe, _ = _split(ebc, 1)  # the mean-pooled table has a TBE of its own
    tbe.weights_host = tbe.weights_host.to("meta")
    with pytest.raises(ConfigError) as err:
        EmbeddingBags.from_torchrec(ebc)
    assert str(err.value) == (
        "tables: all must be on one device, got table 'q0' on cpu, table 'q1' on meta"
    )

    KERNELS.register("test-fp32-only", traits=KernelTraits(formats=frozenset({"fp32"}), cpu=True))(
        TorchReference
    )
    try:
        with pytest.raises(ConfigError) as err:
            EmbeddingBags.from_torchrec(_quant_ebc(False), kernel="test-fp32-only")
        assert str(err.value) == (
            "table 'q0': kernel 'test-fp32-only' does not read int8 rows (it reads fp32)"
        )
    finally:
        KERNELS.unregister("test-fp32-only")

    two = EmbeddingBagConfig(
        name="q9", embedding_dim=8, num_embeddings=4, feature_names=["f"], data_type=DataType.INT2
    )
    with pytest.raises(ConfigError) as err:
        EmbeddingBags.from_torchrec(QuantEBC([two], is_weighted=False, device=torch.device("cpu")))
    assert str(err.value) == (
        "table 'q9' data_type: int2 rows are not read here; allowed: fp32, fp16, int8, int4"
    )
