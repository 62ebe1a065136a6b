"""``EmbeddingBags`` pools as the torch bags and the TorchRec collection it replaces (the Triton
kernels in the interpreter), finds the autotuner's cached winner, remaps original ids inside,
and refuses what it cannot pool with one clear error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from recperf.core.errors import ConfigError
from recperf.embed import DropInConfig, EmbeddingBags
from recperf.embed.autotune import cache_key
from recperf.embed.kernels.base import RTOL, Lookup
from recperf.embed.kernels.formats import format_of
from recperf.embed.traces import Trace

torchrec = pytest.importorskip("torchrec")
from torchrec import (  # noqa: E402
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    KeyedJaggedTensor,
    PoolingType,
)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
COUNT = DropInConfig(count_hot_rows=True)
"""Lets a hot-row kernel without hot rows or a sample count them in the inputs."""
DEBUG = DropInConfig(debug=True)
TRITON = ("triton", "triton-prefetch", "hot-l2", "combined")
Inputs = tuple[list[torch.Tensor], list[torch.Tensor | None], list[torch.Tensor | None] | None]


def _bags(dtype: torch.dtype = torch.float32, seed: int = 0) -> list[nn.EmbeddingBag]:
    """Mixed widths and poolings (three groups), one bag with include_last_offset."""
    torch.manual_seed(seed)
    shapes = [
        (11, 4, "sum", False),
        (7, 4, "mean", False),
        (5, 3, "sum", True),
        (9, 4, "sum", False),
    ]
    return [
        nn.EmbeddingBag(r, d, mode=m, include_last_offset=last, dtype=dtype)
        for r, d, m, last in shapes
    ]


def _inputs(bags: list[nn.EmbeddingBag], batch: int, seed: int, weighted: bool = False) -> Inputs:
    """Per bag 1-D ids with offsets as the bag takes them; bag lengths 0..3 (empty ones too)."""
    g = torch.Generator().manual_seed(seed)
    ids, offs, psw = [], [], []
    for i, bag in enumerate(bags):
        lengths = torch.randint(0, 4, (batch,), generator=g)
        lengths[i % batch] = 0  # every input has an empty bag
        n = int(lengths.sum())
        ids.append(torch.randint(0, bag.num_embeddings, (n,), generator=g))
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
        offs.append(starts if bag.include_last_offset else starts[:-1])
        w = torch.rand(n, generator=g, dtype=torch.float32) - 0.3
        psw.append(w.to(bag.weight.dtype) if weighted and bag.mode == "sum" else None)
    return ids, offs, psw if weighted else None


def _magnitude(bag: nn.EmbeddingBag, ids: torch.Tensor, off: Any, w: Any) -> torch.Tensor:
    """The bag pooled over |weights| and |per-sample weights|: bounds the summation error."""
    return F.embedding_bag(
        ids,
        bag.weight.detach().float().abs(),
        off,
        mode=bag.mode,
        per_sample_weights=None if w is None else w.float().abs(),
        include_last_offset=bag.include_last_offset,
    )


def _assert_pools_as(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> None:
    """Equal up to the summation order: RTOL of the weight dtype times the pooled magnitude."""
    assert got.shape == want.shape and got.dtype == want.dtype and got.device == want.device
    err = (got.double() - want.double()).abs()
    tol = RTOL[format_of(want.dtype) or "fp32"] * bound.double() + 1e-12
    assert bool((err <= tol).all()), f"max error {float(err.max())}"


def _check_bags(module: EmbeddingBags, bags: list[nn.EmbeddingBag], inputs: Inputs) -> None:
    ids, offs, psw = inputs
    got = module(ids, offs, psw)
    assert isinstance(got, list) and len(got) == len(bags)
    for i, bag in enumerate(bags):
        w = None if psw is None else psw[i]
        with torch.no_grad():
            want = bag(ids[i], offs[i], per_sample_weights=w)
        _assert_pools_as(got[i], want, _magnitude(bag, ids[i], offs[i], w))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", ["torch", "torch-hot"])
@pytest.mark.parametrize("weighted", [False, True])
def test_from_torch_pools_as_the_bags(kernel: str, dtype: torch.dtype, weighted: bool) -> None:
    bags = _bags(dtype)
    module = EmbeddingBags.from_torch(bags, kernel=kernel, config=COUNT)
    assert [g["inputs"] for g in module.describe()] == [
        ["bags[0]", "bags[3]"],
        ["bags[1]"],
        ["bags[2]"],
    ]
    for seed in range(2):
        _check_bags(module, bags, _inputs(bags, batch=4, seed=seed, weighted=weighted))


def test_two_d_fixed_length_input_and_a_module_list() -> None:
    bags = nn.ModuleList([nn.EmbeddingBag(6, 3, mode="mean"), nn.EmbeddingBag(8, 3, mode="sum")])
    module = EmbeddingBags.from_torch(bags)
    g = torch.Generator().manual_seed(3)
    ids = [torch.randint(0, 6, (5, 2), generator=g), torch.randint(0, 8, (5, 2), generator=g)]
    psw = [None, torch.rand(5, 2, generator=g)]
    got = module(ids, None, psw)
    with torch.no_grad():
        want = [bags[0](ids[0]), bags[1](ids[1], per_sample_weights=psw[1])]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    zero = module([i[:, :0] for i in ids])  # bags of length 0 pool to zeros
    assert all(bool((z == 0).all()) and z.shape == (5, 3) for z in zero)
    assert [tuple(z.shape) for z in module([i[:0] for i in ids])] == [(0, 3), (0, 3)]


@pytest.mark.parametrize("kernel", TRITON)
def test_triton_kernels_pool_as_the_bags(kernel: str) -> None:
    pytest.importorskip("triton")
    dtype = torch.float16 if kernel in ("triton-prefetch", "combined") else torch.float32
    bags = _bags(dtype, seed=1)
    module = EmbeddingBags.from_torch(bags, kernel=kernel, config=COUNT)
    assert {c.kernel for c in module.choices} == {kernel}
    _check_bags(module, bags, _inputs(bags, batch=3, seed=5, weighted=True))


@pytest.mark.parametrize("kernel", ["torch-hot", "hot-l2"])
def test_remap_kernels_take_original_ids(kernel: str) -> None:
    if kernel == "hot-l2":
        pytest.importorskip("triton")
    bags = _bags(seed=2)
    hot = [torch.tensor([7, 2]), torch.tensor([6]), torch.tensor([4, 0, 1]), torch.tensor([8])]
    module = EmbeddingBags.from_torch(bags, kernel=kernel, hot_rows=hot)
    group = module._groups[0]  # bags 0 and 3
    if kernel == "torch-hot":  # the hottest row moved to the front: ids are remapped inside
        remap = group.kernel._remap  # type: ignore[attr-defined]
        assert int(remap[0][7]) == 0 and int(remap[1][8]) == 0
    else:
        front = group.kernel.remapper.hot_region  # type: ignore[attr-defined]
        assert torch.equal(front[0], bags[0].weight.detach()[7])
        assert torch.equal(front[1], bags[3].weight.detach()[8])
    _check_bags(module, bags, _inputs(bags, batch=4, seed=7, weighted=True))


def test_hot_rows_from_a_sample_trace() -> None:
    bags = [nn.EmbeddingBag(10, 2, mode="sum"), nn.EmbeddingBag(20, 2, mode="sum")]
    ids0 = torch.tensor([3, 3, 3, 5, 5, 1])
    ids1 = torch.tensor([9, 9, 2])
    sample = Trace(name="sample", ids=(ids0, ids1), rows=(10, 20))
    cfg = DropInConfig(hot_fraction=0.2)
    module = EmbeddingBags.from_torch(bags, kernel="torch-hot", sample=sample, config=cfg)
    hot = module._groups[0].hot_rows
    assert hot is not None
    # 20% of 10 rows: 3 then 5; 20% of 20 rows is 4, but only 9 and 2 were seen.
    assert [h.tolist() for h in hot] == [[3, 5], [9, 2]]
    _check_bags(module, bags, _inputs(bags, batch=3, seed=1))


def _ebc(dtype: Any = None, weighted: bool = False) -> Any:
    torch.manual_seed(4)
    kw = {} if dtype is None else {"data_type": dtype}
    mean = PoolingType.SUM if weighted else PoolingType.MEAN
    shapes = [("t0", 4, 12, ["f0", "f2"], PoolingType.SUM), ("t1", 3, 6, ["f1"], mean),
              ("t2", 4, 9, ["f3"], PoolingType.SUM)]  # fmt: skip
    tables = [
        EmbeddingBagConfig(
            name=n, embedding_dim=d, num_embeddings=r, feature_names=f, pooling=p, **kw
        )
        for n, d, r, f, p in shapes
    ]
    return EmbeddingBagCollection(tables=tables, is_weighted=weighted, device=torch.device("cpu"))


def _kjt(batch: int, seed: int, weighted: bool, wdtype: torch.dtype = torch.float32) -> Any:
    g = torch.Generator().manual_seed(seed)
    keys = ["f3", "f1", "f0", "f2"]  # not the collection's order
    rows = {"f0": 12, "f1": 6, "f2": 12, "f3": 9}
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=g)
    lengths[1] = 0
    values = torch.cat(
        [
            torch.randint(
                0, rows[k], (int(lengths[i * batch : (i + 1) * batch].sum()),), generator=g
            )
            for i, k in enumerate(keys)
        ]
    )
    w = (torch.rand(values.numel(), generator=g) - 0.3).to(wdtype) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths, weights=w)


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("kernel", ["torch-hot", "combined", "bag-concat"])
def test_from_torchrec_pools_as_the_collection(kernel: str, fp16: bool, weighted: bool) -> None:
    from torchrec.modules.embedding_configs import DataType

    if kernel == "combined":
        pytest.importorskip("triton")
    ebc = _ebc(DataType.FP16 if fp16 else None, weighted)
    hot = {"t0": torch.tensor([5, 0]), "t2": torch.tensor([8])}  # by name; t1 has none
    if kernel == "bag-concat":  # pools per-table inputs (its parts trait); remaps no rows
        module = EmbeddingBags.from_torchrec(ebc, kernel=kernel)
        assert all(g.parts for g in module._groups)
    else:
        module = EmbeddingBags.from_torchrec(ebc, kernel=kernel, hot_rows=hot)
        assert module._groups[0].hot_rows is not None
        assert [h.tolist() for h in module._groups[0].hot_rows] == [[5, 0], [5, 0], [8]]
    for seed in range(2):
        kjt = _kjt(
            batch=3, seed=seed, weighted=weighted, wdtype=torch.float16 if fp16 else torch.float32
        )
        got = module(kjt)
        with torch.no_grad():
            want = ebc(kjt)
        assert got.keys() == want.keys() == ["f0", "f2", "f1", "f3"]
        assert got.length_per_key() == want.length_per_key()
        assert got.values().dtype == torch.float32
        # Bound: |weights| pooled with |per-sample weights|, per feature as the collection does.
        feats = kjt.to_dict()
        bound = []
        for cfg in ebc.embedding_bag_configs():
            bag = ebc.embedding_bags[cfg.name]
            for f in cfg.feature_names:
                w = feats[f].weights() if weighted else None
                bound.append(_magnitude(bag, feats[f].values(), feats[f].offsets(), w))
        fmt = "fp16" if fp16 else "fp32"
        err = (got.values().double() - want.values().double()).abs()
        assert bool((err <= RTOL[fmt] * torch.cat(bound, 1).double() + 1e-12).all())


def test_a_collection_of_one_group_pools_in_key_order() -> None:
    torch.manual_seed(5)
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=2, num_embeddings=12, feature_names=[f"f{i}"]
        )
        for i in range(4)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    module = EmbeddingBags.from_torchrec(ebc)
    assert len(module.describe()) == 1
    kjt = _kjt(batch=4, seed=3, weighted=False)
    with torch.no_grad():
        want = ebc(kjt)
    got = module(kjt)
    assert got.keys() == want.keys() == ["f0", "f1", "f2", "f3"]
    torch.testing.assert_close(got.values(), want.values(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kernel", ["torch", "bag-concat", "fbgemm-tbe"])
def test_a_kjt_in_feature_order_goes_to_the_kernel_whole(
    kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyedJaggedTensor whose keys are the features in order is one TBE-layout batch: the
    one group's kernel takes it as it is (never cut per feature) and pools what the collection
    pools; in another key order it is cut and pools the same."""
    if kernel == "fbgemm-tbe":
        pytest.importorskip("fbgemm_gpu")
    import recperf.embed.dropin_torchrec as drt

    torch.manual_seed(5)
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=3, num_embeddings=12,
                                 feature_names=[f"f{i}"]) for i in range(4)]  # fmt: skip
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    module = EmbeddingBags.from_torchrec(ebc, kernel=kernel)
    shuffled = _kjt(batch=4, seed=3, weighted=False)
    jagged = shuffled.to_dict()
    kjt = KeyedJaggedTensor.from_jt_dict({f"f{i}": jagged[f"f{i}"] for i in range(4)})
    with torch.no_grad():
        want = ebc(kjt)
    cut = module(shuffled)
    calls: list[int] = []
    real = drt.kjt_inputs
    monkeypatch.setattr(drt, "kjt_inputs", lambda *a: calls.append(1) or real(*a))
    whole = module(kjt)
    assert calls == [] and kjt.keys() == ["f0", "f1", "f2", "f3"]
    assert whole.keys() == want.keys() and whole.length_per_key() == want.length_per_key()
    torch.testing.assert_close(whole.values(), want.values(), rtol=1e-6, atol=1e-7)
    assert torch.equal(whole.values(), cut.values())
    module(shuffled)
    assert calls == [1]  # another key order is cut per feature


