"""Will pinning pay? The L2 model's carve-out sweeps: the pinning kernel with its hot region
sized to shares of the persisting-L2 maximum (``sweep_carve_out``), and its hit rate against
the carve-out for several row formats over one hot-first layout (``sweep_formats``, the
report's figure). A model, not a measurement (``l2model``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.embed.gpus import GpuSpec
from recperf.embed.kernels.base import KernelTraits
from recperf.embed.kernels.formats import ROW_FORMATS, check_format
from recperf.embed.l2layout import (
    ONE_BUFFER,
    check_reads,
    default_variants,
    hot_rows,
    read_row_bytes,
    row_addresses,
    row_stream,
    variant_traits,
)
from recperf.embed.l2model import (
    PredictConfig,
    VariantInput,
    VariantPrediction,
    cached_accesses,
    check_dim,
    check_shape,
    hot_count,
    io_bytes,
    predict,
    replay_carve_outs,
    variant_prediction,
)
from recperf.embed.model import EmbedConfig
from recperf.embed.traces import Trace

SWEEP = (0.0625, 0.125, 0.25, 0.5, 1.0)
"""Carve-outs of ``sweep_carve_out``, as shares of the persisting-L2 maximum."""


def pinning_variant(fmt: str = "fp32") -> str:
    """The first default variant for ``fmt`` whose traits pin L2 (the one a carve-out sweep
    models unless told), or one ConfigError when no registered kernel does."""
    for name in default_variants(fmt):
        if variant_traits(name).pins_l2:
            return name
    raise ConfigError(
        f"variant: no registered kernel pins L2 and reads {fmt} rows (the pinning kernels are "
        f"Triton ones, registered only where triton is installed)"
    )


def _pinning(variant: str | None, fmt: str) -> tuple[str, KernelTraits]:
    name = variant if variant is not None else pinning_variant(fmt)
    tr = variant_traits(name)
    if not tr.pins_l2:
        raise ConfigError(f"variant {name!r}: does not pin L2 (its traits), so has no carve-out")
    check_reads(name, tr, fmt)
    return name, tr


def sweep_carve_out(
    spec: GpuSpec,
    cfg: EmbedConfig,
    trace: Trace,
    shares: Sequence[float] = SWEEP,
    options: PredictConfig | None = None,
    progress: Callable[[float], None] | None = None,
    variant: str | None = None,
) -> tuple[VariantPrediction, ...]:
    """Will pinning pay? The pinning ``variant`` (default ``pinning_variant``) with its hot
    region (and so its carve-out) sized to each share of the persisting-L2 maximum, the hot
    rows split evenly over the tables."""
    opts = options or PredictConfig()
    name, tr = _pinning(variant, opts.dtype)
    check_dim(opts.dtype, cfg.dim)
    row_bytes = read_row_bytes(tr, opts.dtype, cfg.dim)
    out: list[VariantPrediction] = []
    for i, share in enumerate(shares):
        check_range("carve-out share", share, 0.0, 1.0, lo_open=True)
        per_table = int(share * spec.persisting_l2_max_bytes) // row_bytes // cfg.num_tables
        sized = replace(opts, hot_rows_per_table=max(1, per_table))
        out += predict(spec, cfg, trace, [name], sized).variants
        if progress is not None:
            progress((i + 1) / len(shares))
    return tuple(out)


FORMAT_SHARES = (0.0, 0.125, 0.25, 0.5, 1.0)
"""Carve-outs of ``sweep_formats``, as shares of the persisting-L2 maximum (0: no pinning)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class FormatSweep:
    """One row format's pinning variant at each carve-out (``sweep_formats``)."""

    row_format: str
    row_bytes: int
    """Bytes the variant reads per row (``formats.row_bytes``, scale and bias included)."""
    points: tuple[VariantPrediction, ...]
    """One per carve-out, in the order of the shares swept."""

    def to_json(self) -> dict[str, Any]:
        keys = ("carve_out_bytes", "hit_rate", "pinned_share", "dram_bytes_per_batch",
                "time_lower_bound_ms")  # fmt: skip
        first = self.points[0] if self.points else None
        head = {
            "row_format": self.row_format,
            "row_bytes": self.row_bytes,
            "variant": "" if first is None else first.variant,
            "hot_rows_per_table": 0 if first is None else first.hot_rows_per_table,
        }
        return head | {k: [getattr(p, k) for p in self.points] for k in keys}


def sweep_formats(
    spec: GpuSpec,
    cfg: EmbedConfig,
    trace: Trace,
    formats: Sequence[str] = ROW_FORMATS,
    shares: Sequence[float] = FORMAT_SHARES,
    options: PredictConfig | None = None,
    variant: str | None = None,
) -> tuple[FormatSweep, ...]:
    """Hit rate against the persisting carve-out, per row format: the pinning ``variant``
    (default ``pinning_variant``) with as many hot rows laid out first as the smallest of
    ``formats`` fits in the persisting-L2 maximum (or ``options.hot_rows_per_table``), and the
    first ``share`` of that maximum pinned (0: nothing pinned, the LRU has the whole L2). One
    layout serves every format and carve-out, so a sweep costs one line stream per format; for
    whole-line rows it equals ``sweep_carve_out`` (rows only renamed), for others the hot rows
    past the carve-out stay packed together where ``sweep_carve_out`` puts them in id order."""
    opts = options or PredictConfig()
    fmts = [check_format(f, "formats") for f in dict.fromkeys(formats)]
    if not fmts:
        raise ConfigError(f"formats: none given; allowed: {', '.join(ROW_FORMATS)}")
    for share in shares:
        check_range("carve-out share", share, 0.0, 1.0)
    name, tr = _pinning(variant, fmts[0])
    sizes = {f: read_row_bytes(tr, f, cfg.dim) for f in fmts}
    for f in fmts:
        check_reads(name, tr, f)
        check_shape(cfg, trace, f)
    acc = cached_accesses(cfg, trace, opts.batches)
    hot_n = hot_count(spec, cfg, min(sizes.values()), opts)
    hot = hot_rows(cfg, trace, hot_n)
    hot_count_all = sum(int(h.size) for h in hot)
    one_buffer = tr.layout in ONE_BUFFER  # the positions serve every format
    positions = row_addresses(tr.layout, acc, cfg.table_rows, 1, hot) if one_buffer else None
    io = io_bytes(cfg, acc.lookups)
    out = []
    for f in fmts:
        rb = sizes[f]
        fmt = "fp32" if tr.reads_fp32 else f
        stream = row_stream(tr.layout, fmt, cfg.dim, acc, cfg.table_rows, hot, spec, positions)
        pins = [
            min(int(share * spec.persisting_l2_max_bytes), hot_count_all * rb) for share in shares
        ]
        carves = [spec.carve_out(pin) for pin in pins]
        reps = replay_carve_outs(spec, acc, stream, carves, opts)
        points = tuple(
            variant_prediction(
                VariantInput(name=name, traits=tr, row_bytes=rb, carve=carve, hot=hot_n),
                spec,
                cfg,
                rep,
                io,
            )
            for carve, rep in zip(carves, reps, strict=True)
        )
        out.append(FormatSweep(row_format=f, row_bytes=rb, points=points))
    return tuple(out)
