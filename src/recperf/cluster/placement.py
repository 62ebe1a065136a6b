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


def _within(alloc: Allocation | None, max_level: int) -> Allocation | None:
    return alloc if alloc is not None and alloc.level <= max_level else None


def _most_free_first(free: I64, cluster: Cluster, level: int, machines: slice) -> I64:
    """The machines of one group at ``level`` in fill order: under the most free switch of
    each tier below the level first (top tier first), the most free machine first, ties by
    number."""
    tree = cluster.tree
    keys = [-free[machines]]
    for tier in range(1, min(level - 1, tree.tiers + 1)):
        sw_free = tree.group_free(free, tier + 1)
        rank = np.empty(sw_free.size, dtype=np.int64)
        rank[np.argsort(-sw_free, kind="stable")] = np.arange(sw_free.size)
        keys.append(rank[tree.node[tier - 1][machines]])
    out: I64 = machines.start + np.lexsort(keys)
    return out


@PLACEMENTS.register("best-fit")
class BestFit:
    """Consolidate: the fullest machine that fits; else, from the ToR up, the fullest switch
    that fits at the tightest tier that has one; else the whole cluster. Within the switch (or
    cluster), the most free sub-switches and machines first (fewest machines)."""

    name: ClassVar[str] = "best-fit"

    def place(
        self, gpus: int, free: I64, cluster: Cluster, max_level: int, rng: np.random.Generator
    ) -> Allocation | None:
        if gpus <= cluster.gpus_per_machine:
            fits = np.flatnonzero(free >= gpus)
            if fits.size:
                m = int(fits[np.argmin(free[fits])])
                return _within(Allocation.of([m], [gpus], cluster), max_level)
        tree = cluster.tree
        for level in range(int(Level.RACK), tree.top):
            if max_level < level:
                return None
            group_free = tree.group_free(free, level)
            fits = np.flatnonzero(group_free >= gpus)
            if fits.size:
                g = int(fits[np.argmin(group_free[fits])])
                order = _most_free_first(free, cluster, level, tree.group_machines(level, g))
                return _within(_take(order, free, gpus, cluster), max_level)
        if max_level < tree.top or int(free.sum()) < gpus:
            return None
        order = _most_free_first(free, cluster, tree.top, slice(0, tree.machines))
        return _within(_take(order, free, gpus, cluster), max_level)


def _groups(gpus: int, free: I64, cluster: Cluster, max_level: int) -> list[I64]:
    """The sets of machines a job may be spread over within ``max_level`` that have room."""
    tree = cluster.tree
    if max_level >= tree.top:
        return [np.arange(cluster.machines)] if int(free.sum()) >= gpus else []
    if max_level == Level.GPU and gpus > 1:
        return []
    if max_level <= Level.MACHINE:
        return [np.array([m]) for m in np.flatnonzero(free >= gpus).tolist()]
    fits = np.flatnonzero(tree.group_free(free, max_level) >= gpus).tolist()
    out = []
    for g in fits:
        sl = tree.group_machines(max_level, g)
        out.append(np.arange(sl.start, sl.stop))
    return out


@PLACEMENTS.register("first-fit")
class FirstFit:
    """The lowest-numbered machines (within the first rack or machine with room, when the level
    is bounded), filling each before the next: no locality search."""

    name: ClassVar[str] = "first-fit"

    def place(
        self, gpus: int, free: I64, cluster: Cluster, max_level: int, rng: np.random.Generator
    ) -> Allocation | None:
        groups = _groups(gpus, free, cluster, max_level)
        return _take(groups[0], free, gpus, cluster) if groups else None


@PLACEMENTS.register("random")
class RandomSpread:
    """Random machines with free GPUs, one GPU from each in turn (spreads jobs widely); within a
    random rack or machine with room when the level is bounded."""

    name: ClassVar[str] = "random"

    def place(
        self, gpus: int, free: I64, cluster: Cluster, max_level: int, rng: np.random.Generator
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
