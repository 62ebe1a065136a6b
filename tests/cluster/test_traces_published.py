"""Traces as published: Helios with submit times and slowdowns, ITP, Alibaba openb, Philly with
attempts, any CSV by a column mapping; bad input in each is one line naming file, line and field."""

from __future__ import annotations

import csv
import json
from collections import Counter
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.cluster.api import RunSpec, load_jobs, run_summary, simulate
from recperf.cluster.jobs import JobTable
from recperf.cluster.models import iter_s_for
from recperf.cluster.traces import BUNDLED, bundled_path
from recperf.core.errors import ConfigError, RecperfError, TraceFormatError

runner = CliRunner()


def source(trace: str) -> Path:
    path = bundled_path(BUNDLED[trace])
    assert path is not None
    return path


def index(table: JobTable, name: str) -> int:
    return table.name.index(name)


def run_s(table: JobTable, i: int) -> float:
    """The job's run time at its tightest placement (durations here exceed one iteration)."""
    return float(table.total_iters[i] * iter_s_for(table.model[i]))


def csv_jobs(tmp_path: Path, text: str, **options: str) -> JobTable:
    path = tmp_path / "jobs.csv"
    path.write_text(text)
    spec = RunSpec(trace=str(path), format="csv", cluster="helios", trace_options={"csv": options})
    return load_jobs(spec)[0]


def bad(*args: str) -> str:
    """Run the CLI; assert exit 2, no traceback and one output line; return that line."""
    res = runner.invoke(app, list(args))
    text = res.stdout + res.stderr
    assert res.exit_code == 2, text
    assert "Traceback" not in text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    return lines[0]


def simulate_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["cluster", "simulate", "--scheduler", "fifo", "--out", str(tmp_path / "out"), *extra]


# ---------------------------------------------------------------- bundled samples


@pytest.mark.parametrize(
    ("trace", "jobs", "cluster", "histogram", "notes"),
    [
        (
            "itp-cluster01", 1595, "itp-cluster01",
            {1: 1530, 2: 11, 4: 6, 8: 5, 16: 6, 32: 11, 64: 26}, {},
        ),
        ("itp-cluster10", 260, "itp-cluster10", {1: 193, 2: 51, 4: 14, 16: 2}, {}),
        ("csv-itp-cluster10", 260, "itp-cluster10", {1: 193, 2: 51, 4: 14, 16: 2}, {}),
        (
            "alibaba-gpu-2023", 1769, "openb-16", {1: 1754, 2: 1, 4: 3, 8: 11},
            {"fractional_rounded_up": 763, "cpu_only_skipped": 269, "zero_duration_skipped": 0},
        ),
        ("philly-raw", 304, "philly-raw-tenth", {4: 146, 8: 140, 12: 1, 16: 13, 32: 4}, {}),
    ],
)  # fmt: skip
def test_bundled_sample_counts(
    trace: str, jobs: int, cluster: str, histogram: dict[int, int], notes: dict[str, int]
) -> None:
    table, cl = load_jobs(RunSpec(trace=trace))
    assert (len(table), cl.name) == (jobs, cluster)
    assert dict(Counter(table.gpus.tolist())) == histogram
    assert table.trace_notes == notes
    assert int(table.gpus.max()) <= cl.gpus


def test_itp_fields_match_the_file() -> None:
    table, _ = load_jobs(RunSpec(trace="itp-cluster01"))
    rows = list(csv.DictReader(source("itp-cluster01").open()))
    for row in (rows[0], rows[700], rows[-1]):
        i = index(table, row["job_id"])
        assert table.arrival_s[i] == float(row["submission_time"])
        assert table.gpus[i] == int(row["num_gpu"])
        assert run_s(table, i) == pytest.approx(float(row["duration"]), rel=1e-12)
    assert table.name[0] == "965d744f-0445-c1a8-12af-97e4c536c66e"  # the earliest submission
    assert table.arrival_s[0] == 1_932_025.0


