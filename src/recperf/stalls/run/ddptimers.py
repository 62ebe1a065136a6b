"""DDP's own runtime timers as the Profiler's all-reduce clock, with no communication hook.

A DDP comm hook costs a training step about 1.4% here even when it is PyTorch's own C++
all-reduce (DDP then hands the hook unscaled gradients and every hook makes one more pass to
average them), which is above the Profiler's 1% aim. Without a hook DDP keeps its fused
path, and its C++ reducer already timestamps each iteration for its own runtime logging: the
first bucket's all-reduce launch, the end of the backward computation (when the last bucket
is launched), and the completion of every bucket's all-reduce (``finalize_backward``). With
the sampling rate set to 1 it does so every iteration; this module reads those stamps.

What it relies on in PyTorch (2.13; DDP's logger API is private and may move):
``DistributedDataParallel._set_ddp_runtime_logging_sample_rate``, ``ddp.logger``'s
``set_runtime_stats_and_log`` and ``_get_ddp_logging_data().ints_map`` with the keys in
``KEYS``, which on a CPU reducer are ``CLOCK_REALTIME`` nanoseconds (``time.time_ns``). On
CUDA the reducer times with CUDA events and gives durations only, so the Profiler keeps its
timing hook there.

What it gives up against the hook: one window per iteration, from the first launch to the
last completion, instead of one span per bucket. Exposed communication (from the last launch
to the last completion) is the same; the time the all-reduces were busy is bounded by the
window, which also holds any gaps between buckets."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from torch import nn

KEYS = ("backward_comm_time_start", "backward_compute_time_end", "backward_comm_time_end",
        "num_buckets_reduced")  # fmt: skip
"""The reducer's logging fields read each iteration."""


@dataclass(frozen=True, slots=True)
class CommWindow:
    """One iteration's gradient all-reduces as DDP's reducer timed them, in seconds on the
    Profiler's ``perf_counter`` clock."""

    start: float
    """The first bucket's all-reduce launched."""
    last_launch: float
    """The backward computation ended, so the last bucket was launched."""
    end: float
    """Every bucket's all-reduce completed."""
    nbytes: int
    """Gradient bytes reduced (every parameter that takes a gradient)."""
    buckets: int
    """Buckets reduced."""


class DdpTimers:
    """Reads a DDP model's reducer timers once per step; holds the model weakly (the model,
    and its reducer, must go before the process group they use)."""

    def __init__(self, ddp: nn.parallel.DistributedDataParallel, anchor: tuple[int, float]) -> None:
        if any(p.is_cuda for p in ddp.parameters()):
            raise ValueError("comm='ddp-timers': DDP times CUDA models with CUDA events, which "
                             "give durations only; use comm='hook'")  # fmt: skip
        ddp._set_ddp_runtime_logging_sample_rate(1)  # type: ignore[no-untyped-call]
        self._ddp = weakref.ref(ddp)
        self._anchor_ns, self._anchor_s = anchor
        self.nbytes = sum(p.numel() * p.element_size() for p in ddp.parameters() if p.requires_grad)
        self._last_end = 0

    def latest(self) -> CommWindow | None:
        """The window of the iteration whose backward ended last, once (None if the reducer has
        measured nothing new since the last call, e.g. a step without a backward)."""
        ddp: Any = self._ddp()
        if ddp is None:
            return None
        logger = ddp.logger
        logger.set_runtime_stats_and_log()
        ints = logger._get_ddp_logging_data().ints_map
        start, last, end, buckets = (int(ints.get(k, 0)) for k in KEYS)
        if not (0 < start <= end) or end == self._last_end:
            return None
        self._last_end = end
        return CommWindow(start=self._s(start), last_launch=self._s(max(start, min(last, end))),
                          end=self._s(end), nbytes=self.nbytes, buckets=buckets)  # fmt: skip

    def _s(self, ns: int) -> float:
        return self._anchor_s + (ns - self._anchor_ns) / 1e9
