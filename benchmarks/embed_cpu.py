"""The embedding stage on the CPU, measured. Default mode (issue 6): the ``torch`` reference
against ``torch-hot`` (the same pooling over tables whose hottest rows were moved to the front)
for the ``paper`` tables (12 x 500,000 x 128, 150 ids per bag). ``--peers`` (issues 18, 27): the
``paper`` and ``mlperf`` stages (rows capped) in every row format the CPU reads, recperf's
``EmbeddingBags(kernel="auto")`` (and the kernel ``measured_choice`` picks, called directly)
against the CPU peers a careful user would call for those rows: ``nn.EmbeddingBag`` (one per
table, or one over the concatenated tables), FBGEMM's inference TBE (float, fp8 and IntNBit
rows) and training TBE (fp32), TorchRec's float ``EmbeddingBagCollection`` and its quantized one
(int8/int4, quantized by TorchRec with rows 1-byte aligned, as its sharded CPU inference lays
them out, or 16 with ``--qebc-row-alignment 16``; the drop-in wraps that very collection), each
checked equal to the reference first. Both modes run on the bundled reuse trace and on uniform
ids; calls are interleaved over rotating batches (a new seeded order each round) and compared by
their medians, so machine noise hits every variant alike. The peers' rows lie in torch's 4 KiB
pages unless the process starts with ``THP_MEM_ALLOC_ENABLE=1`` (PyTorch's switch putting every
allocation of 2 MiB or more in transparent huge pages), as a careful user of them may set; the
drop-in's own row copies lie in huge pages either way (``kernels/hostmem.py``). The output
records which (``machine.torch_thp_alloc``).

    python benchmarks/embed_cpu.py [--batch-size 64] [--calls 60] [--hot-fraction 0.02,0.1,0.3]
    python benchmarks/embed_cpu.py --peers [--formats fp32,fp16,bf16,fp8,int8,int4]
        [--threads 1] [--rows-cap 60000] [--calls 60]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

import recperf.embed.bench as eb
from recperf.embed import traces
from recperf.embed.kernel_choice import KernelChoice, measured_choice
from recperf.embed.kernels import KERNELS, Lookup, Tables
from recperf.embed.kernels.base import build_kernel, magnitude, mismatch
from recperf.embed.kernels.formats import FLOAT_DTYPES, ROW_FORMATS, quantize
from recperf.embed.kernels.hostmem import thp_mode
from recperf.embed.model import EmbedConfig, config, random_tables
from recperf.embed.timing import copy_bandwidth, lookup_bytes

PEERS_OUT = Path("benchmarks/results/embed_cpu_peers.json")
PEERS_BUNDLE = Path("src/recperf/data/embedding/cpu_peers.json")
PEER_BATCH = {"paper": 64, "mlperf": 512}
"""Batch per config in ``--peers`` mode: each batch moves ~57 MB of rows (above the 32 MB L3)."""
COPIED = "fbgemm-tbe, rows copied"
CONCAT_PER_BAG = "nn.EmbeddingBag concat, per-bag input"
PER_BAG = "per bag"
FLAT = "EmbeddingBags(auto), TBE-layout input"
"""The drop-in given the batch as the concat peer and FBGEMM's module get it: the tables' ids
concatenated, offsets ``[T * B + 1]`` (int64; FBGEMM's module gets int32)."""
RECPERF = ("torch", "recperf auto kernel", "EmbeddingBags(auto)", FLAT, COPIED)
"""recperf's variants (``COPIED``: padded int8/int4 rows only); every other one is a peer. No
two variants read the same rows: each has its own copy (for int8/int4 its own quantized
collection), so that one variant's call does not warm the caches for the next on the same
batch. Until 2026-12-03 the drop-in shared its rows with a "control" (the concat peer over the
drop-in's copy) and, for int8/int4, with TorchRec's collection and the kernel called directly:
those ran 1.1-1.4x faster than the same code over rows of their own (issue 27)."""


def interleaved_samples(fns: list[Any], inputs: list[list[Any]], calls: int) -> list[list[float]]:
    """Seconds of each of ``calls`` calls of each fn (after 3 warm-up rounds), calling them in
    turn on the same rotating batch index, in a new (seeded) order each round: with the first
    fn merely rotating, each fn always ran right after the same one, whose traces in the caches
    and the allocator then counted for it (issue 27)."""
    times: list[list[float]] = [[] for _ in fns]
    rng = random.Random(0)
    for i in range(calls + 3):
        order = list(range(len(fns)))
        rng.shuffle(order)
        for k in order:
            x = inputs[k][i % len(inputs[k])]
            t0 = time.perf_counter()
            fns[k](x)
            if i >= 3:
                times[k].append(time.perf_counter() - t0)
    return times


def interleaved(fns: list[Any], inputs: list[list[Any]], calls: int) -> list[float]:
    """Median seconds of each fn (``interleaved_samples``)."""
    return [statistics.median(t) for t in interleaved_samples(fns, inputs, calls)]


def run(trace_name: str, fraction: float, args: argparse.Namespace) -> dict[str, Any]:
    cfg = config("paper", batch_size=args.batch_size)
    rows = None if trace_name == "reuse-medium-500k" else 500_000
    trace = traces.resolve(trace_name, rows=rows, tables=cfg.num_tables, seed=args.seed)
    tables = random_tables(cfg, torch.float32, "cpu", args.seed)
    lookups = eb.make_lookups(cfg, trace, args.inputs, "cpu")
    eb.CPU_HOT_FRACTION = fraction
    hot = eb.hot_rows_for(cfg, trace, tables)
    ref = KERNELS.build("torch", None, tables)
    hot_kernel = KERNELS.build("torch-hot", None, tables, hot_rows=hot)
    remapped = [
        Lookup(
            indices=torch.cat(
                [
                    hot_kernel._remap[t][s]  # type: ignore[attr-defined]
                    for t, s in enumerate(hot_kernel._segments(lk))  # type: ignore[attr-defined]
                ]
            ),
            offsets=lk.offsets,
            batch_size=lk.batch_size,
        )
        for lk in lookups
    ]
    pool = super(type(hot_kernel), hot_kernel).__call__  # the reference pooling, permuted tables
    assert torch.allclose(pool(remapped[0]), ref(lookups[0]), rtol=1e-5, atol=1e-6)
    t_ref, t_pool, t_all = interleaved(
        [ref, pool, hot_kernel], [lookups, remapped, lookups], args.calls
    )
    return {
        "trace": trace_name,
        "hot_fraction": fraction,
        "hot_rows_per_table": int(hot[0].numel()),
        "reference_ms": t_ref * 1e3,
        "remapped_pooling_ms": t_pool * 1e3,
        "remap_and_pooling_ms": t_all * 1e3,
        "pooling_speedup": t_ref / t_pool,
        "speedup_with_remap": t_ref / t_all,
    }


# -- the peers ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Peer:
    """One way to run the embedding stage: ``fn`` on its own prepared inputs (one per batch,
    as the data path would hand them over), and ``as_btd`` turning its output into the
    reference's ``[B, T, D]``."""

    name: str
    fn: Callable[[Any], Any]
    inputs: list[Any]
    as_btd: Callable[[Any], torch.Tensor]
    takes: str = "TBE layout"
    """The input it is given: ``TBE layout`` (ids concatenated, ``[T * B + 1]`` offsets),
    ``per bag`` (one ids and one offsets tensor a table) or ``KJT``."""


@dataclass(frozen=True, slots=True)
class Stage:
    """One setting's tables in one row format: ``tables`` (what the kernels read; for int8/int4
    the views into TorchRec's quantized collection ``qebc``), the float32 rows they came from,
    and the batches."""

    fmt: str
    tables: Tables
    fp32: Tables
    lookups: list[Lookup]
    qebc: Any = None
    row_alignment: int = 1

    def fresh_tables(self) -> Tables:
        """The same rows in storage of their own (int8/int4: a new TorchRec collection's)."""
        if self.qebc is not None:
            return quantized_tables(self.fresh_qebc(), self.fmt)
        return Tables(weights=tuple(w.clone() for w in self.tables.weights), fmt=self.fmt)

    def fresh_qebc(self) -> Any:
        """Another TorchRec quantized collection of the same float rows: the same codes."""
        return torchrec_quantized(self.fp32, self.fmt, self.row_alignment)


def _segments(lk: Lookup) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per table its ids and its own ``B + 1`` offsets, as a model holding one bag per table
    receives them."""
    b = lk.batch_size
    starts = lk.offsets[::b].tolist()
    return [
        (lk.indices[s:e], lk.offsets[t * b : (t + 1) * b + 1] - s)
        for t, (s, e) in enumerate(itertools.pairwise(starts))
    ]


def _as_float(y: torch.Tensor) -> torch.Tensor:
    return y.float()  # nn.EmbeddingBag pools float16 rows into float16


def _bags(tables: Tables, clone: bool) -> list[nn.EmbeddingBag]:
    return [
        nn.EmbeddingBag.from_pretrained(
            w.clone() if clone else w, freeze=True, mode="sum", include_last_offset=True
        )
        for w in tables.weights
    ]


def bags_per_table(tables: Tables, lookups: Sequence[Lookup]) -> Peer:
    """``nn.EmbeddingBag`` per table (own weights), called table by table."""
    bags = _bags(tables, clone=True)

    def fn(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        return torch.stack(
            [bag(ids, off) for bag, (ids, off) in zip(bags, parts, strict=True)], dim=1
        )

    return Peer("nn.EmbeddingBag x T", fn, [_segments(lk) for lk in lookups], _as_float, PER_BAG)


def bag_concat(
    tables: Tables, lookups: Sequence[Lookup], weight: torch.Tensor | None = None
) -> Peer:
    """One ``nn.EmbeddingBag`` over the tables stacked row-wise (or over ``weight``, those rows
    already stacked); each table's ids shifted by its first row (the shift is part of the timed
    call), table-major bags."""
    stacked = torch.cat(tables.weights) if weight is None else weight
    bag = nn.EmbeddingBag.from_pretrained(
        stacked, freeze=True, mode="sum", include_last_offset=True
    )
    first = torch.tensor([0, *tables.rows[:-1]], dtype=torch.int64).cumsum(0)
    b, t, d = lookups[0].batch_size, tables.num_tables, tables.dim
    inputs = []
    for lk in lookups:
        per_bag = (lk.offsets[1:] - lk.offsets[:-1]).view(t, b).sum(1)
        inputs.append((lk.indices, lk.offsets, torch.repeat_interleave(first, per_bag)))

    def fn(x: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        pooled: torch.Tensor = bag(x[0] + x[2], x[1])
        return pooled

    return Peer(
        "nn.EmbeddingBag concat", fn, inputs, lambda y: y.view(t, b, d).transpose(0, 1).float()
    )


def bag_concat_per_bag(tables: Tables, lookups: Sequence[Lookup]) -> Peer:
    """One ``nn.EmbeddingBag`` over the stacked tables given per-bag inputs, as a careful user
    of it writes the call when the inputs come a table at a time: the ids concatenated and
    shifted by a per-id shift made once for the tables' id counts (fixed for multi-hot
    inputs; made again when they change), the bag starts stacked and shifted by each table's
    first id. All of it in the timed call."""
    stacked = torch.cat(tables.weights)
    bag = nn.EmbeddingBag.from_pretrained(
        stacked, freeze=True, mode="sum", include_last_offset=True
    )
    first = torch.tensor([0, *tables.rows[:-1]], dtype=torch.int64).cumsum(0)
    b, t, d = lookups[0].batch_size, tables.num_tables, tables.dim
    shifts: dict[tuple[int, ...], torch.Tensor] = {}

    def fn(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        sizes = tuple(int(p[0].shape[0]) for p in parts)
        shift = shifts.get(sizes)
        if shift is None:
            shifts.clear()
            shift = shifts[sizes] = torch.repeat_interleave(first, torch.tensor(sizes))
        ids = torch.cat([p[0] for p in parts]).add_(shift)
        bases = torch.tensor([0, *itertools.accumulate(sizes)])
        starts = torch.stack([p[1][:b] for p in parts]).add_(bases[:-1, None])
        offsets = torch.cat([starts.view(-1), bases[-1:]])
        pooled: torch.Tensor = bag(ids, offsets)
        return pooled

    as_btd = lambda y: y.view(t, b, d).transpose(0, 1).float()  # noqa: E731
    return Peer(CONCAT_PER_BAG, fn, [_segments(lk) for lk in lookups], as_btd, PER_BAG)


def fbgemm_inference(tables: Tables, lookups: Sequence[Lookup]) -> Peer:
    """FBGEMM's inference TBE module (``IntNBitTableBatchedEmbeddingBagsCodegen``, what
    TorchRec's quantized collection calls) with the tables' rows copied in, int32 ids and
    offsets, its default bounds check."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen,
    )

    d, b = tables.dim, lookups[0].batch_size
    precision = SparseType[tables.row_format.upper()]
    specs = [("", r, d, precision, EmbeddingLocation.HOST) for r in tables.rows]
    op = IntNBitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=specs,
        device="cpu",
        pooling_mode=PoolingMode.SUM,
        output_dtype=SparseType.FP32,
    )
    op.initialize_weights()
    sbs = tables.scale_bias or (None,) * tables.num_tables
    for (dst, dst_sb), w, sb in zip(op.split_embedding_weights(), tables.weights, sbs, strict=True):
        codes = w.contiguous().view(torch.uint8)
        dst[:, : codes.shape[1]].copy_(codes)  # rows are padded to 16 B
        if sb is not None:
            dst_sb.copy_(sb)
    inputs = [(lk.indices.int(), lk.offsets.int()) for lk in lookups]
    as_btd = lambda y: y.view(b, tables.num_tables, d)  # noqa: E731
    return Peer("fbgemm TBE inference", lambda x: op(x[0], x[1]), inputs, as_btd)


