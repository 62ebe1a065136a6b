"""Chakra export: the files of a real 2-rank run read back with the same schema (and our own
decoder of the length prefix) match the run's traces node for node; the dependency graph by
hand; bad input is one line; and, when grpcio-tools is installed, Chakra's own generated
classes decode the files."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.core.errors import ConfigError
from recperf.stalls.run import differential, runner
from recperf.stalls.run.ranktrace import read_rank_run
from recperf.stalls.run.spec import RunSpec
from recperf.stalls.trace.chakra import Iteration, backward_segments, build_nodes, pick_run
from recperf.stalls.trace.chakra_schema import (
    EtTrace,
    decode_trace,
    encode_trace,
    message_class,
)

cli = CliRunner()
DATA = Path(__file__).parent.parent / "data" / "chakra"
# 8 -> 600 -> 600 -> 10: DDP puts the last two layers in a 1 MiB first bucket, the first apart
MLP = {"features": 8, "hidden": [600, 600]}


def frames(data: bytes) -> list[bytes]:
    """Our own reading of Chakra's framing: varint length, then that many bytes."""
    out, pos = [], 0
    while pos < len(data):
        size = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        out.append(data[pos : pos + size])
        pos += size
    assert pos == len(data)
    return out


def attrs(msg: Any) -> dict[str, Any]:
    return {a.name: getattr(a, a.WhichOneof("value")) for a in msg.attr}


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("profile")
    spec = RunSpec(name="intra", workload="mlp", workload_options=MLP, ranks=2, iters=3,
                   warmup=1, batch_size=8, threads=1)  # fmt: skip
    runner.launch(spec, root / "runs" / "intra")
    return root


