"""The drop-in over a kernel that pools per-table inputs (``bag-concat``, the ``parts`` trait,
issue 27): it returns what the bags return, in their dtype, as views of one output, with the
tables' weights still shared, and takes the general road (its checks, its errors) for
everything but the plain case."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from recperf.core.errors import ConfigError, ContractError
from recperf.embed import DropInConfig, EmbeddingBags
from recperf.embed.kernels import KERNELS, Lookup, Tables, make_lookup
from recperf.embed.kernels.bagconcat import BagConcat, numpy_shift, torch_shift
from recperf.embed.kernels.baglist import BagList
from recperf.embed.kernels.base import Parts, bag_starts, check_kernel, parts_of

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _bags(dtype: torch.dtype, last: tuple[bool, ...], mode: str = "sum") -> list[nn.EmbeddingBag]:
    torch.manual_seed(1)
    return [
        nn.EmbeddingBag(r, 5, mode=mode, include_last_offset=e, dtype=dtype)
        for r, e in zip((13, 4, 9), last, strict=True)
    ]


def _inputs(
    bags: list[nn.EmbeddingBag], batch: int, seed: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids, offs = [], []
    for bag in bags:
        lengths = torch.randint(0, 4, (batch,), generator=g)
        lengths[seed % batch] = 0  # an empty bag in every input
        ids.append(torch.randint(0, bag.num_embeddings, (int(lengths.sum()),), generator=g))
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        offs.append(starts if bag.include_last_offset else starts[:-1])
    return ids, offs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("last", [(False,) * 3, (True,) * 3, (True, False, True)])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_bag_concat_returns_what_the_bags_return(
    dtype: torch.dtype, last: tuple[bool, ...], mode: str
) -> None:
    bags = _bags(dtype, last, mode)
    module = EmbeddingBags.from_torch(bags, kernel="bag-concat")
    assert module._groups[0].parts and module._plain
    for seed in range(2):
        ids, offs = _inputs(bags, batch=4, seed=seed)
        got = module(ids, offs)
        with torch.no_grad():
            want = [bag(i, o) for bag, i, o in zip(bags, ids, offs, strict=True)]
        for a, b in zip(got, want, strict=True):  # one embedding_bag, the same sums: equal
            assert a.dtype == b.dtype == dtype and a.is_contiguous()
            assert torch.equal(a, b)
        # views of one output (no per-bag copies); the bags' weights are shared, not copied
        assert len({x.untyped_storage().data_ptr() for x in got}) == 1
    assert all(
        getattr(module, f"weight{t}").data_ptr() == b.weight.data_ptr() for t, b in enumerate(bags)
    )


def test_the_general_road_still_checks_and_pools() -> None:
    bags = _bags(torch.float32, (False, True, False))
    module = EmbeddingBags.from_torch(bags, kernel="bag-concat")
    ids, offs = _inputs(bags, batch=3, seed=2)
    with torch.no_grad():
        want = [bag(i, o) for bag, i, o in zip(bags, ids, offs, strict=True)]
    # int32 ids and offsets, and per-sample weights, go the general road to the same kernel
    got = module([i.int() for i in ids], [o.int() for o in offs])
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    ones = [torch.ones(i.numel()) for i in ids]
    got = module(ids, offs, ones)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    with pytest.raises(ConfigError, match=r"offsets\[1\]: 4 bags, input 0 has 3"):
        module(ids, [offs[0], torch.cat([offs[1], offs[1][-1:]]), offs[2]])
    with pytest.raises(ConfigError, match=r"indices\[2\]: dtype torch.float32 is not"):
        module([ids[0], ids[1], ids[2].float()], offs)
    with pytest.raises(ConfigError, match=r"indices: 2 tensors for 3 tables"):
        module(ids[:2], offs[:2])
    empty = module(
        [i[:0] for i in ids],
        [o[:0] if not b.include_last_offset else o[:1] for o, b in zip(offs, bags, strict=True)],
    )
    assert [tuple(x.shape) for x in empty] == [(0, 5)] * 3
    debug = EmbeddingBags.from_torch(bags, kernel="bag-concat", config=DropInConfig(debug=True))
    with pytest.raises(ConfigError, match=r"indices\[0\]: id 13 is outside bags\[0\]'s rows"):
        debug([torch.full_like(ids[0], 13), ids[1], ids[2]], offs)


def test_groups_of_mixed_widths_and_a_quantized_copy_cast_their_outputs() -> None:
    torch.manual_seed(4)
    bags = [nn.EmbeddingBag(6, 3), nn.EmbeddingBag(7, 2, mode="mean"), nn.EmbeddingBag(5, 3)]
    ids, offs = _inputs(bags, batch=3, seed=5)
    with torch.no_grad():
        want = [bag(i, o) for bag, i, o in zip(bags, ids, offs, strict=True)]
    module = EmbeddingBags.from_torch(bags, kernel="bag-concat")
    assert not module._plain and all(g.parts for g in module._groups)
    got = module(ids, offs)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    half = module.quantize("fp16", bags=4)  # fp16 rows, outputs in the originals' float32
    got = half(ids, offs)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.float32 and a.is_contiguous()
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)


def test_parts_of_and_bag_starts_cut_a_lookup_per_table() -> None:
    tables = Tables(weights=(torch.randn(7, 2), torch.randn(3, 2)))
    lookup = make_lookup(tables, batch_size=3, pooling_factor=2, seed=1, weighted=True)
    parts = parts_of(lookup)
    assert [int(i.numel()) for i in parts.indices] == [
        int(lookup.offsets[3] - lookup.offsets[0]),
        int(lookup.offsets[6] - lookup.offsets[3]),
    ]
    assert parts.per_sample_weights is not None and len(parts.per_sample_weights) == 2
    starts = bag_starts(parts.offsets, 3)
    assert starts.shape == (2, 3) and starts[:, 0].tolist() == [0, 0]
    ended = [torch.tensor([0, 1, 1, 4]), torch.tensor([0, 2, 2])]
    assert bag_starts(ended, 3).tolist() == [[0, 1, 1], [0, 2, 2]]


class WrongParts(BagConcat):
    """Pools right through a Lookup, wrong per table."""

    def pool_parts(self, parts: Parts) -> torch.Tensor:
        return super().pool_parts(parts) + 1


class Float32Parts(BagConcat):
    """Pools right per table, but in float32 where the rows are fp16 or bf16."""

    def pool_parts(self, parts: Parts) -> torch.Tensor:
        return super().pool_parts(parts).float()


class WrongFlat(BagConcat):
    """Pools right through a Lookup and per table, wrong on the drop-in's short road."""

    def pool_flat(self, indices: torch.Tensor, offsets: torch.Tensor, batch: int) -> torch.Tensor:
        return super().pool_flat(indices, offsets, batch) * 2


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (WrongParts, "pool_parts: at"),
        (Float32Parts, "pool_parts: dtype"),
        (WrongFlat, "pool_flat: at"),
    ],
)
def test_check_kernel_holds_pool_parts_to_the_reference(cls: type, message: str) -> None:
    traits = KERNELS.entry("bag-concat").traits
    KERNELS.register("test-parts", traits=traits)(cls)
    try:
        with pytest.raises(ContractError, match=message):
            check_kernel("test-parts", seed=3, cases=4)
    finally:
        KERNELS.unregister("test-parts")