def test_csv_sample_is_the_itp_file_under_other_names() -> None:
    a, _ = load_jobs(RunSpec(trace="itp-cluster10"))
    b, _ = load_jobs(RunSpec(trace="csv-itp-cluster10"))
    assert a.name == b.name
    for col in ("arrival_s", "gpus", "total_iters", "compute_s", "grad_bytes"):
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col))


def test_alibaba_pods_become_jobs_as_documented() -> None:
    table, _ = load_jobs(RunSpec(trace="alibaba-gpu-2023"))
    rows = {r["name"]: r for r in csv.DictReader(source("alibaba-gpu-2023").open())}
    pending = next(r for r in rows.values() if r["num_gpu"] == "1" and not r["scheduled_time"])
    fractional = next(r for r in rows.values() if r["num_gpu"] == "1" and r["gpu_milli"] != "1000")
    for row in (rows["openb-pod-0000"], pending, fractional):
        i = index(table, row["name"])
        start = row["scheduled_time"] or row["creation_time"]
        assert table.arrival_s[i] == float(row["creation_time"])
        assert run_s(table, i) == pytest.approx(float(row["deletion_time"]) - float(start))
        assert table.gpus[i] == 1
    assert run_s(table, index(table, "openb-pod-0000")) == pytest.approx(12_537_496.0)
    cpu = [n for n, r in rows.items() if r["num_gpu"] == "0"]
    assert cpu and not set(cpu) & set(table.name)


def test_alibaba_counts_reach_the_summary() -> None:
    spec = RunSpec(trace="alibaba-gpu-2023")
    summary = run_summary(spec, simulate(spec))
    assert summary["fractional_rounded_up"] == 763
    assert summary["cpu_only_skipped"] == 269
    assert summary["jobs_total"] == 1769


