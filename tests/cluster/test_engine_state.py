"""The engine's running state lives in one typed ``RunState``: the Simulator creates every
attribute it has in ``__init__``, the state takes no attribute it does not declare, and a second
``run()`` starts from a fresh state (the same outcome, byte for byte)."""

from __future__ import annotations

import ast
import dataclasses
import inspect

import numpy as np
import pytest

from recperf.cluster import engine
from recperf.cluster.engine import Simulator
from recperf.cluster.engine_state import RunState
from recperf.cluster.outcome import EngineConfig
from recperf.cluster.placement import BestFit
from recperf.cluster.schedulers.tiresias import Tiresias
from recperf.cluster.topology import Cluster
from recperf.cluster.traces.synthetic import SyntheticConfig, SyntheticTrace

CLUSTER = Cluster(name="t-16", racks=2, machines_per_rack=2, gpus_per_machine=4)


def assigned_attributes(method: ast.FunctionDef) -> set[str]:
    """Names ``X`` of every ``self.X = ...``, ``self.X += ...`` or ``self.X: T = ...`` (also
    in tuple targets) in ``method``."""
    names: set[str] = set()
    for node in ast.walk(method):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets += t.elts
            elif isinstance(t, ast.Starred):
                targets.append(t.value)
            elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                names |= {t.attr} if t.value.id == "self" else set()  # not self.st.x: a field
    return names


def test_simulator_creates_its_attributes_only_in_init() -> None:
    tree = ast.parse(inspect.getsource(engine))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Simulator")
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    in_init = assigned_attributes(methods.pop("__init__"))
    elsewhere = {name: assigned_attributes(m) for name, m in methods.items()}
    created = {name: attrs - in_init for name, attrs in elsewhere.items() if attrs - in_init}
    assert created == {}
    # what methods do assign to the Simulator itself: only run() swapping in a fresh state
    assert {name: attrs for name, attrs in elsewhere.items() if attrs} == {"run": {"st", "ran"}}
    assert "st" in in_init and len(in_init) < 16  # the per-job arrays live in RunState


def test_run_state_takes_no_undeclared_attribute() -> None:
    state = RunState(3, CLUSTER, np.ones(3))
    assert not hasattr(state, "__dict__")
    with pytest.raises(AttributeError):
        state.n_activ = 1  # type: ignore[attr-defined]  # a typo fails instead of adding one
    fields = {f.name for f in dataclasses.fields(RunState)}
    assert {"state", "free", "queue", "events", "decisions", "segments"} <= fields
    assert state.free.tolist() == [4, 4, 4, 4] and state.free_total == 16
    assert not state.free_view.flags.writeable and not state.any_level.flags.writeable


def test_a_second_run_starts_from_a_fresh_state() -> None:
    cfg = SyntheticConfig(jobs=40, load=1.2, gpus_per_job="1:0.5,2:0.3,8:0.2")
    jobs = SyntheticTrace(cfg).load(None, CLUSTER, np.random.default_rng(1))
    engine_cfg = EngineConfig(checkpoint_s=5.0, restore_s=5.0, record_segments=True)
    sim = Simulator(jobs, CLUSTER, Tiresias(), BestFit(), engine_cfg, seed=1)
    first_state = sim.st
    first = sim.run()
    assert sim.st is first_state  # the first run uses the state built in __init__
    second = sim.run()
    assert sim.st is not first_state and first.events == second.events > 0
    for name in ("first_start_s", "finish_s", "run_s", "progress_s", "preemptions", "busy_t"):
        assert np.array_equal(getattr(first, name), getattr(second, name)), name
    assert first.segments == second.segments
    assert int(first.preemptions.sum()) > 0  # the preemption paths were exercised
