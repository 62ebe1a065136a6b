"""Direct instrumentation of a training loop: time spent waiting on the data iterator, each
step's phases, and the gradient all-reduces of a DDP model, written per rank as a Kineto-shaped
Chrome trace (Perfetto, chrome://tracing and Holistic Trace Analysis open it) that
``differential`` turns into a stall breakdown.

    prof = Profiler(ddp_model)
    for batch in prof.data(loader):
        with prof.step():
            loss = model(batch).sum(); loss.backward(); opt.step()
    prof.write_trace("trace_rank0.json")

The all-reduces are timed one of two ways (``comm=``): ``"ddp-timers"`` reads the timestamps
DDP's own reducer takes (``run.ddptimers``: no hook, DDP's gradients and fused averaging
untouched; one window per iteration), the default on the CPU; ``"hook"`` registers a timing
communication hook (one span per bucket, at the cost of any DDP hook), the default on CUDA,
where the all-reduce and step times come from CUDA events resolved at the end of each step."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from recperf.core.results import atomic_path
from recperf.stalls.run.ddptimers import CommWindow, DdpTimers

T = TypeVar("T")
TRACE_FORMAT = "recperf-stall-trace/3"
TRACE_FORMATS = ("recperf-stall-trace/1", "recperf-stall-trace/2", TRACE_FORMAT)
"""Formats ``differential`` reads: /1 had bare event names on three fixed threads; /2 had one
all-reduce span per bucket only (/3 adds the per-iteration window with ``args.last_launch``)."""
COMM_TIMINGS = ("auto", "ddp-timers", "hook")
"""How a DDP model's all-reduces are timed: ``auto`` is ``hook`` on CUDA, else ``ddp-timers``."""
ANNOTATION = "recperf:"
"""Prefix of the ranges the Profiler marks in its own traces and in torch.profiler traces."""
MAIN_TID = 1
"""Thread id of the loop's spans; all-reduce lanes follow from ``MAIN_TID + 1``."""
_TICKS = 1024
"""Trace times are whole multiples of 1/1024 us: exact in binary floating point, so a span's
``ts + dur`` equals the end it was cut from and nested spans stay nested for every reader."""


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
    """Each all-reduce bucket: (launched, completed, bytes) (the timing hook)."""
    window: CommWindow | None = None
    """The iteration's all-reduces as DDP's reducer timed them (``comm="ddp-timers"``)."""


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
    """Wraps a data iterator and a training step, and times a ``DistributedDataParallel``
    model's all-reduces: from DDP's own reducer timers, or with a timing hook that replaces
    DDP's default and does the same averaging all-reduce (``comm``, see ``COMM_TIMINGS``)."""

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        cuda: bool | None = None,
        annotate: bool = False,
        comm: str = "auto",
    ) -> None:
        if comm not in COMM_TIMINGS:
            raise ValueError(f"comm: {comm!r} is not one of {', '.join(COMM_TIMINGS)}")
        self.records: list[IterRecord] = []
        self.annotate = annotate
        """Also mark data waits, steps and phases as ``recperf:<name>`` ranges in torch.profiler
        traces (the Kineto reader, ``trace.kineto``, reads those too)."""
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self._clock = _CudaClock() if self.cuda else None
        self._data_t: tuple[float, float] | None = None
        self._phases: list[tuple[str, Any, Any]] = []
        self._comm: list[tuple[Any, Any, int]] = []
        self._anchor = (time.time_ns(), time.perf_counter())
        ddp = model if isinstance(model, nn.parallel.DistributedDataParallel) else None
        self._pg: Any = ddp.process_group if ddp is not None else None
        self.world_size = _world_size(self._pg)
        """The trace's ``distributedInfo.world_size``: the model's process group's, else the
        default group's, else 1."""
        self._scale = 1.0 / self.world_size
        if comm == "auto":
            comm = "hook" if self.cuda else "ddp-timers"
        self.comm_timing = comm if ddp is not None else None
        """How the all-reduces are timed (None: no DDP model given)."""
        self.hooked = self.comm_timing == "hook"
        self._timers = DdpTimers(ddp, self._anchor) if ddp is not None and not self.hooked else None
        if ddp is not None and self.hooked:
            ddp.register_comm_hook(self, _timed_allreduce)

    # -- wrapping the loop (on every iteration's path: plain classes, no generator managers) --

    def data(self, iterable: Iterable[T]) -> Iterator[T]:
        """Yield ``iterable``'s items, timing each ``next``."""
        it = iter(iterable)
        while True:
            t0 = time.perf_counter()
            try:
                if self.annotate:
                    with torch.profiler.record_function(f"{ANNOTATION}data_wait"):
                        item = next(it)
                else:
                    item = next(it)
            except StopIteration:
                return
            self._data_t = (t0, time.perf_counter())
            yield item

    def step(self) -> contextlib.AbstractContextManager[None]:
        """One training step; the batch it consumes is the one ``data`` yielded last."""
        return _Step(self)

    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A named part of the current step (e.g. forward, backward, optimizer)."""
        return _Phase(self, name)

    def _range(self, name: str) -> Any:
        """A ``recperf:<name>`` torch.profiler range, entered, when annotating."""
        if not self.annotate:
            return None
        rf = torch.profiler.record_function(f"{ANNOTATION}{name}")
        rf.__enter__()  # type: ignore[no-untyped-call]
        return rf

    def _record(self, t_data: tuple[float, float], t0: float) -> None:
        if self._clock is not None:
            torch.cuda.synchronize()
        end = time.perf_counter()
        rec = IterRecord(start=t_data[0], data_end=max(t_data[1], t0), end=end)
        rec.phases = [(n, self._t(a), self._t(b)) for n, a, b in self._phases]
        rec.comm = sorted((self._t(a), self._t(b), n) for a, b, n in self._comm)
        if self._timers is not None:
            rec.window = self._timers.latest()
        self.records.append(rec)

    def _stamp(self) -> Any:
        return self._clock.event() if self._clock is not None else time.perf_counter()

    def _t(self, stamp: Any) -> float:
        if self._clock is not None and not isinstance(stamp, float):
            return self._clock.time(stamp)
        return float(stamp)

    # -- output ---------------------------------------------------------------------------

    def trace(
        self,
        rank: int = 0,
        meta: dict[str, Any] | None = None,
        *,
        world_size: int | None = None,
        backend: str | None = None,
    ) -> dict[str, Any]:
        """The records as a Kineto-shaped Chrome trace: ``distributedInfo``, one
        ``ProfilerStep#N`` per iteration holding ``recperf:data_wait`` then ``recperf:step``
        (holding the phases) on the main thread, each all-reduce bucket as ``recperf:allreduce``
        on a lane thread of its own. Times in microseconds from the first record (wall-clock
        ``recperf.t0_unix_ns``, to line ranks up); ``recperf`` holds what the analysis needs.
        ``world_size`` and ``backend`` default to the process group's (gloo on the CPU, nccl on
        CUDA)."""
        t0 = self.records[0].start if self.records else 0.0
        wall0 = self._anchor[0] + round((t0 - self._anchor[1]) * 1e9)
        return {
            "schemaVersion": 1,
            "distributedInfo": {
                "backend": backend or ("nccl" if self.cuda else "gloo"),
                "rank": rank,
                "world_size": self.world_size if world_size is None else world_size,
            },
            "deviceProperties": [],
            "displayTimeUnit": "ms",
            "traceEvents": kineto_events(self.records, rank, t0),
            "recperf": {
                "format": TRACE_FORMAT,
                "rank": rank,
                "hooked": self.hooked,
                "comm_timing": self.comm_timing,
                "clock": "cuda-events" if self.cuda else "wall",
                "t0_unix_ns": wall0,
                **(meta or {}),
            },
        }

    def write_trace(
        self,
        path: str | Path,
        rank: int = 0,
        meta: dict[str, Any] | None = None,
        *,
        world_size: int | None = None,
        backend: str | None = None,
    ) -> Path:
        """``trace`` written atomically to ``path`` (default separators: ``"rank": 0`` with
        the space HTA's rank pattern expects)."""
        trace = self.trace(rank, meta, world_size=world_size, backend=backend)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(trace))
        return Path(path)


