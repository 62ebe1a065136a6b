"""Which kernel a drop-in module runs and what it is built with: a kernel named by the caller, or
``auto``, the autotuner's cached winner for this device and these tables (``cached_winner``,
never timed), or the fastest of the kernels that read these rows here, timed on the caller's
batches (``measured_choice``); falling back to the ``torch`` reference with the reason; and the
hot rows of the kernels that remap ids, given or counted in a sample trace."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from recperf.core.config import check_range
from recperf.core.errors import ConfigError, RecperfError
from recperf.embed.autotune import (
    DEFAULT_CACHE,
    TuneResult,
    autotune,
    cache_key,
    device_name,
    record_winner,
)
from recperf.embed.kernels.base import (
    EmbeddingKernel,
    Lookup,
    Tables,
    build_kernel,
    kernel_traits,
    kernels_for,
)
from recperf.embed.kernels.formats import INTEGER_FORMATS
from recperf.embed.traces import Trace

AUTO = "auto"
"""The kernel name that asks for the autotuner's cached winner."""
AUTOTUNE_CACHE = DEFAULT_CACHE / "embed_autotune.json"
"""Where ``autotune`` caches its winners by default (and ``auto`` looks them up)."""
REFERENCE = "torch"


@dataclass(frozen=True, slots=True)
class Timed:
    """One kernel as a measurement timed it: its name, options and ms per batch."""

    kernel: str
    params: Mapping[str, Any]
    ms: float


@dataclass(kw_only=True, slots=True, frozen=True)
class KernelChoice:
    """The kernel one group of tables runs, and why that one."""

    kernel: str
    """The kernel's registered name (or ``package.module:attr``)."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Its options (Config fields)."""
    source: str = "named"
    """``named`` (asked for by name), ``autotune cache``, ``tuned`` (timed by ``tune``),
    ``measured`` (timed by ``measured_choice``) or ``fallback`` (``auto`` found no usable
    winner: the reference runs)."""
    note: str = ""
    """The cache entry used, or why the reference runs instead of a winner."""
    cache_key: str = ""
    """Where ``measured_choice`` cached this winner ("" where it cached none)."""
    timed: tuple[Timed, ...] = ()
    """``measured``: every kernel timed for this choice, fastest first (empty for a choice of
    any other source)."""


def takes_hot_rows(name: str) -> bool:
    """Whether kernel ``name`` takes ``hot_rows`` (the kernels that remap ids)."""
    return kernel_traits(name).hot_rows


def build(
    choice: KernelChoice, tables: Tables, hot_rows: Sequence[torch.Tensor] | None
) -> EmbeddingKernel:
    """The kernel ``choice`` names over ``tables``, given ``hot_rows`` when it takes them."""
    return build_kernel(choice.kernel, dict(choice.params), tables, hot_rows)


def _parse_key(key: str) -> dict[str, str] | None:
    """The fields of an ``autotune.cache_key`` (device|dtype|pooling|T|D|R|B|N|W|trace=...)."""
    parts = key.split("|")
    if len(parts) < 10:
        return None
    # caches written before the row formats named float32/float16 by their dtype
    fmt = {"float32": "fp32", "float16": "fp16"}.get(parts[1], parts[1])
    fields = {"device": parts[0], "dtype": fmt, "pooling": parts[2]}
    for part, tag in zip(parts[3:9], "TDRBNW", strict=True):
        if not part.startswith(tag) or not part[1:].isdigit():
            return None
        fields[tag] = part[1:]
    if not parts[9].startswith("trace="):
        return None
    fields["trace"] = parts[9].removeprefix("trace=")
    return fields


def _read_cache(cache: Path) -> dict[str, Any] | str:
    """The cache's entries, or why there are none."""
    if not cache.is_file():
        return f"no autotune cache at {cache}"
    try:
        data = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"autotune cache {cache} is unreadable ({exc})"
    if not isinstance(data, dict):
        return f"autotune cache {cache} is not a JSON object"
    return data