def _seconds(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@pytest.mark.parametrize("duration", ["attempts", "span", "last"])
def test_philly_raw_run_time_from_attempts(duration: str) -> None:
    spec = RunSpec(trace="philly-raw", trace_options={"philly-raw": {"duration": duration}})
    table, _ = load_jobs(spec)
    records = json.loads(source("philly-raw").read_text())
    first = records[0]  # two attempts, 7 s apart
    assert first["id"] == "application_1506638472019_14199" and len(first["attempts"]) == 2
    spans = [(_seconds(a["start_time"]), _seconds(a["end_time"])) for a in first["attempts"]]
    expected = {
        "attempts": (spans[0][1] - spans[0][0]) + (spans[1][1] - spans[1][0]),
        "span": spans[1][1] - spans[0][0],
        "last": spans[1][1] - spans[1][0],
    }[duration]
    i = index(table, first["id"])
    assert run_s(table, i) == pytest.approx(expected)
    assert table.gpus[i] == 8
    earliest = min(_seconds(r["submitted_time"]) for r in records)
    assert table.arrival_s[i] == pytest.approx(_seconds(first["submitted_time"]) - earliest)
    if duration == "span":  # the release's own runtime, in minutes
        assert run_s(table, i) == pytest.approx(first["runtime"] * 60, abs=1.0)


# ---------------------------------------------------------------- Helios as published


def _helios_records(**fields: object) -> list[dict[str, object]]:
    records = json.loads(source("helios-500").read_text())[:3]
    for rec in records:
        del rec["arrival_time"]
        rec.update(fields)
    return records


def _helios(tmp_path: Path, records: list[dict[str, object]], slowdowns: str = "trace") -> JobTable:
    path = tmp_path / "h.json"
    path.write_text(json.dumps(records, indent=1))
    options = {"helios": {"slowdowns": slowdowns}}
    return load_jobs(RunSpec(trace=str(path), format="helios", trace_options=options))[0]


def test_helios_submit_time_gives_seconds_from_the_first_job(tmp_path: Path) -> None:
    records = _helios_records()
    table = _helios(tmp_path, records)
    submits = {str(r["job_id"]): _seconds(str(r["submit_time"])) for r in records}
    first = min(submits.values())
    for name, when in submits.items():
        assert table.arrival_s[index(table, name)] == when - first
    # "2020-03-26 13:42:30" and "2020-03-28 07:54:39" are 1 d 18 h 12 min 9 s apart
    assert table.arrival_s[index(table, "399455")] - table.arrival_s[index(table, "396689")] == (
        86_400 + 18 * 3600 + 12 * 60 + 9
    )


def test_helios_slowdowns_become_measured_sensitivity(tmp_path: Path) -> None:
    # The bundled extract's factors are the schema's constant 0.8 / 0.7: used only when asked.
    bundled, _ = load_jobs(RunSpec(trace="helios-500"))
    assert np.isnan(bundled.slowdown_measured).all() and np.isnan(bundled.cross_rack_measured).all()
    trace = {"helios": {"slowdowns": "trace"}}
    forced, _ = load_jobs(RunSpec(trace="helios-500", trace_options=trace))
    np.testing.assert_allclose(forced.slowdown_measured, 1 / 0.8)
    np.testing.assert_allclose(forced.cross_rack_measured, 1 / 0.7)
    records = _helios_records(cross_machine_slowdown="0.5", cross_rack_slowdown=0.25)
    del records[2]["cross_rack_slowdown"]
    table = _helios(tmp_path, records)
    auto = _helios(tmp_path, records, slowdowns="auto")  # factors differ between jobs: used
    np.testing.assert_array_equal(auto.cross_rack_measured, table.cross_rack_measured)
    np.testing.assert_allclose(table.slowdown_measured, [2.0, 2.0, 2.0])
    rack = table.cross_rack_measured[[index(table, str(r["job_id"])) for r in records]]
    np.testing.assert_allclose(rack, [4.0, 4.0, np.nan])
    model = _helios(tmp_path, records, slowdowns="model")
    assert np.isnan(model.slowdown_measured).all() and np.isnan(model.cross_rack_measured).all()
    np.testing.assert_array_equal(model.total_iters, table.total_iters)


def test_measured_columns_survive_subset_and_new_arrivals() -> None:
    trace = {"helios": {"slowdowns": "trace"}}
    table, _ = load_jobs(RunSpec(trace="helios-500", jitter_s=600.0, seed=3, trace_options=trace))
    assert np.allclose(table.cross_rack_measured, 1 / 0.7)
    part = table.subset(np.arange(0, 500, 5)).with_notes(dropped_oversized=2)
    assert len(part) == 100 and np.allclose(part.cross_rack_measured, 1 / 0.7)
    assert part.trace_notes == {"dropped_oversized": 2}
    assert part.with_arrivals(part.arrival_s + 1.0).trace_notes == {"dropped_oversized": 2}


def test_helios_bad_option_is_one_line(tmp_path: Path) -> None:
    args = simulate_args(tmp_path, "--trace", "helios-500", "--set", "helios.slowdowns=measured")
    line = bad(*args)
    assert "slowdowns: 'measured' is not one of 'auto', 'trace', 'model'" in line


# ---------------------------------------------------------------- csv by column mapping


def test_csv_mapping_with_spaces_datetimes_and_minutes(tmp_path: Path) -> None:
    text = (
        " job , who , net , submitted , mins , n \n"
        " a , ann , resnet50 , 2021-03-04 10:00:00 , 90 , 4 \n"
        "b,bob,bert,2021-03-04T09:30:00,1.5,1\n"
        "c,,, 2021-03-04 11:00:00+01:00 ,30,8\n"  # 10:00 UTC; no user, no model
        "d,dan,bert,2021-03-04 12:00:00,30,0\n"  # 0 GPUs: skipped and counted
    )
    columns = "id=job,user=who,model=net,arrival=submitted,duration=mins,gpus=n"
    table = csv_jobs(tmp_path, text, columns=columns, duration_unit="min")
    assert table.name == ("b", "a", "c")
    np.testing.assert_array_equal(table.arrival_s, [0.0, 1800.0, 1800.0])
    assert table.users == ("bob", "ann", "") and table.model == ("bert", "resnet50", "unknown")
    assert [run_s(table, i) for i in range(3)] == pytest.approx([90.0, 5400.0, 1800.0])
    np.testing.assert_array_equal(table.gpus, [1, 4, 8])
    assert table.trace_notes == {"cpu_only_skipped": 1}


def test_csv_defaults_time_format_and_hours(tmp_path: Path) -> None:
    text = "arrival,duration,gpus\n04/03/2021 10:00,2,8\n05/03/2021 10:30,0.5,2\n"
    table = csv_jobs(tmp_path, text, time_format="%d/%m/%Y %H:%M", duration_unit="h")
    np.testing.assert_array_equal(table.arrival_s, [0.0, 86_400.0 + 1800.0])
    assert run_s(table, 0) == pytest.approx(7200.0) and run_s(table, 1) == pytest.approx(1800.0)
    assert table.name == ("jobs-2", "jobs-3")  # no id column: FILE-LINE
    seconds = csv_jobs(tmp_path, "arrival,duration,gpus\n100,60,1\n40,600,2\n")
    np.testing.assert_array_equal(seconds.arrival_s, [40.0, 100.0])  # seconds stay as given


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ("arrival=submit,gpus=n", "maps no 'duration'; required keys: arrival, duration, gpus"),
        ("arrival=submit,duration=t,gpus=n,queue=q", "unknown key 'queue'; required keys"),
        ("arrival=submit,duration", "expected KEY=COLUMN, got 'duration'"),
    ],
)
def test_csv_bad_mapping_lists_the_keys(tmp_path: Path, columns: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        csv_jobs(tmp_path, "submit,t,n\n0,1,1\n", columns=columns)


def test_csv_unknown_column_names_the_header(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError) as err:
        csv_jobs(
            tmp_path, "submit , runtime,n\n0,1,1\n", columns="arrival=t,duration=runtime,gpus=n"
        )
    assert (err.value.line, err.value.field) == (1, "t")
    assert "the header has: submit, runtime, n" in str(err.value)


def test_csv_flags_end_to_end(tmp_path: Path) -> None:
    trace = tmp_path / "mine.csv"
    trace.write_text(
        "submit,runtime,num_gpus\n"
        "2021-03-04 10:00:00,10,2\n2021-03-04 10:05:00,20,4\n2021-03-04 10:06:00,5,0\n"
    )
    out = tmp_path / "out"
    res = runner.invoke(app, [
        "cluster", "simulate", "--trace", str(trace), "--format", "csv", "--scheduler", "fifo",
        "--columns", "arrival=submit,duration=runtime,gpus=num_gpus", "--duration-unit", "min",
        "--cluster", "itp-cluster10", "--out", str(out),
    ])  # fmt: skip
    assert res.exit_code == 0, res.stdout + res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["jobs_total"], summary["jobs_finished"], summary["cpu_only_skipped"]) == (
        2,
        2,
        1,
    )
    assert summary["makespan_s"] == pytest.approx(300 + 1200, rel=1e-9)  # no queue on 16 GPUs
    config = tmp_path / "run.toml"
    config.write_text('[csv]\ncolumns = "arrival=submit,duration=runtime,gpus=num_gpus"\n')
    res = runner.invoke(app, [
        "cluster", "simulate", "--trace", str(trace), "--format", "csv", "--scheduler", "fifo",
        "--config", str(config), "--set", "csv.duration_unit=h", "--cluster", "itp-cluster10",
        "--out", str(tmp_path / "toml"),
    ])  # fmt: skip
    assert res.exit_code == 0, res.stdout + res.stderr
    summary = json.loads((tmp_path / "toml" / "summary.json").read_text())
    assert summary["makespan_s"] == pytest.approx(300 + 20 * 3600, rel=1e-9)


