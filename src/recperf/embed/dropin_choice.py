"""Which kernel each group of a drop-in module's tables runs: the one named, ``auto``'s cached
winner or, with none, the fastest timed on the first forward's input, or the winner ``tune``
timed on an example; a kernel that cannot read the group's rows, or remaps hot rows without
any, is refused in one line naming the tables."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import torch

from recperf.core.errors import ConfigError, RecperfError
from recperf.embed.autotune import record_winner
from recperf.embed.dropin_config import NO_HOT, DropInConfig
from recperf.embed.kernel_choice import (
    AUTO,
    PAIRED,
    REFERENCE,
    KernelChoice,
    Timed,
    build,
    build_choice,
    cached_winner,
    measured_choice,
    takes_hot_rows,
)
from recperf.embed.kernels.base import (
    EmbeddingKernel,
    Lookup,
    Parts,
    PartsKernel,
    Tables,
    build_kernel,
    check_reads,
    kernel_traits,
    kernels_for,
    pools_alike,
)
from recperf.embed.timing import time_calls

MEASURE_REPS = 5
"""Timed rounds per kernel when ``auto`` measures on the first forward."""


@dataclass(slots=True)
class Group:
    """Slots whose tables one batched ``Tables`` holds (same width, row format and pooling),
    and the kernel that pools them."""

    slots: tuple[int, ...]
    tables: Tables
    labels: str
    """The tables, as errors name them (``bags[0], bags[3]``)."""
    hot_rows: tuple[torch.Tensor, ...] | None
    choice: KernelChoice
    kernel: EmbeddingKernel
    pending: bool = False
    """``auto`` found no cached winner: the kernels are timed on the first forward's input."""
    parts: bool = False
    """Its kernel pools per-table inputs (the ``parts`` trait): the drop-in calls
    ``pool_parts``, not the kernel on a TBE ``Lookup``."""

    def run(self, choice: KernelChoice, kernel: EmbeddingKernel) -> None:
        """Run ``kernel`` (what ``choice`` names) from now on."""
        self.choice, self.kernel, self.pending = choice, kernel, False
        self.parts = takes_parts(choice.kernel, kernel)


def takes_parts(name: str, kernel: EmbeddingKernel) -> bool:
    """Whether kernel ``name`` (built as ``kernel``) pools per-table inputs."""
    try:
        return kernel_traits(name).parts and isinstance(kernel, PartsKernel)
    except RecperfError:  # a kernel built without a registry entry: the TBE layout
        return False


def make_group(
    slots: tuple[int, ...],
    tables: Tables,
    labels: str,
    hot: tuple[torch.Tensor, ...] | None,
    config: DropInConfig,
    options: Mapping[str, Any],
    tuned: KernelChoice | None = None,
) -> Group:
    """The group with its kernel built: ``tuned`` (a winner timed here before) or as
    ``config`` says."""
    choice = tuned or _named(config, options, tables, hot)
    if choice.source in ("named", "tuned"):
        try:
            check_reads(choice.kernel, tables)
        except ConfigError as exc:  # name the tables whose rows it cannot read
            raise ConfigError(f"{labels}: {exc}") from None
    pending = choice.source == "fallback" and config.kernel == AUTO and config.measure
    if pending:
        choice = replace(choice, note=f"{choice.note}; the kernels are timed on the first forward")
    choice, kernel = build_choice(choice, tables, hot)
    group = Group(slots, tables, labels, hot, choice, kernel, pending)
    group.parts = takes_parts(choice.kernel, kernel)
    return group


def _named(
    config: DropInConfig,
    options: Mapping[str, Any],
    tables: Tables,
    hot: tuple[torch.Tensor, ...] | None,
) -> KernelChoice:
    if config.kernel != AUTO:
        return KernelChoice(kernel=config.kernel, params=options)
    choice = cached_winner(
        tables, cache=config.cache, batch_size=config.batch_size, trace=config.trace
    )
    if hot is None and not config.count_hot_rows and _remaps(choice.kernel):
        why = (
            f"cached winner {choice.kernel!r} remaps hot rows and none were given "
            "(hot_rows, a sample, or count_hot_rows)"
        )
        return KernelChoice(kernel=REFERENCE, source="fallback", note=why)
    return choice


def _remaps(kernel: str) -> bool:
    try:
        return takes_hot_rows(kernel)
    except RecperfError:  # not registered here: build_choice says so
        return False


@dataclass(frozen=True, slots=True)
class Road:
    """A kernel as the first forward timed it on the road the drop-in runs it."""

    choice: KernelChoice
    kernel: EmbeddingKernel
    ms: float
    """Its ms per batch there (the fastest of ``MEASURE_REPS`` rounds; NaN: not timed)."""