def cached_winner(
    tables: Tables,
    *,
    cache: Path | None = AUTOTUNE_CACHE,
    batch_size: int | None = None,
    trace: str | None = None,
) -> KernelChoice:
    """The cached winner for ``tables`` on their device: entries of the same device, dtype,
    pooling, table count, width and total rows (and ``trace`` when given). Of several, the one
    tuned at the batch size nearest ``batch_size`` (when given), then the fewest ms per id.
    None: the reference, with the reason in ``note``."""
    if batch_size is not None:
        check_range("batch_size", batch_size, 1, None)
    if cache is None:
        return KernelChoice(kernel=REFERENCE, source="fallback", note="no autotune cache given")
    store = _read_cache(cache)
    if isinstance(store, str):
        return KernelChoice(kernel=REFERENCE, source="fallback", note=store)
    want = {
        "device": device_name(tables.device),
        "dtype": tables.row_format,
        "pooling": tables.pooling,
        "T": str(tables.num_tables),
        "D": str(tables.dim),
        "R": str(sum(tables.rows)),
    }
    if trace is not None:
        want["trace"] = trace
    matches = []
    for key, entry in store.items():
        fields = _parse_key(key)
        if fields is None or any(fields[k] != v for k, v in want.items()):
            continue
        if isinstance(entry, dict) and isinstance(entry.get("kernel"), str):
            matches.append((fields, key, entry))
    if not matches:
        shape = ", ".join(f"{k}={v}" for k, v in want.items())
        return KernelChoice(
            kernel=REFERENCE, source="fallback", note=f"no cached winner in {cache} for {shape}"
        )

    def rank(match: tuple[dict[str, str], str, dict[str, Any]]) -> tuple[float, float]:
        fields, _, entry = match
        near = 0.0 if batch_size is None else abs(int(fields["B"]) - batch_size)
        return near, float(entry.get("ms", float("inf"))) / max(int(fields["N"]), 1)

    _, key, entry = min(matches, key=rank)
    raw = entry.get("params")
    params: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return KernelChoice(
        kernel=entry["kernel"], params=params, source="autotune cache", note=f"cache key {key}"
    )


def measured_choice(
    tables: Tables,
    lookups: Sequence[Lookup],
    hot_rows: Sequence[torch.Tensor] | None,
    *,
    cache: Path | None,
    trace: str = "dropin",
    reps: int = 5,
) -> KernelChoice:
    """The fastest kernel for ``tables`` on their device, measured on ``lookups``: every kernel
    that reads their row format natively there (``kernels_for``: recperf's own and the
    installed peers), the ones that remap ids only when ``hot_rows`` are given, each checked
    equal to the reference, then timed in turn, ``reps`` rounds, each kernel's fastest round
    counting (``autotune`` with ``interleave``). The winner is cached in ``cache`` per device,
    shapes and ``trace`` (a cached one is returned untimed, ``source`` "autotune cache");
    ``note`` says what won and by how much."""
    check_range("reps", reps, 1, None)
    if not lookups:
        raise ConfigError("lookups: measured_choice needs at least one batch to time")
    names = [
        n
        for n in kernels_for(tables.row_format, tables.device.type)
        if hot_rows is not None or not kernel_traits(n).hot_rows
    ]
    own = [n for n in names if not kernel_traits(n).reads_fp32]
    skipped = ""
    if tables.row_format in INTEGER_FORMATS and own and len(own) < len(names):
        copies = ", ".join(n for n in names if n not in own)
        skipped = f"; not timed: {copies} (float32 copies of the {tables.row_format} rows)"
        names = own  # 4-8x the rows' memory, and flattered by a first call's timing (IN_PLACE_TIE)
    extra = {n: {"hot_rows": tuple(hot_rows)} for n in names if hot_rows is not None}
    extra = {n: e for n, e in extra.items() if kernel_traits(n).hot_rows}
    result = autotune(
        tables,
        lookups,
        variants=names,
        trace=trace,
        reps=reps,
        cache=cache,
        extra=extra,
        interleave=True,
    )
    source = "autotune cache" if result.cached else "measured"
    note = measured_note(result)
    if result.cached:
        note += f" (measured before, cached in {cache})"
    else:
        note += f" (each the fastest of {reps} interleaved rounds, {PAIRED})"
    note += skipped
    kernel, params = result.kernel, result.params
    key = "" if cache is None else cache_key(tables, lookups, trace, names)
    in_place = in_place_tie(result, tables.row_format)
    if in_place is not None:
        kernel, params = str(in_place["kernel"]), dict(in_place.get("params", {}))
        tie = f"within {IN_PLACE_TIE:.0%} of {result.kernel}"
        why = f"which reads float32 copies of the {tables.row_format} rows"
        note = f"{kernel}: {tie}, {why}, so in place wins; {note}"
        if cache is not None and not result.cached:  # a later cache hit gets this pick too
            record_winner(cache, key, kernel, float(in_place["ms"]), note)
    timed = () if result.cached else timed_of(result)
    return KernelChoice(
        kernel=kernel, params=params, source=source, note=note, cache_key=key, timed=timed
    )


def timed_of(result: TuneResult) -> tuple[Timed, ...]:
    """Every candidate ``result`` timed (not those it rejected), fastest first."""
    timed = [
        Timed(kernel=str(c["kernel"]), params=dict(c.get("params", {})), ms=float(c["ms"]))
        for c in result.candidates
        if "ms" in c
    ]
    return tuple(sorted(timed, key=lambda t: t.ms))


PAIRED = "the second of two calls in a row timed"
"""How ``measured_choice`` and the drop-in's roads time a kernel's call (``interleaved_s``)."""
IN_PLACE_TIE = 0.05
"""How close (relative) a kernel reading fp16/bf16/fp8 rows in their own format must come to a
winner that reads float32 copies of them (``reads_fp32``: 2-4x their memory) to be chosen
instead. A first call's few rounds on one batch (cache-warm) flatter the copies: on `paper`
(reuse trace) the reference won such timings on int4 and int8 rows by 4% and 9%, then ran about
1.6x slower than the in-place kernel on rotating batches, so for int8/int4 rows it is not timed
at all where a kernel reads them in place."""


