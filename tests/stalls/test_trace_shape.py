"""recperf's own rank traces are Kineto-shaped (contract A): checked field by field and for
strict nesting per thread on a real 2-rank run and on hand-built records, read back by the
analysis in both formats, and, when traceinsight is installed, loaded by Holistic Trace Analysis
with figures that agree with ours."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from recperf.stalls.run import differential, ranktrace, runner
from recperf.stalls.run.hook import ANNOTATION, MAIN_TID, TRACE_FORMAT, IterRecord, Profiler
from recperf.stalls.run.ranktrace import read_rank_run
from recperf.stalls.run.spec import RunSpec
from recperf.stalls.trace import breakdown, kineto

WARMUP, ITERS = 1, 3
PHASES = ["recperf:forward", "recperf:backward", "recperf:optimizer"]
X_FIELDS = {"name": str, "cat": str, "ph": str, "ts": float, "dur": float, "pid": int, "tid": int}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """A tiny real 2-rank DDP run (gloo), a 2 ms sleep in the data iterator."""
    out = tmp_path_factory.mktemp("shape") / "intra"
    spec = RunSpec(name="intra", workload="mlp", workload_options={"features": 8, "hidden": [16]},
                   ranks=2, iters=ITERS, warmup=WARMUP, batch_size=8, delay_ms=2.0)  # fmt: skip
    return out, [json.loads(p.read_text()) for p in runner.launch(spec, out)]


def _x(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def _check_nesting(events: list[dict[str, Any]]) -> dict[int, int | None]:
    """Per thread, spans strictly nested (never partly overlapping, in whole 1/1024 us so no
    rounding hides an overlap); returns each event's parent (by position in ``events``)."""
    parent: dict[int, int | None] = {}
    by_tid: dict[tuple[int, int], list[int]] = defaultdict(list)
    for k, e in enumerate(events):
        by_tid[(e["pid"], e["tid"])].append(k)
    for ks in by_tid.values():
        ticks = {k: (round(events[k]["ts"] * 1024), round(events[k]["dur"] * 1024)) for k in ks}
        stack: list[int] = []
        for k in sorted(ks, key=lambda k: (ticks[k][0], -ticks[k][1], k)):
            a, d = ticks[k]
            assert float(a) == events[k]["ts"] * 1024 and float(d) == events[k]["dur"] * 1024
            while stack and sum(ticks[stack[-1]]) <= a and ticks[stack[-1]] != (a, d):
                stack.pop()
            if stack:
                top = stack[-1]
                assert sum(ticks[top]) >= a + d, (events[top], events[k])  # no partial overlap
            parent[k] = stack[-1] if stack else None
            stack.append(k)
    return parent


def _check_shape(trace: dict[str, Any], rank: int, world: int, iterations: int) -> None:
    assert trace["schemaVersion"] == 1 and trace["deviceProperties"] == []
    assert trace["distributedInfo"] == {"backend": "gloo", "rank": rank, "world_size": world}
    assert trace["displayTimeUnit"] == "ms" and trace["recperf"]["format"] == TRACE_FORMAT
    events = trace["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X"}
    xs = _x(trace)
    for e in xs:
        for key, kind in X_FIELDS.items():
            assert isinstance(e[key], kind), (key, e)
        assert e["pid"] == rank and e["dur"] >= 0 and e["cat"] == "user_annotation"
        assert isinstance(e["args"]["iteration"], int)
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}  # fmt: skip
    assert {e["tid"] for e in xs} <= set(names) and names[MAIN_TID] == "main"
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in events)
    steps = [e for e in xs if e["name"].startswith("ProfilerStep#")]
    assert [e["name"] for e in steps] == [f"ProfilerStep#{i}" for i in range(iterations)]
    assert all(e["tid"] == MAIN_TID for e in steps)
    parent = _check_nesting(xs)
    children: dict[int | None, list[str]] = defaultdict(list)
    for k, p in sorted(parent.items(), key=lambda kp: xs[kp[0]]["ts"]):
        children[p].append(xs[k]["name"])
        if p is not None:
            assert xs[p]["args"]["iteration"] == xs[k]["args"]["iteration"]
    for k, e in enumerate(xs):
        if e["name"].startswith("ProfilerStep#"):
            assert parent[k] is None and children[k] == ["recperf:data_wait", "recperf:step"]
        elif e["name"] == "recperf:step":
            assert children[k] == PHASES
        elif e["name"] == "recperf:allreduce":
            assert e["tid"] != MAIN_TID and parent[k] is None
            assert isinstance(e["args"]["bytes"], int) and isinstance(e["args"]["bucket"], int)


