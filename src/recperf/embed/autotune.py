"""The kernel autotuner: time every variant and every combination of its tunable Config fields
(its registered space) on this device for one configuration and trace, keep the fastest that
matches the reference, and cache the winner per (device, shapes, trace) in a JSON file."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from recperf.core.errors import ConfigError, RecperfError
from recperf.core.results import atomic_path
from recperf.embed.kernels.base import KERNELS, EmbeddingKernel, Lookup, Tables, pools_alike
from recperf.embed.timing import median_s, time_calls

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "recperf"
Progress = Callable[[float], None]
Space = Mapping[str, tuple[Any, ...]]
"""Tunable Config fields and their candidate values."""


@dataclass(kw_only=True, slots=True)
class TuneResult:
    """The fastest variant and its options, and every candidate timed."""

    kernel: str
    """The winning variant."""
    params: dict[str, Any]
    """Its options (Config fields: the fixed ones and the tuned ones)."""
    ms: float
    """Its ms per batch: the median of its calls, or interleaved the fastest round."""
    candidates: list[dict[str, Any]] = field(default_factory=list)
    """Every candidate: kernel, params and ms, or why it was rejected."""
    cached: bool = False
    """Whether the result came from the cache (nothing was timed)."""
    note: str = ""
    """Why the winner is not the fastest candidate, where a later timing replaced it
    (``record_winner``)."""


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def cache_key(
    tables: Tables,
    lookups: Sequence[Lookup],
    trace: str,
    variants: Sequence[str],
    options: Mapping[str, Mapping[str, Any]] | None = None,
    spaces: Mapping[str, Space] | None = None,
) -> str:
    """Device, row format, pooling, tables' shapes, batch, ids per batch, trace and variants, and
    the variants' fixed options and swept spaces where given."""
    lk = lookups[0]
    given = {
        what: {v: dict(per[v]) for v in sorted(variants) if per.get(v)}
        for what, per in (("options", options or {}), ("spaces", spaces or {}))
    }
    return "|".join(
        [
            device_name(tables.device),
            tables.row_format,
            tables.pooling,
            f"T{tables.num_tables}",
            f"D{tables.dim}",
            f"R{sum(tables.rows)}",
            f"B{lk.batch_size}",
            f"N{int(lk.indices.numel())}",
            f"W{int(lk.per_sample_weights is not None)}",
            f"trace={trace}",
            "variants=" + ",".join(sorted(variants)),
            *(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in given.items() if v),
        ]
    )


def grid(name: str, space: Space | None = None) -> list[dict[str, Any]]:
    """Every combination of ``name``'s tunable Config fields, from its registered space or the
    ``space`` given instead (one empty dict if there are none)."""
    space = KERNELS.entry(name).space if space is None else space
    keys = sorted(space)
    return [
        dict(zip(keys, values, strict=True))
        for values in itertools.product(*(space[k] for k in keys))
    ]


def _build_checked(
    name: str,
    params: dict[str, Any],
    tables: Tables,
    lookup: Lookup,
    want: torch.Tensor,
    extra: dict[str, Any],
) -> EmbeddingKernel | str:
    """The candidate built and checked against the reference's ``want``, or why it was
    rejected."""
    try:
        kernel: EmbeddingKernel = KERNELS.build(name, params, tables, **extra)
        got = kernel(lookup)
    except (RecperfError, RuntimeError, ValueError) as exc:  # e.g. a block too big for the GPU
        return f"failed: {exc}".splitlines()[0]
    if not pools_alike(got, want, tables.row_format):
        return "wrong result"
    return kernel


def _time_one(
    name: str,
    params: dict[str, Any],
    tables: Tables,
    lookups: Sequence[Lookup],
    want: torch.Tensor,
    reps: int,
    extra: dict[str, Any],
) -> float | str:
    """Median seconds per batch, or why the candidate was rejected."""
    kernel = _build_checked(name, params, tables, lookups[0], want, extra)
    if isinstance(kernel, str):
        return kernel
    return median_s(kernel, lookups, reps, tables.device)


def interleaved_s(
    kernels: Sequence[EmbeddingKernel], lookups: Sequence[Lookup], reps: int, device: torch.device
) -> list[float]:
    """Seconds per batch of each kernel: the fastest of ``reps`` rounds, in each of which every
    kernel runs twice in a row on the same batch and the second call is timed, the first of
    the round rotating. On a shared machine a neighbour's burst only ever adds time, and with
    the few rounds a first call can afford the fastest is a steadier estimate than the median
    (measured here under a load of 8 on 2 cores: medians of the same kernel 1.8-8 ms, minimums
    1.2-1.3). Timed right after another kernel, a kernel found the rows that one had read warm
    where both read the same rows (on float32 rows the reference and ``bag-list`` read the
    tables in place) and cold where it reads a copy of its own: timed so, ``bag-list`` won by
    6-15% on ``paper`` fp32 and then ran 7% slower than ``bag-concat`` (issue 27). After a call
    of its own, each finds the caches as it leaves them."""
    times: list[list[float]] = [[] for _ in kernels]
    for i in range(reps):
        for j in range(len(kernels)):
            k = (i + j) % len(kernels)
            batch = [lookups[i % len(lookups)]]
            times[k].append(time_calls(kernels[k], batch, 1, device, warmup=1)[0])
    return [min(t) for t in times]