def fbgemm_split(tables: Tables, lookups: Sequence[Lookup]) -> Peer:
    """FBGEMM's training TBE (``SplitTableBatchedEmbeddingBagsCodegen``) on the CPU, int64."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    d, b = tables.dim, lookups[0].batch_size
    specs = [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r in tables.rows]
    op = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=specs,
        pooling_mode=PoolingMode.SUM,
        weights_precision=SparseType.FP16 if tables.dtype == torch.float16 else SparseType.FP32,
    )
    with torch.no_grad():
        for dst, w in zip(op.split_embedding_weights(), tables.weights, strict=True):
            dst.copy_(w)
    inputs = [(lk.indices, lk.offsets) for lk in lookups]
    as_btd = lambda y: y.view(b, tables.num_tables, d)  # noqa: E731
    return Peer("fbgemm TBE training op", lambda x: op(x[0], x[1]), inputs, as_btd)


def _kjt_peer(name: str, module: Any, tables: Tables, lookups: Sequence[Lookup]) -> Peer:
    """A TorchRec collection called as a model calls it: each call builds the
    ``KeyedJaggedTensor`` from values and lengths, as a fresh batch arrives (a KJT caches its
    split, so reusing one would skip work)."""
    from torchrec import KeyedJaggedTensor

    keys = [f"f{t}" for t in range(tables.num_tables)]
    b, d = lookups[0].batch_size, tables.dim

    def fn(x: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        kjt = KeyedJaggedTensor(keys, x[0], lengths=x[1], stride=b)
        pooled: torch.Tensor = module(kjt).values()
        return pooled

    inputs = [(lk.indices, lk.offsets[1:] - lk.offsets[:-1]) for lk in lookups]
    return Peer(name, fn, inputs, lambda y: y.view(b, tables.num_tables, d).float(), "KJT")


def _ebc_configs(tables: Tables, dtype: Any) -> list[Any]:
    from torchrec import EmbeddingBagConfig

    return [
        EmbeddingBagConfig(name=f"t{t}", embedding_dim=tables.dim, num_embeddings=r,
                           feature_names=[f"f{t}"], data_type=dtype)
        for t, r in enumerate(tables.rows)
    ]  # fmt: skip


def torchrec_ebc(tables: Tables, lookups: Sequence[Lookup]) -> Peer:
    """TorchRec's ``EmbeddingBagCollection`` (one feature per table)."""
    from torchrec import EmbeddingBagCollection
    from torchrec.modules.embedding_configs import DataType

    dtype = DataType.FP16 if tables.dtype == torch.float16 else DataType.FP32
    ebc = EmbeddingBagCollection(tables=_ebc_configs(tables, dtype), device=torch.device("cpu"))
    with torch.no_grad():
        for t, w in enumerate(tables.weights):
            ebc.embedding_bags[f"t{t}"].weight.copy_(w)
    return _kjt_peer("torchrec EBC", ebc, tables, lookups)


