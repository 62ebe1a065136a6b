"""The ingestion simulator as a gymnasium env (``recperf/Ingest-v0``), and the observation,
action and mask encoding that the ``intune`` tuner shares with it on any Target. The agent sees a
chain of stages, each one worker pool: in the env every stage is its own segment; online, intune
shows it the segments of its chosen cuts as stages (``tuners.segment.SegmentTarget``), and both
see per-row costs with the hand-off folded in."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from recperf.core import exact
from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, Measurement, Target, even_split
from recperf.ingest.sim import target as sim_target
from recperf.ingest.sim.model import PipelineSpec, StageSpec, load_spec
from recperf.ingest.sim.solve import pattern_bound
from recperf.ingest.tuners.base import unit_memory
from recperf.ingest.tuners.model import measured_costs
from recperf.ingest.tuners.segment import SegmentTarget

MAX_STAGES = 8
STAGE_FEATURES = 6  # present, busy, queue fill, cpu share, memory share, cost share
# workers/cores, memory/budget, throughput/bound, contention, stages/8, modelled throughput of
# the current allocation / bound, best modelled throughput / bound
GLOBAL_FEATURES = 7
OBS_SIZE = MAX_STAGES * STAGE_FEATURES + GLOBAL_FEATURES
N_STEPS = 3  # move sizes: 1, cores/16, cores/4 workers
KINDS = ("move0", "move1", "move2", "add0", "add1", "add2", "remove", "grow", "shrink",
         "fitnow", "fit1", "fit2", "fit4", "fitbest", "noop")  # fmt: skip
GROW, SHRINK = 1.25, 0.8  # scale the total workers, placed in proportion to per-row cost
FIT_NOW, FIT_BEST, NOOP_KIND = 9, 13, 14
FIT_TOTALS = {10: 1, 11: 2, 12: 4}  # fit kind -> total workers as a multiple of the cores
COST_WINDOW = 32  # recent measurements whose per-row costs are averaged for the fit actions
OBS_HIGH = 16.0


def _actions() -> list[tuple[int, int, int]]:
    """(kind index into KINDS, source stage or -1, destination stage or -1) per action."""
    out = [
        (k, i, j)
        for k in range(N_STEPS)
        for i in range(MAX_STAGES)
        for j in range(MAX_STAGES)
        if i != j
    ]
    # add 1, cores/16 or cores/4 workers to stage j
    out += [(N_STEPS + k, -1, j) for k in range(N_STEPS) for j in range(MAX_STAGES)]
    out += [(6, i, -1) for i in range(MAX_STAGES)]  # remove a worker from stage i
    out += [(7, -1, -1), (8, -1, -1)]  # grow / shrink the total, split in proportion to cost
    # re-fit the workers to the measured costs (at the current total, 1, 2 or 4 x cores, or the
    # total the cost model rates best), then no-op
    out += [(k, -1, -1) for k in range(FIT_NOW, NOOP_KIND + 1)]
    return out


ACTIONS = _actions()
N_ACTIONS = len(ACTIONS)
NOOP = N_ACTIONS - 1


def move_size(cores: int, kind: int) -> int:
    return (1, max(1, round(cores / 16)), max(1, round(cores / 4)))[kind]


def max_total(cores: int, n_stages: int) -> int:
    """Most workers the agent may run (oversubscription allowed): 4 x cores or 2 x (stages +
    cores), whichever is more."""
    return max(4 * cores, 2 * (n_stages + cores))


@dataclass(kw_only=True, slots=True, frozen=True)
class Context:
    """What the encoding needs to know about a target besides its measurements."""

    n: int
    cores: int
    caps: tuple[int | None, ...]
    budget_bytes: float
    base_bytes: float
    per_worker_bytes: tuple[float, ...]
    memory: Callable[[Allocation], float]

    @classmethod
    def of(cls, target: Target) -> Context:
        n = len(target.stage_names)
        if not 1 <= n <= MAX_STAGES:
            raise ConfigError(f"the agent handles 1..{MAX_STAGES} stages; target has {n}")
        base, per = unit_memory(target)
        return cls(
            n=n,
            cores=target.cores,
            caps=tuple(target.max_workers),
            budget_bytes=target.memory_budget_bytes,
            base_bytes=base,
            per_worker_bytes=per,
            memory=target.memory_bytes,
        )

    def bound(self, costs: Sequence[float]) -> float:
        """LP bound (rows/s) of a chain with these per-row costs (cf. sim.pattern_bound)."""
        lims = [self.cores * 1e6 / sum(costs)]
        lims += [cap * 1e6 / c for cap, c in zip(self.caps, costs, strict=True) if cap]
        rate = sum(c * p for c, p in zip(costs, self.per_worker_bytes, strict=True))
        free = self.budget_bytes - (self.base_bytes - sum(self.per_worker_bytes))
        if rate > 0:
            lims.append(max(free, 0.0) * 1e6 / rate)
        return max(min(lims), 1e-9)


def rescale(workers: Sequence[int], costs: Sequence[float], factor: float) -> list[int]:
    """About ``factor`` x the workers in all, each stage's share proportional to its cost."""
    total = sum(workers) * factor
    share = total / sum(costs)
    rnd = math.ceil if factor > 1 else math.floor
    return [max(1, rnd(share * c - 1e-9 if factor > 1 else share * c + 1e-9)) for c in costs]


