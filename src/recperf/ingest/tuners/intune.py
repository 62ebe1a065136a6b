"""The ``intune`` tuner (after InTune, RecSys 2023): the cut pattern chosen from the measured
cost model (the top patterns' modelled optima, measured), then a DQN agent over the segments'
workers (a ``SegmentTarget`` view, each segment one stage) whose actions move workers between
segments, add / remove them, or re-fit them all to the measured per-row costs (coarse
model-guided moves; the Q-network decides when), pre-trained on the simulator and fine-tuned
online on the target it tunes; it keeps the best allocation it measured, ranked by measured
means shrunk toward the cost model so that noise does not pick the winner. The agent's action
space (fixed by its trained weights) moves worker processes; on a target that runs threads, a
last stage measures the thread shapes of its choice that the measured GIL model ranks best
(``shape_windows`` kept for it) and keeps whichever measures best, then probes the in-flight
options where the target has them."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

import recperf.ingest.tuners.dqn as dqn
from recperf.core import exact
from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.core.files import check_name
from recperf.ingest.base import Allocation, Measurement, Target, even_split
from recperf.ingest.sim import env as ienv
from recperf.ingest.tuners.base import TUNERS, TuneLog, TuneResult, check_window
from recperf.ingest.tuners.model import (
    inflight_options,
    measured_costs,
    measured_spec,
    pattern_optima,
    threaded,
)
from recperf.ingest.tuners.segment import SegmentTarget, lift
from recperf.ingest.tuners.shape import pick_inflight, probe_gil, shape_optima

BUNDLED_WEIGHTS = "data/ingest/intune-dqn.npz"
_CACHE: dict[str, dqn.QNet] = {}


@dataclass(kw_only=True, slots=True, frozen=True)
class IntuneConfig:
    """Options of the intune tuner."""

    window_s: float = 1.0
    """Length of each measurement window, seconds."""
    weights: str | None = None
    """Pre-trained weights file (None: the bundled intune-dqn.npz)."""
    pretrain_episodes: int = 40
    """Episodes to pre-train for when the weights file is missing (0: refuse instead)."""
    epsilon: float = 0.1
    """Online exploration rate at the start, decaying linearly to 0 over the budget, [0, 1]."""
    updates_per_step: int = 4
    """Gradient steps per measurement when fine-tuning (0..64)."""
    lr: float = 3e-4
    """Fine-tuning learning rate, (0, 1]."""
    penalty: float = 0.5
    """Reward penalty of a refused (e.g. over-memory) proposal, >= 0."""
    restart_after: int = 12
    """Measurements without a new best before the agent restarts from the best allocation
    (re-measuring it) or, if it is already there, takes a random step (1..1000)."""
    confirm: int = 4
    """Final windows spent re-measuring the two best allocations, so that noise does not pick
    the winner (0..100)."""
    prior_windows: float = 8.0
    """Most weight, in windows, of the cost model's prediction when the final choice ranks the
    measured allocations (see ``scores``; 0: measured means only), 0..1000."""
    patterns: int = 2
    """Cut patterns whose modelled optima are measured before the best measured one is tuned
    (the modelled best first), 1..32."""
    shape_windows: int = 8
    """Windows kept for the last stage on a target that runs threads or has in-flight options
    (a GIL probe, the model's best thread shapes at the chosen cuts, the choice again, the
    in-flight options), 0..100."""
    shapes: int = 3
    """Thread shapes the last stage measures (the measured model's best first), 1..64."""

    def __post_init__(self) -> None:
        check_window("window_s", self.window_s)
        check_range("pretrain_episodes", self.pretrain_episodes, 0, 10**6)
        check_range("epsilon", self.epsilon, 0.0, 1.0)
        check_range("updates_per_step", self.updates_per_step, 0, 64)
        check_range("lr", self.lr, 0.0, 1.0, lo_open=True)
        check_range("penalty", self.penalty, 0.0, None)
        check_range("restart_after", self.restart_after, 1, 1000)
        check_range("confirm", self.confirm, 0, 100)
        check_range("prior_windows", self.prior_windows, 0.0, 1000.0)
        check_range("patterns", self.patterns, 1, 32)
        check_range("shape_windows", self.shape_windows, 0, 100)
        check_range("shapes", self.shapes, 1, 64)


def load_net(config: IntuneConfig, seed: int) -> dqn.QNet:
    """A fresh copy of the pre-trained network (pre-trained now if no weights file exists)."""
    if config.weights is not None:
        path = Path(config.weights)
    else:
        path = Path(str(resources.files("recperf").joinpath(BUNDLED_WEIGHTS)))
    key = str(path)
    if key not in _CACHE:
        if os.path.lexists(check_name(path, "weights")):
            _CACHE[key] = dqn.load(path)[0]
        elif config.pretrain_episodes > 0:
            return dqn.pretrain(config.pretrain_episodes, seed)[0]
        else:
            raise ConfigError(f"{path}: no intune weights (run `recperf ingest pretrain`)")
    return copy.deepcopy(_CACHE[key])


def scores(log: TuneLog, ctx: ienv.Context, prior_windows: float) -> dict[Allocation, float]:
    """Each measured allocation's mean throughput, shrunk toward the cost model's prediction.

    The model (ienv.modelled on the costs averaged over every window, times the median ratio
    of measured to modelled throughput) counts as k windows, k = noise variance / model-error
    variance (empirical Bayes on log throughput, robust to outliers, at most ``prior_windows``;
    no weight until some allocation was measured twice): an exact model outweighs a few noisy
    windows, a poor one (the allocations' means spread around it beyond the noise) barely
    counts."""
    groups: dict[tuple[int, ...], list[float]] = {}
    for m in log.measurements:
        groups.setdefault(m.allocation.workers, []).append(
            exact.log1(max(m.throughput_rows_per_s, 1e-9))
        )
    means = {w: float(np.mean(v)) for w, v in groups.items()}
    k = 0.0
    costs = measured_costs(log.measurements)
    if prior_windows > 0 and all(c > 0 and math.isfinite(c) for c in costs):
        pred = {w: exact.log1(max(ienv.modelled(ctx, w, costs), 1e-9)) for w in groups}
        shift = float(np.median([y - pred[w] for w, v in groups.items() for y in v]))
        dof = sum(len(v) - 1 for v in groups.values())
        noise = sum(float(np.sum((np.array(v) - means[w]) ** 2)) for w, v in groups.items())
        if dof > 0:
            var = noise / dof
            # beyond-noise squared residuals; their median / 0.455 (the median of chi2_1)
            # estimates the model's error variance without being led by one lucky window
            resid = {w: means[w] - pred[w] - shift for w in groups}
            excess = [resid[w] * resid[w] - var / len(v) for w, v in groups.items()]
            model_var = max(float(np.median(excess)) / 0.455, 1e-12)
            k = min(prior_windows, var / model_var)
        for w, v in groups.items():
            means[w] = (len(v) * means[w] + k * (pred[w] + shift)) / (len(v) + k)
    return {Allocation(workers=w): exact.exp1(x) for w, x in means.items()}


def ranked(log: TuneLog, ctx: ienv.Context, prior_windows: float) -> list[Allocation]:
    """Measured allocations, best ``scores`` first (ties: fewer workers)."""
    sc = scores(log, ctx, prior_windows)
    return sorted(sc, key=lambda a: (-sc[a], a.total, a.workers))


@TUNERS.register("intune")
class Intune:
    """Masked epsilon-greedy DQN over the IngestEnv action space, fine-tuned while it tunes."""

    name: str = "intune"
    Config = IntuneConfig

    def __init__(self, config: IntuneConfig | None = None) -> None:
        self.config = config or IntuneConfig()

    def tune(self, target: Target, budget_s: float, seed: int = 0) -> TuneResult:
        return self._tune(target, budget_s, seed)

    def _confirm(self, log: TuneLog, ctx: ienv.Context) -> Allocation:
        """Spend the remaining windows re-measuring the current top two allocations; the
        final choice."""
        prior = self.config.prior_windows
        while log.can_measure():
            top = ranked(log, ctx, prior)[:2]
            counts = [log.count(a) for a in top]
            if log.measure(top[counts.index(min(counts))]) is None:
                break
        return ranked(log, ctx, prior)[0]

    def _choose_cuts(self, log: TuneLog) -> tuple[int, ...] | None:
        """Measure the modelled optima of the best ``patterns`` cut patterns under the cost
        model of what was measured so far; the cuts of the best measured one."""
        target = log.target
        spec = measured_spec(target, log.measurements, name="intune")
        limit = ienv.max_total(target.cores, len(target.stage_names))
        tried = []
        for opt in pattern_optima(spec, worker_limit=limit)[: self.config.patterns]:
            if log.fits_memory(opt.allocation) and log.measure(opt.allocation) is not None:
                tried.append(opt.allocation)
        if not tried:
            return log.best().cuts
        return max(tried, key=log.mean_throughput).cuts

    def _tune(self, target: Target, budget_s: float, seed: int) -> TuneResult:
        cfg = self.config
        rng = np.random.default_rng(seed)
        log = TuneLog(target, budget_s, cfg.window_s)
        if log.measure(even_split(target)) is None:
            return log.result(self.name)
        view = SegmentTarget(target, self._choose_cuts(log))
        shaping = threaded(target) or inflight_options(target) != (0,)
        keep = cfg.shape_windows * log.window_s if shaping else 0.0
        left = budget_s - log.spent_s() - keep
        if left < log.window_s * (1 - 1e-9):
            return log.result(self.name)
        vlog = TuneLog(view, left, cfg.window_s)
        for m in log.measurements:  # what the pattern choice measured at these cuts counts too
            if m.allocation.cut_points(len(target.stage_names)) == view.points:
                vlog.adopt(view.fold(m))
        start = max(vlog.measurements, key=lambda m: vlog.mean_throughput(m.allocation))
        result = lift(self.name, view, log, vlog, self._search(vlog, start, rng, seed))
        return self._shape(log, result) if keep else result

    def _shape(self, log: TuneLog, result: TuneResult) -> TuneResult:
        """The last stage on ``log``'s target after the agent chose ``result``: measure the
        choice again, a GIL probe if no window measured one yet, the measured model's best
        ``shapes`` thread shapes at the choice's cuts, then the in-flight options of the best;
        confirm the top two with what is left; keep the best measured mean of this stage (all
        measured in the same stretch)."""
        target = log.target
        slog = TuneLog(target, log.budget_s - log.spent_s(), self.config.window_s)
        if not slog.can_measure():
            return result
        slog.measure(result.allocation)
        probe_gil(slog)
        model = measured_spec(target, [*log.measurements, *slog.measurements], name="intune")
        limit = ienv.max_total(target.cores, len(target.stage_names))
        fresh = [a for _, a in shape_optima(model, result.allocation.cuts, limit)
                 if not slog.count(a) and slog.fits_memory(a)]  # fmt: skip
        for alloc in fresh[: self.config.shapes]:
            slog.measure(alloc)
        if not slog.history:
            return result
        best = pick_inflight(slog, slog.best())
        while slog.can_measure():  # the rest confirms the top two, as the agent's last windows
            seen = dict.fromkeys(st.allocation for st in slog.history)
            top = sorted(seen, key=slog.mean_throughput)[-2:]
            if slog.measure(min(top, key=slog.count)) is None:
                break
            best = slog.best()
        chosen = best
        steps = (*result.history, *slog.history)
        last = [s for s in steps if s.allocation == chosen]
        return dataclasses.replace(
            result,
            allocation=chosen,
            throughput_rows_per_s=last[-1].throughput_rows_per_s,
            history=steps,
            refused=result.refused + slog.refused,
            tuning_s=log.spent_s(),
        )

    def _search(
        self, log: TuneLog, start: Measurement, rng: np.random.Generator, seed: int
    ) -> Allocation:
        """The DQN's online episode(s) on ``log``'s target from ``start``; the final choice."""
        cfg = self.config
        agent = _Online(cfg, log, dqn.Learner(dqn.DQNConfig(lr=cfg.lr), rng, load_net(cfg, seed)))
        agent.reset(start)
        refusals = stale = 0
        best = log.best()
        explore_s = log.budget_s - cfg.confirm * log.window_s
        while log.spent_s() + log.window_s <= explore_s + 1e-9 and refusals < 3:
            eps = cfg.epsilon * max(0.0, 1 - log.spent_s() / log.budget_s)
            if stale >= cfg.restart_after and best != agent.m.allocation:
                jumped = log.measure(best)  # a new online episode, from the best so far
                if jumped is not None:
                    agent.reset(jumped)
            else:
                explore = stale >= cfg.restart_after or rng.random() < eps
                refusals = 0 if agent.step(explore) else refusals + 1
            stale = 0 if stale >= cfg.restart_after else stale
            now = log.best()
            stale = 0 if now != best else stale + 1
            best = now
        return self._confirm(log, agent.ctx)


class _Online:
    """The agent's view of the target during online fine-tuning: last measurement,
    observation, mask, and the learner it feeds transitions to."""

    def __init__(self, cfg: IntuneConfig, log: TuneLog, learner: dqn.Learner) -> None:
        self.cfg = cfg
        self.log = log
        self.learner = learner
        self.ctx = ienv.Context.of(log.target)

    def reset(self, m: Measurement) -> None:
        self.m = m
        # per-row costs are properties of the stages, not of the allocation: averaging the
        # recent windows (as the env does) keeps the re-fits steady under measurement noise
        self.costs = measured_costs(self.log.measurements[-ienv.COST_WINDOW :])
        self.bound = self.ctx.bound(self.costs)
        self.obs = ienv.observe(self.ctx, m, self.bound, self.costs)
        self.mask = ienv.action_mask(self.ctx, m.allocation.workers, self.costs)

    def step(self, explore: bool) -> bool:
        """One masked epsilon-greedy action, measured and learned from; False if refused."""
        if explore:
            a = int(self.learner.rng.choice(np.flatnonzero(self.mask)))
        else:
            a = self.learner.act_greedy(self.obs, self.mask)
        new = ienv.apply(self.ctx, self.m.allocation.workers, a, self.costs)
        m2 = None if new is None else self.log.measure(Allocation(workers=new))
        obs = self.obs
        if m2 is not None:
            self.reset(m2)
        r = ienv.reward(self.m, self.bound, self.ctx, m2 is None, self.cfg.penalty)
        self.learner.add(obs, a, r, self.obs, self.mask)
        for _ in range(self.cfg.updates_per_step):
            self.learner.update()
        return m2 is not None