def torchrec_quantized(fp32: Tables, fmt: str, row_alignment: int) -> Any:
    """``fp32``'s rows in a TorchRec ``EmbeddingBagCollection`` quantized to int8/int4 by
    TorchRec itself (``torchrec.quant.EmbeddingBagCollection.from_float``), rows padded to a
    multiple of ``row_alignment`` bytes (``quant_prep_customize_row_alignment``; TorchRec's
    default is 16, its sharded CPU inference kernel uses 1)."""
    from torch import quantization as tq
    from torchrec import EmbeddingBagCollection
    from torchrec.modules.embedding_configs import DataType, QuantConfig
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEBC
    from torchrec.quant.embedding_modules import quant_prep_customize_row_alignment

    ebc = EmbeddingBagCollection(
        tables=_ebc_configs(fp32, DataType.FP32), device=torch.device("cpu")
    )
    with torch.no_grad():
        for t, w in enumerate(fp32.weights):
            ebc.embedding_bags[f"t{t}"].weight.copy_(w)
    weight = torch.quint8 if fmt == "int8" else torch.quint4x2
    ebc.qconfig = QuantConfig(
        activation=tq.PlaceholderObserver.with_args(dtype=torch.float),
        weight=tq.PlaceholderObserver.with_args(dtype=weight),
    )
    quant_prep_customize_row_alignment(ebc, [EmbeddingBagCollection], row_alignment)
    return QuantEBC.from_float(ebc)