@pytest.fixture(scope="module")
def exported(profile: Path) -> tuple[Path, dict[str, Any]]:
    out = profile / "et"
    res = cli.invoke(app, ["stalls", "export", "--chakra", "--profile", str(profile),
                           "--out", str(out), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    return out, json.loads(res.stdout)


def spans(trace: dict[str, Any]) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """The rank trace's complete events by (iteration, name without the recperf: prefix)."""
    out = defaultdict(list)
    for ev in trace["traceEvents"]:
        if ev.get("ph", "X") == "X" and "iteration" in ev.get("args", {}):
            out[(ev["args"]["iteration"], ev["name"].removeprefix("recperf:"))].append(ev)
    return out


@pytest.mark.parametrize("rank", [0, 1])
def test_files_match_the_traces(
    profile: Path, exported: tuple[Path, dict[str, Any]], rank: int
) -> None:
    out, summary = exported
    assert json.loads((out / "export.json").read_text()) == summary
    assert summary["run"] == "intra" and summary["world_size"] == 2
    raw = frames((out / f"recperf.{rank}.et").read_bytes())
    meta = message_class("GlobalMetadata").FromString(raw[0])
    assert meta.version == "1.0.0"
    assert attrs(meta)["rank"] == rank and attrs(meta)["world_size"] == 2
    nodes = [message_class("Node").FromString(f) for f in raw[1:]]
    assert [n.id for n in nodes] == list(range(len(nodes)))
    trace = json.loads((profile / "runs" / "intra" / f"rank{rank}.json").read_text())
    assert attrs(meta)["grad_bytes"] == trace["recperf"]["grad_bytes"]
    assert attrs(meta)["flops_per_iteration"] == trace["recperf"]["flops_per_iter"] > 0
    by = spans(trace)
    timed = sorted({i for i, _ in by})[1:]  # warmup = 1
    assert len(timed) == 3
    us = 1.5  # rounding to whole microseconds, and float ts
    by_iter: dict[int, list[Any]] = defaultdict(list)
    for n in nodes:
        assert attrs(n)["is_cpu_op"] is False
        assert all(d < n.id for d in n.data_deps), "nodes are in topological order"
        by_iter[attrs(n)["iteration"]].append(n)
    assert sorted(by_iter) == timed
    prev_opt = None
    for i in timed:
        its = by_iter[i]
        kinds = [(message_class("Node").DESCRIPTOR.fields_by_name["type"]
                  .enum_type.values_by_number[n.type].name) for n in its]  # fmt: skip
        comm = [n for n, k in zip(its, kinds, strict=True) if k == "COMM_COLL_NODE"]
        reduces = sorted(by[(i, "allreduce")], key=lambda e: e["ts"])
        assert len(comm) == len(reduces) == 2
        for node, ev in zip(comm, reduces, strict=True):
            assert attrs(node)["comm_type"] == 0  # ALL_REDUCE
            assert attrs(node)["comm_size"] == ev["args"]["bytes"]
            assert abs(node.duration_micros - ev["dur"]) <= us
        assert sum(attrs(n)["comm_size"] for n in comm) == trace["recperf"]["grad_bytes"]
        fwd, opt = its[0], its[-1]
        assert fwd.name == f"forward#{i}" and opt.name == f"optimizer#{i}"
        assert abs(fwd.duration_micros - by[(i, "forward")][0]["dur"]) <= us
        assert abs(opt.duration_micros - by[(i, "optimizer")][0]["dur"]) <= us
        assert list(fwd.data_deps) == ([] if prev_opt is None else [prev_opt])
        assert {n.id for n in comm} <= set(opt.data_deps)
        for node in comm:
            (dep,) = node.data_deps
            assert nodes[dep].name.startswith(f"backward#{i}.")
        prev_opt = opt.id
    # the backward segments add up to the analysis's backward compute (backward less exposed)
    spec = RunSpec.load(profile / "runs" / "intra" / "spec.json")
    backward_s = differential.run_stats(spec, [read_rank_run(trace)]).backward_s
    segs = [n.duration_micros for n in nodes if n.name.startswith("backward#")]
    assert sum(segs) / 3 / 1e6 == pytest.approx(backward_s, abs=3 * len(segs) * 1e-6)
    assert summary["ranks"][rank]["comm_nodes"] == 6
    assert summary["ranks"][rank]["comp_nodes"] == len(nodes) - 6


def test_graph_by_hand() -> None:
    it = Iteration(number=5, forward=(0.0, 0.001), backward=(0.001, 0.004),
                   optimizer=(0.0045, 0.005),
                   comm=((0.002, 0.0035, 400), (0.003, 0.0038, 100)))  # fmt: skip
    assert backward_segments(it) == ([(0.001, 0.002), (0.002, 0.003)], (0.0038, 0.004))
    nodes = build_nodes([it, Iteration(number=6, forward=(0.006, 0.007), backward=(0.007, 0.008),
                                       optimizer=(0.008, 0.009), comm=())])  # fmt: skip
    got = [(n.name, n.type, n.data_deps, n.ctrl_deps, n.start_time_micros, n.duration_micros)
           for n in nodes]  # fmt: skip
    assert got == [
        ("forward#5", "COMP_NODE", (), (), 0, 1000),
        ("backward#5.0", "COMP_NODE", (0,), (0,), 1000, 1000),
        ("allreduce#5.0", "COMM_COLL_NODE", (1,), (1,), 2000, 1500),
        ("backward#5.1", "COMP_NODE", (1,), (1,), 2000, 1000),
        ("allreduce#5.1", "COMM_COLL_NODE", (3,), (3,), 3000, 800),
        ("backward#5.2", "COMP_NODE", (3, 2, 4), (3,), 3800, 200),
        ("optimizer#5", "COMP_NODE", (5, 2, 4), (5,), 4500, 500),
        ("forward#6", "COMP_NODE", (6,), (6,), 6000, 1000),
        ("backward#6.0", "COMP_NODE", (7,), (7,), 7000, 1000),
        ("optimizer#6", "COMP_NODE", (8,), (8,), 8000, 1000),
    ]
    assert nodes[2].attrs == {"is_cpu_op": False, "iteration": 5, "bucket": 0,
                              "comm_type": 0, "comm_size": 400}  # fmt: skip
    back = decode_trace(encode_trace({"rank": 3, "run": "x"}, nodes))
    assert back == EtTrace(version="1.0.0", metadata={"rank": 3, "run": "x"}, nodes=tuple(nodes))


def test_waiting_backward_has_no_tail() -> None:
    it = Iteration(number=0, forward=(0.0, 1.0), backward=(1.0, 3.0), optimizer=(3.0, 4.0),
                   comm=((2.5, 3.2, 8),))  # fmt: skip
    assert backward_segments(it) == ([(1.0, 2.5)], None)


def test_the_network_run_is_preferred(tmp_path: Path) -> None:
    for name in ("compute", "intra", "network"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "spec.json").write_text("{}")
    assert pick_run(tmp_path, None).name == "network"
    assert pick_run(tmp_path, "compute").name == "compute"
    shutil.rmtree(tmp_path / "runs" / "network")
    assert pick_run(tmp_path, None).name == "intra"


def test_truncated_file_is_named() -> None:
    it = Iteration(number=0, forward=(0.0, 1.0), backward=(1.0, 2.0), optimizer=(2.0, 3.0),
                   comm=())  # fmt: skip
    blob = encode_trace({"rank": 0}, build_nodes([it]))
    with pytest.raises(ConfigError, match=r"x\.et: message at byte"):
        decode_trace(blob[:-3], "x.et")


@pytest.mark.parametrize("case, message", [
    ("no-format", "choose a format: --chakra"),
    ("no-runs", "no runs/ directory"),
    ("no-run", "no run 'nope'; runs: intra"),
    ("missing-rank", "rank1.json: missing (1 of 2 rank traces present)"),
    ("garbled", "rank0.json: not a recperf stall trace"),
    ("prefix", "prefix = 'a/b': expected a file name"),
    ("window", "rank0.json: the all-reduces are one window per iteration (DDP's own timers)"),
])  # fmt: skip
def test_bad_input_is_one_line(profile: Path, tmp_path: Path, case: str, message: str) -> None:
    copy = tmp_path / "p"
    shutil.copytree(profile / "runs", copy / "runs")
    args = ["stalls", "export", "--chakra", "--profile", str(copy), "--out", str(tmp_path / "o")]
    if case == "no-format":
        args.remove("--chakra")
    elif case == "no-runs":
        args[4] = str(tmp_path)
    elif case == "no-run":
        args += ["--run", "nope"]
    elif case == "missing-rank":
        (copy / "runs" / "intra" / "rank1.json").unlink()
    elif case == "garbled":
        (copy / "runs" / "intra" / "rank0.json").write_text("{not json")
    elif case == "window":  # a trace timed by DDP's reducer: no span per bucket
        path = copy / "runs" / "intra" / "rank0.json"
        trace = json.loads(path.read_text())
        ev = next(e for e in trace["traceEvents"] if e["name"] == "recperf:allreduce")
        ev["args"]["last_launch"] = ev["ts"]
        path.write_text(json.dumps(trace))
    else:
        args += ["--prefix", "a/b"]
    res = cli.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1
    assert not list((tmp_path / "o").glob("*.et"))


def test_chakra_generated_classes_read_the_files(
    exported: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools not installed")
    shutil.copy(DATA / "et_def.proto", tmp_path)
    assert protoc.main(["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}",
                        str(tmp_path / "et_def.proto")]) == 0  # fmt: skip
    sys.path.insert(0, str(tmp_path))
    try:
        pb = importlib.import_module("et_def_pb2")
    finally:
        sys.path.remove(str(tmp_path))
    out, _ = exported
    raw = frames((out / "recperf.1.et").read_bytes())
    meta = pb.GlobalMetadata.FromString(raw[0])
    assert meta.version == "1.0.0"
    nodes = [pb.Node.FromString(f) for f in raw[1:]]
    ours = decode_trace((out / "recperf.1.et").read_bytes()).nodes
    assert [(n.id, n.name, pb.NodeType.Name(n.type), tuple(n.data_deps), n.duration_micros)
            for n in nodes] == [(n.id, n.name, n.type, n.data_deps, n.duration_micros)
                                for n in ours]  # fmt: skip
    reduce = next(n for n in nodes if n.type == pb.COMM_COLL_NODE)
    got = {a.name: a.int64_val for a in reduce.attr if a.name.startswith("comm_")}
    assert got == {"comm_type": pb.ALL_REDUCE, "comm_size": ours[reduce.id].attrs["comm_size"]}
    assert got["comm_size"] > 0