def test_rank_traces_are_kineto_shaped(run: tuple[Path, list[dict[str, Any]]]) -> None:
    out, traces = run
    for rank, trace in enumerate(traces):
        _check_shape(trace, rank, 2, WARMUP + ITERS)
        text = (out / f"rank{rank}.json").read_text()
        match = re.search(r'"rank":\s+(\d+)', text)  # how HTA finds a file's rank
        assert match is not None and int(match.group(1)) == rank
        grad_bytes = trace["recperf"]["grad_bytes"]
        per_iteration: dict[int, int] = defaultdict(int)
        for e in _x(trace):
            if e["name"] == "recperf:allreduce":
                per_iteration[e["args"]["iteration"]] += e["args"]["bytes"]
        assert per_iteration == {i: grad_bytes for i in range(WARMUP + ITERS)}
        waits = [e["dur"] for e in _x(trace) if e["name"] == "recperf:data_wait"]
        assert min(waits) >= 2000.0  # the 2 ms sleep in the data iterator


def _rec(t: float, comm: list[tuple[float, float]], phases: list[tuple[str, float, float]]) -> Any:
    r = IterRecord(start=t, data_end=t + 0.01, end=t + 0.1)
    r.comm = [(t + a, t + b, 100 * (k + 1)) for k, (a, b) in enumerate(comm)]
    r.phases = [(n, t + a, t + b) for n, a, b in phases]
    return r