def modelled(ctx: Context, workers: Sequence[int], costs: Sequence[float]) -> float:
    """Rows/s the cost model predicts for ``workers``: the slowest stage's capacity, scaled by
    cores / workers when the workers outnumber the cores (as sim.PipelineSpec.throughput)."""
    rate = min(
        (w if cap is None else min(w, cap)) / c
        for w, cap, c in zip(workers, ctx.caps, costs, strict=True)
    )
    return rate * 1e6 * min(1.0, ctx.cores / sum(workers))


@dataclass(frozen=True, slots=True)
class Fit:
    """The cost model's allocations for every total: ``plan[k]`` has n + k workers, each added
    to the stage with the lowest modelled rate w / c (which maximises the slowest stage at every
    total), stopping at a capped bottleneck, the memory budget or max_total; ``best`` indexes
    the plan entry with the highest modelled throughput (fewest workers on ties)."""

    plan: tuple[tuple[int, ...], ...]
    best: int


@functools.lru_cache(maxsize=128)
def fit(ctx: Context, costs: tuple[float, ...]) -> Fit:
    """The greedy plan of ``Fit`` for per-row ``costs`` (µs/row per stage, all > 0)."""
    w = [1] * ctx.n
    plan = [tuple(w)]
    mem = ctx.base_bytes
    best, best_t = 0, modelled(ctx, w, costs)
    while sum(w) < max_total(ctx.cores, ctx.n):
        i = min(range(ctx.n), key=lambda j: (w[j] / costs[j], -costs[j]))
        cap = ctx.caps[i]
        mem += ctx.per_worker_bytes[i]
        if (cap is not None and w[i] >= cap) or mem > ctx.budget_bytes * (1 + 1e-9):
            break  # the bottleneck cannot grow: more workers elsewhere only add contention
        w[i] += 1
        plan.append(tuple(w))
        t = modelled(ctx, w, costs)
        if t > best_t * (1 + 1e-9):
            best, best_t = len(plan) - 1, t
    return Fit(plan=tuple(plan), best=best)


def _fitted(ctx: Context, workers: Sequence[int], kind: int, costs: Sequence[float]) -> list[int]:
    f = fit(ctx, tuple(costs))
    if kind == FIT_BEST:
        return list(f.plan[f.best])
    total = sum(workers) if kind == FIT_NOW else FIT_TOTALS[kind] * ctx.cores
    return list(f.plan[min(max(total - ctx.n, 0), len(f.plan) - 1)])


def _valid_costs(costs: Sequence[float] | None) -> bool:
    return costs is not None and all(math.isfinite(c) and c > 0 for c in costs)