def _time_all(
    plan: Sequence[tuple[str, dict[str, Any]]],
    tables: Tables,
    lookups: Sequence[Lookup],
    want: torch.Tensor,
    reps: int,
    extra: Mapping[str, dict[str, Any]],
    interleave: bool,
    progress: Progress | None,
) -> list[float | str]:
    """Each candidate's median seconds per batch, or why it was rejected: one after another,
    or (``interleave``) all built and checked first, then timed in turn."""
    if not interleave:
        out: list[float | str] = []
        for i, (name, params) in enumerate(plan):
            out.append(_time_one(name, params, tables, lookups, want, reps, extra.get(name, {})))
            if progress is not None:
                progress((i + 1) / len(plan))
        return out
    built = [
        _build_checked(name, params, tables, lookups[0], want, extra.get(name, {}))
        for name, params in plan
    ]
    ok = [k for k in built if not isinstance(k, str)]
    seconds = iter(interleaved_s(ok, lookups, reps, tables.device) if ok else [])
    if progress is not None:
        progress(1.0)
    return [k if isinstance(k, str) else next(seconds) for k in built]


def autotune(
    tables: Tables,
    lookups: Sequence[Lookup],
    *,
    variants: Sequence[str],
    trace: str = "unnamed",
    reps: int = 20,
    cache: Path | None = DEFAULT_CACHE / "embed_autotune.json",
    extra: dict[str, dict[str, Any]] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    spaces: Mapping[str, Space] | None = None,
    progress: Progress | None = None,
    interleave: bool = False,
) -> TuneResult:
    """Time ``variants`` x their grids; the winner is cached under ``cache_key``. Per variant,
    ``extra`` gives its data (e.g. the hot rows), ``options`` its fixed Config options (the
    grid's values override them) and ``spaces`` a space to sweep instead of its registered one.
    ``interleave`` builds every candidate at once (memory: each holds what it builds, e.g. a
    copy of the tables) and times them in turn, which is fair on a busy machine; off, they are
    built and timed one at a time."""
    key = cache_key(tables, lookups, trace, variants, options, spaces)
    store = _load(cache)
    if key in store:
        return TuneResult(**store[key], cached=True)
    if cache is not None:  # fail before the timing, not after it
        _check_writable(cache)
    want = KERNELS.build("torch", None, tables)(lookups[0])
    fixed = options or {}
    plan = [
        (name, {**fixed.get(name, {}), **params})
        for name in variants
        for params in grid(name, (spaces or {}).get(name))
    ]
    for name, params in plan:  # a bad option or space is the user's one-line error, up front
        KERNELS.config(name, params)
    candidates: list[dict[str, Any]] = []
    timings = _time_all(plan, tables, lookups, want, reps, extra or {}, interleave, progress)
    for (name, params), t in zip(plan, timings, strict=True):
        row: dict[str, Any] = {"kernel": name, "params": params}
        row.update({"ms": t * 1e3} if isinstance(t, float) else {"rejected": t})
        candidates.append(row)
    timed = [c for c in candidates if "ms" in c]
    if not timed:
        raise RecperfError(f"autotune: no variant ran: {candidates[0].get('rejected')}")
    best = min(timed, key=lambda c: c["ms"])
    result = TuneResult(
        kernel=best["kernel"], params=best["params"], ms=best["ms"], candidates=candidates
    )
    if cache is not None:
        store[key] = {k: v for k, v in asdict(result).items() if k != "cached"}
        cache.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(cache) as tmp:
            tmp.write_text(json.dumps(store, indent=1, sort_keys=True) + "\n")
    return result


def record_winner(
    cache: Path,
    key: str,
    kernel: str,
    ms: float,
    note: str,
    params: Mapping[str, Any] | None = None,
) -> None:
    """Make ``kernel`` (with ``params``, default none) the cached winner under ``key``, an entry
    ``autotune`` wrote, where a later timing beat its pick (the drop-in's ``_by_road``, or its
    trial on the next batches); the timed candidates stay, ``note`` says why."""
    store = _load(cache)
    entry = store.get(key)
    if not isinstance(entry, dict):
        return
    chosen = dict(params or {})
    store[key] = {**entry, "kernel": kernel, "params": chosen, "ms": ms, "note": note}
    with atomic_path(cache) as tmp:
        tmp.write_text(json.dumps(store, indent=1, sort_keys=True) + "\n")


def _check_writable(cache: Path) -> None:
    """The cache's directory exists or can be made, and takes new files."""
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"autotune cache {cache}: cannot create its directory ({exc.strerror}); "
            "set XDG_CACHE_HOME to a writable directory"
        ) from None
    if not os.access(cache.parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"autotune cache {cache}: its directory is not writable; "
            "set XDG_CACHE_HOME to a writable directory"
        )


def _load(cache: Path | None) -> dict[str, Any]:
    if cache is None or not cache.is_file():
        return {}
    try:
        data: dict[str, Any] = json.loads(cache.read_text())
        return data
    except ValueError:
        return {}  # a corrupt cache is only a cache: re-tune and overwrite it