def quantized_tables(qebc: Any, fmt: str) -> Tables:
    """The rows of ``qebc``'s one TBE as ``Tables``: views into its buffer (not copies)."""
    (tbe,) = qebc._emb_modules
    splits = tbe.split_embedding_weights()
    return Tables(
        weights=tuple(w for w, _ in splits), fmt=fmt, scale_bias=tuple(sb for _, sb in splits)
    )


def stage(
    cfg: EmbedConfig, fmt: str, lookups: list[Lookup], seed: int, row_alignment: int = 1
) -> Stage:
    """``cfg``'s seeded float32 tables in row format ``fmt``: cast (fp16, bf16), quantized by
    recperf (fp8) or by TorchRec (int8, int4, rows aligned to ``row_alignment`` bytes: the
    drop-in wraps that collection)."""
    fp32 = random_tables(cfg, torch.float32, "cpu", seed)
    if fmt in FLOAT_DTYPES:
        weights = tuple(w.to(FLOAT_DTYPES[fmt]) for w in fp32.weights)
        return Stage(fmt, Tables(weights=weights), fp32, lookups)
    if fmt == "fp8":
        weights = tuple(quantize(w, "fp8")[0] for w in fp32.weights)
        return Stage(fmt, Tables(weights=weights, fmt="fp8"), fp32, lookups)
    qebc = torchrec_quantized(fp32, fmt, row_alignment)
    return Stage(fmt, quantized_tables(qebc, fmt), fp32, lookups, qebc, row_alignment)


def auto_kernel(st: Stage, trace: str) -> tuple[Peer, KernelChoice]:
    """The kernel ``measured_choice`` picks for these tables, called on the batches directly."""
    choice = measured_choice(st.tables, st.lookups[:2], None, cache=None, trace=trace, reps=5)
    kernel = build_kernel(choice.kernel, dict(choice.params), st.fresh_tables())
    return Peer("recperf auto kernel", kernel, list(st.lookups), lambda y: y), choice


