"""Analytic model of a chained ingestion pipeline: per-stage worker pools, bottleneck throughput,
memory, the LP upper bound and the even / oracle allocators that tuners are judged against."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar

from recperf.core.config import check_range, from_mapping, load_toml
from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation

MIB = 2**20
GIB = 2**30
C = TypeVar("C")


@dataclass(kw_only=True, slots=True, frozen=True)
class StageSpec:
    """One pipeline stage, run by a pool of identical worker processes."""

    name: str
    """Unique stage name (e.g. ``decode``)."""
    cost_us_per_row: float
    """CPU time one worker spends per row, microseconds (> 0)."""
    max_workers: int | None = None
    """Most workers that help this stage (>= 1); ``None`` for no cap."""
    memory_mib_per_worker: float = 0.0
    """Resident memory of one worker, MiB (>= 0)."""

    def __post_init__(self) -> None:
        check_range("cost_us_per_row", self.cost_us_per_row, 0.0, None, lo_open=True)
        if self.max_workers is not None:
            check_range("max_workers", self.max_workers, 1, None)
        check_range("memory_mib_per_worker", self.memory_mib_per_worker, 0.0, None)


AllocLike = Allocation | Sequence[int]


@dataclass(kw_only=True, slots=True, frozen=True)
class PipelineSpec:
    """A chain of stages sharing ``cores`` CPU cores and a memory budget."""

    name: str = "custom"
    """Label used in results."""
    cores: int
    """CPU cores the stages share (1..1024)."""
    memory_budget_gib: float
    """Memory the workers and inter-stage buffers may use, GiB (> 0)."""
    stages: tuple[StageSpec, ...]
    """The stages, in pipeline order (at least one)."""
    transfer_us_per_row: float = 0.0
    """Cost of handing a row to the next stage, microseconds, charged to every stage (>= 0)."""
    memory_mib_per_batch: float = 0.0
    """Size of one buffered batch, MiB (>= 0)."""
    batch_rows: int = 8192
    """Rows per batch (>= 1); informational here, used by the executor and env."""
    queue_batches: int = 2
    """Batches buffered between each pair of adjacent stages (>= 0)."""

    def __post_init__(self) -> None:
        check_range("cores", self.cores, 1, 1024)
        check_range("memory_budget_gib", self.memory_budget_gib, 0.0, None, lo_open=True)
        check_range("transfer_us_per_row", self.transfer_us_per_row, 0.0, None)
        check_range("memory_mib_per_batch", self.memory_mib_per_batch, 0.0, None)
        check_range("batch_rows", self.batch_rows, 1, None)
        check_range("queue_batches", self.queue_batches, 0, None)
        if not self.stages:
            raise ConfigError("stage: the pipeline needs at least one [[stage]]")
        seen: set[str] = set()
        for st in self.stages:
            if st.name in seen:
                raise ConfigError(f"stage: duplicate stage name {st.name!r}")
            seen.add(st.name)

    # -- the model ---------------------------------------------------------------------------

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    def row_costs_us(self) -> tuple[float, ...]:
        """Per-row cost of each stage including the transfer to the next one."""
        return tuple(s.cost_us_per_row + self.transfer_us_per_row for s in self.stages)

    def workers(self, alloc: AllocLike) -> tuple[int, ...]:
        """The worker counts of ``alloc``, checked to have one entry per stage."""
        w = tuple(alloc.workers if isinstance(alloc, Allocation) else alloc)
        if len(w) != self.n_stages:
            raise ConfigError(f"allocation has {len(w)} entries; the pipeline has {self.n_stages}")
        return w

    def contention(self, alloc: AllocLike) -> float:
        """Factor (<= 1) every stage's capacity is scaled by when workers outnumber cores."""
        total = sum(self.workers(alloc))
        return 1.0 if total <= self.cores else self.cores / total

    def capacities(self, alloc: AllocLike) -> tuple[float, ...]:
        """Rows/s each stage could sustain alone under ``alloc`` (contention included)."""
        w = self.workers(alloc)
        scale = self.contention(w)
        out = []
        for st, wi, cost in zip(self.stages, w, self.row_costs_us(), strict=True):
            useful = wi if st.max_workers is None else min(wi, st.max_workers)
            out.append(max(useful, 0) * 1e6 / cost * scale)
        return tuple(out)

    def throughput(self, alloc: AllocLike) -> float:
        """Pipeline rows/s: the slowest stage of the chain."""
        return min(self.capacities(alloc))

    def bottleneck(self, alloc: AllocLike) -> str:
        """Name of the slowest stage (the first one on ties)."""
        caps = self.capacities(alloc)
        return self.stages[caps.index(min(caps))].name

    def buffer_mib(self) -> float:
        """Memory of the batches queued between stages, MiB."""
        return (self.n_stages - 1) * self.queue_batches * self.memory_mib_per_batch

    def memory_bytes(self, alloc: AllocLike) -> float:
        """Workers' memory plus inter-stage buffers, bytes."""
        w = self.workers(alloc)
        stage_mib = sum(wi * s.memory_mib_per_worker for wi, s in zip(w, self.stages, strict=True))
        return (stage_mib + self.buffer_mib()) * MIB

    def check_allocation(self, alloc: AllocLike) -> None:
        """Raise ConfigError if a stage has < 1 or > max_workers workers or memory is over."""
        w = self.workers(alloc)
        for st, wi in zip(self.stages, w, strict=True):
            if wi < 1:
                raise ConfigError(f"allocation: stage {st.name!r} has {wi} workers; needs >= 1")
            if st.max_workers is not None and wi > st.max_workers:
                raise ConfigError(
                    f"allocation: stage {st.name!r} has {wi} workers, over its "
                    f"max_workers = {st.max_workers}"
                )
        total_mib = self.memory_bytes(w) / MIB
        if total_mib > self.memory_budget_gib * 1024 * (1 + 1e-12):
            buf = self.buffer_mib()
            raise ConfigError(
                f"allocation needs {total_mib:.1f} MiB (stage memory {total_mib - buf:.1f} MiB "
                f"+ buffers {buf:.1f} MiB), over memory_budget_gib = {self.memory_budget_gib:g} "
                f"GiB ({self.memory_budget_gib * 1024:.1f} MiB)"
            )

    def fits(self, alloc: AllocLike) -> bool:
        """True if ``alloc`` passes check_allocation and uses at most ``cores`` workers."""
        try:
            self.check_allocation(alloc)
        except ConfigError:
            return False
        return sum(self.workers(alloc)) <= self.cores

    def with_(self, **changes: Any) -> PipelineSpec:
        return dataclasses.replace(self, **changes)


