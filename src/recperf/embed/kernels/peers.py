"""FBGEMM's inference table-batched operator as a recperf kernel, ``fbgemm-tbe`` (the one
TorchRec's quantized collection runs), over every row format it reads, so that ``auto`` can pick
it where it measures faster; it pools exactly what the reference pools (``reference.py``). The
other peer, one ``embedding_bag`` over the concatenated float tables, is ``bagconcat.py``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from recperf.core.errors import ConfigError
from recperf.embed.kernels.base import (
    KERNELS,
    KernelTraits,
    Lookup,
    Tables,
    check_tables_match,
    validate_lookup,
)
from recperf.embed.kernels.formats import INTEGER_FORMATS, SCALE_BIAS_BYTES
from recperf.embed.kernels.formats import row_bytes as format_row_bytes
from recperf.embed.kernels.hostmem import empty_rows

try:  # fbgemm-gpu (or its CPU build) is optional: without it only bag-concat registers
    import fbgemm_gpu  # type: ignore[import-untyped]  # noqa: F401  (loads its operators)
    from fbgemm_gpu.split_embedding_configs import SparseType  # type: ignore[import-untyped]
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (  # type: ignore[import-untyped]
        BoundsCheckMode,
        EmbeddingLocation,
    )
except ImportError:  # pragma: no cover - fbgemm is installed in the dev environment
    SparseType = None

TBE_FORMATS = frozenset({"fp32", "fp16", "fp8", "int8", "int4"})
"""What FBGEMM's inference TBE reads (no bf16 rows in fbgemm-gpu 1.8)."""
TBE_TYPES = {"fp32": "FP32", "fp16": "FP16", "fp8": "FP8", "int8": "INT8", "int4": "INT4"}
CACHE_LINE = 128
"""FBGEMM starts each table of a buffer it allocates on a cache line; so does a copy here."""
MEAN = 1
"""FBGEMM's ``PoolingMode.MEAN``; ``SUM`` is 0."""


@dataclass(frozen=True, slots=True)
class TbeBuffer:
    """Every table's rows in one ``uint8`` buffer, FBGEMM's IntNBit layout: table ``t`` starts
    at byte ``offsets[t]``, rows ``stride`` bytes apart, int8/int4 rows led by their scale and
    bias."""

    data: torch.Tensor
    offsets: tuple[int, ...]
    stride: int
    shared: bool
    """Whether ``data`` is the tables' own storage (no copy was made)."""
    note: str = ""
    """How a copy was laid out (``CopiedRows.note``), "" for the tables' own storage."""


def shared_buffer(tables: Tables) -> TbeBuffer | None:
    """The buffer the tables already lie in, when they are views into one (as FBGEMM's and
    TorchRec's ``split_embedding_weights()`` return them), with one row stride and, for
    int8/int4, each row's scale and bias right before its codes; else None."""
    fmt = tables.row_format
    first = tables.weights[0]
    storage = first.untyped_storage()
    elem = first.element_size()
    stride = first.stride(0) * elem
    if stride < format_row_bytes(fmt, tables.dim):
        return None
    offsets: list[int] = []
    for t, w in enumerate(tables.weights):
        if w.untyped_storage().data_ptr() != storage.data_ptr() or w.stride() != first.stride():
            return None
        if w.stride(1) != 1 and w.shape[1] > 1:
            return None
        start = int(w.storage_offset()) * elem
        if fmt in INTEGER_FORMATS:
            assert tables.scale_bias is not None
            sb = tables.scale_bias[t]
            if sb.untyped_storage().data_ptr() != storage.data_ptr() or sb.stride(0) != stride:
                return None
            if sb.storage_offset() + SCALE_BIAS_BYTES != start:
                return None
            start = int(sb.storage_offset())
        offsets.append(start)
    data = torch.empty(0, dtype=torch.uint8, device=first.device)
    data.set_(storage, 0, (storage.nbytes(),), (1,))
    return TbeBuffer(data=data, offsets=tuple(offsets), stride=stride, shared=True)


