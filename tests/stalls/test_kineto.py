"""The Kineto reader on real traces: a 2-rank gloo DDP run recorded here with torch.profiler
(a DataLoader sleeping a known time per batch), public NCCL GPU traces from HTA's tests, and
recperf's own rank traces; HTA itself on the same GPU trace; and bad input."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from recperf.cli.stalls import app
from recperf.core.errors import ConfigError
from recperf.stalls.cost.advisor import ProfileSummary
from recperf.stalls.run import differential
from recperf.stalls.run.hook import IterRecord, Profiler
from recperf.stalls.run.spec import RunSpec
from recperf.stalls.trace.kineto import analyze_paths, find_traces

from .kineto_record import record

DATA = Path(__file__).parents[1] / "data" / "kineto"
NCCL = DATA / "hta_nccl_2gpu" / "nccl_data.json.gz"
SAMPLED = DATA / "hta_sampled_128gpu"
cli = CliRunner()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("kineto")
    record(out)
    return out / "traces", json.loads((out / "meta.json").read_text())


@pytest.fixture(scope="module")
def nccl() -> dict[str, Any]:
    return analyze_paths([NCCL]).to_json()


def _doc(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_gloo_ddp_iterations_match_the_injected_sleep_and_gradient_bytes(
    recorded: tuple[Path, dict[str, Any]],
) -> None:
    traces, meta = recorded
    s = analyze_paths(find_traces([traces])).to_json()
    assert (s["ranks"], s["world_size"], s["backend"], s["device"]) == (2, 2, "gloo", "cpu")
    for its in s["iterations"].values():
        assert [f["step"] for f in its] == [1, 2, 3, 4]  # ProfilerStep#N after one warm-up
        for f in its:
            assert meta["sleep_s"] <= f["data_wait_s"] <= 1.5 * meta["sleep_s"] + 0.005
            assert f["compute_s"] > 0 and f["exposed_comm_s"] >= 0
            assert 0 <= f["overlapped_comm_s"] <= f["comm_busy_s"] and f["comm_busy_s"] > 0
            parts = f["data_wait_s"] + f["compute_s"] + f["exposed_comm_s"]
            assert parts == pytest.approx(f["iteration_s"], rel=1e-9)
            assert (f["allreduces"], f["allreduce_bytes"]) == (1, meta["grad_bytes"])
    assert (s["grad_bytes"], s["num_layers"], s["nodes"]) == (meta["grad_bytes"], 1, 1)
    assert s["interconnect_stall_s"] == s["exposed_comm_s"] and s["network_stall_s"] == 0.0
    assert s["data_prep_stall_s"] == 0.0 and "cannot split" in s["method"]["data_fetch_stall_s"]
    # DDP broadcasts its rebuilt buckets in the first step only: afterwards all bytes are grads
    later = analyze_paths(find_traces([traces]), skip_steps=1).to_json()
    assert later["comm_bytes"] == meta["grad_bytes"] and later["iters"] == 3
    slow = s["slowest_rank"]
    medians = {r["rank"]: r["iteration_median_s"] for r in s["per_rank"]}
    assert slow["rank"] == max(medians, key=lambda r: medians[r]) and slow["margin_s"] >= 0


def test_ranks_per_node_makes_exposed_comm_a_network_stall(
    recorded: tuple[Path, dict[str, Any]],
) -> None:
    s = analyze_paths(find_traces([recorded[0]]), ranks_per_node=1).to_json()
    assert s["nodes"] == 2 and s["interconnect_stall_s"] == 0.0
    assert s["network_stall_s"] == s["exposed_comm_s"] > 0
    assert "--ranks-per-node 1" in s["method"]["network_stall_s"]


def test_gzipped_and_plain_traces_read_alike(
    recorded: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    plain = find_traces([recorded[0]])
    for p in plain:  # gzip is found by its magic bytes, whatever the name
        (tmp_path / (p.name + ".gz")).write_bytes(gzip.compress(p.read_bytes()))
    a, b = analyze_paths(plain).to_json(), analyze_paths(find_traces([tmp_path])).to_json()
    assert a["iterations"] == b["iterations"]


def test_cli_writes_a_summary_that_advise_reads_or_refuses_clearly(
    recorded: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    args = ["analyze", "--traces", str(recorded[0]), "--out", str(tmp_path), "--json"]
    res = cli.invoke(app, [*args, "--batch-size", "8", "--param-bytes", "9000"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert json.loads(res.stdout) == summary
    profile = ProfileSummary.from_mapping(summary)
    assert profile.compute_s == summary["compute_s"] and profile.batch_size == 8
    assert profile.grad_bytes == recorded[1]["grad_bytes"]
    res = cli.invoke(app, ["advise", "--profile", str(tmp_path), "--budget-h", "1",
                           "--epoch-samples", "1000"])  # fmt: skip
    assert res.exit_code == 2 and "'flops_per_iter' missing" in res.output  # never invented


def test_nccl_gpu_trace_places_kernels_by_correlation(nccl: dict[str, Any]) -> None:
    s = nccl
    assert (s["device"], s["backend"], s["world_size"], s["iters"]) == ("cuda", "nccl", 2, 3)
    doc = json.loads(gzip.decompress(NCCL.read_bytes()))
    allreduce = [e["args"]["In msg nelems"] * 4 for e in doc["traceEvents"]
                 if e.get("cat") == "kernel" and "AllReduce" in e["name"]]  # fmt: skip
    its = s["iterations"]["0"]
    assert sum(f["allreduce_bytes"] for f in its) == sum(allreduce)
    assert len({f["allreduce_bytes"] for f in its}) == 1  # the same buckets every step
    for f in its:
        assert 0 < f["overlapped_comm_s"] < f["comm_busy_s"]
        assert f["exposed_comm_s"] == pytest.approx(f["comm_busy_s"] - f["overlapped_comm_s"])
        assert f["gpu_compute_s"] > 0 and f["data_wait_s"] == 0


def test_two_sampled_ranks_of_a_128_gpu_job() -> None:
    s = analyze_paths(find_traces([SAMPLED]), ranks_per_node=8).to_json()
    assert (s["ranks"], s["world_size"], s["nodes"]) == (2, 128, 16)
    assert [r["rank"] for r in s["per_rank"]] == [0, 1]
    assert s["network_stall_s"] == s["exposed_comm_s"] > 0 and s["interconnect_stall_s"] == 0
    assert s["slowest_rank"]["rank"] == 1 and s["slowest_rank"]["margin_s"] > 0
    assert s["grad_bytes"] is None  # no all-reduce kernel in the sample: not invented


def test_agrees_with_hta_on_the_gpu_trace(nccl: dict[str, Any], tmp_path: Path) -> None:
    hta = pytest.importorskip("hta.trace_analysis")
    shutil.copy(NCCL, tmp_path / "rank0.json.gz")
    t = hta.TraceAnalysis(trace_dir=str(tmp_path))
    overlap_pct = float(t.get_comm_comp_overlap(visualize=False)["comp_comm_overlap_pctg"][0])
    compute_us = float(t.get_temporal_breakdown(visualize=False)["compute_time(us)"][0])
    its = nccl["iterations"]["0"][:-1]  # HTA drops the last step's kernels
    mine_pct = 100 * sum(f["overlapped_comm_s"] for f in its) / sum(f["comm_busy_s"] for f in its)
    assert mine_pct == pytest.approx(overlap_pct, rel=0.05)
    assert 1e6 * sum(f["gpu_compute_s"] for f in its) == pytest.approx(compute_us, rel=0.05)


def _records() -> list[IterRecord]:
    """3 iterations with 2 buckets each, the second's completion later each time."""
    out = []
    for i in range(3):
        t = i * 1.0
        rec = IterRecord(start=t, data_end=t + 0.1, end=t + 0.6)
        rec.phases = [("forward", t + 0.1, t + 0.2), ("backward", t + 0.2, t + 0.5),
                      ("optimizer", t + 0.5, t + 0.6)]  # fmt: skip
        rec.comm = [(t + 0.3, t + 0.35, 1000), (t + 0.4, t + 0.47 + 0.01 * i, 3000)]
        out.append(rec)
    return out