class _Step:
    __slots__ = ("prof", "range", "t0", "t_data")

    def __init__(self, prof: Profiler) -> None:
        self.prof = prof

    def __enter__(self) -> None:
        p = self.prof
        now = time.perf_counter()
        self.t_data = p._data_t or (now, now)
        p._data_t = None
        p._phases, p._comm = [], []
        if p._clock is not None:
            p._clock.start()
        self.t0 = time.perf_counter()
        self.range = p._range("step")

    def __exit__(self, *exc: object) -> None:
        if self.range is not None:
            self.range.__exit__(*exc)
        if exc[0] is None:  # a failed step is not an iteration
            self.prof._record(self.t_data, self.t0)


class _Phase:
    __slots__ = ("a", "name", "prof", "range")

    def __init__(self, prof: Profiler, name: str) -> None:
        self.prof, self.name = prof, name

    def __enter__(self) -> None:
        self.a = self.prof._stamp()
        self.range = self.prof._range(self.name)

    def __exit__(self, *exc: object) -> None:
        if self.range is not None:
            self.range.__exit__(*exc)
        if exc[0] is None:
            self.prof._phases.append((self.name, self.a, self.prof._stamp()))


def _world_size(pg: Any) -> int:
    if pg is not None:
        return int(pg.size())
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def kineto_events(records: list[IterRecord], rank: int, t0: float) -> list[dict[str, Any]]:
    """Trace events of ``records``: thread and process names first, then per iteration its
    spans clamped into their parents (CUDA-event times can stray by microseconds), and the
    buckets first-fit onto comm lanes so that spans on one thread never partly overlap."""
    events: list[dict[str, Any]] = []
    lane_end: list[int] = []  # per comm lane, the end of its last span

    def tick(t: float) -> int:
        return round((t - t0) * 1e6 * _TICKS)

    def span(name: str, a: int, b: int, tid: int, i: int, **args: Any) -> None:
        events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": rank,
                       "tid": tid, "ts": a / _TICKS, "dur": (b - a) / _TICKS,
                       "args": {"iteration": i, **args}})  # fmt: skip

    for i, r in enumerate(records):
        s = tick(r.start)
        d = max(s, tick(r.data_end))
        e = max(d, tick(r.end))
        span(f"ProfilerStep#{i}", s, e, MAIN_TID, i)
        span(f"{ANNOTATION}data_wait", s, d, MAIN_TID, i)
        span(f"{ANNOTATION}step", d, e, MAIN_TID, i)
        prev = d
        for name, a, b in sorted(r.phases, key=lambda ph: ph[1]):
            pa = min(max(tick(a), prev), e)
            prev = min(max(tick(b), pa), e)
            span(f"{ANNOTATION}{name}", pa, prev, MAIN_TID, i)
        for ca, b, args in _comm_spans(r, tick):
            cb = max(ca, b)
            lane = next((j for j, end in enumerate(lane_end) if end <= ca), len(lane_end))
            if lane == len(lane_end):
                lane_end.append(cb)
            lane_end[lane] = cb
            span(f"{ANNOTATION}allreduce", ca, cb, MAIN_TID + 1 + lane, i, **args)
    names = [(MAIN_TID, "main")] + [
        (MAIN_TID + 1 + j, f"allreduce {j}") for j in range(len(lane_end))
    ]
    meta = [_meta("process_name", rank, 0, name=f"rank {rank}"),
            _meta("process_sort_index", rank, 0, sort_index=rank)]  # fmt: skip
    for tid, name in names:
        meta.append(_meta("thread_name", rank, tid, name=name))
        meta.append(_meta("thread_sort_index", rank, tid, sort_index=tid))
    return meta + events