def dropin_auto(st: Stage) -> tuple[list[Peer], list[Any]]:
    """``EmbeddingBags(kernel="auto")`` as a user builds it: from the ``nn.EmbeddingBag`` list
    (float rows; fp8 by its ``quantize``) or from TorchRec's quantized collection (int8/int4),
    called as they are, no autotune cache: the first call (a warm-up) measures, and where
    kernels came close the next calls confirm the pick (``settle``). The per-bag and the
    TBE-layout variants are two modules, each over rows of its own; the modules in the order
    of their variants."""
    from recperf.embed.dropin import EmbeddingBags
    from recperf.embed.dropin_config import DropInConfig

    config = DropInConfig(kernel="auto", cache=None)
    b, t, d = st.lookups[0].batch_size, st.tables.num_tables, st.tables.dim
    if st.qebc is not None:  # the KJT, and the TBE layout FBGEMM's module takes (int64)
        module = EmbeddingBags.from_torchrec(st.qebc, "auto", config=config)
        flat_q = EmbeddingBags.from_torchrec(st.fresh_qebc(), "auto", config=config)
        keyed = lambda y: y.values().view(b, t, d).float()  # noqa: E731
        given = [(lk.indices, lk.offsets) for lk in st.lookups]
        return [
            _kjt_peer("EmbeddingBags(auto)", module, st.tables, st.lookups),
            Peer(FLAT, lambda x: flat_q(x[0], x[1]), given, keyed),
        ], [module, flat_q]

    def build() -> Any:
        if st.fmt == "fp8":
            bags = EmbeddingBags.from_torch(_bags(st.fp32, clone=False), config=config)
            return bags.quantize("fp8", kernel="auto", bags=16)
        return EmbeddingBags.from_torch(_bags(st.tables, clone=True), "auto", config=config)

    module, flat_module = build(), build()

    def fn(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        return module([p[0] for p in parts], [p[1] for p in parts])

    def flat(x: tuple[torch.Tensor, torch.Tensor]) -> Any:
        return flat_module(x[0], x[1])

    inputs = [_segments(lk) for lk in st.lookups]
    as_btd = lambda y: torch.stack(y, dim=1).float().view(b, t, d)  # noqa: E731
    given = [(lk.indices, lk.offsets) for lk in st.lookups]
    return [
        Peer("EmbeddingBags(auto)", fn, inputs, as_btd, PER_BAG),
        Peer(FLAT, flat, given, as_btd),
    ], [module, flat_module]


SETTLE_ROUNDS = 200
"""The most rounds ``settle`` runs (a trial of 4 kernels, 5 timed forwards each, each after an
untimed one, and 5 more each for two that came close: 60)."""


def settle(peers: Sequence[Peer], modules: Sequence[Any]) -> list[int]:
    """Every variant called in turn on the round's batch, in a new seeded order each round (as
    ``interleaved_samples`` times them), until each drop-in module's first pick is confirmed
    (its trial over: ``DropInConfig.confirm``), as a model's first batches would; the calls
    each module made on trial. A drop-in's trial thus times its kernels amid the other
    variants' calls, as the timing then runs it, not in a loop of its own. The interleaved
    timing then measures the kernel each settled on, as the peers are measured after their
    warm-up."""
    rng = random.Random(1)
    calls = [0] * len(modules)
    for i in range(SETTLE_ROUNDS):
        trying = [m.on_trial for m in modules]
        if not any(trying):
            break
        calls = [c + t for c, t in zip(calls, trying, strict=True)]
        order = list(range(len(peers)))
        rng.shuffle(order)
        for k in order:
            peers[k].fn(peers[k].inputs[i % len(peers[k].inputs)])
    else:
        raise RuntimeError(f"settle: a drop-in still on trial after {SETTLE_ROUNDS} rounds")
    return calls


PEERS_BY_FORMAT: dict[str, tuple[str, ...]] = {
    "fp32": ("bags", "concat", "concat-per-bag", "tbe", "split", "ebc"),
    "fp16": ("bags", "concat", "concat-per-bag", "tbe", "ebc"),
    # FBGEMM 1.8 reads no bf16 rows; TorchRec's EBC makes fp16 of them
    "bf16": ("bags", "concat", "concat-per-bag"),
    "fp8": ("tbe",),
    "int8": ("tbe", "qebc"),
    "int4": ("tbe", "qebc"),
}
"""The peers that read each row format."""


@dataclass(frozen=True, slots=True)
class Built:
    """A setting's variants, what ``measured_choice`` picked, and the drop-in modules (the
    per-bag one first)."""

    peers: list[Peer]
    auto: KernelChoice
    modules: list[Any]


def build_peers(st: Stage, trace: str) -> Built:
    """recperf's variants first (the reference, the kernel ``auto`` picks, the drop-in with
    ``auto``; for int8/int4 ``fbgemm-tbe`` over an unpadded copy of the rows), then every peer
    that reads the row format: they all pool the same batches out of the same rows."""
    tables, lookups = st.tables, st.lookups
    make = {
        "bags": lambda: bags_per_table(tables, lookups),
        "concat": lambda: bag_concat(tables, lookups),
        "concat-per-bag": lambda: bag_concat_per_bag(tables, lookups),
        "tbe": lambda: fbgemm_inference(tables, lookups),
        "split": lambda: fbgemm_split(tables, lookups),
        "ebc": lambda: torchrec_ebc(tables, lookups),
        "qebc": lambda: _kjt_peer("torchrec quantized EBC", st.fresh_qebc(), tables, lookups),
    }
    auto, choice = auto_kernel(st, trace)
    dropin, modules = dropin_auto(st)
    ref = KERNELS.build("torch", None, tables)
    head = [Peer("torch", ref, list(lookups), lambda y: y), auto, *dropin]
    if st.qebc is not None and padded(tables):  # padded rows against an unpadded copy of them
        copied = KERNELS.build("fbgemm-tbe", {"copy_rows": True}, tables)
        head.append(Peer(COPIED, copied, list(lookups), lambda y: y))
    peers = head + [make[k]() for k in PEERS_BY_FORMAT[st.fmt]]
    return Built(peers, choice, modules)


def padded(tables: Tables) -> bool:
    """Whether the tables' rows lie further apart than their bytes (TorchRec's 16-byte
    alignment: 144 B apart for 132 B int8 rows at D = 128)."""
    w = tables.weights[0]
    return w.stride(0) * w.element_size() > tables.row_bytes


def check_peers(peers: Sequence[Peer], tables: Tables, lookup: Lookup) -> dict[str, float]:
    """Each peer's largest absolute difference from the reference on ``lookup``; raise
    AssertionError naming the first peer outside the reference's tolerance (``RTOL``)."""
    want = KERNELS.build("torch", None, tables)(lookup)
    bound = magnitude(tables, lookup)
    errors = {}
    for p in peers:
        got = p.as_btd(p.fn(p.inputs[0]))
        why = mismatch(got.contiguous(), want, bound, tables.row_format)
        if why:  # not an assert: the check must hold under python -O too
            raise AssertionError(f"{p.name} differs from the reference: {why}")
        errors[p.name] = float((got - want).abs().max())
    return errors


def format_error(st: Stage) -> dict[str, float]:
    """How far the row format moves the pooled outputs from float32 rows', over the batches:
    per bag ||pooled - pooled_fp32|| / ||pooled_fp32|| (median and max over bags), and the
    largest element error over the mean norm of a float32 row."""
    ref = KERNELS.build("torch", None, st.tables)
    exact = KERNELS.build("torch", None, st.fp32)
    rel, elem = [], []
    row_norm = float(torch.cat(st.fp32.weights).norm(dim=1).mean())
    for lk in st.lookups:
        got, want = ref(lk), exact(lk)
        norms = want.norm(dim=2)
        keep = norms > 0
        rel.append(((got - want).norm(dim=2)[keep] / norms[keep]).flatten())
        elem.append(float((got - want).abs().max()) / row_norm)
    r = torch.cat(rel)
    return {
        "pooled_rel_err_median": float(r.median()),
        "pooled_rel_err_max": float(r.max()),
        "max_abs_err_per_row_norm": max(elem),
    }


def peer_config(name: str, rows_cap: int, batch_size: int | None) -> EmbedConfig:
    """``name``'s stage with every table capped at ``rows_cap`` rows, at its peers batch."""
    cfg = config(name, rows_cap=rows_cap, batch_size=batch_size or PEER_BATCH[name])
    return replace(cfg, table_rows=tuple(min(r, rows_cap) for r in cfg.table_rows))


def tables_mib(tables: Tables) -> float:
    parts = [*tables.weights, *(tables.scale_bias or ())]
    return sum(w.shape[0] * w.shape[1] * w.element_size() for w in parts) / 2**20


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


@dataclass(frozen=True, slots=True)
class Sitting:
    """One build's timing at one thread count: each variant's calls (ms), in variant order."""

    names: tuple[str, ...]
    takes: tuple[str, ...]
    ms: tuple[list[float], ...]
    copy_gb_per_s: float
    load: tuple[float, float]


def time_peers(peers: Sequence[Peer], threads: int, calls: int) -> Sitting:
    """One thread count: the copy bandwidth, then every peer interleaved."""
    torch.set_num_threads(threads)
    # The best of three medians: on a shared machine a neighbour's burst only ever lowers it.
    copy_gbps = max(copy_bandwidth(torch.device("cpu"), nbytes=1 << 27) for _ in range(3)) / 1e9
    load = os.getloadavg()[0]
    samples = interleaved_samples([p.fn for p in peers], [p.inputs for p in peers], calls)
    ms = tuple([x * 1e3 for x in xs] for xs in samples)
    names, takes = tuple(p.name for p in peers), tuple(p.takes for p in peers)
    return Sitting(names, takes, ms, copy_gbps, (load, os.getloadavg()[0]))


def summarize(names: Sequence[str], takes: Sequence[str], ms: Sequence[list[float]],
              nbytes: int, copy_gbps: float) -> dict[str, Any]:  # fmt: skip
    """Each variant's median and quartiles of ``ms`` (its calls), its GB/s and its speedup over
    the reference and over the fastest peer; the drop-in's and the picked kernel's ratios, and
    each drop-in's against the fastest peer given the same input as it (``same_input``)."""
    variants: list[dict[str, Any]] = []
    for name, given, xs in zip(names, takes, ms, strict=True):
        q1, med, q3 = _quartiles(xs)
        gbps = nbytes / (med / 1e3) / 1e9
        variants.append({
            "variant": name,
            "kind": "recperf" if name in RECPERF else "peer",
            "takes": given,
            "ms_per_batch": med, "ms_q1": q1, "ms_q3": q3, "ms_min": min(xs),
            "gb_per_s": gbps,
            "pct_of_copy_bw": 100.0 * gbps / copy_gbps,
        })  # fmt: skip
    ref_ms = variants[0]["ms_per_batch"]
    best = min((v for v in variants if v["kind"] == "peer"), key=lambda v: v["ms_per_batch"])
    for v in variants:
        v["speedup_vs_torch"] = ref_ms / v["ms_per_batch"]
        v["speedup_vs_best_peer"] = best["ms_per_batch"] / v["ms_per_batch"]
    by_min = min((v for v in variants if v["kind"] == "peer"), key=lambda v: v["ms_min"])
    named = {v["variant"]: v for v in variants}
    dropin, kernel = named["EmbeddingBags(auto)"], named["recperf auto kernel"]
    flat = {}
    if FLAT in named:
        v = named[FLAT]
        flat = {"auto_flat_vs_best_peer": v["speedup_vs_best_peer"],
                "auto_flat_vs_best_peer_by_min": by_min["ms_min"] / v["ms_min"]}  # fmt: skip
    for key, name in (("auto", "EmbeddingBags(auto)"), ("auto_flat", FLAT)):
        mine = named.get(name)
        same = [v for v in variants if v["kind"] == "peer" and mine and v["takes"] == mine["takes"]]
        if mine and same:
            peer = min(same, key=lambda v: v["ms_per_batch"])
            flat[f"{key}_same_input_peer"] = peer["variant"]
            flat[f"{key}_vs_same_input_peer"] = peer["ms_per_batch"] / mine["ms_per_batch"]
    return flat | {
        "best_peer": best["variant"],
        "auto_vs_best_peer": dropin["speedup_vs_best_peer"],
        "auto_kernel_vs_best_peer": kernel["speedup_vs_best_peer"],
        # A shared machine's bursts only add time: the fastest calls, compared, as a check.
        "best_peer_by_min": by_min["variant"],
        "auto_vs_best_peer_by_min": by_min["ms_min"] / dropin["ms_min"],
        "auto_kernel_vs_best_peer_by_min": by_min["ms_min"] / kernel["ms_min"],
        "variants": variants,
    }


EACH = (
    "best_peer",
    "auto_vs_best_peer",
    "auto_flat_vs_best_peer",
    "auto_kernel_vs_best_peer",
    "auto_vs_same_input_peer",
    "auto_flat_vs_same_input_peer",
)
"""What each build's own sitting gives, listed per build beside the pooled figures."""


def pooled(sittings: Sequence[Sitting], nbytes: int) -> dict[str, Any]:
    """The builds' calls pooled per variant (medians and quartiles over them all), and each
    build's own ratios (``EACH``) as the spread between builds."""
    names = sittings[0].names
    ms = tuple([x for s in sittings for x in s.ms[k]] for k in range(len(names)))
    copy = statistics.median(s.copy_gb_per_s for s in sittings)
    row = summarize(names, sittings[0].takes, ms, nbytes, copy)
    each = [summarize(s.names, s.takes, s.ms, nbytes, s.copy_gb_per_s) for s in sittings]
    row["per_build"] = {k: [e[k] for e in each] for k in EACH if k in each[0]}
    loads = [x for s in sittings for x in s.load]
    return {"copy_gb_per_s": copy, "load_avg_1m": [min(loads), max(loads)]} | row


@dataclass(frozen=True, slots=True)
class Build:
    """One build of a setting's variants, checked, its drop-ins settled, and what it chose."""

    peers: list[Peer]
    errors: dict[str, float]
    choices: dict[str, Any]


def build_setting(st: Stage, trace_name: str) -> Build:
    """``st``'s variants built anew (rows of their own, drop-ins that measure anew), checked
    equal to the reference (the drop-ins measure there), the drop-ins settled."""
    built = build_peers(st, trace_name)
    errors = check_peers(built.peers, st.tables, st.lookups[0])
    settled = settle(built.peers, built.modules)
    choices = {
        "auto_kernel": built.auto.kernel, "auto_note": built.auto.note,
        "dropin_choice": _described(built.modules[0]), "dropin_settle_calls": settled,
    }  # fmt: skip
    if len(built.modules) > 1:
        choices["dropin_flat_choice"] = _described(built.modules[1])
    return Build(built.peers, errors, choices)


def peers_setting(
    name: str, trace_name: str, fmt: str, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """One config on one trace with ``fmt`` rows: ``args.builds`` times, every variant built
    anew (fresh rows, where memory lands anew; drop-ins that measure and settle anew), checked,
    and timed per thread count; per thread count the builds' calls pooled, with each build's
    ratios beside them. One build's variants sit at fixed places in memory for all its calls,
    and between builds the same code moved by up to 9% against the same peer (issue 27)."""
    cfg = peer_config(name, args.rows_cap, args.batch_size)
    trace = eb.bench_trace(cfg, trace_name, args.seed)
    lookups = eb.make_lookups(cfg, trace, args.inputs, "cpu")
    n = int(lookups[0].indices.numel())
    threads = [int(t) for t in args.threads.split(",")]
    sittings: dict[int, list[Sitting]] = {t: [] for t in threads}
    builds: list[dict[str, Any]] = []
    torch.set_num_threads(1)  # the drop-in measures on its first call: at the timed threads
    with torch.no_grad():  # not inference_mode: FBGEMM's training op has no kernel under it
        st = stage(cfg, fmt, lookups, args.seed, args.qebc_row_alignment)
        nbytes = lookup_bytes(lookups[0], cfg.dim, 1, cfg.num_tables) + n * (
            st.tables.row_bytes - cfg.dim
        )  # the rows at their size, scale and bias included
        head: dict[str, Any] = {
            "config": name, "trace": trace_name, "dtype": fmt, "batch_size": cfg.batch_size,
            "tables": cfg.num_tables, "rows": sum(cfg.table_rows),
            "table_mib": tables_mib(st.tables), "row_bytes": st.tables.row_bytes,
            "row_stride": st.tables.weights[0].stride(0) * st.tables.weights[0].element_size(),
            "lookups_per_batch": n, "bytes_per_batch": nbytes, "builds": args.builds,
        }  # fmt: skip
        if fmt != "fp32":
            head["error_vs_fp32"] = format_error(st)
        errors: dict[str, float] = {}
        for b in range(args.builds):
            if b:  # a new stage: every variant's rows (and the drop-ins) anew
                st = stage(cfg, fmt, lookups, args.seed, args.qebc_row_alignment)
            build = build_setting(st, trace_name)
            builds.append(build.choices)
            for k, v in build.errors.items():
                errors[k] = max(errors.get(k, 0.0), v)
            for t in threads:
                sittings[t].append(time_peers(build.peers, t, args.calls))
            del build, st
    head |= builds[0] | {"per_build_choices": builds}
    out: list[dict[str, Any]] = []
    for t in threads:
        row = head | {"threads": t} | pooled(sittings[t], nbytes)
        for v in row["variants"]:
            v["max_abs_err"] = errors[v["variant"]]
        out.append(row)
        _print_row(row)
    return out


def _described(module: Any) -> str:
    return "; ".join(f"{g['kernel']} ({g['source']}: {g['note']})" for g in module.describe())


def _print_row(row: dict[str, Any]) -> None:
    where = f"{row['config']} / {row['trace']} / {row['dtype']} / {row['threads']} thread(s)"
    load = row["load_avg_1m"][0]
    print(f"{where}: copy {row['copy_gb_per_s']:.1f} GB/s, load {load:.2f}", flush=True)
    if "auto_flat_vs_best_peer" in row:
        print(f"  {FLAT}: {row['auto_flat_vs_best_peer']:.2f}x the best peer", flush=True)
    for v in row["variants"]:
        print(
            f"  {v['variant']:34s} {v['ms_per_batch']:8.2f} ms [{v['ms_q1']:.2f}, "
            f"{v['ms_q3']:.2f}] min {v['ms_min']:.2f} {v['gb_per_s']:6.2f} GB/s "
            f"({v['pct_of_copy_bw']:4.1f}% of copy) "
            f"{v['speedup_vs_torch']:5.2f}x torch {v['speedup_vs_best_peer']:5.2f}x best peer",
            flush=True,
        )
    picks = [c["dropin_choice"].split(" (")[0] for c in row["per_build_choices"]]
    flats = [c.get("dropin_flat_choice", "-").split(" (")[0] for c in row["per_build_choices"]]
    each = ", ".join(f"{x:.2f}" for x in row["per_build"]["auto_vs_best_peer"])
    print(
        f"  auto picked {row['auto_kernel']}; the drop-in {'/'.join(picks)} "
        f"(TBE layout {'/'.join(flats)}); drop-in {row['auto_vs_best_peer']:.2f}x (builds: "
        f"{each}), kernel {row['auto_kernel_vs_best_peer']:.2f}x the best peer "
        f"({row['best_peer']}); by the fastest calls {row['auto_vs_best_peer_by_min']:.2f}x and "
        f"{row['auto_kernel_vs_best_peer_by_min']:.2f}x",
        flush=True,
    )
    for key, label in (("auto", "drop-in"), ("auto_flat", FLAT)):
        if f"{key}_vs_same_input_peer" in row:
            print(f"  {label}: {row[f'{key}_vs_same_input_peer']:.2f}x the fastest peer given the "
                  f"same input ({row[f'{key}_same_input_peer']})", flush=True)  # fmt: skip
    if "auto_flat_vs_best_peer" in row["per_build"]:
        flat = ", ".join(f"{x:.2f}" for x in row["per_build"]["auto_flat_vs_best_peer"])
        print(f"  {FLAT} by build: {flat}", flush=True)


def machine() -> dict[str, Any]:
    import fbgemm_gpu
    import torchrec

    model = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
         if ln.startswith("model name")), platform.processor(),
    )  # fmt: skip
    return {
        "cpu": model, "cpus": os.cpu_count(), "memory_gib": round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "torch": torch.__version__, "fbgemm_gpu": fbgemm_gpu.__version__,
        "torchrec": getattr(torchrec, "__version__", "1.8.0"),
        "thp_mode": thp_mode(), "torch_thp_alloc": os.environ.get("THP_MEM_ALLOC_ENABLE") == "1",
    }  # fmt: skip


