"""intune's Q-network in exact numpy: a float64 MLP (Linear-ReLU-Linear-ReLU-Linear) with a
hand-written forward, backward and Adam whose every bit is the same on any CPU.

BLAS, torch and numpy's SIMD kernels choose their summation order (and transcendental
approximations) by CPU, so only elementwise IEEE operations (+ - * / sqrt, maximum, where,
comparisons) are used here, each product summed over its inner index in index order
(``matmul``), and scalar sums go through ``math.fsum`` (correctly rounded)."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recperf.core.errors import ConfigError
from recperf.core.files import check_present
from recperf.ingest.sim import env as ienv

HIDDEN = 32


@dataclass(frozen=True, slots=True)
class Layout:
    """The MLP's input layout, from the env's observation and action space (read on first use:
    the env module imports the tuners, so it is only partly loaded while this one is)."""

    sf: int
    """Features per stage."""
    gf: int
    """Global features."""
    shapes: dict[str, tuple[int, ...]]
    """Weight name -> shape, in the order of the weights' digest."""
    src: np.ndarray
    """Per action: its source stage (MAX_STAGES, the all-zero pad row, if none)."""
    dst: np.ndarray
    """Per action: its destination stage (likewise)."""
    kind: np.ndarray
    """Per action: its kind's index into the input's one-hot part (the last len(KINDS))."""

    @property
    def width(self) -> int:
        return self.shapes["w1"][0]

    def parts(self) -> tuple[slice, slice, slice, slice]:
        """Input columns of the source stage, destination stage, globals and one-hot kind."""
        sf, gf = self.sf, self.gf
        return slice(0, sf), slice(sf, 2 * sf), slice(2 * sf, 2 * sf + gf), slice(2 * sf + gf, None)


@functools.cache
def layout() -> Layout:
    width = 2 * ienv.STAGE_FEATURES + ienv.GLOBAL_FEATURES + len(ienv.KINDS)
    shapes = {
        "w1": (width, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, HIDDEN), "b2": (HIDDEN,),
        "w3": (HIDDEN, 1), "b3": (1,),
    }  # fmt: skip
    pad = ienv.MAX_STAGES
    return Layout(
        sf=ienv.STAGE_FEATURES,
        gf=ienv.GLOBAL_FEATURES,
        shapes=shapes,
        src=np.array([i if i >= 0 else pad for _, i, _ in ienv.ACTIONS]),
        dst=np.array([j if j >= 0 else pad for _, _, j in ienv.ACTIONS]),
        kind=np.array([k for k, _, _ in ienv.ACTIONS]) + width - len(ienv.KINDS),
    )