def copied_buffer(tables: Tables, huge_pages: bool = True) -> TbeBuffer:
    """The tables' rows copied into one new buffer (rows unpadded, tables on cache lines where
    the gap holds no whole row: FBGEMM counts a table's rows up to the next one's start), in
    transparent huge pages with ``huge_pages`` (``hostmem.empty_rows``)."""
    fmt = tables.row_format
    stride = format_row_bytes(fmt, tables.dim)
    offsets: list[int] = []
    size = 0
    for n in tables.rows:
        offsets.append(size)
        size += n * stride
        if -size % CACHE_LINE < stride:
            size += -size % CACHE_LINE
    placed = empty_rows((size,), torch.uint8, huge_pages=huge_pages)
    data = placed.data.zero_()
    for t, (w, start) in enumerate(zip(tables.weights, offsets, strict=True)):
        rows = data[start : start + w.shape[0] * stride].view(w.shape[0], stride)
        codes = w.contiguous().view(torch.uint8)
        if fmt in INTEGER_FORMATS:
            assert tables.scale_bias is not None
            rows[:, :SCALE_BIAS_BYTES] = tables.scale_bias[t]
            rows[:, SCALE_BIAS_BYTES:] = codes
        else:
            rows.copy_(codes)
    return TbeBuffer(
        data=data, offsets=tuple(offsets), stride=stride, shared=False, note=placed.note
    )


