"""The switch tree of a cluster: machines under ToR switches, under any number of further tiers,
under one core. Uneven fan-out is allowed; machines are numbered so that every switch's machines
are consecutive, which makes per-switch sums one ``np.add.reduceat``.

Placement levels follow the tree: ``0`` one GPU, ``1`` one machine, ``1 + t`` several machines
under one tier-``t`` switch (``t = 1`` the ToR or rack), and ``top = tiers + 2`` across the top
tier's switches, through the core.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

I64 = NDArray[np.int64]

GPU, MACHINE, FIRST_SWITCH = 0, 1, 2
"""Levels every tree has; the rest depend on its depth."""


@dataclass(frozen=True, eq=False)
class Tree:
    """Machines (all with ``gpus_per_machine`` GPUs) and the switch above each at every tier."""

    tier_names: tuple[str, ...]
    """Switch tiers from the ToR up, e.g. ``("rack",)`` or ``("tor", "pod")``."""
    gpus_per_machine: int
    node: tuple[I64, ...]
    """``node[t - 1][m]``: index of the tier-``t`` switch above machine ``m``."""
    first: tuple[I64, ...] = field(init=False)
    """``first[t - 1][s]``: the lowest machine under tier-``t`` switch ``s``."""
    size: tuple[I64, ...] = field(init=False)
    """``size[t - 1][s]``: how many machines tier-``t`` switch ``s`` has under it."""
    link_offset: tuple[int, ...] = field(init=False)
    """Uplinks are numbered tier by tier: tier-``t`` switch ``s`` owns link
    ``link_offset[t - 1] + s``."""

    def __post_init__(self) -> None:
        firsts, sizes, offsets, total = [], [], [], 0
        for ids in self.node:
            starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
            if not np.array_equal(ids[starts], np.arange(starts.size)):
                raise ValueError("tree: switches must be numbered in machine order")
            firsts.append(starts.astype(np.int64))
            sizes.append(np.diff(np.r_[starts, ids.size]).astype(np.int64))
            offsets.append(total)
            total += int(starts.size)
        object.__setattr__(self, "first", tuple(firsts))
        object.__setattr__(self, "size", tuple(sizes))
        object.__setattr__(self, "link_offset", tuple(offsets))
        for arr in (*self.node, *firsts, *sizes):
            arr.setflags(write=False)

    # ------------------------------------------------------------------ shape
    @property
    def machines(self) -> int:
        return int(self.node[0].size)

    @property
    def tiers(self) -> int:
        return len(self.tier_names)

    @property
    def top(self) -> int:
        """The widest level: across the top tier's switches."""
        return self.tiers + 2

    @property
    def links(self) -> int:
        """Number of switch uplinks (every switch has one, to its parent or the core)."""
        return self.link_offset[-1] + int(self.size[-1].size)

    def switches(self, tier: int) -> int:
        return int(self.size[tier - 1].size)

    def link_tier(self) -> I64:
        """The tier (1-based) of every uplink."""
        return np.repeat(np.arange(1, self.tiers + 1), [s.size for s in self.size])

    # ------------------------------------------------------------------ levels
    def capacity(self, level: int) -> int:
        """The most GPUs one placement at ``level`` can hold."""
        if level <= GPU:
            return 1
        if level == MACHINE:
            return self.gpus_per_machine
        if level >= self.top:
            return self.machines * self.gpus_per_machine
        return int(self.size[level - 2].max()) * self.gpus_per_machine

    def min_levels(self, gpus: I64) -> NDArray[np.int8]:
        """The tightest level a job of ``gpus`` GPUs can be placed at (vectorised)."""
        g = np.asarray(gpus)
        out = np.full(g.shape, self.top, dtype=np.int8)
        for level in range(self.top - 1, GPU - 1, -1):
            out[g <= self.capacity(level)] = level
        return out

    def group_free(self, free: I64, level: int) -> I64:
        """Per-group sums of a per-machine count, the groups being the placements at ``level``:
        machines (MACHINE and GPU), the switches of one tier, or the whole cluster (top)."""
        if level <= MACHINE:
            return free
        if level >= self.top:
            return np.asarray([int(free.sum())], dtype=np.int64)
        out: I64 = np.add.reduceat(free, self.first[level - 2])
        return out

    def group_of(self, level: int) -> I64:
        """Per machine, the index of its group at ``level`` (see ``group_free``)."""
        if level <= MACHINE:
            return np.arange(self.machines, dtype=np.int64)
        if level >= self.top:
            return np.zeros(self.machines, dtype=np.int64)
        return self.node[level - 2]

    def group_machines(self, level: int, group: int) -> slice:
        """The machines of one group at ``level``."""
        if level <= MACHINE:
            return slice(group, group + 1)
        if level >= self.top:
            return slice(0, self.machines)
        start = int(self.first[level - 2][group])
        return slice(start, start + int(self.size[level - 2][group]))

    def level_caps(self, free: I64) -> I64:
        """The largest GPU demand placeable on ``free`` at each level, indexed by level: GPU and
        top the total, MACHINE the most free on one machine, each switch tier the most free
        under one of its switches."""
        total = int(free.sum())
        caps = [total, int(free.max())]
        caps += [int(np.add.reduceat(free, f).max()) for f in self.first]
        caps.append(total)
        return np.asarray(caps, dtype=np.int64)

    def level_of(self, machines: Sequence[int], gpus: int) -> int:
        """The widest level a placement on ``machines`` (``gpus`` GPUs in all) spans."""
        if gpus <= 1:
            return GPU
        if len(machines) == 1:
            return MACHINE
        for t, ids in enumerate(self.node, 1):
            head = ids[machines[0]]
            if all(ids[m] == head for m in machines):
                return 1 + t
        return self.top

    def uplinks(self, machines: Sequence[int], level: int) -> tuple[int, ...]:
        """The switch uplinks a placement at ``level`` crosses: at every tier below the level,
        the uplink of each switch it uses."""
        out: list[int] = []
        for t in range(1, level - 1):
            ids, off = self.node[t - 1], self.link_offset[t - 1]
            out.extend(sorted({off + int(ids[m]) for m in machines}))
        return tuple(out)


