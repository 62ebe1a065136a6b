"""Interval arithmetic on sorted, disjoint (merged) lists of (start, end) seconds: union,
length, intersection, difference, clipping and complement; what the stall figures are made of."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

Interval = tuple[float, float]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint union of ``intervals``."""
    out: list[Interval] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def length(merged: Sequence[Interval]) -> float:
    """Total length of a merged list."""
    return sum((b - a for a, b in merged), 0.0)


def overlap(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Length of the intersection of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """The merged list ``a`` less the merged list ``b``."""
    out, j = [], 0
    for lo, hi in a:
        while j < len(b) and b[j][1] <= lo:
            j += 1
        k, t = j, lo
        while k < len(b) and b[k][0] < hi:
            if b[k][0] > t:
                out.append((t, b[k][0]))
            t = max(t, b[k][1])
            k += 1
        if t < hi:
            out.append((t, hi))
    return out


def clip(merged: Sequence[Interval], lo: float, hi: float) -> list[Interval]:
    """The part of a merged list inside [lo, hi] (found by bisection: ends are sorted too)."""
    i = bisect.bisect_right(merged, (lo, math.inf))
    i = i - 1 if i and merged[i - 1][1] > lo else i
    out = []
    while i < len(merged) and merged[i][0] < hi:
        a, b = merged[i]
        if b > lo:
            out.append((max(a, lo), min(b, hi)))
        i += 1
    return out


def complement(merged: Sequence[Interval], lo: float, hi: float) -> list[Interval]:
    """The parts of [lo, hi] that the merged list does not cover."""
    out, t = [], lo
    for a, b in merged:
        if a > t:
            out.append((t, a))
        t = max(t, b)
    if hi > t:
        out.append((t, hi))
    return out
