"""Digests of every seeded computation that reaches a result, printed as one JSON object; run
by tests/core/test_exact.py in fresh interpreters with and without the CPU's SIMD paths.
Keys starting with ``control:`` are computed with numpy's own kernels, to show the switch
works; every other key must not depend on the CPU."""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.hexdigest()[:16]


def files(folder: Path) -> str:
    """One digest over the bytes of every file under ``folder``, by relative name."""
    return sha(*(p.relative_to(folder).as_posix().encode() + p.read_bytes()
                 for p in sorted(folder.rglob("*")) if p.is_file()))  # fmt: skip


def core() -> dict[str, str]:
    from recperf.core import exact

    x = np.random.default_rng(1).uniform(-700.0, 700.0, 50_000)
    rng = np.random.default_rng(2)
    return {
        "exact.exp": sha(exact.exp(x).tobytes()),
        "exact.log": sha(exact.log(np.abs(x)).tobytes()),
        "exact.power": sha(exact.power(np.abs(x), -1.1).tobytes()),
        "exact.draws": sha(
            exact.normal(rng, 0, 1, 5000).tobytes(), exact.exponential(rng, 2.0, 5000).tobytes()
        ),
        "control:np.exp": sha(np.exp(x).tobytes()),
    }


def cluster(tmp: Path) -> dict[str, str]:
    from recperf.cluster import api
    from recperf.cluster.outcome import EngineConfig
    from recperf.cluster.traces.synthetic import SyntheticConfig

    out: dict[str, str] = {}
    for dist, scheduler in (("lognormal", "tiresias"), ("exp", "netsens")):
        syn = SyntheticConfig(jobs=400, load=0.9, duration_dist=dist)
        spec = api.RunSpec(
            trace="synthetic", scheduler=scheduler, cluster="tiresias-n32g4", synthetic=syn,
            seed=4, engine=EngineConfig(congestion=2.0),
        )  # fmt: skip
        folder = tmp / f"cluster-{dist}"
        api.write_run(folder, spec, api.simulate(spec))
        out[f"cluster:{dist}:{scheduler}"] = sha(
            (folder / "summary.json").read_bytes(), (folder / "jobs.parquet").read_bytes()
        )
    jitter = api.RunSpec(trace="tiresias-60", scheduler="srtf", jitter_s=600.0, seed=9)
    folder = tmp / "cluster-jitter"
    api.write_run(folder, jitter, api.simulate(jitter))
    out["cluster:jitter"] = sha((folder / "summary.json").read_bytes())
    return out


def ingest(tmp: Path) -> dict[str, str]:
    from recperf.ingest.data.criteo import GenerateConfig, generate
    from recperf.ingest.sim import env as ienv
    from recperf.ingest.tuners import dqn
    from recperf.ingest.tuning import simulate

    out: dict[str, str] = {}
    for tuner in ("intune", "autotune", "plumber"):
        doc = simulate("udf-64", tuner, seed=3, budget_s=40.0, noise=0.05)
        out[f"ingest:simulate:{tuner}"] = sha(json.dumps(doc, sort_keys=True).encode())
    doc = simulate("membound-128", "oracle", seed=1, budget_s=5.0)
    out["ingest:simulate:membound-oracle"] = sha(json.dumps(doc, sort_keys=True).encode())
    net, _ = dqn.pretrain(2, 7, episode_steps=24)  # the Q-network's forward, backward, Adam
    rng = np.random.default_rng(9)
    obs = rng.uniform(-1.0, 2.0, (4, ienv.OBS_SIZE)).astype(np.float32)
    mask = rng.random((4, ienv.N_ACTIONS)) < 0.3
    learner = dqn.Learner(dqn.DQNConfig(), rng, net)
    acts = [learner.act_greedy(o, m) for o, m in zip(obs, mask, strict=True)]
    out["ingest:qnet"] = sha(net.digest().encode(), net.masked(obs, mask).tobytes(), bytes(acts))
    specs = [ienv.random_spec(np.random.default_rng(s)) for s in range(20)]
    out["ingest:random_spec"] = sha(repr(specs).encode())
    generate(GenerateConfig(rows=3000, shards=2, seed=7), tmp / "criteo")
    out["ingest:criteo"] = files(tmp / "criteo")
    return out


def embed() -> dict[str, str]:
    from recperf.embed import traces

    return {
        "embed:zipf": sha(traces.zipf(50_000, 20_000, 1.05, 3).numpy().tobytes()),
        "embed:uniform": sha(traces.uniform(50_000, 20_000, 3).numpy().tobytes()),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        doc = {**core(), **cluster(Path(tmp)), **ingest(Path(tmp)), **embed()}
    json.dump(doc, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
