"""The DQN behind ``intune``: a Q-network (``qnet``, exact on any CPU) that scores every
(source, destination, kind) action from the two stages' features, a replay buffer, double-DQN
updates with a target network, and pre-training on random simulated pipelines."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from recperf.core.config import check_range, check_seed
from recperf.ingest.sim import env as ienv
from recperf.ingest.tuners.qnet import Adam, huber
from recperf.ingest.tuners.qnet import QNet as QNet
from recperf.ingest.tuners.qnet import load as load
from recperf.ingest.tuners.qnet import save as save


@dataclass(kw_only=True, slots=True, frozen=True)
class DQNConfig:
    """Learning hyper-parameters shared by pre-training and online fine-tuning."""

    gamma: float = 0.9
    """Discount of future rewards, [0, 1)."""
    lr: float = 1e-3
    """Adam learning rate, (0, 1]."""
    batch: int = 32
    """Transitions per gradient step (1..4096)."""
    buffer: int = 20000
    """Replay buffer capacity (1..10^7)."""
    target_every: int = 200
    """Gradient steps between target-network syncs (1..10^6)."""

    def __post_init__(self) -> None:
        check_range("gamma", self.gamma, 0.0, 0.999)
        check_range("lr", self.lr, 0.0, 1.0, lo_open=True)
        check_range("batch", self.batch, 1, 4096)
        check_range("buffer", self.buffer, 1, 10**7)
        check_range("target_every", self.target_every, 1, 10**6)


class Learner:
    """Replay buffer, online and target networks, masked double-DQN updates."""

    def __init__(self, config: DQNConfig, rng: np.random.Generator, net: QNet) -> None:
        self.config = config
        self.rng = rng
        self.net = net
        self.target = net.copy()
        self.opt = Adam(net.params, lr=config.lr)
        cap, o = config.buffer, ienv.OBS_SIZE
        self.obs = np.zeros((cap, o), np.float32)
        self.next_obs = np.zeros((cap, o), np.float32)
        self.next_mask = np.zeros((cap, ienv.N_ACTIONS), bool)
        self.act = np.zeros(cap, np.int64)
        self.rew = np.zeros(cap, np.float64)
        self.size = self.pos = self.updates = 0

    def add(self, o: np.ndarray, a: int, r: float, o2: np.ndarray, mask2: np.ndarray) -> None:
        i = self.pos
        self.obs[i], self.act[i], self.rew[i], self.next_obs[i] = o, a, r, o2
        self.next_mask[i] = mask2.astype(bool)
        self.pos = (i + 1) % self.config.buffer
        self.size = min(self.size + 1, self.config.buffer)

    def act_greedy(self, o: np.ndarray, mask: np.ndarray) -> int:
        """The allowed action of highest Q (the first of equals; action 0 if none is allowed)."""
        return int(np.argmax(self.net.masked(o[None], mask[None].astype(bool))[0]))

    def update(self) -> float:
        """One Adam step on the Huber loss of a replayed batch against its double-DQN target
        (the online network picks the next action, the target network scores it)."""
        if self.size < min(self.config.batch, 16):
            return 0.0
        idx = self.rng.integers(0, self.size, min(self.config.batch, self.size))
        o, o2 = self.obs[idx], self.next_obs[idx]
        rows = np.arange(len(idx))
        best = np.argmax(self.net.masked(o2, self.next_mask[idx]), axis=1)
        y = self.rew[idx] + self.config.gamma * self.target.q(o2, rows, best)
        q, cache = self.net.forward(o, rows, self.act[idx])
        loss, dq = huber(q, y)
        self.opt.step(self.net.backward(cache, dq))
        self.updates += 1
        if self.updates % self.config.target_every == 0:
            self.target = self.net.copy()
        return loss


def pretrain(
    episodes: int,
    seed: int = 0,
    *,
    episode_steps: int = 48,
    config: DQNConfig | None = None,
    eps_start: float = 1.0,
    eps_end: float = 0.05,
) -> tuple[QNet, dict[str, Any]]:
    """Train a QNet from scratch on ``episodes`` random simulated pipelines (seeded: the
    initial weights, pipelines and exploration all come from one generator)."""
    check_range("episodes", episodes, 1, 10**6)
    check_seed(seed)
    config = config or DQNConfig()
    rng = np.random.default_rng(seed)
    learner = Learner(config, rng, QNet.init(rng))
    env = ienv.IngestEnv(None, episode_steps=episode_steps)
    t0 = time.perf_counter()
    finals = []
    for ep in range(episodes):
        eps = eps_end + (eps_start - eps_end) * max(0.0, 1 - ep / max(1, 0.7 * episodes))
        o, info = env.reset(seed=int(rng.integers(2**31)))
        done = False
        while not done:
            mask = info["action_mask"]
            if rng.random() < eps:
                a = int(rng.choice(np.flatnonzero(mask)))
            else:
                a = learner.act_greedy(o, mask)
            o2, r, term, trunc, info = env.step(a)
            learner.add(o, a, r, o2, info["action_mask"])
            learner.update()
            o, done = o2, term or trunc
        finals.append(info["throughput_rows_per_s"] / info["lp_bound_rows_per_s"])
    meta = {
        "episodes": episodes,
        "seed": seed,
        "episode_steps": episode_steps,
        "wall_s": time.perf_counter() - t0,
        "final_fraction_last100": math.fsum(finals[-100:]) / len(finals[-100:]),
        "weights_sha256": learner.net.digest(),
    }
    return learner.net, meta