def apply(
    ctx: Context, workers: Sequence[int], action: int, costs: Sequence[float] | None = None
) -> tuple[int, ...] | None:
    """The workers after ``action``, or None if it is invalid (cap, memory, < 1, total, or a
    re-fit that changes nothing).

    ``costs`` (measured µs/row per stage) place grow / shrink and the re-fits; without them
    grow / shrink scale each stage's own workers and the re-fits are invalid."""
    kind, src, dst = ACTIONS[action]
    if kind == NOOP_KIND:
        return tuple(workers)
    if max(src, dst) >= ctx.n:
        return None
    if FIT_NOW <= kind <= FIT_BEST:
        if costs is None or not _valid_costs(costs):
            return None
        w = _fitted(ctx, workers, kind, costs)
        if w == list(workers):
            return None
    elif kind in (7, 8):
        factor = GROW if kind == 7 else SHRINK
        if costs is not None and _valid_costs(costs):
            w = rescale(workers, costs, factor)
        else:
            w = [max(1, (math.ceil if kind == 7 else math.floor)(x * factor)) for x in workers]
        w = [x if cap is None else min(x, cap) for x, cap in zip(w, ctx.caps, strict=True)]
        if w == list(workers):
            return None
    else:
        k = move_size(ctx.cores, kind % N_STEPS) if kind < 2 * N_STEPS else 1
        w = list(workers)
        if src >= 0:
            w[src] -= k
        if dst >= 0:
            w[dst] += k
    if min(w) < 1 or sum(w) > max_total(ctx.cores, ctx.n):
        return None
    if any(cap is not None and wi > cap for wi, cap in zip(w, ctx.caps, strict=True)):
        return None
    if ctx.memory(Allocation(workers=tuple(w))) > ctx.budget_bytes * (1 + 1e-9):
        return None
    return tuple(w)


def action_mask(
    ctx: Context, workers: Sequence[int], costs: Sequence[float] | None = None
) -> np.ndarray:
    """int8 mask of the valid actions (no-op always valid)."""
    return np.array([apply(ctx, workers, a, costs) is not None for a in range(N_ACTIONS)], np.int8)


def observe(
    ctx: Context, m: Measurement, bound: float, costs: Sequence[float] | None = None
) -> np.ndarray:
    """Fixed-size observation of one measurement, padded to MAX_STAGES stages.

    ``costs``: the per-row cost estimate (default: this measurement's own), for the cost
    shares and the modelled throughputs of the current and of the best re-fit allocation."""
    w = m.allocation.workers
    raw = m.cost_us_per_row if costs is None else costs
    costs = [c if math.isfinite(c) else 0.0 for c in raw]
    total_cost = sum(costs) or 1.0
    now = best = 0.0
    if _valid_costs(costs):
        f = fit(ctx, tuple(costs))
        now = modelled(ctx, w, costs) / bound
        best = modelled(ctx, f.plan[f.best], costs) / bound
    x = np.zeros(OBS_SIZE, np.float32)
    for i in range(ctx.n):
        x[i * STAGE_FEATURES : (i + 1) * STAGE_FEATURES] = (
            1.0,
            m.busy_frac[i],
            m.queue_fill[i],
            w[i] / ctx.cores,
            w[i] * ctx.per_worker_bytes[i] / ctx.budget_bytes,
            costs[i] / total_cost,
        )
    total = sum(w)
    x[-GLOBAL_FEATURES:] = (
        total / ctx.cores,
        m.memory_bytes / ctx.budget_bytes,
        m.throughput_rows_per_s / bound,
        min(1.0, ctx.cores / total),
        ctx.n / MAX_STAGES,
        now,
        best,
    )
    return np.clip(x, 0.0, OBS_HIGH)


def reward(m: Measurement, bound: float, ctx: Context, refused: bool, penalty: float) -> float:
    """Throughput / bound; a refused (over-memory or invalid) proposal pays ``penalty``; a
    small memory term breaks ties toward fewer workers."""
    r = m.throughput_rows_per_s / bound - 0.01 * m.memory_bytes / ctx.budget_bytes
    return r - penalty if refused else r


def random_spec(rng: np.random.Generator) -> PipelineSpec:
    """A random pipeline: 2..128 cores, 2..8 stages, log-uniform costs, some caps, and a memory
    budget that binds in about a third of the draws."""
    cores = round(float(exact.loguniform(rng, 2.0, 128.0, 1)[0]))
    n = int(rng.integers(2, MAX_STAGES + 1))
    costs = exact.loguniform(rng, 0.2, 40.0, n)
    mem = exact.loguniform(rng, 32.0, 2048.0, n)
    ideal = costs / costs.sum() * cores
    stages = tuple(
        StageSpec(
            name=f"s{i}",
            cost_us_per_row=float(costs[i]),
            max_workers=int(rng.integers(1, max(2, int(ideal[i] * 1.5) + 2)))
            if rng.random() < 0.25
            else None,
            memory_mib_per_worker=float(mem[i]),
        )
        for i in range(n)
    )
    ones = float(mem.sum())
    need = float((np.maximum(ideal, 1.0) * mem).sum())
    budget = max(ones * 1.3, need * float(exact.uniform(rng, 0.4, 2.0, 1)[0]))
    return PipelineSpec(
        name="random",
        cores=cores,
        memory_budget_gib=budget / 1024,
        stages=stages,
        transfer_us_per_row=float(exact.uniform(rng, 0.0, 0.5, 1)[0]),
    )