def test_auto_finds_the_cached_winner_and_falls_back_with_a_reason(tmp_path: Path) -> None:
    bags = _bags(seed=3)[:1]
    inputs = _inputs(bags, batch=4, seed=2)
    cache = tmp_path / "tune.json"
    cfg = DropInConfig(cache=cache, count_hot_rows=True)
    empty = EmbeddingBags.from_torch(bags, kernel="auto", config=cfg)
    assert empty.choices[0].kernel == "torch" and empty.choices[0].source == "fallback"
    assert "no autotune cache" in empty.choices[0].note
    # Time only when asked: tune caches the winner, and auto finds it without timing.
    tuned = EmbeddingBags.from_torch(bags, config=cfg).tune(*inputs, variants=["torch-hot"], reps=1)
    assert tuned[0].kernel == "torch-hot" and tuned[0].source == "tuned"
    # A second module asking to tune the same shapes reads the cache instead of timing.
    again = EmbeddingBags.from_torch(bags, config=cfg).tune(*inputs, variants=["torch-hot"], reps=1)
    assert again[0].source == "autotune cache" and "cached" in again[0].note
    auto = EmbeddingBags.from_torch(bags, kernel="auto", config=cfg)
    assert auto.choices[0].kernel == "torch-hot" and auto.choices[0].source == "autotune cache"
    _check_bags(auto, bags, inputs)
    near = DropInConfig(cache=cache, batch_size=5, count_hot_rows=True)  # nearest tuned: 4
    assert (
        EmbeddingBags.from_torch(bags, kernel="auto", config=near).choices[0].kernel == "torch-hot"
    )
    # A winner that remaps hot rows, with none given nor counting allowed: the reference, why.
    cold = EmbeddingBags.from_torch(bags, kernel="auto", config=DropInConfig(cache=cache))
    assert cold.choices[0].kernel == "torch" and cold.choices[0].source == "fallback"
    assert "remaps hot rows and none were given" in cold.choices[0].note
    hot = [torch.tensor([1, 2])]
    warm = EmbeddingBags.from_torch(
        bags, kernel="auto", hot_rows=hot, config=DropInConfig(cache=cache)
    )
    assert warm.choices[0].kernel == "torch-hot"
    elsewhere = DropInConfig(cache=cache, trace="elsewhere")
    miss = EmbeddingBags.from_torch(bags, kernel="auto", config=elsewhere).choices[0]
    assert (
        miss.source == "fallback"
        and "no cached winner" in miss.note
        and "trace=elsewhere" in miss.note
    )
    # A winner this machine cannot build runs as the reference, saying why.
    store = json.loads(cache.read_text())
    ((key, entry),) = store.items()
    store[key] = {**entry, "kernel": "gone-kernel"}
    cache.write_text(json.dumps(store))
    gone = EmbeddingBags.from_torch(bags, kernel="auto", config=cfg).choices[0]
    assert gone.kernel == "torch" and "gone-kernel" in gone.note and gone.source == "fallback"


