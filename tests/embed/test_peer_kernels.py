"""The installed peers as recperf kernels (``kernels/peers.py``) and the choice among every
kernel by measurement (``kernel_choice.measured_choice``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from recperf.core.errors import ConfigError
from recperf.embed.autotune import TuneResult
from recperf.embed.kernel_choice import PAIRED, in_place_tie, measured_choice
from recperf.embed.kernels import KERNELS, Lookup, Tables, make_lookup
from recperf.embed.kernels.base import KernelTraits, kernel_traits, kernels_for
from recperf.embed.kernels.reference import TorchReference

CPU_FLOAT = KernelTraits(formats=frozenset({"fp32"}), cpu=True)


class Slow(TorchReference):
    """The reference, pooled 20 times over: correct, and measurably the slowest."""

    def __call__(self, lookup: Lookup) -> torch.Tensor:
        out = super().__call__(lookup)
        for _ in range(19):
            out = super().__call__(lookup)
        return out


class Wrong(TorchReference):
    """The reference plus one: fast, and wrong."""

    def __call__(self, lookup: Lookup) -> torch.Tensor:
        return super().__call__(lookup) + 1.0


@pytest.fixture
def plugins() -> Iterator[None]:
    KERNELS.register("test-slow", traits=CPU_FLOAT)(Slow)
    KERNELS.register("test-wrong", traits=CPU_FLOAT)(Wrong)
    yield
    KERNELS.unregister("test-slow")
    KERNELS.unregister("test-wrong")


def _tables_and_lookups(seed: int = 0) -> tuple[Tables, list[Lookup]]:
    g = torch.Generator().manual_seed(seed)
    tables = Tables(weights=tuple(torch.randn(r, 8, generator=g) for r in (30, 5, 12)))
    lookups = [make_lookup(tables, batch_size=4, pooling_factor=3, seed=seed + i) for i in range(2)]
    return tables, lookups


def test_measured_choice_times_every_cpu_kernel_and_caches_the_winner(
    plugins: None, tmp_path: Path
) -> None:
    tables, lookups = _tables_and_lookups()
    cache = tmp_path / "tune.json"
    choice = measured_choice(tables, lookups, None, cache=cache, reps=3)
    assert choice.source == "measured"
    assert choice.kernel not in {"test-slow", "test-wrong", "torch-hot"}
    assert choice.kernel in kernels_for("fp32", "cpu")
    note = choice.note
    assert note.startswith(f"{choice.kernel} ") and "ms per batch" in note
    assert "test-wrong rejected (wrong result)" in note
    assert "torch-hot" not in note  # remaps ids: a candidate only with hot rows
    # every correct candidate is named with its time, the slow one after the winner
    assert "test-slow " in note and note.index("test-slow") > note.index(choice.kernel)
    again = measured_choice(tables, lookups, None, cache=cache, reps=3)
    assert note.endswith(f"(each the fastest of 3 interleaved rounds, {PAIRED})")
    assert (again.kernel, again.source) == (choice.kernel, "autotune cache")
    assert again.note.startswith(note.rsplit(" (each", 1)[0]) and str(cache) in again.note


def test_hot_row_kernels_are_candidates_only_with_hot_rows(tmp_path: Path) -> None:
    tables, lookups = _tables_and_lookups(1)
    hot = tuple(torch.arange(min(r, 3)) for r in tables.rows)
    choice = measured_choice(tables, lookups, hot, cache=None, reps=2)
    assert "torch-hot" in choice.note and choice.source == "measured"


def test_a_close_winner_over_float32_copies_gives_way_to_rows_read_in_place() -> None:
    """The reference reads float32 copies of the rows (2-8x the memory of int8/int4/fp16): a
    kernel reading them in place within 5% of it is chosen instead; further off, or on fp32
    rows, the measured winner stands."""

    def result(torch_ms: float, other_ms: float) -> TuneResult:
        return TuneResult(kernel="torch", params={}, ms=torch_ms, candidates=[
            {"kernel": "torch", "params": {}, "ms": torch_ms},
            {"kernel": "bag-concat", "params": {}, "ms": other_ms},
            {"kernel": "torch-hot", "rejected": "needs hot rows"},
        ])  # fmt: skip

    tie = in_place_tie(result(2.70, 2.80), "int4")
    assert tie is not None and tie["kernel"] == "bag-concat"
    assert in_place_tie(result(2.70, 2.80), "fp32") is None  # no copy to save
    assert in_place_tie(result(2.70, 2.84), "int8") is None  # 5.2% off: the winner stands
    assert in_place_tie(result(2.70, 80.0), "fp8") is None
    assert kernel_traits("torch").reads_fp32 and not kernel_traits("bag-concat").reads_fp32


def test_measured_choice_refuses_no_batches() -> None:
    tables, _ = _tables_and_lookups()
    with pytest.raises(ConfigError, match="lookups"):
        measured_choice(tables, [], None, cache=None)


# -- the peers -------------------------------------------------------------------------------

fbgemm = pytest.importorskip("fbgemm_gpu")
from fbgemm_gpu.split_embedding_configs import SparseType  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (  # noqa: E402
    IntNBitTableBatchedEmbeddingBagsCodegen,
)

from recperf.embed.kernels import check_kernel  # noqa: E402
from recperf.embed.kernels.base import magnitude, mismatch  # noqa: E402
from recperf.embed.kernels.formats import quantize  # noqa: E402
from recperf.embed.kernels.peers import row_alignment  # noqa: E402


def test_peers_are_registered_with_their_traits() -> None:
    tbe, bag = kernel_traits("fbgemm-tbe"), kernel_traits("bag-concat")
    assert tbe.formats == {"fp32", "fp16", "fp8", "int8", "int4"}  # FBGEMM 1.8 reads no bf16
    assert bag.formats == {"fp32", "fp16", "bf16"}
    assert (tbe.peer, tbe.cpu, tbe.gpu, bag.peer, bag.cpu) == ("fbgemm", True, False, "torch", True)
    assert "fbgemm-tbe" in kernels_for("int4", "cpu") and "fbgemm-tbe" not in kernels_for(
        "fp32", "cuda"
    )
    assert "bag-concat" not in kernels_for("int8", "cpu")


@pytest.mark.parametrize("name", ["fbgemm-tbe", "bag-concat"])
def test_peer_passes_check_kernel_in_every_format_it_reads(name: str) -> None:
    check_kernel(name, seed=7, cases=6)


def _fbgemm_module(fmt: str, rows: tuple[int, ...], dim: int, seed: int, align: int) -> tuple[
    IntNBitTableBatchedEmbeddingBagsCodegen, Tables
]:  # fmt: skip
    """An FBGEMM inference TBE holding ``fmt`` rows (quantized by recperf), and the ``Tables``
    over its ``split_embedding_weights()`` views, as a TorchRec import would make them."""
    ty = {"int8": SparseType.INT8, "int4": SparseType.INT4, "fp16": SparseType.FP16}[fmt]
    op = IntNBitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[("", r, dim, ty, EmbeddingLocation.HOST) for r in rows],
        device="cpu",
        output_dtype=SparseType.FP32,
        row_alignment=align,
    )
    op.initialize_weights()
    g = torch.Generator().manual_seed(seed)
    weights, sbs = [], []
    for (dst, dst_sb), r in zip(op.split_embedding_weights(), rows, strict=True):
        q, sb = quantize(torch.randn(r, dim, generator=g), fmt)
        dst.copy_(q.view(torch.uint8))
        if sb is not None:
            assert dst_sb is not None
            dst_sb.copy_(sb)
            sbs.append(dst_sb)
        weights.append(dst if fmt != "fp16" else dst.view(torch.float16))
    return op, Tables(weights=tuple(weights), fmt=fmt, scale_bias=tuple(sbs) or None)


@pytest.mark.parametrize(("fmt", "align"), [("int8", 1), ("int4", 16), ("fp16", 16)])
def test_fbgemm_tbe_reads_fbgemm_tables_where_they_lie(fmt: str, align: int) -> None:
    op, tables = _fbgemm_module(fmt, (9, 1, 20), 8, seed=3, align=align)
    kernel = KERNELS.build("fbgemm-tbe", None, tables)
    assert kernel.buffer.shared  # type: ignore[attr-defined]
    assert kernel.buffer.data.data_ptr() == op.weights_host.data_ptr()  # type: ignore[attr-defined]
    lookup = make_lookup(tables, batch_size=3, pooling_factor=2, seed=1, weighted=True)
    got = kernel(lookup)
    ref = KERNELS.build("torch", None, tables)(lookup)
    assert mismatch(got, ref, magnitude(tables, lookup), fmt) == ""
    theirs = op(lookup.indices.int(), lookup.offsets.int(), lookup.per_sample_weights)
    torch.testing.assert_close(got, theirs.view(got.shape), rtol=0, atol=0)
    copied = KERNELS.build("fbgemm-tbe", {"copy_rows": True}, tables)  # unpadded, on request
    assert not copied.buffer.shared  # type: ignore[attr-defined]
    torch.testing.assert_close(copied(lookup), got, rtol=0, atol=0)
    # a row changed in FBGEMM's buffer is what the kernel reads next: no copy was made
    op.split_embedding_weights()[0][0][lookup.indices[0]].fill_(0)
    assert not torch.equal(kernel(lookup), got) or bool((got == 0).all())


def test_fbgemm_is_told_the_row_stride_as_the_smallest_alignment_that_gives_it() -> None:
    assert [row_alignment(132, s) for s in (132, 144, 160, 200)] == [1, 16, 32, 200]
    assert row_alignment(68, 80) == 16 and row_alignment(512, 512) == 1


def test_fbgemm_tbe_copies_tables_that_do_not_share_a_buffer() -> None:
    tables = Tables(weights=(torch.randn(4, 8), torch.randn(3, 8)))
    assert not KERNELS.build("fbgemm-tbe", None, tables).buffer.shared  # type: ignore[attr-defined]


def test_fbgemm_reads_fp8_codes_and_int4_nibbles_as_formats_says() -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    finite = codes[(codes & 0x7F) != 0x7F]  # 0x7F/0xFF: NaN to torch, +-480 to FBGEMM
    one = Lookup(indices=torch.tensor([0]), offsets=torch.tensor([0, 1]), batch_size=1)
    fp8 = Tables(weights=(finite[None, :],), fmt="fp8")
    got = KERNELS.build("fbgemm-tbe", None, fp8)(one)[0, 0]
    assert torch.equal(got, fp8.dequantized(0)[0])
    # int4: row 0 holds codes 1 (low nibble, column 0) and 2 (high nibble, column 1), ...
    packed = torch.tensor([[0x21, 0x43, 0x65, 0x87]], dtype=torch.uint8)
    sb = torch.tensor([[1.0, 0.0]], dtype=torch.float16).view(torch.uint8)
    int4 = Tables(weights=(packed,), fmt="int4", scale_bias=(sb,))
    got = KERNELS.build("fbgemm-tbe", None, int4)(one)[0, 0]
    want = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert got.tolist() == want == int4.dequantized(0)[0].tolist()


def test_fbgemm_tbe_refuses_an_id_outside_its_table() -> None:
    tables = Tables(weights=(torch.randn(4, 8),))
    bad = Lookup(indices=torch.tensor([4]), offsets=torch.tensor([0, 1]), batch_size=1)
    with pytest.raises(ConfigError, match=r"table 0 has rows 0\.\.3, got id 4 at indices\[0\]"):
        KERNELS.build("fbgemm-tbe", None, tables)(bad)
    assert bad.indices.tolist() == [4]  # the caller's ids are untouched


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize(
    ("ids", "offsets", "why"),
    [
        ([0, 3, 1], [0, 1, 3], r"table 1 has rows 0\.\.2, got id 3 at indices\[1\]"),
        ([0, -1, 0], [0, 1, 3], r"table 1 has rows 0\.\.2, got id -1 at indices\[1\]"),
        ([0, 0, 0], [0, 2, 1], "offsets: must rise"),
        ([0, 0, 0], [1, 1, 3], "offsets: must rise"),
    ],
)
def test_fbgemm_tbe_bounds_ids_whichever_check_it_runs(
    exact: bool, ids: list[int], offsets: list[int], why: str
) -> None:
    """Where FBGEMM's operator bounds each table by its true rows (a copy made here, 4 and 3
    rows of 32 B), it alone bounds the ids; where it would not (views into one buffer with a
    row between the tables and one after: 5 and 4 rows to it), those tables' ids are bounded
    first. Either way an id past its table, a negative one (a pruned row to FBGEMM) or bad
    offsets raise, naming what is wrong."""
    big = torch.randn(9, 8)
    weights = (big[0:4], big[5:8]) if not exact else (big[0:4].clone(), big[5:8].clone())
    kernel = KERNELS.build("fbgemm-tbe", None, Tables(weights=weights))
    assert kernel.exact is exact and kernel.buffer.shared is not exact
    assert kernel.loose == (() if exact else (0, 1))
    lookup = Lookup(indices=torch.tensor(ids), offsets=torch.tensor(offsets), batch_size=1)
    with pytest.raises(ConfigError, match=why):
        kernel(lookup)
    good = Lookup(indices=torch.tensor([3, 2, 0]), offsets=torch.tensor([0, 1, 3]), batch_size=1)
    want = torch.stack([big[3], big[7] + big[5]])[None]
    assert torch.allclose(kernel(good), want)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_auto_does_not_time_float32_copies_of_integer_rows(fmt: str) -> None:
    """Where a kernel reads int8/int4 rows in place, the reference (float32 copies, 4-8x the
    memory, flattered by a first call's cache-warm rounds) is not a candidate; the note says so."""
    g = torch.Generator().manual_seed(3)
    packed = [quantize(torch.randn(r, 8, generator=g), fmt) for r in (30, 5, 12)]
    tables = Tables(weights=tuple(q for q, _ in packed), fmt=fmt,
                    scale_bias=tuple(sb for _, sb in packed))  # fmt: skip
    lookups = [make_lookup(tables, batch_size=4, pooling_factor=3, seed=1)]
    assert "torch" in kernels_for(fmt, "cpu") and "fbgemm-tbe" in kernels_for(fmt, "cpu")
    choice = measured_choice(tables, lookups, None, cache=None, reps=1)
    assert choice.kernel == "fbgemm-tbe"
    assert f"not timed: torch (float32 copies of the {fmt} rows)" in choice.note


def test_a_winner_picked_after_the_timing_is_what_the_cache_then_gives(tmp_path: Path) -> None:
    """A pick that replaces autotune's (the in-place tie here; the drop-in's roads likewise) is
    written to the cache, so a later cache hit gives the kernel that ran, not the one timed
    fastest; the timed candidates stay and the note says why."""
    from recperf.embed.autotune import record_winner
    from recperf.embed.kernel_choice import cached_winner

    g = torch.Generator().manual_seed(5)
    tables = Tables(weights=(torch.randn(20, 8, generator=g),))  # fp32: no in-place tie
    lookup = make_lookup(tables, batch_size=4, pooling_factor=3, seed=2)
    cache = tmp_path / "tune.json"
    first = measured_choice(tables, [lookup], None, cache=cache, reps=1)
    assert first.cache_key and first.source == "measured"
    other = next(k for k in ("torch", "bag-list", "bag-concat") if k != first.kernel)
    record_winner(cache, first.cache_key, other, 1.5, "timed on the drop-in's roads")
    again = measured_choice(tables, [lookup], None, cache=cache, reps=1)
    assert (again.kernel, again.source) == (other, "autotune cache")
    assert cached_winner(tables, cache=cache).kernel == other
    entry = json.loads(cache.read_text())[first.cache_key]
    assert entry["note"] == "timed on the drop-in's roads" and len(entry["candidates"]) >= 2