def measure(
    group: Group,
    lookup: Lookup,
    config: DropInConfig,
    parts: Parts | None = None,
    out_dtype: torch.dtype | None = None,
    flat: bool = False,
) -> list[Road]:
    """A pending group's kernels timed on ``lookup`` (``measured_choice``, which caches the
    winner), the winner built to run from now on. Given the same batch as ``parts`` and the
    dtype the drop-in returns, the winner is then timed against every kernel that pools
    per-table inputs, on the roads the drop-in runs them (``_by_road``; ``flat``: the batch
    came in the TBE layout, and so will the next), and the fastest there runs. Returns every
    road timed, fastest first (the one running, untimed, where none was)."""
    choice = measured_choice(
        group.tables,
        [lookup],
        group.hot_rows,
        cache=config.cache,
        trace=config.trace or "dropin",
        reps=MEASURE_REPS,
    )
    choice, kernel = build_choice(choice, group.tables, group.hot_rows)
    roads = [Road(choice, kernel, float("nan"))]
    if parts is not None and out_dtype is not None and choice.source == "measured":
        roads = _by_road(group, choice, kernel, lookup, parts, out_dtype, flat)
        best = roads[0]
        if best.choice.kernel != choice.kernel and config.cache is not None and choice.cache_key:
            record_winner(config.cache, choice.cache_key, best.choice.kernel, best.ms,
                          best.choice.note, best.choice.params)  # fmt: skip
    group.run(roads[0].choice, roads[0].kernel)
    return roads


def _by_road(
    group: Group,
    choice: KernelChoice,
    kernel: EmbeddingKernel,
    lookup: Lookup,
    parts: Parts,
    out_dtype: torch.dtype,
    flat: bool = False,
) -> list[Road]:
    """The measured winner and its rivals, timed on the drop-in's roads, fastest first: every
    kernel that pools per-table inputs, on the inputs as given, in the rows' dtype, cast only
    where that is not ``out_dtype`` (``flat``: the batch comes in the TBE layout, and such a
    kernel runs ``pool_lookup`` on it, the road ``forward`` takes then); every other kernel
    ``measured_choice`` timed (``_whole_rivals``), on the TBE ``Lookup``, its ``[B, T, D]``
    float32 then made table-major in ``out_dtype`` (what the drop-in does with it).
    ``measured_choice`` times kernels on the ``Lookup`` only, where one that pools fp16/bf16
    rows casts them to float32, a pass the drop-in never makes: under that bias it picked
    ``fbgemm-tbe`` for fp16 rows, 0.5x the fastest peer on ``mlperf`` (issue 27). A rival
    ahead of the winner says so in its note."""
    given = lookup if flat else None

    def whole_road(k: EmbeddingKernel) -> Callable[[object], torch.Tensor]:
        return lambda _: k(lookup).transpose(0, 1).to(out_dtype).contiguous()

    if isinstance(kernel, PartsKernel) and takes_parts(choice.kernel, kernel):
        first = _parts_road(kernel, parts, given, out_dtype)
    else:
        first = whole_road(kernel)
    entries: list[tuple[str, Mapping[str, Any], EmbeddingKernel, Callable[[object], Any]]] = [
        (choice.kernel, choice.params, kernel, first)
    ]
    for name, rival in _parts_rivals(choice.kernel, group.tables, lookup, parts, kernel):
        entries.append((name, {}, rival, _parts_road(rival, parts, given, out_dtype)))
    for timed, rival in _whole_rivals(choice, group, lookup, kernel):
        entries.append((timed.kernel, timed.params, rival, whole_road(rival)))
    if len(entries) == 1:
        return [Road(choice, kernel, float("nan"))]
    best = [float("inf")] * len(entries)
    for i in range(MEASURE_REPS):  # interleaved as autotune.interleaved_s: each call timed
        for k in (j % len(entries) for j in range(i, i + len(entries))):  # after one of its own
            t = time_calls(entries[k][3], [None], 1, group.tables.device, warmup=1)[0]
            best[k] = min(best[k], t)
    ms = [b * 1e3 for b in best]
    out = []
    for k in sorted(range(len(entries)), key=ms.__getitem__):
        name, params, rival, _ = entries[k]
        if k == 0:
            out.append(Road(choice, kernel, ms[0]))
            continue
        others = "; ".join(f"{e[0]} {m:.3f} ms" for e, m in zip(entries[1:], ms[1:], strict=True)
                           if e[0] != name)  # fmt: skip
        note = (
            f"{name} {ms[k]:.3f} ms per batch on the drop-in's road"
            + (" (the inputs in the TBE layout), " if flat else ", ")
            + f"{choice.kernel} {ms[0]:.3f} ms on its road"
            + (f", {others}" if others else "")
            + f" (the fastest of {MEASURE_REPS} interleaved rounds, {PAIRED}); on the TBE layout "
            f"alone: {choice.note}"
        )
        road = KernelChoice(kernel=name, params=params, source="measured", note=note,
                            cache_key=choice.cache_key)  # fmt: skip
        out.append(Road(road, rival, ms[k]))
    return out


