"""The share of each stage's time that holds the GIL, estimated from what a measurement window
saw of the threads running it (per-thread CPU against wall time).

The model treats the GIL as one resource per process: each of the N threads busy on a segment
needs it for a fraction g of its CPU time, and when the threads contend, the GIL is the
bottleneck, so N * g * cpu / wall = 1 (the threads' GIL time fills the wall clock). Hence, per
segment run by workers of N >= 2 threads (a process of T >= 2 threads, or W >= 2 threads of the
consumer's process),

    g = 1 / (N_busy * cpu / wall), clipped to [0, 1],

with N_busy = the segment's busy wall / (processes * window) (the average busy threads of one
of its processes) and cpu / wall over the segment's stages (storage waits are not in the wall,
nor the time a runnable thread waited for a CPU, so other load on the machine does not pass for
GIL contention; with no contention at all the estimate is 1 / N_busy, its upper bound).
The segment's GIL time g * cpu is shared among its stages by their share of (wall - cpu), the
time their threads spent runnable but not running (waiting for the GIL shows there), and each
stage's fraction is its GIL time over its CPU. A stage run by single-threaded workers only, or
whose threads were not on average more than one busy, gives NaN: nothing was measured."""

from __future__ import annotations

import math
from collections.abc import Sequence


def gil_fractions(
    segments: Sequence[tuple[int, int]],
    workers: Sequence[int],
    threads: Sequence[int],
    cpu_s: Sequence[float],
    wall_s: Sequence[float],
    busy_s: Sequence[float],
    window_s: float,
) -> tuple[float, ...]:
    """Each stage's GIL fraction (0..1, NaN where unmeasured); ``busy_s`` per stage is its
    segment's busy wall (the tasks' wall, summed over its threads), the rest per stage."""
    out = [math.nan] * len(cpu_s)
    for (a, b), w, t in zip(segments, workers, threads, strict=True):
        per_process = t if t else w  # T = 0: the W threads share the consumer's process
        processes = w if t else 1
        if per_process < 2 or window_s <= 0:
            continue
        n_busy = busy_s[a] / (processes * window_s)
        cpu, wall = sum(cpu_s[a:b]), sum(wall_s[a:b])
        if n_busy <= 1.0 or cpu <= 0 or wall <= 0:
            continue
        g = min(1.0, max(0.0, wall / (n_busy * cpu)))
        waits = [max(0.0, wall_s[i] - cpu_s[i]) for i in range(a, b)]
        total = sum(waits)
        for i, wait in zip(range(a, b), waits, strict=True):
            if cpu_s[i] <= 0:
                continue
            share = wait / total if total > 0 else cpu_s[i] / cpu
            out[i] = min(1.0, max(0.0, g * cpu * share / cpu_s[i]))
    return tuple(out)