def _comm_spans(r: IterRecord, tick: Callable[[float], int]) -> list[tuple[int, int, Any]]:
    """An iteration's all-reduce spans in ticks with their args: each bucket the hook timed,
    or the window DDP's timers give (its last launch in microseconds, as ``ts``)."""
    spans: list[tuple[int, int, Any]] = [
        (tick(a), tick(b), {"bytes": n, "bucket": k}) for k, (a, b, n) in enumerate(r.comm)
    ]
    if (w := r.window) is not None:
        last_us = tick(w.last_launch) / _TICKS
        args = {"bytes": w.nbytes, "buckets": w.buckets, "last_launch": last_us}
        spans.append((tick(w.start), tick(w.end), args))
    return spans


def _meta(kind: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "ts": 0, "args": args}


def _timed_allreduce(state: Profiler, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    """DDP's averaging all-reduce, with each bucket's launch and completion noted.

    Kept lean, being on the backward pass. The mean is taken as DDP's hook-less path takes it,
    by multiplying with 1 / world size (``div_`` is slower; exact alike for powers of two);
    DDP fuses that into its copy into the bucket but hands a comm hook the bucket unscaled, so
    this is one pass over the gradients, the bulk of the hook's cost; it is timed as compute
    (the launch is noted after it), as in DDP's own path. The collective goes to the
    model's process group directly, as DDP's own C++ path does (skipping ``dist.all_reduce``'s
    Python checks). DDP takes only a Python future from a Python hook, so the completion is a
    chained callback: it notes the time on the collective's thread as the result is handed on.
    """
    tensor = bucket.buffer()
    if state._scale != 1.0:
        tensor.mul_(state._scale)
    start = state._stamp()  # after the scaling, which DDP's own path does in its copy: compute
    fut = state._pg.allreduce([tensor]).get_future()
    comm, stamp, nbytes = state._comm, state._stamp, tensor.nbytes

    def done(f: torch.futures.Future[Any]) -> torch.Tensor:
        comm.append((start, stamp(), nbytes))
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