def peers_main(args: argparse.Namespace) -> None:
    settings = []
    for fmt in args.formats.split(","):
        for name in args.configs.split(","):
            for trace in args.traces.split(","):
                settings += peers_setting(name, trace, fmt, args)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python benchmarks/embed_cpu.py", *sys.argv[1:]]),
        "machine": machine(),
        "calls": args.calls, "builds": args.builds, "inputs": args.inputs,
        "rows_cap": args.rows_cap, "seed": args.seed, "settings": settings,
    }  # fmt: skip
    # The bundled copy is the same data, rounded and compact: the report only shows it.
    texts = (json.dumps(result, indent=1), json.dumps(_rounded(result), separators=(",", ":")))
    for path, text in zip((args.out or PEERS_OUT, args.bundle), texts, strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text + "\n")
        tmp.replace(path)  # a run that fails half-way leaves the previous result whole


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", action="store_true", help="Measure the CPU peers (issue 18).")
    batch_help = "Default 64 (paper); with --peers 64 for paper, 512 for mlperf."
    ap.add_argument("--batch-size", type=int, default=None, help=batch_help)
    ap.add_argument("--calls", type=int, default=None, help="Timed calls per variant (default 60).")
    ap.add_argument("--inputs", type=int, default=8, help="Distinct batches rotated through.")
    ap.add_argument("--hot-fraction", default=None,
                    help="Default 0.02,0.1,0.3; with --peers one value, default 0.1.")  # fmt: skip
    ap.add_argument("--traces", default="reuse-medium-500k,uniform")
    ap.add_argument("--threads", default=None, help="Default 1 (both modes).")
    ap.add_argument("--configs", default="paper,mlperf", help="With --peers.")
    ap.add_argument("--formats", default=",".join(ROW_FORMATS),
                    help="With --peers: row formats (default all the CPU reads).")  # fmt: skip
    ap.add_argument("--rows-cap", type=int, default=60_000, help="With --peers: rows per table.")
    ap.add_argument("--qebc-row-alignment", type=int, default=1, choices=(1, 16),
                    help="With --peers, int8/int4: TorchRec's row alignment in bytes (1, "
                    "what its sharded CPU inference uses; 16, from_float's default).")  # fmt: skip
    ap.add_argument("--builds", type=int, default=3,
                    help="With --peers: times every variant is built anew and timed (fresh rows, "
                    "drop-ins measuring anew); their calls are pooled (default 3).")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--bundle", type=Path, default=PEERS_BUNDLE, help="With --peers: the copy "
                    "the report reads.")  # fmt: skip
    args = ap.parse_args()
    if args.peers:
        if args.builds < 1:
            ap.error(f"--builds: {args.builds}; at least 1")
        args.calls = args.calls or 60
        args.threads = args.threads or "1"
        bad = sorted(set(args.formats.split(",")) - set(ROW_FORMATS))
        if bad:
            ap.error(f"--formats: {bad[0]!r}; allowed: {', '.join(ROW_FORMATS)}")
        peers_main(args)
        return
    args.calls = args.calls or 60
    args.batch_size = args.batch_size or 64
    args.out = args.out or Path("benchmarks/results/embed_cpu.json")
    torch.set_num_threads(int(args.threads or 1))
    rows = []
    for trace in args.traces.split(","):
        for fraction in (float(f) for f in (args.hot_fraction or "0.02,0.1,0.3").split(",")):
            row = run(trace, fraction, args)
            rows.append(row)
            print(
                f"{trace:18s} hot {fraction:4.2f}: reference {row['reference_ms']:.2f} ms, "
                f"remapped pooling {row['remapped_pooling_ms']:.2f} ms "
                f"({row['pooling_speedup']:.2f}x), with the remap {row['remap_and_pooling_ms']:.2f}"
                f" ms ({row['speedup_with_remap']:.2f}x)",
                flush=True,
            )
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "args": vars(args) | {"out": str(args.out), "bundle": None},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