def _own_trace(path: Path) -> RunSpec:
    """recperf's own rank trace of ``_records``, as the Profiler writes it."""
    prof = Profiler(cuda=False)
    prof.records = _records()
    meta = {"grad_bytes": 4000, "param_bytes": 4000, "num_param_tensors": 2,
            "flops_per_iter": 1e6, "device_name": "cpu", "instrumented": True,
            "world": 1, "warmup": 1}  # fmt: skip
    prof.write_trace(path, 0, meta)
    return RunSpec(name="x", workload="mlp", ranks=1)


def test_recperf_own_traces_give_the_direct_figures(tmp_path: Path) -> None:
    spec = _own_trace(tmp_path / "rank0.json")
    direct = differential.run_stats_from_files(spec, [tmp_path / "rank0.json"])
    s = analyze_paths([tmp_path / "rank0.json"]).to_json()
    assert s["iters"] == 2  # the warm-up iteration is dropped, as the direct analysis does
    for key in ("iteration_s", "data_wait_s", "compute_s", "exposed_comm_s", "comm_busy_s",
                "overlapped_comm_s", "backward_s"):  # fmt: skip
        assert s[key] == pytest.approx(getattr(direct, key), abs=1e-9), key
    assert (s["grad_bytes"], s["num_layers"]) == (4000, 2)


