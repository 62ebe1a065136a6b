"""A chain of segments as a Ray Data dataset, and the driver's side of streaming it.

Each segment is one ``map_batches`` operator over whole blocks (``batch_size=None``) run by an
actor pool of a fixed size; with ``workers=None`` Ray Data's own autoscaling decides (an actor
pool of 1..cap actors), as a user who leaves it to Ray writes it. Actors, not tasks: on a small
machine Ray's per-task scheduling dominates (two task pools of 8 and 7 sleeping 0.19-s blocks
ran 8.6 blocks/s of the 36.8 possible; actor pools 31.6), and an actor keeps its segment's
state (readers, buffers) without a per-process cache. Every operator is given a
``ray_remote_args_fn`` (which places its workers on the nodes a placement names), and Ray Data
never fuses an operator that has one, so the cuts of the allocation are the operator
boundaries. The source is one single-row block per work item (``from_items``), held by the
driver: no read task of Ray's own runs before the first segment."""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from recperf.ingest.raydata.meter import Reporter
from recperf.ingest.raydata.work import Block, SegmentFn, SegmentWork

ITEM = "item"
"""The source blocks' one column: the work item's index (the first segment maps it to data)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class OperatorPlan:
    """How one segment runs on Ray."""

    work: SegmentWork
    workers: int | None
    """Pool size; None: Ray Data's autoscaling decides (up to ``cap``)."""
    cap: int
    """Most workers Ray Data may start when it decides (the stage's max_workers or the CPUs)."""
    nodes: tuple[int, ...] | None = None
    """Workers per node (indices into the runtime's ``node_ids``); None: wherever Ray puts them."""
    memory_bytes: float = 0.0
    """Memory each worker reserves (Ray's logical ``memory`` resource); 0: none."""
    cpus: float = 1.0
    """Logical CPUs each worker holds (a fraction where more workers than CPUs time-share)."""

    @property
    def name(self) -> str:
        return "+".join(self.work.stages)


class _OpActor:
    """An actor pool's worker: the segment opened once, after the work's slow start."""

    def __init__(self, work: SegmentWork, op: int, meter: Any) -> None:
        time.sleep(work.start_s)
        self.fn = work.open()
        self.reporter = Reporter(meter, op)

    def __call__(self, block: Block) -> Block:
        return _run(self.fn, self.reporter, block)


def _run(fn: SegmentFn, reporter: Reporter, block: Block) -> Block:
    t0 = time.time()
    out, times = fn(block)
    reporter.record(t0, time.time(), times.rows_out, times)
    return out


def _remote_args_fn(
    nodes: tuple[int, ...] | None, node_ids: Sequence[str]
) -> Callable[[], dict[str, Any]]:
    """Ray remote args for each new task or actor: none, or node affinity cycling through the
    placement (node i named ``nodes[i]`` times per round)."""
    if nodes is None or len(node_ids) < 2:
        return dict
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    order = [node_ids[i] for i, k in enumerate(nodes) for _ in range(k)]
    ring = itertools.cycle(order)

    def args() -> dict[str, Any]:
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(next(ring), soft=False)}

    return args


def build_dataset(
    ray: Any, items: int, ops: Sequence[OperatorPlan], meter: Any, node_ids: Sequence[str]
) -> Any:
    """The dataset of ``items`` work items through ``ops``, every worker reporting to ``meter``."""
    ds = ray.data.from_items([{ITEM: i} for i in range(items)], override_num_blocks=items)
    for j, op in enumerate(ops):
        kw: dict[str, Any] = {
            "batch_size": None,
            "batch_format": "numpy",
            "zero_copy_batch": True,
            "num_cpus": op.cpus,
            "ray_remote_args_fn": _remote_args_fn(op.nodes, node_ids),
        }
        if op.memory_bytes > 0:
            kw["memory"] = op.memory_bytes
        pool = (
            ray.data.ActorPoolStrategy(min_size=1, max_size=op.cap)
            if op.workers is None
            else ray.data.ActorPoolStrategy(size=op.workers)
        )
        with warnings.catch_warnings():  # deprecated for Ray 2.64; the version is pinned
            warnings.filterwarnings("ignore", message=".*ray_remote_args_fn.*")
            ds = ds.map_batches(_OpActor, fn_constructor_args=(op.work, j, meter),
                                compute=pool, **kw)  # fmt: skip
    return ds


class Stream:
    """The driver iterating a dataset: ``pull`` consumes blocks until a deadline, each through
    ``consume`` (the trainer's side: it returns the rows it took), stamping rows and times."""

    def __init__(self, ds: Any, consume: Callable[[Block], int]) -> None:
        self._it: Iterator[Block] | None = iter(
            ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=2)
        )
        self._consume = consume
        self.arrivals: list[tuple[float, int]] = []
        """(wall time, rows) of every block the consumer took."""
        self.first_s: float | None = None
        self.started = time.time()
        self.exhausted = False

    def pull(self, until: float) -> None:
        """Consume blocks until wall clock ``until`` or the end of the dataset."""
        while self._it is not None and time.time() < until:
            try:
                block = next(self._it)
            except StopIteration:
                self.exhausted = True
                self.close()
                return
            rows = self._consume(block)
            now = time.time()
            if self.first_s is None:
                self.first_s = now - self.started
            self.arrivals.append((now, rows))

    @property
    def closed(self) -> bool:
        """Stopped: by ``close`` or at the dataset's end."""
        return self._it is None

    def rows_between(self, a: float, b: float) -> int:
        return sum(r for t, r in self.arrivals if a <= t < b)

    def close(self) -> None:
        """Stop the execution (Ray Data shuts its operators and their actors down)."""
        it, self._it = self._it, None
        if it is not None and hasattr(it, "close"):
            it.close()
