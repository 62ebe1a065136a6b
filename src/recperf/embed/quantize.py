"""Float embedding tables converted to a row format (fp16, bf16, fp8, int8, int4), all or nothing,
and what it costs: per table, the relative error of pooled outputs against the float rows on an
access trace (the bundled one by default)."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.core.files import GiB, check_input
from recperf.core.results import atomic_path
from recperf.embed import traces
from recperf.embed.kernels.formats import (
    FLOAT_DTYPES,
    check_format,
    dequantize,
    format_of,
    quantize,
    row_bytes,
)

DEFAULT_TRACE = next(iter(traces.BUNDLED))
"""The trace the error is measured on unless another is named: the bundled real one."""
DEFAULT_BAGS = 2048
"""Bags pooled per table for the error."""
DEFAULT_POOLING_FACTOR = 20
"""Ids per bag for the error, where no configuration says."""
MAX_IDS = 10_000_000
"""Ids per table the error is measured on, at most (bags x pooling factor)."""
TABLES_MAX_BYTES = 64 * GiB
"""The largest ``--tables`` file read."""


@dataclass(frozen=True, slots=True)
class QuantizedTable:
    """One table's rows in a row format (new tensors; the float rows are untouched)."""

    weight: torch.Tensor
    """The float rows (fp16, bf16) or the codes (``uint8``: fp8, int8, int4)."""
    scale_bias: torch.Tensor | None
    """int8/int4: ``uint8 [rows, 4]``, float16 scale and bias per row; else None."""
    fmt: str
    """The row format."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TableError:
    """What quantizing one table cost."""

    table: str
    """The table (``bags[2]``, ``table 't1'`` or ``tables[0]``)."""
    rows: int
    dim: int
    bytes_per_row_before: int
    """Bytes of a float row as it was."""
    bytes_per_row_after: int
    """Bytes of a row in the new format, its scale and bias included."""
    bags: int
    """Bags pooled (those whose float result is all zeros are left out of the error)."""
    max_rel_err: float
    """Largest ``||pooled - pooled_float|| / ||pooled_float||`` (L2 over D) of a bag."""
    mean_rel_err: float
    """Its mean over the bags."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantizationReport:
    """The error of quantizing every table of a module to ``row_format``."""

    row_format: str
    trace: str
    """The access trace the bags' ids came from (each table's ids taken modulo its rows)."""
    pooling_factor: tuple[int, ...]
    """Ids per bag, per table."""
    tables: tuple[TableError, ...]

    @property
    def max_rel_err(self) -> float:
        """The largest bag error over all tables."""
        return max(t.max_rel_err for t in self.tables)

    def to_json(self) -> dict[str, Any]:
        return {
            "row_format": self.row_format,
            "trace": self.trace,
            "pooling_factor": list(self.pooling_factor),
            "reference": "the float rows pooled in float64; bags summed (mean: same ratio)",
            "max_rel_err": self.max_rel_err,
            "tables": [asdict(t) for t in self.tables],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QuantizationReport:
        return cls(
            row_format=str(data["row_format"]),
            trace=str(data["trace"]),
            pooling_factor=tuple(int(p) for p in data["pooling_factor"]),
            tables=tuple(TableError(**t) for t in data["tables"]),
        )


def quantize_tables(
    weights: Sequence[torch.Tensor], fmt: str, labels: Sequence[str]
) -> tuple[QuantizedTable, ...]:
    """Every float table of ``weights`` in row format ``fmt`` (new tensors), or one ConfigError
    naming the first table (by ``labels``) and field that cannot be: nothing half-way."""
    check_format(fmt, "dtype")
    from recperf.embed.dropin_inputs import relabel

    out = []
    for w, label in zip(weights, labels, strict=True):
        have = format_of(w.dtype)
        if have not in FLOAT_DTYPES:
            raise ConfigError(
                f"{label}: already {have or 'quantized'} rows; quantize converts float tables"
            )
        try:
            q, sb = quantize(w, fmt)
        except ConfigError as exc:
            raise relabel(label, exc) from None
        out.append(QuantizedTable(q, sb, fmt))
    return tuple(out)


def check_sampling(tables: int, bags: int, pooling_factor: int | Sequence[int]) -> tuple[int, ...]:
    """The ids per bag of each table, or one ConfigError: ``bags`` and each pooling factor
    >= 1, one factor for all tables or one per table, at most ``MAX_IDS`` ids a table."""
    check_range("bags", bags, 1, None)
    if isinstance(pooling_factor, int):
        factors: tuple[int, ...] = (pooling_factor,) * tables
    else:
        factors = tuple(pooling_factor)
    if len(factors) != tables:
        raise ConfigError(f"pooling_factor: {len(factors)} values for {tables} tables")
    for per_bag in factors:
        check_range("pooling_factor", per_bag, 1, None)
        if bags * per_bag > MAX_IDS:
            raise ConfigError(
                f"bags x pooling_factor = {bags:,} x {per_bag:,} ids a table; at most {MAX_IDS:,}"
            )
    return factors


def trace_bags(
    trace: traces.Trace, rows: Sequence[int], bags: int, pooling_factor: Sequence[int]
) -> list[torch.Tensor]:
    """Per table ``[bags, L]`` ids (L its pooling factor): the first ``bags * L`` ids of the
    trace's stream for it (table t reads stream t modulo the trace's tables, cycled), taken
    modulo the table's rows, as ``bench`` takes them."""
    check_sampling(len(rows), bags, pooling_factor)
    out = []
    for t, (r, per_bag) in enumerate(zip(rows, pooling_factor, strict=True)):
        stream = trace.ids[t % trace.tables]
        pos = torch.arange(bags * per_bag, dtype=torch.int64) % stream.numel()
        out.append((stream[pos] % r).reshape(bags, per_bag))
    return out


def pooled_error(weight: torch.Tensor, table: QuantizedTable, ids: torch.Tensor) -> torch.Tensor:
    """Per bag of ``ids`` ``[bags, L]`` (with at least one float row not zero) the relative L2
    error of the quantized rows' sum against the float rows' (both in float64); only the rows
    the bags touch are dequantized."""
    used, inverse = torch.unique(ids, return_inverse=True)
    ref_rows = weight.detach()[used].double()
    sb = None if table.scale_bias is None else table.scale_bias[used]
    got_rows = dequantize(table.weight[used], sb, table.fmt).double()
    ref = F.embedding_bag(inverse, ref_rows, mode="sum")
    got = F.embedding_bag(inverse, got_rows, mode="sum")
    norm = ref.norm(dim=1)
    keep = norm > 0
    rel: torch.Tensor = (got - ref)[keep].norm(dim=1) / norm[keep]
    return rel


def error_report(
    weights: Sequence[torch.Tensor],
    quantized: Sequence[QuantizedTable],
    labels: Sequence[str],
    *,
    trace: traces.Trace,
    bags: int = DEFAULT_BAGS,
    pooling_factor: int | Sequence[int] = DEFAULT_POOLING_FACTOR,
) -> QuantizationReport:
    """Each table's pooled-output error on ``bags`` bags of ``trace`` (``pooling_factor`` ids
    per bag: one for all tables or one per table)."""
    factors = check_sampling(len(weights), bags, pooling_factor)
    rows = [int(w.shape[0]) for w in weights]
    ids = trace_bags(trace, rows, bags, factors)
    entries = []
    for w, q, label, table_ids in zip(weights, quantized, labels, ids, strict=True):
        rel = pooled_error(w, q, table_ids)
        fmt = format_of(w.dtype) or "fp32"
        dim = int(w.shape[1])
        entries.append(
            TableError(
                table=label,
                rows=int(w.shape[0]),
                dim=dim,
                bytes_per_row_before=row_bytes(fmt, dim),
                bytes_per_row_after=row_bytes(q.fmt, dim),
                bags=int(rel.numel()),
                max_rel_err=float(rel.max()) if rel.numel() else 0.0,
                mean_rel_err=float(rel.mean()) if rel.numel() else 0.0,
            )
        )
    fmt = quantized[0].fmt if quantized else "fp32"
    return QuantizationReport(
        row_format=fmt, trace=trace.name, pooling_factor=factors, tables=tuple(entries)
    )


def load_trace(name: str, rows: Sequence[int], seed: int = 0) -> traces.Trace:
    """The trace ``name`` with one stream per table (a one-table trace tiled, as ``bench``
    does); a generated one sized to the largest table."""
    generated = name == "uniform" or name.startswith("zipf:") or name in traces.PRESETS
    return traces.resolve(name, rows=max(rows) if generated else None, tables=len(rows), seed=seed)


def quantize_with_report(
    weights: Sequence[torch.Tensor],
    fmt: str,
    labels: Sequence[str],
    *,
    trace: str | traces.Trace = DEFAULT_TRACE,
    bags: int = DEFAULT_BAGS,
    pooling_factor: int | Sequence[int] = DEFAULT_POOLING_FACTOR,
    seed: int = 0,
) -> tuple[tuple[QuantizedTable, ...], QuantizationReport]:
    """``quantize_tables`` and its ``error_report`` (the trace loaded first: a bad name fails
    before any work)."""
    check_sampling(len(weights), bags, pooling_factor)
    rows = [int(w.shape[0]) for w in weights]
    loaded = trace if isinstance(trace, traces.Trace) else load_trace(trace, rows, seed)
    quantized = quantize_tables(weights, fmt, labels)
    report = error_report(
        weights, quantized, labels, trace=loaded, bags=bags, pooling_factor=pooling_factor
    )
    return quantized, report


def load_tables(path: str | Path) -> tuple[list[torch.Tensor], list[str]]:
    """Float tables saved with ``torch.save``: a list of 2-D float tensors (labels
    ``tables[i]``) or a dict of them by name; one ConfigError naming the file and the entry."""
    p = check_input(path, "--tables", max_bytes=TABLES_MAX_BYTES)
    try:
        obj = torch.load(p, weights_only=True, map_location="cpu")
    except (RuntimeError, ValueError, EOFError, OSError, pickle.UnpicklingError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"--tables {p}: not a torch.save file of tensors: {why}") from None
    if isinstance(obj, dict):
        items = [(f"table {str(k)!r}", v) for k, v in obj.items()]
    elif isinstance(obj, list | tuple):
        items = [(f"tables[{i}]", v) for i, v in enumerate(obj)]
    else:
        got = type(obj).__name__
        raise ConfigError(f"--tables {p}: expected a list or dict of 2-D float tensors, got {got}")
    if not items:
        raise ConfigError(f"--tables {p}: holds no tables")
    for label, w in items:
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype not in FLOAT_DTYPES.values():
            got = f"{tuple(w.shape)} {w.dtype}" if isinstance(w, torch.Tensor) else type(w).__name__
            raise ConfigError(
                f"--tables {p}: {label}: expected a 2-D float32, float16 or bfloat16 tensor, "
                f"got {got}"
            )
        if w.shape[0] < 1 or w.shape[1] < 1:
            raise ConfigError(f"--tables {p}: {label}: expected rows >= 1 and D >= 1")
    return [w for _, w in items], [label for label, _ in items]


def save_quantized(
    path: str | Path, quantized: Sequence[QuantizedTable], labels: Sequence[str]
) -> Path:
    """The quantized tables as one ``torch.save`` file (written to a temporary name first):
    ``{"row_format": ..., "tables": [{"table", "weight", "scale_bias"}, ...]}``, in FBGEMM's
    IntNBit split layout for int8/int4 (``formats``)."""
    document = {
        "row_format": quantized[0].fmt if quantized else "",
        "tables": [
            {"table": label, "weight": q.weight, "scale_bias": q.scale_bias}
            for q, label in zip(quantized, labels, strict=True)
        ],
    }
    with atomic_path(path) as tmp:
        torch.save(document, tmp)
    return Path(path)