def _version_1(prof: Profiler, meta: dict[str, Any]) -> dict[str, Any]:
    """The records as recperf-stall-trace/1 wrote them (bare names, one lane per kind)."""
    events = []

    def span(name: str, a: float, b: float, tid: int, **args: Any) -> None:
        events.append({"name": name, "ph": "X", "pid": 0, "tid": tid, "ts": a * 1e6,
                       "dur": (b - a) * 1e6, "args": args})  # fmt: skip

    for i, r in enumerate(prof.records):
        span("data_wait", r.start, r.data_end, 0, iteration=i)
        span("step", r.data_end, r.end, 0, iteration=i)
        for name, a, b in r.phases:
            span(name, a, b, 1, iteration=i)
        for k, (a, b, n) in enumerate(r.comm):
            span("allreduce", a, b, 2, iteration=i, bucket=k, bytes=n)
    return {"traceEvents": events, "recperf": {**meta, "format": "recperf-stall-trace/1"}}


def test_version_1_traces_read_as_the_current_format(tmp_path: Path) -> None:
    _own_trace(tmp_path / "rank0.json")
    prof = Profiler(cuda=False)
    doc = _doc(tmp_path / "rank0.json")
    prof.records = _records()
    v1 = _write(tmp_path / "v1" / "rank0.json", _version_1(prof, doc["recperf"]))
    old, new = analyze_paths([v1]).to_json(), analyze_paths([tmp_path / "rank0.json"]).to_json()
    assert new["iters"] == old["iters"] == 2
    for key in ("iteration_s", "data_wait_s", "compute_s", "exposed_comm_s", "backward_s",
                "comm_busy_s", "grad_bytes", "num_layers"):  # fmt: skip
        assert new[key] == pytest.approx(old[key], abs=1e-9), key


def _write(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def _one_line_error(args: list[str]) -> str:
    res = cli.invoke(app, ["analyze", *args])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0].removeprefix("error: ")


def test_bad_traces_are_one_line_naming_the_file(
    recorded: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    r0, r1 = find_traces([recorded[0]])
    doc = _doc(r0)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no trace files" in _one_line_error(["--traces", str(empty)])
    assert "no such file" in _one_line_error(["--traces", str(tmp_path / "nope.json")])
    bad = _write(tmp_path / "a" / "bad.json", "{garbled")
    assert _one_line_error(["--traces", str(bad)]).startswith(f"{bad}: not a torch.profiler")
    gz = tmp_path / "b" / "bad.json.gz"
    gz.parent.mkdir()
    gz.write_bytes(b"\x1f\x8b" + b"junk")
    assert _one_line_error(["--traces", str(gz)]).startswith(f"{gz}: not a torch.profiler")
    noev = _write(tmp_path / "c" / "x.json", {"schemaVersion": 1})
    assert "no 'traceEvents' list" in _one_line_error(["--traces", str(noev)])
    steps = {**doc, "traceEvents": [e for e in doc["traceEvents"]
                                    if not e["name"].startswith("ProfilerStep")]}  # fmt: skip
    nostep = _write(tmp_path / "d" / "x.json", steps)
    assert _one_line_error(["--traces", str(nostep)]).startswith(f"{nostep}: no ProfilerStep#N")
    world = _write(tmp_path / "e" / "r1.json", {**_doc(r1), "distributedInfo": {
        "backend": "gloo", "rank": 1, "world_size": 4}})  # fmt: skip
    msg = _one_line_error(["--traces", str(r0), "--traces", str(world)])
    assert msg == f"{world}: world_size 4, but {r0} has 2"
    dup = _write(tmp_path / "f" / "again.json", doc)
    assert _one_line_error(["--traces", str(r0), "--traces", str(dup)]) == (
        f"{dup}: rank 0 again (also {r0})"
    )
    msg = _one_line_error(["--traces", str(r0), "--skip-steps", "4"])
    assert msg == f"{r0}: --skip-steps 4 leaves none of its 4 iteration(s)"
    events = [dict(e) for e in doc["traceEvents"]]
    k = next(i for i, e in enumerate(events) if e.get("ph") == "X")
    events[k]["ts"] = "soon"
    ts = _write(tmp_path / "g" / "x.json", {**doc, "traceEvents": events})
    assert _one_line_error(["--traces", str(ts)]) == (
        f"{ts}: traceEvents[{k}].ts = 'soon': expected a number"
    )
    assert "give one of them" in _one_line_error(["--traces", str(r0), "--run", str(tmp_path)])


def test_find_traces_takes_a_recperf_run_directorys_own_traces(tmp_path: Path) -> None:
    _own_trace(tmp_path / "rank0.json").save(tmp_path / "spec.json")
    _write(tmp_path / "torch_rank0.json", {"traceEvents": []})
    assert find_traces([tmp_path]) == [tmp_path / "rank0.json"]
    with pytest.raises(ConfigError, match="no trace files"):
        find_traces([])
    assert not math.isnan(analyze_paths(find_traces([tmp_path])).to_json()["compute_frac"])
