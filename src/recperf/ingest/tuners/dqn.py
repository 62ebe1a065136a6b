"""The DQN behind ``intune``: a Q-network that scores every (source, destination, kind) action
from the two stages' features, a replay buffer, double-DQN updates with a target network, and
pre-training on random simulated pipelines."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from recperf.core.config import check_range, check_seed
from recperf.core.errors import ConfigError
from recperf.ingest.sim import env as ienv

HIDDEN = 32


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread: these tiny batches only lose to thread hand-offs (measured
    10x slower with 2 threads on a busy 2-core host)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class QNet(nn.Module):
    """Q(s, a) = MLP(features of a's source stage, of its destination, globals, a's kind):
    one shared scorer for all actions, so it generalises across stage counts and slots."""

    src: torch.Tensor
    dst: torch.Tensor
    kind: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        src = [i if i >= 0 else ienv.MAX_STAGES for _, i, _ in ienv.ACTIONS]
        dst = [j if j >= 0 else ienv.MAX_STAGES for _, _, j in ienv.ACTIONS]
        kind = torch.zeros(ienv.N_ACTIONS, len(ienv.KINDS))
        for a, (k, _, _) in enumerate(ienv.ACTIONS):
            kind[a, k] = 1.0
        self.register_buffer("src", torch.tensor(src))
        self.register_buffer("dst", torch.tensor(dst))
        self.register_buffer("kind", kind)
        width = 2 * ienv.STAGE_FEATURES + ienv.GLOBAL_FEATURES + len(ienv.KINDS)
        self.mlp = nn.Sequential(
            nn.Linear(width, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
            nn.Linear(HIDDEN, 1),
        )  # fmt: skip

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        b = obs.shape[0]
        stages = obs[:, : ienv.MAX_STAGES * ienv.STAGE_FEATURES].view(
            b, ienv.MAX_STAGES, ienv.STAGE_FEATURES
        )
        pad = torch.cat([stages, stages.new_zeros(b, 1, ienv.STAGE_FEATURES)], dim=1)
        glob = obs[:, -ienv.GLOBAL_FEATURES :].unsqueeze(1).expand(b, ienv.N_ACTIONS, -1)
        kind = self.kind.unsqueeze(0).expand(b, -1, -1)
        x = torch.cat([pad[:, self.src], pad[:, self.dst], glob, kind], dim=2)
        out: torch.Tensor = self.mlp(x).squeeze(2)
        return out


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
        self.target = QNet()
        self.target.load_state_dict(net.state_dict())
        self.opt = torch.optim.Adam(net.parameters(), lr=config.lr)
        cap, o = config.buffer, ienv.OBS_SIZE
        self.obs = np.zeros((cap, o), np.float32)
        self.next_obs = np.zeros((cap, o), np.float32)
        self.next_mask = np.zeros((cap, ienv.N_ACTIONS), bool)
        self.act = np.zeros(cap, np.int64)
        self.rew = np.zeros(cap, np.float32)
        self.size = self.pos = self.updates = 0

    def add(self, o: np.ndarray, a: int, r: float, o2: np.ndarray, mask2: np.ndarray) -> None:
        i = self.pos
        self.obs[i], self.act[i], self.rew[i], self.next_obs[i] = o, a, r, o2
        self.next_mask[i] = mask2.astype(bool)
        self.pos = (i + 1) % self.config.buffer
        self.size = min(self.size + 1, self.config.buffer)

    def act_greedy(self, o: np.ndarray, mask: np.ndarray) -> int:
        with torch.no_grad():
            q = self.net(torch.from_numpy(o[None])).numpy()[0]
        q[~mask.astype(bool)] = -np.inf
        return int(np.argmax(q))

    def update(self) -> float:
        if self.size < min(self.config.batch, 16):
            return 0.0
        idx = self.rng.integers(0, self.size, min(self.config.batch, self.size))
        o, o2 = torch.from_numpy(self.obs[idx]), torch.from_numpy(self.next_obs[idx])
        mask2 = torch.from_numpy(self.next_mask[idx])
        with torch.no_grad():
            best = self.net(o2).masked_fill(~mask2, -1e9).argmax(1, keepdim=True)
            nxt = self.target(o2).gather(1, best).squeeze(1)
            y = torch.from_numpy(self.rew[idx]) + self.config.gamma * nxt
        q = self.net(o).gather(1, torch.from_numpy(self.act[idx])[:, None]).squeeze(1)
        loss = nn.functional.smooth_l1_loss(q, y)
        self.opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self.opt.step()
        self.updates += 1
        if self.updates % self.config.target_every == 0:
            self.target.load_state_dict(self.net.state_dict())
        return float(loss.detach())


def pretrain(
    episodes: int,
    seed: int = 0,
    *,
    episode_steps: int = 48,
    config: DQNConfig | None = None,
    eps_start: float = 1.0,
    eps_end: float = 0.05,
) -> tuple[QNet, dict[str, Any]]:
    """Train a QNet from scratch on ``episodes`` random simulated pipelines (seeded)."""
    check_range("episodes", episodes, 1, 10**6)
    check_seed(seed)
    with one_thread():
        return _pretrain(episodes, seed, episode_steps, config or DQNConfig(), eps_start, eps_end)


def _pretrain(
    episodes: int,
    seed: int,
    episode_steps: int,
    config: DQNConfig,
    eps_start: float,
    eps_end: float,
) -> tuple[QNet, dict[str, Any]]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    learner = Learner(config, rng, QNet())
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
        "final_fraction_last100": float(np.mean(finals[-100:])),
    }
    return learner.net, meta


def save(net: QNet, meta: dict[str, Any], path: str | Path) -> None:
    torch.save({"state_dict": net.state_dict(), "meta": meta}, str(path))


def load(path: str | Path) -> tuple[QNet, dict[str, Any]]:
    """Load weights saved by ``save``; a missing or bad file is a one-line ConfigError."""
    try:
        blob = torch.load(str(path), map_location="cpu", weights_only=True)
        net = QNet()
        net.load_state_dict(blob["state_dict"])
    except (OSError, KeyError, RuntimeError, TypeError) as exc:
        raise ConfigError(f"{path}: cannot load intune weights: {exc}") from None
    return net, dict(blob.get("meta", {}))
