"""Placement policies: which free GPUs a job gets (consolidated best-fit, first-fit, random)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from recperf.cluster.base import I64, PLACEMENTS, Allocation
from recperf.cluster.topology import Cluster, Level


def _take(order: I64, free: I64, gpus: int, cluster: Cluster) -> Allocation | None:
    """Fill ``gpus`` from machines in ``order``, taking all free GPUs of each before the next."""
    machines: list[int] = []
    counts: list[int] = []
    need = gpus
    for m in order.tolist():
        f = int(free[m])
        if f <= 0:
            continue
        take = min(f, need)
        machines.append(m)
        counts.append(take)
        need -= take
        if need == 0:
            return Allocation.of(machines, counts, cluster)
    return None


def _within(alloc: Allocation | None, max_level: Level) -> Allocation | None:
    return alloc if alloc is not None and alloc.level <= max_level else None


@PLACEMENTS.register("best-fit")
class BestFit:
    """Consolidate: the fullest machine that fits; else the fullest rack that fits, its emptiest
    machines first (fewest machines); else racks and machines with the most free GPUs first."""

    name: ClassVar[str] = "best-fit"

    def place(
        self, gpus: int, free: I64, cluster: Cluster, max_level: Level, rng: np.random.Generator
    ) -> Allocation | None:
        if gpus <= cluster.gpus_per_machine:
            fits = np.flatnonzero(free >= gpus)
            if fits.size:
                m = int(fits[np.argmin(free[fits])])
                return _within(Allocation.of([m], [gpus], cluster), max_level)
        if max_level <= Level.MACHINE:
            return None
        mpr = cluster.machines_per_rack
        rack_free = cluster.rack_free(free)
        fits = np.flatnonzero(rack_free >= gpus)
        if fits.size:
            r = int(fits[np.argmin(rack_free[fits])])
            local = free[r * mpr : (r + 1) * mpr]
            order = r * mpr + np.argsort(-local, kind="stable")
            return _within(_take(order, free, gpus, cluster), max_level)
        if max_level <= Level.RACK or int(free.sum()) < gpus:
            return None
        rack_rank = np.argsort(-rack_free, kind="stable")
        key = np.empty(cluster.machines, dtype=np.int64)
        rank_of_rack = np.empty(cluster.racks, dtype=np.int64)
        rank_of_rack[rack_rank] = np.arange(cluster.racks)
        key[:] = rank_of_rack[np.arange(cluster.machines) // mpr] * (cluster.gpus_per_machine + 1)
        key -= free
        return _within(_take(np.argsort(key, kind="stable"), free, gpus, cluster), max_level)


def _groups(gpus: int, free: I64, cluster: Cluster, max_level: Level) -> list[I64]:
    """The sets of machines a job may be spread over within ``max_level`` that have room."""
    if max_level >= Level.CLUSTER:
        return [np.arange(cluster.machines)] if int(free.sum()) >= gpus else []
    if max_level == Level.GPU and gpus > 1:
        return []
    if max_level <= Level.MACHINE:
        return [np.array([m]) for m in np.flatnonzero(free >= gpus).tolist()]
    mpr = cluster.machines_per_rack
    rack_free = cluster.rack_free(free)
    return [np.arange(r * mpr, (r + 1) * mpr) for r in np.flatnonzero(rack_free >= gpus).tolist()]


@PLACEMENTS.register("first-fit")
class FirstFit:
    """The lowest-numbered machines (within the first rack or machine with room, when the level
    is bounded), filling each before the next: no locality search."""

    name: ClassVar[str] = "first-fit"

    def place(
        self, gpus: int, free: I64, cluster: Cluster, max_level: Level, rng: np.random.Generator
    ) -> Allocation | None:
        groups = _groups(gpus, free, cluster, max_level)
        return _take(groups[0], free, gpus, cluster) if groups else None


@PLACEMENTS.register("random")
class RandomSpread:
    """Random machines with free GPUs, one GPU from each in turn (spreads jobs widely); within a
    random rack or machine with room when the level is bounded."""

    name: ClassVar[str] = "random"

    def place(
        self, gpus: int, free: I64, cluster: Cluster, max_level: Level, rng: np.random.Generator
    ) -> Allocation | None:
        groups = _groups(gpus, free, cluster, max_level)
        if not groups:
            return None
        group = groups[int(rng.integers(len(groups)))]
        candidates = group[free[group] > 0]
        perm = candidates[rng.permutation(candidates.size)]
        taken = np.zeros(cluster.machines, dtype=np.int64)
        need = gpus
        while need:
            for m in perm.tolist():
                if taken[m] < free[m]:
                    taken[m] += 1
                    need -= 1
                    if need == 0:
                        break
        used = [m for m in perm.tolist() if taken[m]]
        return Allocation.of(used, [int(taken[m]) for m in used], cluster)