# -- loading ----------------------------------------------------------------------------------


def _build(cls: type[C], data: Mapping[str, Any], source: str) -> C:
    """``from_mapping`` plus missing-key checks, with every error prefixed by ``source``."""
    required = [
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    for key in required:
        if key not in data:
            raise ConfigError(f"{source}: missing required key {key!r}")
    try:
        return from_mapping(cls, data, source=source)
    except ConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def spec_from_mapping(data: Mapping[str, Any], source: str = "spec") -> PipelineSpec:
    """Build a PipelineSpec from a TOML-shaped mapping (``[[stage]]`` tables under ``stage``)."""
    top = dict(data)
    if "stages" in top:
        raise ConfigError(f"{source}: unknown key 'stages'; declare stages as [[stage]] tables")
    raw = top.pop("stage", None)
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ConfigError(f"{source}: stage: expected one or more [[stage]] tables")
    stages = []
    for i, table in enumerate(raw):
        label = f"stage[{i}]" + (
            f" {table['name']!r}" if isinstance(table.get("name"), str) else ""
        )
        stages.append(_build(StageSpec, table, f"{source}: {label}"))
    return _build(PipelineSpec, {**top, "stages": tuple(stages)}, source)


BUNDLED = ("criteo-16", "udf-64", "membound-128")


def load_spec(spec: str | Path) -> PipelineSpec:
    """A bundled spec name (see ``BUNDLED``) or a path to a TOML spec file."""
    if isinstance(spec, str) and spec in BUNDLED:
        ref = resources.files("recperf").joinpath(f"data/ingest/{spec}.toml")
        with resources.as_file(ref) as path:
            data = load_toml(path)
        return spec_from_mapping({"name": spec, **data}, source=f"{spec}.toml")
    path = Path(spec)
    data = load_toml(path)
    return spec_from_mapping({"name": path.stem, **data}, source=str(path))


# -- bound and allocators ---------------------------------------------------------------------

Binding = Literal["cores", "max_workers", "memory"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Bound:
    """The LP relaxation's optimum: real-valued workers, no floor of one worker per stage."""

    throughput_rows_per_s: float
    """Highest throughput any allocation (even fractional) can reach."""
    workers: tuple[float, ...]
    """The real-valued workers per stage that reach it (the least such)."""
    binding: Binding
    """The constraint that limits the throughput."""
    binding_stage: str | None = None
    """For ``max_workers``, the capped stage that binds."""


def lp_bound(spec: PipelineSpec) -> Bound:
    """Solve max T s.t. T*c_i/1e6 <= w_i <= max_i, sum w <= cores, memory(w) <= budget.

    The least workers for throughput T are w_i = T*c_i/1e6, linear in T, so every constraint
    caps T on its own and T* is the smallest of those caps.
    """
    costs = spec.row_costs_us()
    limits: list[tuple[float, Binding, str | None]] = [
        (spec.cores * 1e6 / sum(costs), "cores", None)
    ]
    for st, c in zip(spec.stages, costs, strict=True):
        if st.max_workers is not None:
            limits.append((st.max_workers * 1e6 / c, "max_workers", st.name))
    mib_per_rate = sum(c * s.memory_mib_per_worker for c, s in zip(costs, spec.stages, strict=True))
    free_mib = spec.memory_budget_gib * 1024 - spec.buffer_mib()
    if free_mib < 0:
        limits.append((0.0, "memory", None))
    elif mib_per_rate > 0:
        limits.append((free_mib * 1e6 / mib_per_rate, "memory", None))
    t, binding, stage = min(limits, key=lambda lim: lim[0])
    return Bound(
        throughput_rows_per_s=t,
        workers=tuple(t * c / 1e6 for c in costs),
        binding=binding,
        binding_stage=stage,
    )


def even(spec: PipelineSpec) -> Allocation:
    """Deal cores one at a time round-robin, skipping stages at their cap or out of memory.

    Every stage gets at least one worker (even if that oversubscribes the cores or the memory).
    """
    w = [1] * spec.n_stages
    left = spec.cores - spec.n_stages
    budget_mib = spec.memory_budget_gib * 1024
    used_mib = spec.memory_bytes(w) / MIB
    while left > 0:
        gave = False
        for i, st in enumerate(spec.stages):
            if left == 0:
                break
            if st.max_workers is not None and w[i] >= st.max_workers:
                continue
            if used_mib + st.memory_mib_per_worker > budget_mib:
                continue
            w[i] += 1
            used_mib += st.memory_mib_per_worker
            left -= 1
            gave = True
        if not gave:
            break
    return Allocation(workers=tuple(w))


def _least_workers(ratio: float, costs: Sequence[float]) -> list[int]:
    """Least integer workers per stage for throughput ``ratio * 1e6`` rows/s (>= 1 each)."""
    out = []
    for c in costs:
        x = ratio * c
        out.append(max(1, math.ceil(x - 1e-9 * max(1.0, x))))
    return out


OVERSUBSCRIBE = 8
"""Default most workers per uncapped stage, as a multiple of the cores (see ``oracle``)."""


def stage_limits(spec: PipelineSpec, worker_limit: int | None = None) -> list[int]:
    """Most workers each stage may get: its cap, else ``worker_limit`` (default 8 x cores)."""
    limit = OVERSUBSCRIBE * spec.cores if worker_limit is None else worker_limit
    return [limit if s.max_workers is None else min(s.max_workers, limit) for s in spec.stages]


def oracle(spec: PipelineSpec, worker_limit: int | None = None) -> Allocation:
    """The best integer allocation within caps and memory; ties go to fewer workers.

    Workers may outnumber the cores (the model then scales every stage by cores / workers), so
    each uncapped stage is limited to ``worker_limit`` workers (default 8 x cores). Exact for the
    min-of-stages model: take an optimum w* and r = min_j w*_j / c_j (a candidate w / c_i); the
    least workers reaching r, ceil(r * c_j), are <= w* everywhere, so they reach at least r with
    no more workers and no more memory. The best of those candidate allocations is optimal.
    """
    costs = spec.row_costs_us()
    budget_mib = spec.memory_budget_gib * 1024 * (1 + 1e-12)
    caps = stage_limits(spec, worker_limit)
    candidates = sorted(
        {w / c for c, cap in zip(costs, caps, strict=True) for w in range(1, cap + 1)}
    )
    best: list[int] | None = None
    best_t = -1.0
    for ratio in candidates:  # ratio = rows per microsecond each stage must at least reach
        w = _least_workers(ratio, costs)
        if any(wi > cap for wi, cap in zip(w, caps, strict=True)):
            break  # least workers grow with the ratio: every later candidate is over a cap too
        if spec.memory_bytes(w) / MIB > budget_mib:
            break  # memory grows with the ratio as well
        t = spec.throughput(w)
        if best is None or t > best_t * (1 + 1e-9):
            best, best_t = w, t
    if best is None:
        raise ConfigError(
            f"{spec.name}: no allocation of >= 1 worker per stage fits the caps and "
            f"memory_budget_gib = {spec.memory_budget_gib:g}"
        )
    return Allocation(workers=tuple(best))