def test_auto_prefers_the_nearest_batch(tmp_path: Path) -> None:
    bags = [nn.EmbeddingBag(5, 2)]
    module = EmbeddingBags.from_torch(bags)
    tables = module._groups[0].tables
    store = {}
    for b, kernel in ((2, "torch"), (64, "torch-hot")):
        lk = Lookup(
            indices=torch.zeros(b, dtype=torch.int64), offsets=torch.arange(b + 1), batch_size=b
        )
        store[cache_key(tables, [lk], "t", [kernel])] = {"kernel": kernel, "params": {}, "ms": 1.0}
    cache = tmp_path / "c.json"
    cache.write_text(json.dumps(store))
    for hint, want in ((3, "torch"), (50, "torch-hot"), (None, "torch-hot")):  # None: ms per id
        cfg = DropInConfig(cache=cache, batch_size=hint, count_hot_rows=True)
        assert EmbeddingBags.from_torch(bags, kernel="auto", config=cfg).choices[0].kernel == want


def test_mixed_dtypes_are_grouped() -> None:
    torch.manual_seed(8)
    bags = [
        nn.EmbeddingBag(6, 3, dtype=torch.float16),
        nn.EmbeddingBag(5, 3),
        nn.EmbeddingBag(4, 3, dtype=torch.float16),
    ]
    module = EmbeddingBags.from_torch(bags, kernel="torch-hot", config=COUNT)
    assert [(g["inputs"], g["dtype"]) for g in module.describe()] == [
        (["bags[0]", "bags[2]"], "float16"),
        (["bags[1]"], "float32"),
    ]
    _check_bags(module, bags, _inputs(bags, batch=3, seed=4))