def test_csv_flag_on_another_format_is_one_line(tmp_path: Path) -> None:
    line = bad(*simulate_args(tmp_path, "--trace", "itp-cluster10", "--columns", "arrival=a"))
    assert "--columns (= --set csv.columns) only applies when 'csv' is part of the run" in line


def test_sweep_takes_each_formats_options(tmp_path: Path) -> None:
    trace = tmp_path / "s.csv"
    trace.write_text("t,d,g\n0,100,1\n50,100,2\n")
    res = runner.invoke(app, [
        "cluster", "sweep", "--traces", f"{trace},tiresias-60", "--format", "csv",
        "--columns", "arrival=t,duration=d,gpus=g", "--schedulers", "fifo", "--backend", "serial",
        "--cluster", "itp-cluster10", "--out", str(tmp_path / "sw"),
    ])  # fmt: skip
    assert res.exit_code == 0, res.stdout + res.stderr
    rows = json.loads((tmp_path / "sw" / "sweep.json").read_text())["groups"]
    assert [g["runs_ok"] for g in rows] == [1, 1]


# ---------------------------------------------------------------- bad input, every loader


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


ITP = "job_id,submission_time,duration,num_gpu\n"
POD = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"  # noqa: E501
POD_ROW = "openb-pod-{n},1000,1024,1,{milli},,LS,Running,{created},{deleted},{scheduled}\n"