def test_bag_concat_pools_a_weighted_mean_per_table_as_through_a_lookup() -> None:
    g = torch.Generator().manual_seed(2)
    tables = Tables(weights=(torch.randn(9, 4, generator=g), torch.randn(5, 4, generator=g)),
                    pooling="mean")  # fmt: skip
    lookup = make_lookup(tables, batch_size=4, pooling_factor=2, seed=3, weighted=True)
    kernel = KERNELS.build("bag-concat", None, tables)
    assert isinstance(kernel, BagConcat)
    via: Lookup = lookup
    torch.testing.assert_close(kernel.pool_parts(parts_of(via)).transpose(0, 1), kernel(via))


def test_bag_concat_pools_as_the_bags_batch_after_batch_whatever_the_bag_sizes() -> None:
    bags = _bags(torch.float32, (False, True, False))
    module = EmbeddingBags.from_torch(bags, kernel="bag-concat")
    assert isinstance(module._groups[0].kernel, BagConcat)
    batches = [_inputs(bags, batch=5, seed=s) for s in (0, 0, 1, 2, 0)]  # sizes repeat, change
    for ids, offs in batches:  # per bag, then in the TBE layout (its per-id shift kept)
        with torch.no_grad():
            want = [bag(i, o) for bag, i, o in zip(bags, ids, offs, strict=True)]
        for got in (module(ids, offs), module(*_flat(ids, offs, 5))):
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("with_offsets", [False, True])
def test_shifted_ids_agree_on_the_cpu_and_on_any_device(with_offsets: bool) -> None:
    g = torch.Generator().manual_seed(4)
    batch, first = 3, [0, 13, 17, 30]
    lengths = [torch.randint(0, 4, (batch,), generator=g) for _ in first]
    lengths[2].zero_()  # an input without ids
    ids = [torch.randint(0, 9, (int(n.sum()),), generator=g) for n in lengths]
    ids[1] = torch.arange(2 * int(lengths[1].sum()))[::2]  # a strided view
    starts = [torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)]) for n in lengths]
    offsets = [s if t % 2 else s[:-1] for t, s in enumerate(starts)] if with_offsets else None
    got = numpy_shift(ids, first, offsets, batch)
    want = torch_shift(ids, first, offsets, batch)
    assert torch.equal(got[0], torch.cat([i + f for i, f in zip(ids, first, strict=True)]))
    assert torch.equal(got[0], want[0])
    if offsets is None:
        assert got[1] is None and want[1] is None
        return
    assert got[1] is not None and want[1] is not None and torch.equal(got[1], want[1])
    assert got[1].tolist() == [0, *torch.cat(lengths).cumsum(0).tolist()]