def test_half_rebuilds_the_kernels() -> None:
    bags = _bags(seed=6)
    module = EmbeddingBags.from_torch(bags, kernel="torch-hot", config=COUNT).half()
    halves = [b.half() for b in bags]
    assert {g["dtype"] for g in module.describe()} == {"float16"}
    _check_bags(module, halves, _inputs(halves, batch=2, seed=3))


def _bad_bags(case: str) -> Any:
    if case == "max":
        return [nn.EmbeddingBag(4, 2, mode="max")]
    if case == "padding_idx":
        return [nn.EmbeddingBag(4, 2, padding_idx=0)]
    if case == "sequence":
        return [nn.Embedding(4, 2)]
    if case == "float64":
        return [nn.EmbeddingBag(4, 2, dtype=torch.float64)]
    return nn.EmbeddingBag(4, 2)  # one bag, not a list


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("max", "mode 'max' is not supported"),
        ("padding_idx", "padding_idx = 0 is not supported"),
        ("sequence", "sequence embedding"),
        ("float64", "is not float32, float16 or bfloat16"),
        ("single", "expected a list of torch.nn.EmbeddingBag"),
    ],
)
def test_unsupported_modules_are_refused(case: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EmbeddingBags.from_torch(_bad_bags(case))


@pytest.mark.parametrize("weighted", [False, True])
def test_a_torchrec_module_takes_the_tbe_layout_as_its_kjt(weighted: bool) -> None:
    """Built from TorchRec, the module also takes the batch as FBGEMM's module does (ids
    concatenated in the collection's feature order, ``[F * B + 1]`` offsets, weights): the
    same KeyedTensor as for that batch's KeyedJaggedTensor; a bad offsets tensor is refused
    in one line."""
    ebc = _ebc(weighted=weighted)
    module = EmbeddingBags.from_torchrec(ebc, kernel="bag-concat")
    jagged = _kjt(batch=3, seed=2, weighted=weighted).to_dict()
    order = ["f0", "f2", "f1", "f3"]  # the collection's features, in its order
    kjt = KeyedJaggedTensor.from_jt_dict({f: jagged[f] for f in order})
    w = kjt.weights() if weighted else None
    got = module(kjt.values(), kjt.offsets(), w)
    want = module(kjt)
    assert got.keys() == want.keys() == order
    assert torch.equal(got.values(), want.values())
    with torch.no_grad():
        torch.testing.assert_close(got.values(), ebc(kjt).values(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match=r"offsets: length 12 is not 4 inputs x B \+ 1"):
        module(kjt.values(), kjt.offsets()[:-1], w)


def test_one_group_takes_the_tbe_layout_without_making_a_kjt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every feature in one group, in order (the short road): the collection's KeyedTensor
    for the batch in the TBE layout, no ``KeyedJaggedTensor`` made on the way."""
    from recperf.embed import dropin_torchrec

    made: list[object] = []
    real = dropin_torchrec.tbe_kjt
    monkeypatch.setattr(dropin_torchrec, "tbe_kjt", lambda *a: made.append(a) or real(*a))
    torch.manual_seed(5)
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=4, num_embeddings=r, feature_names=[f"f{i}"])
        for i, r in enumerate((7, 5))
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    module = EmbeddingBags.from_torchrec(ebc, kernel="bag-concat")
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1"], values=torch.tensor([6, 0, 2, 4, 1, 3]),
        lengths=torch.tensor([2, 0, 1, 1, 2, 0]),
    )  # fmt: skip
    got = module(kjt.values(), kjt.offsets())
    assert not made and got.keys() == ["f0", "f1"]
    with torch.no_grad():
        torch.testing.assert_close(got.values(), ebc(kjt).values(), rtol=1e-5, atol=1e-6)


def test_unsupported_torchrec_modules_are_refused() -> None:
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection

    ec = EmbeddingCollection(
        tables=[EmbeddingConfig(name="t", embedding_dim=2, num_embeddings=4, feature_names=["f"])]
    )
    with pytest.raises(ConfigError, match="EmbeddingCollection returns sequence embeddings"):
        EmbeddingBags.from_torchrec(ec)
    module = EmbeddingBags.from_torchrec(_ebc(), config=DEBUG)
    with pytest.raises(ConfigError, match="expected a TorchRec KeyedJaggedTensor"):
        module([torch.tensor([1])])
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0"], values=torch.tensor([1]), lengths=torch.tensor([1])
    )
    with pytest.raises(ConfigError, match="no key 'f1'"):
        module(kjt)
    big = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1", "f2", "f3"],
        values=torch.tensor([1, 7, 1, 1]),
        lengths=torch.ones(4, dtype=torch.int64),
    )
    with pytest.raises(ConfigError, match=r"features\['f1'\].values: id 7 is outside table 't1'"):
        module(big)
    with pytest.raises(ConfigError, match="has no weights"):
        EmbeddingBags.from_torchrec(_ebc(weighted=True))(_kjt(2, 0, weighted=False))


def _call(case: str) -> None:
    bags = [nn.EmbeddingBag(6, 2, mode="sum"), nn.EmbeddingBag(6, 2, mode="mean")]
    module = EmbeddingBags.from_torch(bags, config=DEBUG)
    ids, off = torch.tensor([1, 2, 3]), torch.tensor([0, 2])
    calls = {
        "tables": ([ids], [off]),
        "device": ([ids, ids.to("meta")], [off, off.to("meta")]),
        "start": ([ids, ids], [off, torch.tensor([1, 2])]),
        "decreasing": ([ids, ids], [torch.tensor([0, 2, 1])] * 2),
        "past_end": ([ids, ids], [off, torch.tensor([0, 4])]),
        "range": ([ids, torch.tensor([1, 6, 0])], [off, off]),
        "batch": ([ids, ids], [off, torch.tensor([0, 1, 2])]),
        "two_d": ([ids[None], ids], [off, off]),
        "float_ids": ([ids.float(), ids], [off, off]),
        "mean_weights": ([ids, ids], [off, off], [None, torch.ones(3)]),
    }
    module(*calls[case])


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("tables", r"indices: 1 tensors for 2 tables"),
        ("device", r"indices\[1\]: is on meta, the table's weights on cpu"),
        ("start", r"offsets\[1\]: must start at 0, got 1"),
        ("decreasing", r"offsets\[0\]: must not decrease"),
        ("past_end", r"offsets\[1\]: must not decrease, nor pass len\(indices\) = 3"),
        ("range", r"indices\[1\]: id 6 is outside bags\[1\]'s rows 0..5"),
        ("batch", r"offsets\[1\]: 3 bags, input 0 has 2"),
        ("two_d", r"offsets\[0\]: must be None with 2-D indices"),
        ("float_ids", r"indices\[0\]: dtype torch.float32 is not"),
        ("mean_weights", r"per_sample_weights\[1\]: bags\[1\] pools by mean"),
    ],
)
def test_bad_inputs_are_one_clear_error(case: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _call(case)


def test_bad_settings_are_one_clear_error() -> None:
    bags = [nn.EmbeddingBag(6, 2)]
    with pytest.raises(ConfigError, match=r"hot_rows: expected one tensor per table \(1\), got 2"):
        EmbeddingBags.from_torch(bags, kernel="torch-hot", hot_rows=[torch.tensor([1])] * 2)
    with pytest.raises(ConfigError, match=r"hot_rows\[0\]: row ids must lie in 0..5"):
        EmbeddingBags.from_torch(bags, kernel="torch-hot", hot_rows=[torch.tensor([6])])
    with pytest.raises(ConfigError, match="kernel 'torch' does not remap hot rows"):
        EmbeddingBags.from_torch(bags, kernel="torch", hot_rows=[torch.tensor([1])])
    with pytest.raises(ConfigError, match="hot_fraction"):
        DropInConfig(hot_fraction=0.0)
    with pytest.raises(ConfigError, match="'auto' takes its options from the autotune cache"):
        EmbeddingBags.from_torch(bags, kernel="auto", options={"hot_fraction": 0.5})
    last = EmbeddingBags.from_torch([nn.EmbeddingBag(6, 2, include_last_offset=True)], config=DEBUG)
    with pytest.raises(ConfigError, match=r"offsets\[0\]: last offset 2 is not len\(indices\) = 3"):
        last([torch.tensor([1, 2, 3])], [torch.tensor([0, 1, 2])])
    with pytest.raises(ConfigError, match="bags: expected a list"):
        EmbeddingBags.from_torch(bags[0])  # type: ignore[arg-type]


def test_importing_recperf_embed_stays_cheap() -> None:
    code = "import sys, recperf.embed as e; print('torch' in sys.modules, 'dropin' in dir(e))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_auto_without_a_cached_winner_measures_on_the_first_forward(tmp_path: Path) -> None:
    from recperf.embed.kernels.base import kernel_traits

    bags = _bags(seed=9)
    inputs = _inputs(bags, batch=4, seed=3, weighted=True)
    cfg = DropInConfig(cache=tmp_path / "tune.json")
    module = EmbeddingBags.from_torch(bags, kernel="auto", config=cfg)
    assert all(c.source == "fallback" and "first forward" in c.note for c in module.choices)
    _check_bags(module, bags, inputs)  # the first call times, then pools with the winner
    for c in module.choices:
        assert c.source == "measured" and "ms per batch" in c.note
        assert not kernel_traits(c.kernel).hot_rows  # none given: no remapping kernel timed
    _check_bags(module, bags, inputs)
    later = EmbeddingBags.from_torch(bags, kernel="auto", config=cfg)
    assert [(c.kernel, c.source) for c in later.choices] == [
        (c.kernel, "autotune cache") for c in module.choices
    ]
    still = EmbeddingBags.from_torch(
        bags, kernel="auto", config=DropInConfig(cache=tmp_path / "other.json", measure=False)
    )
    _check_bags(still, bags, inputs)
    assert all(c.kernel == "torch" and c.source == "fallback" for c in still.choices)