def row_alignment(row_bytes: int, stride: int) -> int:
    """The ``row_alignment`` that makes FBGEMM step ``stride`` bytes from row to row (it rounds
    ``row_bytes`` up to a multiple of it): the smallest power of two that does, else
    ``stride`` itself (FBGEMM's own modules use 1 on the CPU, TorchRec 16). Passing ``stride``
    always works, but TorchRec's 144-byte int8 rows (D = 128) then ran slower, the same rows
    and result: medians 2.12 against 1.82 ms a batch (paper tables, 1 thread, interleaved)."""
    for align in (1, 2, 4, 8, 16, 32, 64, 128):
        if -(-row_bytes // align) * align == stride:
            return align
    return stride


def fbgemm_rows(buffer: TbeBuffer) -> tuple[int, ...]:
    """Each table's row count as FBGEMM's CPU operator takes it, and so bounds its ids by:
    from the table's first byte to the next table's (or the buffer's end), in whole rows of
    ``buffer.stride`` bytes (``row_alignment`` makes FBGEMM step by it)."""
    ends = [*sorted(set(buffer.offsets)), int(buffer.data.numel())]
    nxt = {start: ends[i + 1] for i, start in enumerate(ends[:-1])}
    return tuple((nxt[start] - start) // buffer.stride for start in buffer.offsets)


def padding_note(tables: Tables, buffer: TbeBuffer) -> str:
    """What ``describe()`` adds where int8/int4 rows are read in place with padding between
    them, and how to lay them out unpadded ("" otherwise)."""
    data = format_row_bytes(tables.row_format, tables.dim)
    if not buffer.shared or buffer.stride == data or tables.row_format not in INTEGER_FORMATS:
        return ""
    return (
        f"the {tables.row_format} rows are read where they lie, {buffer.stride} B apart for "
        f"{data} B of row: FBGEMM read 16-byte-aligned int8 rows 1.3-1.6x (int4 1.6-1.9x) "
        "slower than unpadded ones on the x86 CPUs measured (benchmarks/RESULTS.md); TorchRec "
        "lays them out unpadded after "
        "quant_prep_customize_row_alignment(model, [EmbeddingBagCollection], 1) before "
        "from_float, as its sharded CPU inference does; kernel='fbgemm-tbe' with "
        "options={'copy_rows': True} copies them (their memory once more)"
    )


def offsets_and_signs_ok(ids: torch.Tensor, offsets: torch.Tensor) -> bool:
    """Whether ``offsets`` rise from 0 to ``len(ids)`` and no id is negative: one host sync.
    On a CPU by numpy: torch's int64 ``min`` took 44 us over ``paper``'s 115,200 ids, numpy's
    10 us (issue 27)."""
    n = ids.shape[0]
    if ids.device.type == "cpu":
        o = offsets.numpy()
        lo = int(np.diff(o).min(initial=0))
        if n:
            lo = min(lo, int(ids.numpy().min()))
        return int(o[0]) == 0 and int(o[-1]) == n and lo >= 0
    lo_t = offsets.diff().min()
    if n:
        lo_t = torch.minimum(lo_t, ids.min())
    return int(offsets[0]) == 0 and int(offsets[-1]) == n and int(lo_t) >= 0


@dataclass(kw_only=True, slots=True, frozen=True)
class FbgemmTBEConfig:
    """Options of ``fbgemm-tbe``."""

    copy_rows: bool = False
    """Copy the rows into an unpadded buffer even when they lie in one (TorchRec's
    ``from_float`` pads int8 rows to 16 bytes by default: 144 B for D = 128, against 132 B).
    FBGEMM read the padded rows 1.3-1.9x slower on the x86 CPUs measured, but the copy costs the
    tables' memory once more, so it is never chosen for you (not in the tunable space):
    unpadded rows from TorchRec itself are read in place as fast (``padding_note``)."""

    huge_pages: bool = True
    """Lay a copy of the rows in transparent huge pages where Linux offers them
    (``hostmem.empty_rows``); rows read in place stay where they are."""

    def __post_init__(self) -> None:
        for name in ("copy_rows", "huge_pages"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ConfigError(f"{name}: expected true or false, got {value!r}")


if SparseType is not None:

    @KERNELS.register(
        "fbgemm-tbe",
        config=FbgemmTBEConfig,
        traits=KernelTraits(
            formats=TBE_FORMATS, cpu=True, gpu=False, layout="combined", peer="fbgemm"
        ),
    )
    class FbgemmTBE:
        """FBGEMM's inference TBE operator (``int_nbit_split_embedding_codegen_lookup_function``,
        what ``IntNBitTableBatchedEmbeddingBagsCodegen`` and TorchRec's quantized collection
        call) over fp32, fp16, fp8 (e4m3, exponent bias 7) and int8/int4 rows, float32 out; on
        the CPU only (its placements are host ones; the installed build is fbgemm-gpu-cpu). fp8
        codes 0x7F/0xFF are ±480 to FBGEMM, NaN to torch: ``formats.quantize`` never makes them.
        Tables that are views into one buffer (``split_embedding_weights()`` of an FBGEMM or
        TorchRec module) are read where they lie; otherwise their rows are copied once, here,
        into one buffer in FBGEMM's layout (``buffer.shared`` says which; ``config.copy_rows``
        copies them anyway, unpadded). Ids are bounds-checked by FBGEMM on every call, as its
        module does."""

        name: str

        def __init__(self, tables: Tables, *, config: FbgemmTBEConfig) -> None:
            if tables.device.type != "cpu":
                raise ConfigError(f"fbgemm-tbe: runs on the CPU, the tables are on {tables.device}")
            if tables.row_format not in TBE_FORMATS:
                raise ConfigError(f"fbgemm-tbe: FBGEMM reads no {tables.row_format} rows")
            self.name = "fbgemm-tbe"
            self.tables = tables
            shared = None if config.copy_rows else shared_buffer(tables)
            self.buffer = shared or copied_buffer(tables, config.huge_pages)
            n, dev, d = tables.num_tables, tables.device, tables.dim
            ty = SparseType[TBE_TYPES[tables.row_format]]
            self._args = {
                "dev_weights": self.buffer.data,
                "uvm_weights": torch.empty(0, dtype=torch.uint8, device=dev),
                "weights_placements": torch.full(
                    (n,), EmbeddingLocation.HOST.value, dtype=torch.int32, device=dev
                ),
                "weights_offsets": torch.tensor(self.buffer.offsets, dtype=torch.int64, device=dev),
                "weights_tys": torch.full((n,), ty.as_int(), dtype=torch.uint8, device=dev),
                "D_offsets": torch.arange(0, (n + 1) * d, d, dtype=torch.int32, device=dev),
                "total_D": n * d,
                **{f"max_{k}_D": 0 for k in ("int2", "int4", "int8", "float16", "float32")},
                "max_float8_D": 0,
                "row_alignment": row_alignment(
                    format_row_bytes(tables.row_format, d), self.buffer.stride
                ),
                "fp8_exponent_bits": -1,
                "fp8_exponent_bias": -1,
                "output_dtype": SparseType.FP32.as_int(),
                "pooling_mode": MEAN if tables.pooling == "mean" else 0,
            }
            key = {"int8": "int8", "int4": "int4", "fp16": "float16", "fp32": "float32"}
            self._args[f"max_{key.get(tables.row_format, 'float8')}_D"] = d
            if tables.row_format == "fp8":
                fp8 = SparseType.FP8.default_config()
                self._args["fp8_exponent_bits"] = int(fp8.get("exponent_bits"))
                self._args["fp8_exponent_bias"] = int(fp8.get("exponent_bias"))
            self._rows = torch.tensor(tables.rows, dtype=torch.int64, device=dev)
            self._warning = torch.zeros(1, dtype=torch.int64, device=dev)
            self.layout_note = padding_note(tables, self.buffer) or self.buffer.note
            pairs = list(zip(fbgemm_rows(self.buffer), tables.rows, strict=True))
            self.loose = tuple(t for t, (n, r) in enumerate(pairs) if n > r)
            """The tables FBGEMM's operator would let ids past their rows into (it counts a
            table's rows up to where the next begins, so an aligned start leaves room for more):
            their ids are bounded here, the rest by the operator itself. Where FBGEMM counts
            fewer rows than a table has, its own bounds check runs instead."""
            self._loose_rows = torch.tensor([tables.rows[t] for t in self.loose])
            self._fatal = any(n < r for n, r in pairs)

        @property
        def exact(self) -> bool:
            """Whether FBGEMM's operator alone bounds every table's ids (no ``loose`` table)."""
            return not self.loose

        def _check(self, lookup: Lookup) -> None:
            """Offsets, signs and the ``loose`` tables' ids (FBGEMM's separate bounds check
            costs 240 us a call on ``paper``'s 115,200 ids, this ~15 us); raise naming what is
            wrong. FBGEMM takes id -1 for a pruned row, so negative ids are refused here."""
            ids, offsets = lookup.indices, lookup.offsets
            ok = offsets_and_signs_ok(ids, offsets)
            if ok and self.loose:
                starts = offsets[:: lookup.batch_size].tolist()
                tops = [ids[starts[t] : starts[t + 1]].amax() if starts[t + 1] > starts[t]
                        else ids.new_zeros(()) for t in self.loose]  # fmt: skip
                ok = bool((torch.stack(tops) < self._loose_rows).all())
            if not ok:
                validate_lookup(self.tables, lookup)

        def __call__(self, lookup: Lookup) -> torch.Tensor:
            check_tables_match(self.tables, lookup)
            w = lookup.per_sample_weights
            ids, offsets = lookup.indices, lookup.offsets
            self._check(lookup)
            try:
                if self._fatal:  # FATAL raises (WARNING would zero the caller's ids)
                    torch.ops.fbgemm.bounds_check_indices(
                        self._rows, ids, offsets, BoundsCheckMode.FATAL.value, self._warning, w
                    )
                out: torch.Tensor = (
                    torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function(
                        indices=ids, offsets=offsets, indice_weights=w, **self._args
                    )
                )
            except RuntimeError:  # an id past its table's rows: name it
                validate_lookup(self.tables, lookup)
                raise
            return out.view(lookup.batch_size, self.tables.num_tables, self.tables.dim)