@pytest.mark.parametrize(
    ("seconds", "want"),
    [
        ((2e-3, 1e-3, 3e-3), "bag-concat"),
        ((2e-3, 3e-3, 1e-3), "bag-list"),
        ((1e-3, 2e-3, 3e-3), "torch"),
    ],
)
@pytest.mark.parametrize("flat", [False, True])
def test_auto_times_a_winner_on_the_tbe_layout_against_parts_kernels_on_the_drop_ins_roads(
    monkeypatch: pytest.MonkeyPatch, seconds: tuple[float, ...], want: str, flat: bool
) -> None:
    """The winner on its road (here ``torch`` on the TBE layout, its outputs made per table)
    against every kernel that pools the inputs as given (``bag-concat``, ``bag-list``), per
    bag or (``flat``) in the TBE layout, where they run ``pool_lookup``: the fastest wins."""
    from recperf.embed import dropin_choice
    from recperf.embed.kernel_choice import KernelChoice

    winner = KernelChoice(kernel="torch", source="measured", note="torch 1.000 ms per batch")
    monkeypatch.setattr(dropin_choice, "measured_choice", lambda *a, **k: winner)
    calls: list[torch.Tensor] = []

    def timed(
        fn: object, inputs: list[object], reps: int, device: object, warmup: int
    ) -> list[float]:
        i, pos = divmod(len(calls), 3)  # round i runs roads i, i + 1, i + 2 (mod 3)
        assert (reps, warmup) == (1, 1)  # each timed call right after an untimed one
        calls.append(fn(inputs[0]))  # type: ignore[operator]
        return [seconds[(i + pos) % 3]]

    monkeypatch.setattr(dropin_choice, "time_calls", timed)
    lookups: list[object] = []
    short: list[object] = []
    for cls in (BagConcat, BagList):  # which road each parts kernel is timed on
        road = cls.pool_lookup
        counted = lambda k, lk, r=road: lookups.append(lk) or r(k, lk)  # noqa: E731
        monkeypatch.setattr(cls, "pool_lookup", counted)
        flat_road = cls.pool_flat
        went = lambda k, *a, r=flat_road: short.append(a) or r(k, *a)  # noqa: E731
        monkeypatch.setattr(cls, "pool_flat", went)
    bags = _bags(torch.float16, (False, True, False))
    module = EmbeddingBags.from_torch(bags, "auto", config=DropInConfig(kernel="auto", cache=None))
    ids, offs = _inputs(bags, batch=4, seed=0)
    got = module(*_flat(ids, offs, 4)) if flat else module(ids, offs)
    (choice,) = module.choices
    assert (choice.kernel, choice.source) == (want, "measured")
    assert len(calls) == 3 * dropin_choice.MEASURE_REPS
    assert all(c.shape == (3, 4, 5) and c.dtype == torch.float16 for c in calls)
    timed_flat = 2 * dropin_choice.MEASURE_REPS  # the two parts kernels' roads
    assert len(lookups) == (timed_flat if flat else 0)
    assert len(short) == int(flat and want != "torch")  # then pooled on the short road
    if want != "torch":
        layout = " (the inputs in the TBE layout), " if flat else ", "
        assert f"on the drop-in's road{layout}torch " in choice.note
        assert "alone: torch 1.000 ms" in choice.note
    with torch.no_grad():
        for a, bag, i, o in zip(got, bags, ids, offs, strict=True):
            torch.testing.assert_close(a, bag(i, o), rtol=2e-3, atol=2e-3)


def _flat(
    ids: list[torch.Tensor], offs: list[torch.Tensor], batch: int
) -> tuple[torch.Tensor, ...]:
    """The same batch in the TBE layout: ids concatenated, offsets ``[T * B + 1]``."""
    starts = [0]
    for i in ids:
        starts.append(starts[-1] + int(i.numel()))
    bag_starts = [o[:batch] + s for o, s in zip(offs, starts, strict=False)]
    return torch.cat(ids), torch.cat([*bag_starts, torch.tensor([starts[-1]])])