def _pod(n: int, created: object = 0, deleted: object = 100, scheduled: object = 0) -> str:
    return POD_ROW.format(n=n, milli=500, created=created, deleted=deleted, scheduled=scheduled)


def _philly_raw(**change: object) -> str:
    records = json.loads(source("philly-raw").read_text())[:3]
    records[1].update(change)
    return json.dumps(records, indent=1)


def _helios_text(**change: object) -> str:
    records = _helios_records()
    records[1].update(change)
    return json.dumps(records, indent=1)


def _helios_line(text: str) -> int:
    return [i + 1 for i, ln in enumerate(text.splitlines()) if ln == " {"][1]


CASES = {
    # name: (format, file name, text, line, field, why)
    "csv time": ("csv", "t.csv", "arrival,duration,gpus\n2021-03-04 10:00,1,1\nyesterday,1,1\n",
                 3, "arrival", "not an ISO date-time (2020-03-31 20:00:34): 'yesterday'"),
    "csv mixed": ("csv", "t.csv", "arrival,duration,gpus\n10,1,1\n2021-03-04 10:00,1,1\n",
                  3, "arrival", "not a number of seconds like the first row's"),
    "csv negative": ("csv", "t.csv", "arrival,duration,gpus\n0,-5,1\n", 2, "duration",
                     "must be > 0"),
    "csv duplicate": ("csv", "t.csv", "id,arrival,duration,gpus\nx,0,5,1\ny,1,5,1\nx,2,5,1\n",
                      4, "id", "duplicate job id 'x' (first on line 2)"),
    "itp negative": ("itp", "c.csv", ITP + "a,0,600,1\nb,10,-600,2\n", 3, "duration",
                     "must be > 0"),
    "itp time": ("itp", "c.csv", ITP + "a,soon,600,1\n", 2, "submission_time",
                 "not a number: 'soon'"),
    "itp duplicate": ("itp", "c.csv", ITP + "a,0,600,1\na,5,600,1\n", 3, "job_id",
                      "duplicate job id 'a'"),
    "alibaba time": ("alibaba-gpu-2023", "p.csv", POD + _pod(0) + _pod(1, created="x"), 3,
                     "creation_time", "not a number: 'x'"),
    "alibaba negative": ("alibaba-gpu-2023", "p.csv", POD + _pod(0, deleted=50, scheduled=60), 2,
                         "deletion_time", "50 is before scheduled_time 60"),
    "alibaba duplicate": ("alibaba-gpu-2023", "p.csv", POD + _pod(7) + _pod(7), 3, "name",
                          "duplicate job id 'openb-pod-7'"),
    "tiresias duplicate": ("tiresias", "t.csv",
                           "job_id,num_gpu,submit_time,iterations,model_name,duration\n"
                           "1,1,0,10,vgg16,100\n1,1,5,10,vgg16,100\n", 3, "job_id",
                           "duplicate job id '1' (first on line 2)"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_csv_like_input_names_file_line_and_field(tmp_path: Path, case: str) -> None:
    fmt, name, text, line_no, field, why = CASES[case]
    path = _write(tmp_path, name, text)
    line = bad(*simulate_args(tmp_path, "--trace", str(path), "--format", fmt))
    assert line.startswith(f"error: {path}:{line_no}: field {field!r} "), line
    assert why in line


@pytest.mark.parametrize(
    ("change", "field", "why"),
    [
        ({"submit_time": "31/03/2020"}, "submit_time", "not an ISO date-time"),
        ({"duration": "-60"}, "duration", "must be > 0"),
        ({"job_id": "396689"}, "job_id", "duplicate job id '396689'"),
        ({"cross_rack_slowdown": "1.4"}, "cross_rack_slowdown", "must be a speed factor in (0, 1]"),
    ],
)
def test_bad_helios_record(tmp_path: Path, change: dict[str, object], field: str, why: str) -> None:
    text = _helios_text(**change)
    path = _write(tmp_path, "h.json", text)
    line = bad(*simulate_args(tmp_path, "--trace", str(path), "--format", "helios"))
    assert line.startswith(f"error: {path}:{_helios_line(text)}: field {field!r} "), line
    assert why in line


@pytest.mark.parametrize(
    ("change", "field", "why"),
    [
        ({"submitted_time": "Oct 7"}, "submitted_time", "not an ISO date-time"),
        (
            {
                "attempts": [
                    {"start_time": "2017-10-07 10:00:00", "end_time": "2017-10-07 09:00:00"}
                ]
            },
            "end_time",
            "is before start_time",
        ),
        ({"id": "application_1506638472019_14199"}, "id", "duplicate job id"),
        ({"attempts": []}, "attempts", "must be a non-empty list"),
    ],
)
def test_bad_philly_raw_record(
    tmp_path: Path, change: dict[str, object], field: str, why: str
) -> None:
    text = _philly_raw(**change)
    path = _write(tmp_path, "p.json", text)
    line = bad(*simulate_args(tmp_path, "--trace", str(path), "--format", "philly-raw"))
    assert line.startswith(f"error: {path}:{_helios_line(text)}: field {field!r} "), line
    assert why in line


# ---------------------------------------------------------------- jobs larger than the cluster


def test_oversized_jobs_fail_or_are_dropped_and_counted(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "big.csv", "id,arrival,duration,gpus\na,0,60,2\nhuge,5,60,32\nb,9,60,2\n"
    )
    args = simulate_args(
        tmp_path, "--trace", str(path), "--format", "csv", "--cluster", "itp-cluster10"
    )
    line = bad(*args)
    assert line == "error: job 'huge' needs 32 GPUs but cluster 'itp-cluster10' has only 16"
    res = runner.invoke(app, [*args, "--drop-oversized"])
    assert res.exit_code == 0, res.stdout + res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["jobs_total"], summary["dropped_oversized"]) == (2, 1)
    spec = RunSpec(trace=str(path), format="csv", cluster="itp-cluster10", drop_oversized=True)
    jobs, _ = load_jobs(spec)
    assert jobs.name == ("a", "b") and jobs.trace_notes == {"dropped_oversized": 1}
    fits, _ = load_jobs(RunSpec(trace="itp-cluster10", drop_oversized=True))
    assert len(fits) == 260 and fits.trace_notes == {"dropped_oversized": 0}
    tiny = _write(
        tmp_path, "tiny.toml", "[cluster]\nracks = 1\nmachines_per_rack = 1\ngpus_per_machine = 1\n"
    )
    with pytest.raises(RecperfError, match="every job needs more than the 1 GPUs of 'tiny'"):
        load_jobs(RunSpec(trace=str(path), format="csv", cluster=str(tiny), drop_oversized=True))


# ---------------------------------------------------------------- listing


def test_list_shows_the_new_formats_and_traces() -> None:
    res = runner.invoke(app, ["cluster", "list"])
    assert res.exit_code == 0
    text = " ".join(res.stdout.split())
    for name in ("itp", "alibaba-gpu-2023", "philly-raw", "csv", "itp-cluster01", "openb-16"):
        assert name in text
