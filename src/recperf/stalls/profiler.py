"""Direct instrumentation of a training loop: time spent waiting on the data iterator, each
step's phases, and every gradient all-reduce (through a DDP communication hook), written as a
Chrome trace per rank that ``analysis`` turns into a stall breakdown.

    prof = Profiler(ddp_model)
    for batch in prof.data(loader):
        with prof.step():
            loss = model(batch).sum(); loss.backward(); opt.step()
    prof.write_trace("trace_rank0.json")

On CUDA (NCCL) the all-reduce and step times come from CUDA events, resolved at the end of
each step; on the CPU (gloo) from the wall clock when the collective's future completes."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from recperf.core.results import atomic_path

T = TypeVar("T")
TRACE_FORMAT = "recperf-stall-trace/1"
ANNOTATION = "recperf:"
"""Prefix of the ranges the Profiler marks in torch.profiler traces."""


@dataclass(slots=True)
class IterRecord:
    """One iteration, all times in seconds on this process's ``perf_counter`` clock."""

    start: float
    """When the data iterator was asked for the batch."""
    data_end: float
    """When the batch arrived (= step start)."""
    end: float
    """When the step ended."""
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    """Named parts of the step (forward, backward, optimizer), as (name, start, end)."""
    comm: list[tuple[float, float, int]] = field(default_factory=list)
    """Each all-reduce bucket: (launched, completed, bytes)."""


class _CudaClock:
    """Converts CUDA events recorded during a step into perf_counter times at its end."""

    def __init__(self) -> None:
        self.ref = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self.ref_t = 0.0

    def start(self) -> None:
        torch.cuda.synchronize()
        self.ref_t = time.perf_counter()
        self.ref.record()

    def event(self) -> Any:
        ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        ev.record()
        return ev

    def time(self, ev: Any) -> float:
        return self.ref_t + float(self.ref.elapsed_time(ev)) / 1e3


class Profiler:
    """Wraps a data iterator and a training step; optionally registers a timing all-reduce
    hook on a ``DistributedDataParallel`` model (which replaces DDP's default hook and does
    the same averaging all-reduce)."""

    def __init__(
        self, model: nn.Module | None = None, *, cuda: bool | None = None, annotate: bool = False
    ) -> None:
        self.records: list[IterRecord] = []
        self.annotate = annotate
        """Also mark data waits, steps and phases as ``recperf:<name>`` ranges in torch.profiler
        traces (``analysis`` reads those too)."""
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self._clock = _CudaClock() if self.cuda else None
        self._data_t: tuple[float, float] | None = None
        self._phases: list[tuple[str, Any, Any]] = []
        self._comm: list[tuple[Any, Any, int]] = []
        self.hooked = False
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model.register_comm_hook(self, _timed_allreduce)
            self.hooked = True

    # -- wrapping the loop ----------------------------------------------------------------

    def data(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yield ``iterable``'s items, timing each ``next``."""
        it = iter(iterable)
        while True:
            t0 = time.perf_counter()
            try:
                with self._range("data_wait"):
                    item = next(it)
            except StopIteration:
                return
            self._data_t = (t0, time.perf_counter())
            yield item

    @contextmanager
    def step(self) -> Iterator[None]:
        """One training step; the batch it consumes is the one ``data`` yielded last."""
        t_data = self._data_t or (time.perf_counter(), time.perf_counter())
        self._data_t = None
        self._phases, self._comm = [], []
        if self._clock is not None:
            self._clock.start()
        t0 = time.perf_counter()
        with self._range("step"):
            yield
        if self._clock is not None:
            torch.cuda.synchronize()
        end = time.perf_counter()
        rec = IterRecord(start=t_data[0], data_end=max(t_data[1], t0), end=end)
        rec.phases = [(n, self._t(a), self._t(b)) for n, a, b in self._phases]
        rec.comm = sorted((self._t(a), self._t(b), n) for a, b, n in self._comm)
        self.records.append(rec)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A named part of the current step (e.g. forward, backward, optimizer)."""
        a = self._stamp()
        with self._range(name):
            yield
        self._phases.append((name, a, self._stamp()))

    def _range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        if self.annotate:
            return torch.profiler.record_function(f"{ANNOTATION}{name}")
        return contextlib.nullcontext()

    def _stamp(self) -> Any:
        return self._clock.event() if self._clock is not None else time.perf_counter()

    def _t(self, stamp: Any) -> float:
        if self._clock is not None and not isinstance(stamp, float):
            return self._clock.time(stamp)
        return float(stamp)

    # -- output ---------------------------------------------------------------------------

    def trace(self, rank: int = 0, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """The records as a Chrome trace (open it in Perfetto or chrome://tracing); times in
        microseconds from the first record, ``recperf`` holds what the analysis needs."""
        t0 = self.records[0].start if self.records else 0.0
        events: list[dict[str, Any]] = []

        def span(name: str, a: float, b: float, tid: int, **args: Any) -> None:
            events.append(
                {
                    "name": name,
                    "ph": "X",
                    "pid": rank,
                    "tid": tid,
                    "ts": (a - t0) * 1e6,
                    "dur": max(b - a, 0.0) * 1e6,
                    "args": args,
                }
            )

        for i, r in enumerate(self.records):
            span("data_wait", r.start, r.data_end, 0, iteration=i)
            span("step", r.data_end, r.end, 0, iteration=i)
            for name, a, b in r.phases:
                span(name, a, b, 1, iteration=i)
            for k, (a, b, n) in enumerate(r.comm):
                span("allreduce", a, b, 2, iteration=i, bucket=k, bytes=n)
        return {
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "recperf": {
                "format": TRACE_FORMAT,
                "rank": rank,
                "hooked": self.hooked,
                "clock": "cuda-events" if self.cuda else "wall",
                **(meta or {}),
            },
        }

    def write_trace(
        self, path: str | Path, rank: int = 0, meta: dict[str, Any] | None = None
    ) -> Path:
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(self.trace(rank, meta)))
        return Path(path)


def _timed_allreduce(state: Profiler, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    """DDP's default averaging all-reduce, with the launch and completion of each bucket noted."""
    tensor = bucket.buffer()
    start = state._stamp()
    tensor.div_(dist.get_world_size())
    work: Any = dist.all_reduce(tensor, async_op=True)
    fut = work.get_future()
    nbytes = tensor.numel() * tensor.element_size()

    def done(f: torch.futures.Future[Any]) -> torch.Tensor:
        state._comm.append((start, state._stamp(), nbytes))
        out: torch.Tensor = f.value()[0]
        return out

    chained: torch.futures.Future[torch.Tensor] = fut.then(done)
    return chained


# DDP compares the hook's annotations with the real types; postponed evaluation made them text.
_timed_allreduce.__annotations__.update(
    bucket=dist.GradBucket,  # type: ignore[attr-defined]
    state=Profiler,
    **{"return": torch.futures.Future[torch.Tensor]},
)