Params = dict[str, np.ndarray]


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` summed over the inner index in index order by elementwise float64 operations:
    the same bits on every CPU (BLAS blocks and vectorises the sum differently per CPU)."""
    out: np.ndarray = a[:, :1] * b[:1]
    tmp = np.empty_like(out)
    for k in range(1, a.shape[1]):
        np.multiply(a[:, k : k + 1], b[k : k + 1], out=tmp)
        out += tmp
    return out


def row_sums(a: np.ndarray) -> np.ndarray:
    """Each row's sum, in index order (``matmul`` by a column of ones; x * 1 is exact)."""
    out: np.ndarray = matmul(a, np.ones((a.shape[1], 1)))[:, 0]
    return out


def _stages(obs: np.ndarray) -> np.ndarray:
    """(batch, MAX_STAGES + 1, STAGE_FEATURES) float64 stage features, an all-zero row last."""
    b, n, sf = obs.shape[0], ienv.MAX_STAGES, ienv.STAGE_FEATURES
    pad = np.zeros((b, n + 1, sf))
    pad[:, :-1] = obs[:, : n * sf].reshape(b, n, sf)
    return pad


@dataclass(frozen=True, slots=True)
class Cache:
    """What the backward pass needs of one forward: the rows and the layers' pre-activations
    (feature-major: one column per (observation, action) row)."""

    obs: np.ndarray
    rows: np.ndarray
    acts: np.ndarray
    pre1: np.ndarray
    pre2: np.ndarray
    h1: np.ndarray
    h2: np.ndarray


class QNet:
    """Q(s, a) = MLP(features of a's source stage, of its destination, globals, a's kind):
    one shared scorer for all actions, so it generalises across stage counts and slots.
    Weights are ``x @ w + b`` float64 arrays of the shapes in ``layout().shapes``."""

    def __init__(self, params: Params) -> None:
        shapes = layout().shapes
        if set(params) != set(shapes):
            raise ConfigError(f"intune weights: expected arrays {sorted(shapes)}")
        for name, shape in shapes.items():
            p = params[name]
            if p.shape != shape or not np.issubdtype(p.dtype, np.floating):
                raise ConfigError(f"intune weights: {name} must be float {shape}, got {p.shape}")
            if not np.isfinite(p).all():
                raise ConfigError(f"intune weights: {name} holds a NaN or infinity")
        self.params = {name: np.array(params[name], np.float64) for name in shapes}

    @classmethod
    def init(cls, rng: np.random.Generator) -> QNet:
        """torch.nn.Linear's initialisation: weights and biases ~ U(+-1/sqrt(fan_in))."""
        params = {}
        shapes = layout().shapes
        for name, shape in shapes.items():
            fan_in = shapes["w" + name[1:]][0]
            bound = 1.0 / math.sqrt(fan_in)
            params[name] = rng.uniform(-bound, bound, shape)
        return cls(params)

    def copy(self) -> QNet:
        return QNet({name: p.copy() for name, p in self.params.items()})

    def digest(self) -> str:
        """SHA-256 of the weights' bytes, in ``layout().shapes`` order."""
        h = hashlib.sha256()
        for name in layout().shapes:
            h.update(self.params[name].tobytes())
        return h.hexdigest()

    def forward(
        self, obs: np.ndarray, rows: np.ndarray, acts: np.ndarray
    ) -> tuple[np.ndarray, Cache]:
        """Q of action ``acts[i]`` in observation ``obs[rows[i]]``, and the backward's cache.

        The first layer is summed per part (source, destination, globals, kind), each part
        once per stage or observation and then gathered, not once per action."""
        lay, p = layout(), self.params
        src, dst, glob, _ = lay.parts()
        w1 = p["w1"]
        stages = _stages(obs).reshape(-1, lay.sf).T  # (features, batch * (MAX_STAGES + 1))
        slot = rows * (ienv.MAX_STAGES + 1)
        pre1 = matmul(w1[src].T, stages)[:, slot + lay.src[acts]]
        pre1 += matmul(w1[dst].T, stages)[:, slot + lay.dst[acts]]
        pre1 += matmul(w1[glob].T, obs[:, -lay.gf :].astype(np.float64).T)[:, rows]
        pre1 += w1[lay.kind[acts]].T  # one-hot @ w1: the kind's row of w1, exactly
        pre1 += p["b1"][:, None]
        h1 = np.maximum(pre1, 0.0)
        pre2 = matmul(p["w2"].T, h1) + p["b2"][:, None]
        h2 = np.maximum(pre2, 0.0)
        q = matmul(p["w3"].T, h2)[0] + p["b3"][0]
        return q, Cache(obs, rows, acts, pre1, pre2, h1, h2)

    def q(self, obs: np.ndarray, rows: np.ndarray, acts: np.ndarray) -> np.ndarray:
        return self.forward(obs, rows, acts)[0]

    def masked(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(batch, N_ACTIONS) Q-values of the allowed actions, -inf elsewhere."""
        rows, acts = np.nonzero(mask)
        out = np.full(mask.shape, -np.inf)
        out[rows, acts] = self.q(obs, rows, acts)
        return out

    def inputs(self, obs: np.ndarray, rows: np.ndarray, acts: np.ndarray) -> np.ndarray:
        """(width, rows) the MLP's input, one column per (observation, action) row."""
        lay = layout()
        src, dst, glob, _ = lay.parts()
        stages = _stages(obs)
        x = np.zeros((len(rows), lay.width))
        x[:, src] = stages[rows, lay.src[acts]]
        x[:, dst] = stages[rows, lay.dst[acts]]
        x[:, glob] = obs[rows, -lay.gf :]
        x[np.arange(len(rows)), lay.kind[acts]] = 1.0
        return x.T

    def backward(self, cache: Cache, dq: np.ndarray) -> Params:
        """Gradients of sum(dq * q) with respect to every weight (torch's ReLU rule: no
        gradient where the pre-activation is <= 0)."""
        p = self.params
        d3 = dq[None, :]
        d2 = np.where(cache.pre2 > 0, matmul(p["w3"], d3), 0.0)
        d1 = np.where(cache.pre1 > 0, matmul(p["w2"], d2), 0.0)
        x = self.inputs(cache.obs, cache.rows, cache.acts)
        return {
            "w1": matmul(x, d1.T), "b1": row_sums(d1),
            "w2": matmul(cache.h1, d2.T), "b2": row_sums(d2),
            "w3": matmul(cache.h2, d3.T), "b3": row_sums(d3),
        }  # fmt: skip


def huber(q: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean smooth-L1 (Huber, beta 1) loss of q against y, and its gradient in q."""
    d = q - y
    a = np.abs(d)
    small = a < 1.0
    loss = math.fsum(np.where(small, 0.5 * d * d, a - 0.5).tolist()) / len(d)
    return loss, np.where(small, d, np.sign(d)) / len(d)


class Adam:
    """torch.optim.Adam's update (no weight decay, no amsgrad), its bias corrections kept as
    running products rather than ``beta ** t`` (libm's pow is not the same on every CPU)."""

    def __init__(
        self,
        params: Params,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.params = params
        self.lr, self.betas, self.eps = lr, betas, eps
        self.m = {n: np.zeros_like(p) for n, p in params.items()}
        self.v = {n: np.zeros_like(p) for n, p in params.items()}
        self.beta_t = [1.0, 1.0]
        self.steps = 0

    def step(self, grads: Params) -> None:
        """One update of every parameter in place."""
        b1, b2 = self.betas
        self.steps += 1
        self.beta_t = [self.beta_t[0] * b1, self.beta_t[1] * b2]
        step_size = self.lr / (1.0 - self.beta_t[0])
        root2 = math.sqrt(1.0 - self.beta_t[1])
        for name, p in self.params.items():
            g = grads[name]
            m = self.m[name] = self.m[name] * b1 + g * (1.0 - b1)
            v = self.v[name] = self.v[name] * b2 + (g * g) * (1.0 - b2)
            p -= step_size * (m / (np.sqrt(v) / root2 + self.eps))


def save(net: QNet, meta: dict[str, Any], path: str | Path) -> None:
    """Weights and ``meta`` (as a JSON string) in an .npz archive, loadable without pickle."""
    arrays: dict[str, Any] = {**net.params, "meta": np.array(json.dumps(meta, sort_keys=True))}
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load(path: str | Path) -> tuple[QNet, dict[str, Any]]:
    """Load weights saved by ``save``; a missing or bad file is a one-line ConfigError."""
    check_present(path, "intune weights")
    try:
        with np.load(path, allow_pickle=False) as blob:
            params = {name: blob[name] for name in layout().shapes}
            meta = json.loads(str(blob["meta"][()]))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{path}: cannot load intune weights: {exc}") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{path}: cannot load intune weights: meta is not a JSON object")
    try:
        return QNet(params), meta
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
