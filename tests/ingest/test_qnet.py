"""intune's exact numpy Q-network: forward, backward, Huber loss and Adam against torch on the
same float64 weights, its weights file, and the same bits without the CPU's SIMD features."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recperf.core.errors import ConfigError
from recperf.ingest.sim import env as ienv
from recperf.ingest.tuners import dqn
from recperf.ingest.tuners.qnet import Adam, QNet, huber, layout, load, matmul, save


def batch(seed: int, n: int = 6, share: float = 0.3) -> tuple[QNet, np.ndarray, np.ndarray]:
    """A random network, ``n`` random observations and a mask allowing ~``share`` of actions."""
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-1.0, 2.0, (n, ienv.OBS_SIZE)).astype(np.float32)
    mask = rng.random((n, ienv.N_ACTIONS)) < share
    return QNet.init(rng), obs, mask


def torch_mlp(net: QNet) -> list[torch.nn.Linear]:
    """torch's Linear-ReLU-Linear-ReLU-Linear with the same float64 weights."""
    layers = [torch.nn.Linear(*s).double() for s in ((layout().width, 32), (32, 32), (32, 1))]
    with torch.no_grad():
        for i, layer in enumerate(layers, 1):
            layer.weight.copy_(torch.from_numpy(net.params[f"w{i}"].T))
            layer.bias.copy_(torch.from_numpy(net.params[f"b{i}"]))
    return layers


def run_mlp(layers: list[torch.nn.Linear], x: torch.Tensor) -> torch.Tensor:
    for layer in layers[:-1]:
        x = torch.relu(layer(x))
    out: torch.Tensor = layers[-1](x)[:, 0]
    return out


@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=9))
@settings(max_examples=30, deadline=None)
def test_matmul_sums_each_product_in_index_order(row: list[float]) -> None:
    a = np.array([row, row[::-1]])
    b = np.linspace(-1.5, 2.5, len(row) * 3).reshape(len(row), 3)
    for i in range(2):
        for j in range(3):
            want = a[i, 0] * b[0, j]
            for k in range(1, len(row)):
                want += a[i, k] * b[k, j]
            assert matmul(a, b)[i, j] == want


def test_forward_and_backward_match_torch_autograd() -> None:
    net, obs, mask = batch(1)
    rows, acts = np.nonzero(mask)
    x = torch.from_numpy(net.inputs(obs, rows, acts).T.copy())
    layers = torch_mlp(net)
    want = run_mlp(layers, x)
    q, cache = net.forward(obs, rows, acts)
    np.testing.assert_allclose(q, want.detach().numpy(), rtol=0, atol=1e-12)
    dq = np.random.default_rng(2).standard_normal(len(rows))
    (want * torch.from_numpy(dq)).sum().backward()  # type: ignore[no-untyped-call]
    grads = net.backward(cache, dq)
    for i, layer in enumerate(layers, 1):
        assert layer.weight.grad is not None and layer.bias.grad is not None
        np.testing.assert_allclose(grads[f"w{i}"], layer.weight.grad.numpy().T, atol=1e-9)
        np.testing.assert_allclose(grads[f"b{i}"], layer.bias.grad.numpy(), atol=1e-9)


def test_a_rows_q_does_not_depend_on_the_other_rows() -> None:
    net, obs, mask = batch(3)
    full = net.masked(obs, np.ones_like(mask))
    some = net.masked(obs, mask)
    assert np.array_equal(some[mask], full[mask])
    assert np.all(some[~mask] == -np.inf)


def test_huber_matches_torch_smooth_l1() -> None:
    q = np.array([0.2, -3.0, 1.0, 4.5, -0.7, 0.0])
    y = np.array([0.0, 0.5, 0.0, 1.0, -0.2, 2.0])
    tq = torch.from_numpy(q).requires_grad_()
    want = torch.nn.functional.smooth_l1_loss(tq, torch.from_numpy(y))
    want.backward()  # type: ignore[no-untyped-call]
    loss, dq = huber(q, y)
    assert loss == pytest.approx(float(want.detach()), abs=1e-15)
    assert tq.grad is not None
    np.testing.assert_allclose(dq, tq.grad.numpy(), atol=1e-15)


def test_adam_matches_torch_adam() -> None:
    net, _, _ = batch(4)
    params = {n: torch.from_numpy(p.copy()).requires_grad_() for n, p in net.params.items()}
    opt = torch.optim.Adam(params.values(), lr=1e-3)
    ours = Adam(net.params, lr=1e-3)
    rng = np.random.default_rng(5)
    for _ in range(30):
        grads = {n: rng.standard_normal(p.shape) for n, p in net.params.items()}
        for n, p in params.items():
            p.grad = torch.from_numpy(grads[n])
        opt.step()
        ours.step(grads)
    for n, p in params.items():
        np.testing.assert_allclose(net.params[n], p.detach().numpy(), rtol=0, atol=1e-12)


def test_weights_file_round_trips_exactly(tmp_path: Path) -> None:
    net, _, _ = batch(6)
    path = tmp_path / "w.npz"
    save(net, {"episodes": 3, "command": "x"}, path)
    back, meta = load(path)
    assert back.digest() == net.digest()
    assert meta == {"episodes": 3, "command": "x"}
    np.load(path, allow_pickle=False).close()  # plain arrays only


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"w1": np.zeros((3, 3))}, "w1 must be float"),
        ({"b2": np.full(32, np.nan)}, "b2 holds a NaN"),
        ({"meta": np.array("[1]")}, "meta is not a JSON object"),
        ({"w3": None}, "cannot load intune weights"),  # an archive without w3 (as a torch .pt)
        (None, "cannot load intune weights"),  # not an archive at all
    ],
)
def test_bad_weights_files_are_one_line(
    tmp_path: Path, change: dict[str, Any] | None, match: str
) -> None:
    path = tmp_path / "w.npz"
    if change is None:
        path.write_bytes(b"not a weights file")
    else:
        arrays = {**batch(7)[0].params, "meta": np.array("{}"), **change}
        with open(path, "wb") as f:
            np.savez(f, **{k: v for k, v in arrays.items() if v is not None})
    with pytest.raises(ConfigError, match=match) as err:
        load(path)
    assert "\n" not in str(err.value)


def test_the_bundled_weights_load_and_choose_an_allowed_action() -> None:
    from importlib import resources

    from recperf.ingest.tuners.intune import BUNDLED_WEIGHTS

    net, meta = load(Path(str(resources.files("recperf").joinpath(BUNDLED_WEIGHTS))))
    assert meta["weights_sha256"] == net.digest()
    _, obs, mask = batch(8, n=1)
    learner = dqn.Learner(dqn.DQNConfig(), np.random.default_rng(0), net)
    assert mask[0, learner.act_greedy(obs[0], mask[0])]