class IngestEnv(gym.Env[np.ndarray, np.int64]):
    """Each step applies one action (move, add or remove workers, or re-fit them all to the
    per-row costs averaged over the episode's recent windows) and measures a window.

    ``spec``: a PipelineSpec or bundled name for a fixed pipeline, None for a random pipeline
    per episode. Invalid actions change nothing and pay ``penalty``; ``info["action_mask"]``
    (and ``action_mask()``) says which actions are valid.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's API

    def __init__(
        self,
        spec: PipelineSpec | str | None = None,
        *,
        episode_steps: int = 48,
        noise: float = 0.02,
        penalty: float = 0.5,
    ) -> None:
        self.fixed = load_spec(spec) if isinstance(spec, str) else spec
        if episode_steps < 1:
            raise ConfigError(f"episode_steps = {episode_steps} must be >= 1")
        self.episode_steps = episode_steps
        self.noise = noise
        self.penalty = penalty
        self.observation_space = gym.spaces.Box(0.0, OBS_HIGH, (OBS_SIZE,), np.float32)
        self.action_space = gym.spaces.Discrete(N_ACTIONS)
        self.target: sim_target.SimTarget | None = None
        self._view: SegmentTarget | None = None
        self._ctx: Context | None = None
        self._last: Measurement | None = None
        self._seen: list[Measurement] = []
        self._bound = 1.0
        self._t = 0

    def _info(self) -> dict[str, Any]:
        assert self._last is not None and self._ctx is not None
        return {
            "action_mask": self.action_mask(),
            "throughput_rows_per_s": self._last.throughput_rows_per_s,
            "allocation": self._last.allocation.workers,
            "lp_bound_rows_per_s": self._bound,
        }

    def action_mask(self) -> np.ndarray:
        if self._last is None or self._ctx is None:
            raise ConfigError("call reset() before action_mask()")
        return action_mask(self._ctx, self._last.allocation.workers, self.costs())

    def costs(self) -> tuple[float, ...]:
        """Per-row costs averaged over the episode's last COST_WINDOW measurements."""
        return tuple(measured_costs(self._seen[-COST_WINDOW:]))

    def _measure(self, workers: tuple[int, ...]) -> Measurement:
        assert self._view is not None
        self._last = self._view.measure(Allocation(workers=workers), 1.0)
        self._seen.append(self._last)
        return self._last

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        spec = self.fixed or random_spec(self.np_random)
        self.target = sim_target.SimTarget(
            spec, seed=int(self.np_random.integers(2**31)), noise=self.noise
        )
        # the per-stage view intune's agent sees online at these cuts (hand-off in the costs)
        self._view = SegmentTarget(self.target, None)
        self._ctx = Context.of(self._view)
        # the bound of the space the agent searches: every stage its own segment
        self._bound = pattern_bound(spec, None).throughput_rows_per_s
        self._seen = []
        self._measure(even_split(self.target).workers)
        self._t = 0
        return self._observe(), self._info()

    def _observe(self) -> np.ndarray:
        assert self._ctx is not None and self._last is not None
        return observe(self._ctx, self._last, self._bound, self.costs())

    def step(self, action: np.int64 | int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.target is None or self._ctx is None or self._last is None:
            raise ConfigError("call reset() before step()")
        a = int(action)
        if not 0 <= a < N_ACTIONS:
            raise ConfigError(f"action {a} is outside 0..{N_ACTIONS - 1}")
        new = apply(self._ctx, self._last.allocation.workers, a, self.costs())
        refused = new is None
        last = self._last if new is None else self._measure(new)
        r = reward(last, self._bound, self._ctx, refused, self.penalty)
        self._t += 1
        obs = self._observe()
        return obs, float(r), False, self._t >= self.episode_steps, self._info()


ENV_ID = "recperf/Ingest-v0"


def register() -> str:
    """Register ``recperf/Ingest-v0`` with gymnasium (idempotent); returns the id."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="recperf.ingest.sim.env:IngestEnv")
    return ENV_ID


register()