def _parts_rivals(
    winner: str, tables: Tables, lookup: Lookup, parts: Parts, kernel: EmbeddingKernel
) -> list[tuple[str, EmbeddingKernel]]:
    """Every other kernel that pools per-table inputs of these rows (no hot rows), built and
    checked to pool what the winner pools."""
    want = kernel(lookup).transpose(0, 1)
    out: list[tuple[str, EmbeddingKernel]] = []
    for n in kernels_for(tables.row_format, tables.device.type):
        if n == winner or not kernel_traits(n).parts or kernel_traits(n).hot_rows:
            continue
        rival = build_kernel(n, None, tables)
        if not isinstance(rival, PartsKernel):
            continue
        if pools_alike(rival.pool_parts(parts), want, tables.row_format):
            out.append((n, rival))
    return out


def _whole_rivals(
    choice: KernelChoice, group: Group, lookup: Lookup, kernel: EmbeddingKernel
) -> list[tuple[Timed, EmbeddingKernel]]:
    """Every other kernel ``measured_choice`` timed that pools no per-table inputs (FBGEMM's
    TBE, the reference; with hot rows the kernels that remap them), with the options it was
    fastest with, built as it was timed and checked to pool what the winner pools: on the
    first batch's warm rows it may have lost by little, and it runs on the TBE layout as it
    was timed."""
    want = kernel(lookup)
    out = []
    seen = {choice.kernel}
    for t in choice.timed:  # fastest first: each kernel once, at its fastest options
        if t.kernel in seen or kernel_traits(t.kernel).parts:
            continue
        seen.add(t.kernel)
        rival = build(KernelChoice(kernel=t.kernel, params=t.params), group.tables, group.hot_rows)
        if pools_alike(rival(lookup), want, group.tables.row_format):
            out.append((t, rival))
    return out


def _parts_road(
    rival: EmbeddingKernel, parts: Parts, flat: Lookup | None, out_dtype: torch.dtype
) -> Callable[[object], torch.Tensor]:
    """A kernel that pools parts, on the batch as it comes: per table, or ``flat``."""
    kernel = cast(PartsKernel, rival)  # _parts_rivals keeps only these
    if flat is not None:
        return lambda _: kernel.pool_lookup(flat).to(out_dtype)
    return lambda _: kernel.pool_parts(parts).to(out_dtype)


def tune(
    group: Group,
    lookup: Lookup,
    config: DropInConfig,
    *,
    variants: Sequence[str] | None,
    reps: int,
    trace: str,
) -> None:
    """``variants`` (default ``default_variants``) timed on ``lookup`` by the autotuner (its
    cache is ``config.cache``), the winner built to run from now on."""
    from recperf.embed.autotune import autotune

    names = list(variants or default_variants(group, config))
    _check_variants(names, group, config)
    extra = {
        v: {"hot_rows": group.hot_rows}
        for v in names
        if group.hot_rows is not None and takes_hot_rows(v)
    }
    result = autotune(
        group.tables,
        [lookup],
        variants=names,
        trace=trace,
        reps=reps,
        cache=config.cache,
        extra=extra,
    )
    when = "when tuned (cached)" if result.cached else "on the example"
    choice = KernelChoice(
        kernel=result.kernel,
        params=result.params,
        source="autotune cache" if result.cached else "tuned",
        note=f"{result.ms:.3f} ms per batch {when}",
    )
    group.run(choice, build(choice, group.tables, group.hot_rows))


def _hot_ok(group: Group, config: DropInConfig) -> bool:
    return group.hot_rows is not None or config.count_hot_rows


def default_variants(group: Group, config: DropInConfig) -> list[str]:
    """Every kernel that reads the group's rows and runs natively on its device
    (``kernels_for``), less those that remap hot rows when there are none."""
    names = kernels_for(group.tables.row_format, group.tables.device.type)
    return [n for n in names if _hot_ok(group, config) or not takes_hot_rows(n)]


def _check_variants(names: Sequence[str], group: Group, config: DropInConfig) -> None:
    for name in names:
        try:
            check_reads(name, group.tables)
        except ConfigError as exc:
            raise ConfigError(f"variants: {group.labels}: {exc}") from None
        if not _hot_ok(group, config) and takes_hot_rows(name):
            raise ConfigError(f"variants: {NO_HOT.format(name=name)}")