def uniform(racks: int, machines_per_rack: int, gpus_per_machine: int) -> Tree:
    """``racks`` racks of ``machines_per_rack`` machines each: one switch tier."""
    node = np.repeat(np.arange(racks, dtype=np.int64), machines_per_rack)
    return Tree(tier_names=("rack",), gpus_per_machine=gpus_per_machine, node=(node,))


def from_paths(
    tier_names: Sequence[str], paths: Sequence[tuple[str, ...]], gpus_per_machine: int
) -> tuple[Tree, list[int]]:
    """A tree from one switch path per host (ToR first, top tier last); a switch is identified
    by its whole path, so names may repeat under different parents. Returns the tree and, per
    machine of the tree, the index of its host in ``paths``: hosts are renumbered so that every
    switch's hosts are consecutive (top-tier switches in order of first appearance, and so on
    down; hosts of one ToR in input order)."""
    tiers = len(tier_names)
    # Sort key: the order in which each switch (by its path from the top) first appears.
    seen: list[dict[tuple[str, ...], int]] = [{} for _ in range(tiers)]
    keys = []
    for path in paths:
        key = []
        for depth in range(tiers):  # depth 0: the top tier
            prefix = tuple(reversed(path))[: depth + 1]
            key.append(seen[depth].setdefault(prefix, len(seen[depth])))
        keys.append(tuple(key))
    order = sorted(range(len(paths)), key=lambda h: keys[h])  # stable: input order within a ToR
    node = []
    for t in range(1, tiers + 1):
        depth = tiers - t
        prefixes = [tuple(reversed(paths[h]))[: depth + 1] for h in order]
        index: dict[tuple[str, ...], int] = {}
        node.append(np.asarray([index.setdefault(p, len(index)) for p in prefixes], np.int64))
    tree = Tree(tier_names=tuple(tier_names), gpus_per_machine=gpus_per_machine, node=tuple(node))
    return tree, order