@pytest.mark.parametrize("kernel", ["bag-concat", "torch", "fbgemm-tbe"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_tbe_layout_pools_as_the_per_bag_inputs(dtype: torch.dtype, kernel: str) -> None:
    """One kernel for all bags takes the concatenated ids as they are (``pool_lookup``, or a
    TBE kernel's ``Lookup``); mixed groups, per-sample weights and ``debug`` cut them into
    per-bag views: the same outputs."""
    if kernel == "fbgemm-tbe" and (dtype == torch.bfloat16 or "fbgemm-tbe" not in KERNELS):
        pytest.skip("FBGEMM reads no bf16 rows (or is not installed)")
    bags = _bags(dtype, (True, False, True))
    module = EmbeddingBags.from_torch(bags, kernel=kernel)
    for seed in range(2):
        ids, offs = _inputs(bags, batch=4, seed=seed)
        flat_ids, flat_offs = _flat(ids, offs, 4)
        want = module(ids, offs)
        got = module(flat_ids, flat_offs)
        assert all(torch.equal(a, b) and a.dtype == dtype for a, b in zip(got, want, strict=True))
        ones = torch.ones(flat_ids.numel())
        weighted = module(flat_ids, flat_offs, ones)  # the general road, cut per bag
        assert all(torch.equal(a, b) for a, b in zip(weighted, want, strict=True))
    mixed = [nn.EmbeddingBag(7, 3), nn.EmbeddingBag(5, 4, mode="mean", include_last_offset=True)]
    ids, offs = _inputs(mixed, batch=3, seed=3)
    dropin = EmbeddingBags.from_torch(mixed)
    want = dropin(ids, offs)
    got = dropin(*_flat(ids, offs, 3))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    debug = EmbeddingBags.from_torch(bags, kernel="bag-concat", config=DropInConfig(debug=True))
    bad_ids, bad_offs = _flat([torch.full_like(ids[0], 13), *_inputs(bags, 3, 3)[0][1:]],
                              _inputs(bags, 3, 3)[1], 3)  # fmt: skip
    with pytest.raises(ConfigError, match=r"indices\[0\]: id 13 is outside bags\[0\]'s rows"):
        debug(bad_ids, bad_offs)


def test_a_settled_module_pools_an_unweighted_tbe_batch_on_the_short_road(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``pool_flat`` once a call, the batch as it is; with weights or ``debug`` the long road
    (cut per bag) pools the same; a batch the short road does not take is refused there."""
    calls: list[object] = []
    real = BagConcat.pool_flat
    monkeypatch.setattr(BagConcat, "pool_flat", lambda k, *a: calls.append(a) or real(k, *a))
    bags = _bags(torch.float16, (False, True, False))
    module = EmbeddingBags.from_torch(bags, kernel="bag-concat")
    ids, offs = _inputs(bags, batch=4, seed=0)
    want = module(ids, offs)
    flat_ids, flat_offs = _flat(ids, offs, 4)
    got = module(flat_ids, flat_offs)  # gradients on: no graph recorded
    assert len(calls) == 1 and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert not any(t.requires_grad for t in got)
    with torch.no_grad():
        again = module(flat_ids, flat_offs)
    assert len(calls) == 2 and all(torch.equal(a, b) for a, b in zip(again, want, strict=True))
    weighted = module(flat_ids, flat_offs, torch.ones(flat_ids.numel()))
    module.config = replace(module.config, debug=True)
    checked = module(flat_ids, flat_offs)
    assert len(calls) == 2
    for out in (weighted, checked):
        assert all(torch.equal(a, b) for a, b in zip(out, want, strict=True))
    module.config = replace(module.config, debug=False)
    with pytest.raises(ConfigError, match="indices: expected a 1-D int64 tensor"):
        module(flat_ids.int(), flat_offs)
    assert len(calls) == 2


def test_the_tbe_layout_refuses_what_it_cannot_cut() -> None:
    bags = _bags(torch.float32, (False, False, False))
    module = EmbeddingBags.from_torch(bags, kernel="bag-concat")
    ids, offs = _flat(*_inputs(bags, batch=4, seed=0), 4)
    with pytest.raises(ConfigError, match=r"offsets: length 12 is not 3 inputs x B \+ 1"):
        module(ids, offs[:-1])
    with pytest.raises(ConfigError, match="offsets: with indices as one tensor"):
        module(ids, [offs])
    with pytest.raises(ConfigError, match="indices: expected a 1-D int64 tensor"):
        module(ids.int(), offs)
    with pytest.raises(ConfigError, match="per_sample_weights: with indices as one tensor"):
        module(ids, offs, [torch.ones(3)])