def in_place_tie(result: TuneResult, row_format: str) -> dict[str, Any] | None:
    """The fastest timed candidate that reads the rows in place, where the winner reads float32
    copies of rows stored otherwise and that candidate is within ``IN_PLACE_TIE`` of it."""
    if row_format == "fp32" or not kernel_traits(result.kernel).reads_fp32:
        return None
    own = [c for c in result.candidates
           if "ms" in c and not kernel_traits(str(c["kernel"])).reads_fp32]  # fmt: skip
    if not own:
        return None
    best = min(own, key=lambda c: float(c["ms"]))
    return best if float(best["ms"]) <= result.ms * (1 + IN_PLACE_TIE) else None


def measured_note(result: TuneResult) -> str:
    """What won and by how much: each kernel's best median (fastest first), the winner's lead
    over the runner-up, and the candidates rejected and why."""
    best: dict[str, float] = {}
    rejected: dict[str, str] = {}
    for c in result.candidates:
        name = str(c["kernel"])
        if "ms" in c:
            best[name] = min(best.get(name, float("inf")), float(c["ms"]))
        elif name not in best:
            rejected.setdefault(name, str(c.get("rejected", "rejected")))
    ranked = sorted(best.items(), key=lambda kv: kv[1])
    if not ranked:
        return f"{result.kernel} {result.ms:.3f} ms per batch"
    head = f"{ranked[0][0]} {ranked[0][1]:.3f} ms per batch"
    if len(ranked) > 1:
        head += f", {ranked[1][1] / ranked[0][1]:.2f}x faster than {ranked[1][0]}"
    rest = [f"{n} {ms:.3f} ms" for n, ms in ranked[1:]]
    rest += [f"{n} rejected ({why})" for n, why in rejected.items() if n not in best]
    return "; ".join([head, *rest])


def build_choice(
    choice: KernelChoice, tables: Tables, hot_rows: Sequence[torch.Tensor] | None
) -> tuple[KernelChoice, EmbeddingKernel]:
    """``choice`` built over ``tables``; a cached winner that cannot run here (not registered,
    e.g. a Triton one without triton, or options or a device it refuses) gives way to the
    reference, with a note naming the winner and why."""
    try:
        return choice, build(choice, tables, hot_rows)
    except RecperfError as exc:
        if choice.source != "autotune cache":
            raise
        why = f"cached winner {choice.kernel!r} cannot run here: {exc}"
    fallback = KernelChoice(kernel=REFERENCE, source="fallback", note=why)
    return fallback, build(fallback, tables, hot_rows)


def hot_rows_from_trace(
    sample: Trace, rows: Sequence[int], fraction: float
) -> tuple[torch.Tensor, ...]:
    """Per table, its ``fraction`` most looked-up rows in ``sample`` (most first, only rows the
    sample touches): one id stream per table, ids within each table's rows."""
    check_range("hot_fraction", fraction, 0.0, 1.0, lo_open=True)
    if sample.tables != len(rows):
        raise ConfigError(f"sample: trace has {sample.tables} tables, the module {len(rows)}")
    for t, (have, want) in enumerate(zip(sample.rows, rows, strict=True)):
        if have > want:
            raise ConfigError(f"sample: table {t} has {have} rows in the trace, {want} here")
    from recperf.embed.locality import hot_rows

    k = max(1, int(fraction * max(rows)))
    out = []
    for t, (ids, hot) in enumerate(zip(sample.ids, hot_rows(sample, k), strict=True)):
        counts = torch.bincount(ids, minlength=sample.rows[t])
        keep = hot[: max(1, int(fraction * rows[t]))]
        out.append(keep[counts[keep] > 0])
    return tuple(out)


def check_hot_rows(hot_rows: object, rows: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """``hot_rows`` as int64 CPU tensors, one per table, each of distinct ids within its table."""
    if not isinstance(hot_rows, Sequence) or len(hot_rows) != len(rows):
        n = f"{len(hot_rows)}" if isinstance(hot_rows, Sequence) else type(hot_rows).__name__
        raise ConfigError(f"hot_rows: expected one tensor per table ({len(rows)}), got {n}")
    out = []
    for t, (ids, r) in enumerate(zip(hot_rows, rows, strict=True)):
        ids = torch.as_tensor(ids).detach().to("cpu").reshape(-1)
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ConfigError(f"hot_rows[{t}]: expected integer row ids, got {ids.dtype}")
        ids = ids.to(torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= r):
            raise ConfigError(f"hot_rows[{t}]: row ids must lie in 0..{r - 1}")
        ordered = ids.sort().values
        if bool((ordered[1:] == ordered[:-1]).any()):
            raise ConfigError(f"hot_rows[{t}]: row ids must be distinct")
        out.append(ids)
    return tuple(out)