def test_overlapping_buckets_get_lanes_and_stray_phases_are_clamped() -> None:
    prof = Profiler(cuda=False)
    prof.records = [
        # buckets 0 and 1 overlap, 2 starts as 0 ends (shares its lane); the phases stray out
        # of the step by microseconds, as CUDA-event times can
        _rec(0.0, [(0.05, 0.08), (0.06, 0.09), (0.08, 0.1)],
             [("forward", 0.009999, 0.04), ("backward", 0.039, 0.095),
              ("optimizer", 0.095, 0.1001)]),
        _rec(0.2, [(0.05, 0.07), (0.06, 0.065), (0.062, 0.064)], []),
    ]  # fmt: skip
    trace = prof.trace(3, world_size=4)
    xs = _x(trace)
    parent = _check_nesting(xs)
    comm = [(e["args"]["iteration"], e["args"]["bucket"], e["tid"]) for e in xs
            if e["name"] == "recperf:allreduce"]  # fmt: skip
    lane = MAIN_TID + 1
    assert comm == [(0, 0, lane), (0, 1, lane + 1), (0, 2, lane),
                    (1, 0, lane), (1, 1, lane + 1), (1, 2, lane + 2)]  # fmt: skip
    names = {e["tid"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {MAIN_TID, lane, lane + 1, lane + 2}
    step = next(k for k, e in enumerate(xs) if e["name"] == "recperf:step")
    phases = [e for k, e in enumerate(xs) if parent[k] == step]
    assert [e["name"] for e in phases] == PHASES
    assert phases[0]["ts"] == xs[step]["ts"]  # clamped to the step's start
    assert phases[1]["ts"] == phases[0]["ts"] + phases[0]["dur"]  # no overlap with forward
    assert phases[2]["ts"] + phases[2]["dur"] == xs[step]["ts"] + xs[step]["dur"]
    assert trace["distributedInfo"] == {"backend": "gloo", "rank": 3, "world_size": 4}


def test_the_nesting_check_catches_a_partial_overlap() -> None:
    span = {"ph": "X", "cat": "user_annotation", "pid": 0, "tid": 1, "args": {"iteration": 0}}
    nested = [{**span, "name": "a", "ts": 0.0, "dur": 10.0}, {**span, "name": "b", "ts": 2.0,
              "dur": 8.0}, {**span, "name": "c", "ts": 10.0, "dur": 1.0}]  # fmt: skip
    assert _check_nesting(nested) == {0: None, 1: 0, 2: None}
    with pytest.raises(AssertionError):
        _check_nesting([*nested, {**span, "name": "d", "ts": 9.5, "dur": 1.0}])
    with pytest.raises(AssertionError):  # not a whole number of 1/1024 us
        _check_nesting([{**span, "name": "e", "ts": 0.1, "dur": 1.0}])


def _v1(trace: dict[str, Any]) -> dict[str, Any]:
    """The same records as a recperf-stall-trace/1 file (bare names on tids 0, 1, 2)."""
    events = []
    for e in _x(trace):
        name = e["name"].removeprefix(ANNOTATION)
        if name.startswith("ProfilerStep#"):
            continue
        tid = 0 if name in ("data_wait", "step") else 2 if name == "allreduce" else 1
        events.append({"name": name, "ph": "X", "pid": e["pid"], "tid": tid, "ts": e["ts"],
                       "dur": e["dur"], "args": e["args"]})  # fmt: skip
    meta = {**trace["recperf"], "format": "recperf-stall-trace/1"}
    return {"traceEvents": events, "displayTimeUnit": "ms", "recperf": meta}


def test_both_formats_give_the_same_figures(
    run: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    out, traces = run
    spec = RunSpec.load(out / "spec.json")
    old = [_v1(t) for t in traces]
    paths = []
    for rank, t in enumerate(old):
        paths.append(tmp_path / f"rank{rank}.json")
        paths[-1].write_text(json.dumps(t))
    new_stats = differential.run_stats_from_files(spec, [out / f"rank{r}.json" for r in range(2)])
    assert differential.run_stats_from_files(spec, paths) == new_stats
    assert new_stats.buckets == 1 and new_stats.iteration_s > new_stats.data_wait_s > 0.002


def test_holistic_trace_analysis_loads_them_and_agrees(
    run: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    pytest.importorskip("hta")
    from hta.common.call_stack import CallStackGraph, CallStackIdentity
    from hta.trace_analysis import TraceAnalysis

    out, traces = run
    for rank in range(2):  # HTA reads every .json in the folder: the rank traces alone
        shutil.copy(out / f"rank{rank}.json", tmp_path)
    # without include_last_profiler_step HTA drops the last step (Kineto's is often cut short)
    ta = TraceAnalysis(trace_dir=str(tmp_path), include_last_profiler_step=True)
    assert ta.t.get_ranks() == [0, 1]  # none dropped for "no analyzable events"
    assert ta.get_profiler_steps() == list(range(WARMUP + ITERS))
    sym = ta.t.symbol_table.get_sym_table()
    for rank, trace in enumerate(traces):
        df = ta.t.get_trace(rank)
        events = trace["traceEvents"]
        assert len(df) == len(_x(trace))
        names = [sym[n] for n in df["name"]]
        assert names == [events[i]["name"] for i in df["index"]]
        # HTA puts each event in the ProfilerStep holding its start: our args.iteration
        assert list(df["iteration"]) == [events[i]["args"]["iteration"] for i in df["index"]]
        bytes_ = [b for b, n in zip(df["bytes"], names, strict=True) if n == "recperf:allreduce"]
        assert sum(bytes_) == trace["recperf"]["grad_bytes"] * (WARMUP + ITERS)
        depth: dict[str, set[int]] = defaultdict(set)
        for tid, thread in df.groupby("tid"):
            d = CallStackGraph(thread, CallStackIdentity(rank, rank, int(tid))).get_depth()
            assert d is not None
            for i, n in zip(thread.index, thread["name"], strict=True):
                depth[re.sub(r"#\d+$", "", sym[n])].add(int(d[i]))
        assert depth == {"ProfilerStep": {0}, "recperf:data_wait": {1}, "recperf:step": {1},
                         **{p: {2} for p in PHASES}, "recperf:allreduce": {0}}  # fmt: skip
        # HTA's times are ours rounded to whole microseconds (ts up, end down)
        ours = differential.run_stats(RunSpec(name="intra", workload="mlp", ranks=2),
                                       [read_rank_run(trace)])  # fmt: skip
        timed = df[df["iteration"] >= WARMUP]
        steps = [d for d, n in zip(timed["dur"], timed["name"], strict=True)
                 if sym[n].startswith("ProfilerStep#")]  # fmt: skip
        waits = [d for d, n in zip(timed["dur"], timed["name"], strict=True)
                 if sym[n] == "recperf:data_wait"]  # fmt: skip
        assert statistics.fmean(steps) / 1e6 == pytest.approx(ours.iteration_s, abs=2e-6)
        assert statistics.fmean(waits) / 1e6 == pytest.approx(ours.data_wait_s, abs=2e-6)


def kineto_means(docs: list[dict[str, Any]], sources: list[str]) -> dict[str, float]:
    """What the Kineto reader (``stalls analyze``'s and ``profile``'s torch_trace path) gives:
    means over iterations, then ranks (its ``allreduces`` is the hook's ``buckets``)."""
    keys = ("iteration_s", "data_wait_s", "compute_s", "backward_s", "exposed_comm_s",
            "overlapped_comm_s", "comm_busy_s", "allreduces")  # fmt: skip
    per_rank = []
    for rank, (doc, source) in enumerate(zip(docs, sources, strict=True)):
        figs = breakdown.iteration_figures(kineto.normalise(doc, source, rank))
        per_rank.append({k: statistics.fmean(float(getattr(f, k)) for f in figs) for k in keys})
    means = {k: statistics.fmean(r[k] for r in per_rank) for k in keys}
    means["buckets"] = means.pop("allreduces")
    return means


def test_the_kineto_reader_gives_the_hooks_figures_on_recperf_traces(
    run: tuple[Path, list[dict[str, Any]]],
) -> None:
    """Issue 28, one trace path: on recperf's own traces (no ops recorded: the hook's
    last-launch rule) the Kineto reader gives every figure the hook's own analysis gives, warmup
    included, each iteration's and so their means."""
    _, traces = run
    every = [{**t, "recperf": {**t["recperf"], "warmup": 0}} for t in traces]
    per_rank = []
    for t in every:
        figs = [ranktrace._iteration_figures(it) for it in ranktrace._iterations(t)]
        assert len(figs) == WARMUP + ITERS
        per_rank.append({k: statistics.fmean(f[k] for f in figs) for k in figs[0]})
    hook = {k: statistics.fmean(r[k] for r in per_rank) for k in per_rank[0]}
    new = kineto_means(every, [f"rank{r}" for r in range(len(every))])
    assert set(new) == set(hook)
    assert hook["buckets"] == 1.0 and hook["exposed_comm_s"] > 0
    for key, value in hook.items():
        assert new[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
