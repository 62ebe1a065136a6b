"""``stalls analyze`` refuses traces that cannot be one run's, in one line naming the file, the
event and the field: a negative duration, iterations running backwards or overlapping, a
timestamp that is not a finite number, ranks tracing different iterations, and two jobs' traces
given as the ranks of one (by their clocks or their run ids)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from recperf.cli.stalls import app
from recperf.stalls.run.hook import IterRecord, Profiler
from recperf.stalls.trace.kineto import analyze_paths

DATA = Path(__file__).parents[1] / "data" / "kineto"
NCCL = DATA / "hta_nccl_2gpu" / "nccl_data.json.gz"
R0, R1 = (DATA / "hta_sampled_128gpu" / f"sampled_rank-{r}.json.gz" for r in (0, 1))
cli = CliRunner()


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(gzip.decompress(path.read_bytes()))
    return data


def _write(path: Path, doc: dict[str, Any], raw: tuple[str, str] | None = None) -> Path:
    text = json.dumps(doc)
    path.write_text(text if raw is None else text.replace(*raw))
    return path


def _error(*paths: Path) -> str:
    res = cli.invoke(app, ["analyze", *(a for p in paths for a in ("--traces", str(p)))])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0].removeprefix("error: ")


def _step(doc: dict[str, Any], n: int) -> int:
    return next(i for i, e in enumerate(doc["traceEvents"]) if e.get("name") == f"ProfilerStep#{n}")


@pytest.fixture(scope="module")
def nccl() -> dict[str, Any]:
    return _load(NCCL)


def test_a_negative_duration_names_the_event(nccl: dict[str, Any], tmp_path: Path) -> None:
    k = _step(nccl, 5)
    nccl["traceEvents"][k] = {**nccl["traceEvents"][k], "dur": -5}
    bad = _write(tmp_path / "neg.json", nccl)
    assert _error(bad) == f"{bad}: traceEvents[{k}] (ProfilerStep#5).dur = -5: negative"


@pytest.mark.parametrize(("shift_us", "why"), [
    (-300_000.0, "starts after ProfilerStep#5 (traceEvents[{k5}]) although numbered before it: "
                 "the timestamps run backwards"),
    (-1_000.0, "starts 0.939 ms before ProfilerStep#4 (traceEvents[{k4}]) ends: iterations of "
               "one thread cannot overlap"),
])  # fmt: skip
def test_iterations_out_of_order_name_the_event(tmp_path: Path, shift_us: float, why: str) -> None:
    doc = _load(NCCL)
    k4, k5 = _step(doc, 4), _step(doc, 5)
    doc["traceEvents"][k5] = {**doc["traceEvents"][k5]}
    doc["traceEvents"][k5]["ts"] += shift_us
    bad = _write(tmp_path / "order.json", doc)
    first = k4 if shift_us < -200_000 else k5
    name = "ProfilerStep#4" if first == k4 else "ProfilerStep#5"
    assert _error(bad) == f"{bad}: traceEvents[{first}] ({name}).ts: " + why.format(k4=k4, k5=k5)


@pytest.mark.parametrize(("raw", "shown"), [("1e400", "inf"), ("NaN", "nan"), ("-1e400", "-inf")])
def test_a_timestamp_that_is_not_finite(tmp_path: Path, raw: str, shown: str) -> None:
    doc = _load(NCCL)
    k = _step(doc, 5)
    doc["traceEvents"][k] = {**doc["traceEvents"][k], "ts": "@ts@"}
    bad = _write(tmp_path / "ts.json", doc, ('"@ts@"', raw))
    assert _error(bad) == f"{bad}: traceEvents[{k}].ts = {shown}: expected a number"


def test_ranks_tracing_different_iterations(tmp_path: Path) -> None:
    doc = _load(R1)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "ProfilerStep#552"]
    bad = _write(tmp_path / "r1.json", doc)
    assert _error(R0, bad) == (
        f"{bad}: steps #551..#551 (1), but {R0} has #551..#552 (2): ranks of one run trace "
        "the same iterations"
    )


def test_two_jobs_a_day_apart_are_not_two_ranks(tmp_path: Path) -> None:
    doc = _load(R1)
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), int | float):
            e["ts"] += 86_400e6
    bad = _write(tmp_path / "r1.json", doc)
    assert _error(R0, bad) == (
        f"{bad}: traced from 2023-04-29 23:51:38 UTC, but {R0} from 2023-04-28 23:51:38 UTC "
        "(86,399 s apart, no overlap): ranks of one run train at the same time; these are two "
        "jobs"
    )
    assert analyze_paths([R0, R1]).to_json()["ranks"] == 2  # the same job's ranks still read


def _own(path: Path, rank: int, run: str) -> Path:
    prof = Profiler(cuda=False)
    for i in range(3):
        t = float(i)
        rec = IterRecord(start=t, data_end=t + 0.1, end=t + 0.6)
        rec.comm = [(t + 0.3, t + 0.35, 1000)]
        prof.records.append(rec)
    meta = {"grad_bytes": 1000, "param_bytes": 1000, "num_param_tensors": 1,
            "flops_per_iter": 1e6, "device_name": "cpu", "instrumented": True,
            "world": 2, "warmup": 0, "run": run}  # fmt: skip
    prof.write_trace(path, rank, meta, world_size=2)
    return path


def test_ranks_of_two_recperf_runs(tmp_path: Path) -> None:
    a = _own(tmp_path / "a.json", 0, "intra")
    b = _own(tmp_path / "b.json", 1, "network")
    assert _error(a, b) == (
        f"{b}: run 'network', but {a} has run 'intra': the traces of two runs, not two ranks of one"
    )
    same = _own(tmp_path / "c.json", 1, "intra")
    assert analyze_paths([a, same]).to_json()["ranks"] == 2
