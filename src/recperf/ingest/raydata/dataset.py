"""The live pipeline's batches from Ray Data, as a plain iterator: the same ``Batch``es (torch
tensors, ``Batch.kjt()``) as the native engine's, every row of an epoch exactly once.

    for batch in ray_batches("data/criteo", PipelineConfig(batch_size=4096)):
        loss = model(batch.dense, batch.kjt(), batch.labels)

Ray is started here (or joined: ``ClusterSpec(address=...)``) and shut down when the iterator
is exhausted, closed, garbage-collected or fails; a runtime passed in is left open (tests and
tuners share one). Allocations: ``fused`` (one operator of every stage, a worker per logical
CPU), ``even`` (every stage its own operator, the CPUs dealt round-robin) or an ``Allocation``
(each segment an actor pool of its workers)."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, AllocationRefused, even_split, fused
from recperf.ingest.live.batch import Batch, PipelineConfig
from recperf.ingest.live.dispatch import MIB
from recperf.ingest.raydata.criteo import PREFETCH_BLOCKS, CriteoPipeline
from recperf.ingest.raydata.engine import OperatorPlan, build_dataset
from recperf.ingest.raydata.meter import start_meter
from recperf.ingest.raydata.runtime import ClusterSpec, RayRuntime

DRAIN_S = 1.0
"""How often the driver empties the meter (nobody reads a plain iterator's records)."""


@dataclass(slots=True, frozen=True)
class _Shape:
    """A CriteoPipeline on ``cores`` logical CPUs, as the fused and even splits see a target."""

    pipe: CriteoPipeline
    cores: int

    @property
    def stage_names(self) -> tuple[str, ...]:
        return self.pipe.stage_names

    @property
    def max_workers(self) -> tuple[int | None, ...]:
        return self.pipe.max_workers

    @property
    def memory_budget_bytes(self) -> float:
        return self.pipe.memory_budget_bytes

    def memory_bytes(self, alloc: Allocation) -> float:
        return self.pipe.memory_bytes(alloc.workers, alloc.segments(len(self.stage_names)))


def resolve(pipe: CriteoPipeline, allocation: Allocation | str, cpus: int) -> Allocation:
    """``fused``, ``even`` or an Allocation, checked: single-threaded workers (a Ray actor runs
    one block at a time), at least one per segment, within the memory budget."""
    shape = _Shape(pipe, cpus)
    n = len(pipe.stage_names)
    if isinstance(allocation, str):
        if allocation not in ("fused", "even"):
            raise ConfigError(f"allocation = {allocation!r}: the Ray engine takes fused, even "
                              "or an Allocation")  # fmt: skip
        return fused(shape) if allocation == "fused" else even_split(shape)
    alloc = allocation.normalized(n)
    if any(t != 1 for t in alloc.segment_threads()):
        raise ConfigError(f"allocation {alloc.label(pipe.stage_names)}: the Ray engine runs "
                          "single-threaded actors (threads 1)")  # fmt: skip
    if min(alloc.workers) < 1:
        raise AllocationRefused(f"allocation {alloc.label(pipe.stage_names)}: every segment "
                                "needs a worker")  # fmt: skip
    need = shape.memory_bytes(alloc)
    if need > pipe.memory_budget_bytes:
        raise AllocationRefused(
            f"allocation {alloc.label(pipe.stage_names)} needs {need / MIB:,.0f} MiB (workers "
            f"+ blocks), over memory_budget_gib = {pipe.config.memory_budget_gib:g}"
        )
    return alloc


def operator_plans(pipe: CriteoPipeline, alloc: Allocation, cpus_total: int) -> list[OperatorPlan]:
    """One actor pool of the allocation's workers per segment."""
    segs = alloc.segments(len(pipe.stage_names))
    works = pipe.works(segs)
    cpus = min(1.0, cpus_total / alloc.total)  # more workers than CPUs share them
    return [OperatorPlan(work=w, workers=n, cap=n, cpus=cpus)
            for w, n in zip(works, alloc.workers, strict=True)]  # fmt: skip


def ray_batches(
    data: str | Path,
    config: PipelineConfig | None = None,
    allocation: Allocation | str = "fused",
    *,
    cluster: ClusterSpec | None = None,
    runtime: RayRuntime | None = None,
    repeat_epochs: int = 1,
) -> Iterator[Batch]:
    """The batches of ``data`` through Ray Data (see the module docstring). The data and the
    allocation's name are checked before Ray starts; ``repeat_epochs`` is the epochs a
    ``config.epochs = None`` pipeline runs."""
    if isinstance(allocation, str) and allocation not in ("fused", "even"):
        raise ConfigError(f"allocation = {allocation!r}: the Ray engine takes fused, even or "
                          "an Allocation")  # fmt: skip
    ready: deque[Batch] = deque()
    pipe = CriteoPipeline(data, config or PipelineConfig(), repeat_epochs=repeat_epochs,
                          on_batch=ready.append)  # fmt: skip
    inflight = allocation.inflight if isinstance(allocation, Allocation) else 0
    if inflight:
        pipe.read_concurrency = inflight
    return _stream(pipe, allocation, ready, cluster, runtime)


def _stream(
    pipe: CriteoPipeline,
    allocation: Allocation | str,
    ready: deque[Batch],
    cluster: ClusterSpec | None,
    runtime: RayRuntime | None,
) -> Iterator[Batch]:
    with contextlib.ExitStack() as stack:
        rt = runtime
        if rt is None:
            rt = stack.enter_context(RayRuntime(cluster or ClusterSpec()))
        alloc = resolve(pipe, allocation, rt.cpus)
        meter = start_meter(rt.ray)
        stack.callback(_kill, rt.ray, meter)
        ds = build_dataset(
            rt.ray, pipe.items(), operator_plans(pipe, alloc, rt.cpus), meter, rt.node_ids
        )
        it = iter(ds.iter_batches(batch_size=None, batch_format="numpy",
                                  prefetch_batches=PREFETCH_BLOCKS))  # fmt: skip
        stack.callback(_close, it)
        drained = time.monotonic()
        for block in it:
            pipe.consume(block)
            while ready:
                yield ready.popleft()
            if time.monotonic() - drained >= DRAIN_S:
                meter.drain.remote()  # records dropped in the actor: nothing waits on them
                drained = time.monotonic()


def _close(it: Any) -> None:
    """Stop Ray Data's execution (its operators and their actors go)."""
    close = getattr(it, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            close()


def _kill(ray: Any, actor: Any) -> None:
    with contextlib.suppress(Exception):
        ray.kill(actor)
