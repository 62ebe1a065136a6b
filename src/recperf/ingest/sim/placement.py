"""The ingestion model over several nodes: the LP bound with one CPU row per node and one network
row per link direction (bytes per row handed across nodes x rows/s <= a NIC's bandwidth), and the
placement of an allocation's single-threaded workers onto nodes that keeps that traffic low.

Rows/s are Mrows/s inside the LPs (a segment's µs per row x Mrows/s = cores), so every row's
coefficients stay near 1 whatever the units of the spec."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
from scipy.optimize import linprog  # type: ignore[import-untyped]

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.ingest.base import MAX_CORES, Allocation, AllocationRefused, cut_patterns
from recperf.ingest.sim.model import PipelineSpec, Segments
from recperf.ingest.sim.solve import segments_of

TIE = 1e-9
"""Relative slack within which two throughputs count as equal (the LP's own tolerance is ~1e-9)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Network:
    """The links between nodes: every node has one NIC of the same bandwidth."""

    link_bytes_per_s: float = math.inf
    """Bandwidth of each node's NIC, bytes/s, in each direction on its own (> 0; inf: no limit)."""

    def __post_init__(self) -> None:
        if self.link_bytes_per_s != math.inf:
            check_range("link_bytes_per_s", self.link_bytes_per_s, 0.0, None, lo_open=True)


@dataclass(kw_only=True, slots=True, frozen=True)
class PlacementBound:
    """The multi-node LP's optimum for one cut pattern (real-valued workers)."""

    throughput_rows_per_s: float
    """Highest throughput any placement (even fractional) of these segments reaches."""
    workers: tuple[tuple[float, ...], ...]
    """Busy workers (cores) of each segment on each node at that throughput, the placement that
    crosses the fewest bytes between nodes among those reaching it."""
    link_out_bytes_per_s: tuple[float, ...]
    """Bytes/s each node sends to other nodes in that placement."""
    link_in_bytes_per_s: tuple[float, ...]
    """Bytes/s each node receives from other nodes in that placement."""
    binding: str
    """The constraint holding the largest share of the optimum: ``cores`` (every node's CPUs),
    ``node n1 cpus``, ``link n0 out``, ``link n2 in``, ``max_workers <stage>``, ``memory``,
    ``consumer``."""
    cuts: tuple[int, ...] | None = None
    """Where the chain is cut (as ``Allocation.cuts``; None: every stage its own segment)."""


class PlacementRow(TypedDict):
    """One segment of a placement as JSON: ``{"segment": "a+b", "nodes": {"n0": 3, "n1": 2}}``."""

    segment: str
    nodes: dict[str, float]


@dataclass(frozen=True, slots=True)
class _Terms:
    """Each segment's core-µs per row (threads 1, with its hand-off: the single-pool bound's
    cost), one worker's MiB, its cap and capping stage, and bytes per row it hands on."""

    cost: tuple[float, ...]
    mem: tuple[float, ...]
    caps: tuple[int | None, ...]
    cap_stage: tuple[str | None, ...]
    out_bytes: tuple[float, ...]

    @classmethod
    def of(cls, spec: PipelineSpec, segs: Segments) -> _Terms:
        caps = spec.segment_caps(segs)
        stages = [spec.stages[a:b] for a, b in segs]
        return cls(
            cost=spec.segment_costs_us(segs),
            mem=spec.segment_memory_mib(segs),
            caps=caps,
            cap_stage=tuple(
                None if c is None else next(st.name for st in sts if st.max_workers == c)
                for c, sts in zip(caps, stages, strict=True)
            ),
            out_bytes=tuple(sts[-1].out_bytes_per_row for sts in stages),
        )


@dataclass
class _Lp:
    """A linear program under construction: variables T, r[j][m] (Mrows/s segment j runs on
    node m) and f[j][a][b] (Mrows/s of segment j's output from node a to the next segment on b,
    or to the consumer on node 0); for ``place``, z (the busiest NIC's bytes per row) and the
    shares of the rows instead."""

    k: int
    n: int
    ub: list[tuple[dict[int, float], float]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    eq: list[tuple[dict[int, float], float]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return 1 + self.k * self.n * (self.n + 1)

    def r(self, j: int, m: int) -> int:
        return 1 + j * self.n + m

    def f(self, j: int, a: int, b: int) -> int:
        return 1 + self.k * self.n + (j * self.n + a) * self.n + b

    def le(self, coeffs: dict[int, float], rhs: float, name: str) -> None:
        """``coeffs . v <= rhs``, scaled to a right-hand side of 1 where it is positive (the
        dual of such a row is then its share of the optimum)."""
        s = rhs if rhs > 0 else 1.0
        self.ub.append(({i: c / s for i, c in coeffs.items() if c}, rhs / s))
        self.names.append(name)

    def same(self, coeffs: dict[int, float], rhs: float = 0.0) -> None:
        """``coeffs . v == rhs``."""
        self.eq.append((coeffs, rhs))

    def dense(self, rows: list[tuple[dict[int, float], float]]) -> tuple[np.ndarray, np.ndarray]:
        out = np.zeros((len(rows), self.size))
        for i, (row, _) in enumerate(rows):
            for v, c in row.items():
                out[i, v] += c
        return out, np.asarray([rhs for _, rhs in rows])

    def solve(self, objective: dict[int, float], fixed: float | None = None) -> _Solved:
        """Minimize ``objective . v``, variable 0 held at ``fixed`` if given."""
        c = np.zeros(self.size)
        for v, w in objective.items():
            c[v] = w
        bounds: list[tuple[float, float | None]] = [(0.0, None)] * self.size
        if fixed is not None:
            bounds[0] = (fixed, fixed)
        for a in range(self.n):  # the last segment hands on to the consumer, on node 0
            for b in range(1, self.n):
                bounds[self.f(self.k - 1, a, b)] = (0.0, 0.0)
        a_ub, b_ub = self.dense(self.ub) if self.ub else (None, None)
        a_eq, b_eq = self.dense(self.eq)
        res = linprog(c, a_ub, b_ub, a_eq, b_eq, bounds=bounds, method="highs")
        if res.status != 0:
            raise RuntimeError(f"placement LP failed: {res.message}")
        duals = -np.asarray(res.ineqlin.marginals) if self.ub else np.zeros(0)
        return np.maximum(np.asarray(res.x), 0.0) + 0.0, duals  # no -1e-12 nor -0.0


_Solved = tuple[np.ndarray, np.ndarray]
"""A solution's variables and each ``<=`` row's dual (>= 0: what one more unit of it is worth)."""


def _check_nodes(node_cpus: Sequence[int]) -> None:
    if not node_cpus or not all(isinstance(c, int) for c in node_cpus):
        raise ConfigError(f"node_cpus = {list(node_cpus)}: expected one CPU count per node")
    for i, c in enumerate(node_cpus):
        check_range(f"node_cpus[{i}]", c, 1, MAX_CORES)


def _chain(k: int, n: int, total: dict[int, float], rhs: float) -> _Lp:
    """An LP whose segments each run ``total . v + rhs`` rows, carried on by the flows."""
    lp = _Lp(k, n)
    for j in range(k):
        lp.same({**{lp.r(j, m): 1.0 for m in range(n)}, **total}, rhs)
        for a in range(n):  # what segment j runs on node a leaves it
            lp.same({**{lp.f(j, a, b): 1.0 for b in range(n)}, lp.r(j, a): -1.0})
        for b in range(n if j + 1 < k else 0):  # and is what segment j + 1 runs on node b
            lp.same({**{lp.f(j, a, b): 1.0 for a in range(n)}, lp.r(j + 1, b): -1.0})
    return lp


def _build(spec: PipelineSpec, terms: _Terms, node_cpus: Sequence[int], network: Network) -> _Lp:
    """The bound's LP: each segment runs T rows/s, within node CPUs, caps, memory, the
    consumer's thread and the links."""
    k, n = len(terms.cost), len(node_cpus)
    lp = _chain(k, n, {0: -1.0}, 0.0)
    cost = terms.cost
    for m, cpus in enumerate(node_cpus):
        lp.le({lp.r(j, m): cost[j] for j in range(k)}, cpus, f"node n{m} cpus")
    for j, (cap, stage) in enumerate(zip(terms.caps, terms.cap_stage, strict=True)):
        if cap is not None:
            lp.le({lp.r(j, m): cost[j] for m in range(n)}, cap, f"max_workers {stage}")
    free_mib = spec.memory_budget_gib * 1024 - spec.buffer_mib(k)
    per_mib = [c * mem for c, mem in zip(cost, terms.mem, strict=True)]
    if free_mib < 0:  # the buffers alone are over the budget
        lp.le({0: 1.0}, 0.0, "memory")
    elif any(per_mib):
        lp.le({lp.r(j, m): per_mib[j] for j in range(k) for m in range(n)}, free_mib, "memory")
    if spec.consumer_us_per_row > 0:
        lp.le({0: spec.consumer_us_per_row}, 1.0, "consumer")
    if network.link_bytes_per_s != math.inf:
        _links_within(lp, terms, {}, network.link_bytes_per_s / 1e6)  # bytes/row x Mrows/s
    return lp


def _crossing(
    lp: _Lp, weights: Sequence[float], node: int | None = None, leaving: bool = True
) -> dict[int, float]:
    """``weights[j]`` for every flow of segment j between two nodes (those leaving ``node``,
    or entering it; every such flow for None)."""
    return {
        lp.f(j, a, b): w
        for j, w in enumerate(weights)
        if w > 0
        for a, b in itertools.product(range(lp.n), repeat=2)
        if a != b and node in (None, a if leaving else b)
    }


def _links_within(lp: _Lp, terms: _Terms, extra: dict[int, float], rhs: float) -> None:
    """One row per node and direction: bytes crossing its NIC + ``extra . v`` <= ``rhs``."""
    for m, way in itertools.product(range(lp.n), ("out", "in")):
        row = _crossing(lp, terms.out_bytes, m, way == "out")
        if row:
            lp.le({**row, **extra}, rhs, f"link n{m} {way}")


def _two_step(lp: _Lp, terms: _Terms, sense: float) -> tuple[_Solved, _Solved]:
    """The best variable 0 (highest with ``sense`` -1, lowest with 1), then at that value the
    flows crossing the fewest bytes (the fewest rows where no segment hands on any bytes, so
    that a placement still keeps its chain together)."""
    first = lp.solve({0: sense})
    weights = terms.out_bytes if any(terms.out_bytes) else (1.0,) * lp.k
    return first, lp.solve(_crossing(lp, weights), fixed=float(first[0][0]))


def _binding(lp: _Lp, solved: _Solved) -> str:
    """The row with the largest dual (each row is scaled to a right-hand side of 1, so its dual
    is its share of T); ``cores`` when every node's CPU row holds a share."""
    v, shares = solved
    if v[0] <= 0:  # only the buffers alone over the budget leave nothing
        return "memory"
    if shares.size == 0 or shares.max() <= 0:
        return "cores"
    i = int(np.argmax(shares >= shares.max() * (1 - TIE)))
    name = lp.names[i]
    cpus = [s for s, nm in zip(shares, lp.names, strict=True) if nm.endswith(" cpus")]
    if name.endswith(" cpus") and len(cpus) == lp.n and min(cpus) > shares.max() * TIE:
        return "cores"
    return name


def _links(lp: _Lp, terms: _Terms, v: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Bytes/s out of and into each node under flows ``v``."""
    sent = np.zeros((lp.n, lp.n))
    for j, bytes_ in enumerate(terms.out_bytes):
        for a, b in itertools.product(range(lp.n), repeat=2):
            sent[a, b] += bytes_ * float(v[lp.f(j, a, b)]) * 1e6 if a != b else 0.0
    return tuple(map(float, sent.sum(axis=1))), tuple(map(float, sent.sum(axis=0)))


def placement_bound(
    spec: PipelineSpec,
    node_cpus: Sequence[int],
    network: Network,
    cuts: Sequence[int] | None = None,
) -> PlacementBound:
    """The most rows/s the segments of ``cuts`` (single-threaded worker processes, as on the Ray
    engine) reach on nodes of ``node_cpus`` CPUs joined by ``network``, the consumer on node 0;
    ``spec.cores`` and ``spec.thread_options`` are not used. One node, or links without limit,
    give ``pattern_bound`` of the same spec on ``sum(node_cpus)`` cores."""
    terms, lp = _pattern(spec, node_cpus, network, cuts)
    first, (v, _) = _two_step(lp, terms, -1.0)
    out, into = _links(lp, terms, v)
    return PlacementBound(
        throughput_rows_per_s=float(first[0][0]) * 1e6,
        workers=tuple(
            tuple(float(v[lp.r(j, m)]) * terms.cost[j] for m in range(lp.n)) for j in range(lp.k)
        ),
        link_out_bytes_per_s=out,
        link_in_bytes_per_s=into,
        binding=_binding(lp, first),
        cuts=None if cuts is None or len(cuts) == spec.n_stages - 1 else tuple(cuts),
    )


def _pattern(
    spec: PipelineSpec, node_cpus: Sequence[int], network: Network, cuts: Sequence[int] | None
) -> tuple[_Terms, _Lp]:
    """The bound's LP for the segments of ``cuts``."""
    _check_nodes(node_cpus)
    terms = _Terms.of(spec, segments_of(spec.n_stages, cuts))
    return terms, _build(spec, terms, node_cpus, network)


def placement_lp_bound(
    spec: PipelineSpec, node_cpus: Sequence[int], network: Network
) -> PlacementBound:
    """The best ``placement_bound`` over every cut pattern (fewest cuts first on ties)."""
    best: tuple[float, tuple[int, ...]] | None = None
    for cuts in cut_patterns(spec.n_stages):
        rate = float(_pattern(spec, node_cpus, network, cuts)[1].solve({0: -1.0})[0][0])
        if best is None or rate > best[0] * (1 + TIE):
            best = (rate, cuts)
    assert best is not None  # a chain has at least the fused pattern
    return placement_bound(spec, node_cpus, network, best[1])


def worker_slots(node_cpus: Sequence[int], workers: int) -> tuple[int, ...]:
    """How many of ``workers`` each node may hold: its CPUs, or where the workers outnumber
    the CPUs (they then share them, each a fraction of one), its CPUs times that ratio, rounded
    up so that every worker has a place."""
    total = sum(node_cpus)
    if workers <= total:
        return tuple(node_cpus)
    return tuple(math.ceil(c * workers / total) for c in node_cpus)


def place(
    spec: PipelineSpec, alloc: Allocation, node_cpus: Sequence[int], network: Network
) -> tuple[tuple[int, ...], ...]:
    """Workers of each segment of ``alloc`` on each node (totals ``alloc.workers``, no node over
    its CPUs). Every worker of a segment takes an equal share of its rows (as Ray Data deals
    blocks to an operator's tasks), so a placement fixes each node's share of each segment's
    rows; the one chosen sends the fewest bytes per row through the busiest NIC (where links
    have a limit), then the fewest across all links, rounded by largest remainder.
    Deterministic."""
    _check_nodes(node_cpus)
    if any(t != 1 for t in alloc.segment_threads()):
        raise AllocationRefused(
            f"allocation {alloc.label(spec.stage_names)}: placement runs single-threaded "
            "worker processes only (threads 1)"
        )
    if alloc.total > sum(node_cpus):
        raise AllocationRefused(
            f"allocation of {alloc.total} workers does not fit {len(node_cpus)} nodes of "
            f"{sum(node_cpus)} CPUs in all ({', '.join(map(str, node_cpus))})"
        )
    segs, workers = spec.layout(alloc)
    terms = _Terms.of(spec, segs)
    lp = _chain(len(segs), len(node_cpus), {}, 1.0)  # r: shares of the rows; v[0]: z
    for m, cpus in enumerate(node_cpus):
        lp.le({lp.r(j, m): w for j, w in enumerate(workers)}, cpus, f"node n{m} cpus")
    if network.link_bytes_per_s != math.inf:
        _links_within(lp, terms, {0: -1.0}, 0.0)
    _, (v, _) = _two_step(lp, terms, 1.0)
    real = [[w * float(v[lp.r(j, m)]) for m in range(lp.n)] for j, w in enumerate(workers)]
    return _round(real, workers, node_cpus)


def _round(
    real: list[list[float]], workers: Sequence[int], node_cpus: Sequence[int]
) -> tuple[tuple[int, ...], ...]:
    """Integer workers near ``real`` with each segment's total ``workers`` and each node within
    its CPUs: floors, then the largest remainders where a node has room, then the roomiest
    nodes (first on ties) for what is left."""
    n = len(node_cpus)
    out = [[math.floor(x + TIE) for x in row] for row in real]  # sum <= w + n * TIE: <= w
    room = [c - sum(row[m] for row in out) for m, c in enumerate(node_cpus)]
    need = [w - sum(row) for row, w in zip(out, workers, strict=True)]
    order = sorted(
        ((real[j][m] - out[j][m], j, m) for j in range(len(out)) for m in range(n)),
        key=lambda e: (-e[0], e[1], e[2]),
    )
    for frac, j, m in order:
        if frac > TIE and need[j] > 0 and room[m] > 0:
            out[j][m] += 1
            need[j] -= 1
            room[m] -= 1
    for j in range(len(out)):
        while need[j] > 0:
            m = max(range(n), key=lambda i: (room[i], -i))
            out[j][m] += 1
            need[j] -= 1
            room[m] -= 1
    return tuple(tuple(row) for row in out)


def placement_json(
    spec: PipelineSpec, cuts: Sequence[int] | None, placement: Sequence[Sequence[float]]
) -> list[PlacementRow]:
    """JSON-ready rows of a placement (``place``'s or a ``PlacementBound``'s workers), one per
    segment of ``cuts``: ``{"segment": "a+b", "nodes": {"n0": 3, "n1": 2}}``."""
    segs = segments_of(spec.n_stages, cuts)
    if len(placement) != len(segs):
        raise ConfigError(f"placement has {len(placement)} rows for {len(segs)} segments")
    return [
        {"segment": spec.segment_label(seg), "nodes": {f"n{m}": w for m, w in enumerate(row)}}
        for seg, row in zip(segs, placement, strict=True)
    ]
