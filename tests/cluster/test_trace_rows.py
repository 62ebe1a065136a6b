"""Trace rows as real files have them: rows that cannot be simulated (dropped and counted with
--drop-invalid, else one error naming the row and the flag), odd but valid files (a byte-order
mark, trailing blank lines, Unix-epoch times) read, and wrong ones (extra fields, a NUL byte,
repeated JSON keys, unknown cluster sections) refused in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.cluster.api import RunSpec, dropping_invalid, load_jobs
from recperf.cluster.topology import load_cluster
from recperf.cluster.traces import BUNDLED
from recperf.cluster.traces.common import bundled
from recperf.core.config import load_toml
from recperf.core.errors import ConfigError, TraceFormatError
from recperf.report.cluster_section import run_trace, section_from_runs

runner = CliRunner()
FIXTURE = Path(__file__).parents[1] / "data" / "cluster" / "philly-schema-zero-runtime.csv"
PHILLY_COLUMNS = "arrival=start-time,duration=run-time,gpus=num-gpus"
HINT = "(--drop-invalid drops such rows and counts them)"


def cli(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout + res.stderr


def simulate(tmp_path: Path, *args: str) -> tuple[int, str]:
    return cli("cluster", "simulate", "--scheduler", "fifo", "--out", str(tmp_path / "o"), *args)


def one_error(code: int, text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), text
    return lines[0]


def summary(tmp_path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((tmp_path / "o" / "summary.json").read_text())
    return data


def test_zero_run_times_are_dropped_and_counted(tmp_path: Path) -> None:
    code, text = simulate(
        tmp_path, "--trace", str(FIXTURE), "--format", "csv", "--columns", PHILLY_COLUMNS,
        "--drop-invalid",
    )  # fmt: skip
    assert code == 0, text
    got = summary(tmp_path)
    assert got["jobs_finished"] == 38
    assert got["dropped_invalid"] == 2
    assert got["dropped_invalid_by_reason"] == {"run-time <= 0": 2}


def test_zero_run_time_without_the_flag_names_row_and_flag(tmp_path: Path) -> None:
    line = one_error(
        *simulate(tmp_path, "--trace", str(FIXTURE), "--format", "csv", "--columns", PHILLY_COLUMNS)
    )
    assert line.startswith(f"error: {FIXTURE}:12: field 'run-time' must be > 0")
    assert line.endswith(f"got '0' {HINT}")
    assert not (tmp_path / "o" / "summary.json").exists()


# One file per format with one good row and rows that cannot be simulated, and the reasons.
TIRESIAS = "job_id,num_gpu,submit_time,iterations,model_name,duration\n"
CASES = {
    "tiresias": (
        TIRESIAS + "a,1,0,100,vgg16,50\nb,0,5,100,vgg16,50\nc,2,5,100,vgg16,0\nd,2,x,100,vgg16,9\n",
        {"num_gpu <= 0": 1, "duration <= 0": 1, "submit_time not a number": 1},
    ),
    "csv": (
        "arrival,duration,gpus\n0,10,1\n5,-3,1\n7,10,1.5\n8,10\n",
        {"duration <= 0": 1, "gpus not a whole number": 1, "too few fields": 1},
    ),
    "itp": (
        "job_id,submission_time,duration,num_gpu\na,0,10,1\nb,1,0,1\nc,2,10,-1\n",
        {"duration <= 0": 1, "num_gpu < 0": 1},
    ),
    "helios": (
        json.dumps(
            [
                {
                    "job_id": "a",
                    "max_parallelism": 1,
                    "arrival_time": 0,
                    "duration": 9,
                    "model": "m",
                },
                {
                    "job_id": "b",
                    "max_parallelism": 0,
                    "arrival_time": 1,
                    "duration": 9,
                    "model": "m",
                },
                {"job_id": "c", "max_parallelism": 1, "arrival_time": 2, "model": "m"},
            ],
            indent=1,
        ),
        {"max_parallelism <= 0": 1, "duration missing": 1},
    ),
    "philly-raw": (
        json.dumps(
            [
                {
                    "id": "a",
                    "num_gpus": 4,
                    "submitted_time": "2017-10-03 10:00:00",
                    "attempts": [
                        {"start_time": "2017-10-03 10:00:00", "end_time": "2017-10-03 11:00:00"}
                    ],
                },
                {
                    "id": "b",
                    "num_gpus": 4,
                    "submitted_time": "2017-10-03 10:00:00",
                    "attempts": [
                        {"start_time": "2017-10-03 10:00:00", "end_time": "2017-10-03 10:00:00"}
                    ],
                },
                {
                    "id": "c",
                    "num_gpus": 4,
                    "submitted_time": "yesterday",
                    "attempts": [
                        {"start_time": "2017-10-03 10:00:00", "end_time": "2017-10-03 11:00:00"}
                    ],
                },
            ],
            indent=1,
        ),
        {"attempts' run time <= 0": 1, "submitted_time not a time": 1},
    ),
    "alibaba-gpu-2023": (
        "name,num_gpu,gpu_milli,creation_time,scheduled_time,deletion_time\n"
        "a,1,1000,0,0,100\nb,2,1000,10,20,5\nc,2,1000,,,100\n",
        {"deletion_time before scheduled_time": 1, "creation_time not a number": 1},
    ),
    "philly": (
        "ResNet-50 (batch size 64)\tcmd\t1\tFalse\t1000\t0\t1\n"
        "ResNet-50 (batch size 64)\tcmd\t1\tFalse\t0\t5\t1\n"
        "Nonesuch\tcmd\t1\tFalse\t1000\t5\t1\n"
        "ResNet-50 (batch size 64)\tcmd\t1\tFalse\t1000\t5\n",
        {"total_steps <= 0": 1, "job_type not measured": 1, "too few fields": 1},
    ),
}


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_every_format_drops_and_counts_by_reason(tmp_path: Path, fmt: str) -> None:
    text, reasons = CASES[fmt]
    path = tmp_path / "trace.txt"
    path.write_text(text)
    jobs, _ = load_jobs(dropping_invalid(RunSpec(trace=str(path), format=fmt)))
    assert len(jobs) == 1
    assert jobs.dropped_invalid == dict(sorted(reasons.items()))
    with pytest.raises(TraceFormatError) as err:
        load_jobs(RunSpec(trace=str(path), format=fmt))
    assert str(err.value).endswith(HINT) and err.value.line is not None


def test_csv_keeps_cpu_only_rows_as_skipped_not_invalid(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival,duration,gpus\n0,10,1\n1,10,0\n2,0,1\n")
    jobs, _ = load_jobs(dropping_invalid(RunSpec(trace=str(path), format="csv")))
    assert jobs.trace_notes == {"cpu_only_skipped": 1}
    assert jobs.dropped_invalid == {"duration <= 0": 1}


@pytest.mark.parametrize(
    "how",
    [("--drop-invalid",), ("--set", "csv.drop_invalid=true"), ("--config", "CONFIG")],
)
def test_drop_invalid_by_flag_set_or_toml(tmp_path: Path, how: tuple[str, ...]) -> None:
    config = tmp_path / "run.toml"
    config.write_text("[csv]\ndrop_invalid = true\n")
    args = [str(config) if a == "CONFIG" else a for a in how]
    code, text = simulate(
        tmp_path, "--trace", str(FIXTURE), "--format", "csv", "--columns", PHILLY_COLUMNS, *args
    )
    assert code == 0, text
    assert summary(tmp_path)["dropped_invalid"] == 2


def test_compare_and_sweep_take_the_flag(tmp_path: Path) -> None:
    trace = ["--format", "csv", "--columns", PHILLY_COLUMNS, "--drop-invalid"]
    out = str(tmp_path / "cmp")
    code, text = cli("cluster", "compare", "--trace", str(FIXTURE), "--schedulers", "fifo,sjf",
                     "--out", out, *trace)  # fmt: skip
    assert code == 0, text
    runs = json.loads((tmp_path / "cmp" / "compare.json").read_text())["runs"]
    assert [r["dropped_invalid"] for r in runs] == [2, 2]
    out = str(tmp_path / "sweep")
    code, text = cli("cluster", "sweep", "--traces", f"{FIXTURE},tiresias-60", "--schedulers",
                     "fifo", "--backend", "serial", "--out", out, *trace)  # fmt: skip
    assert code == 0, text
    table = pq.read_table(tmp_path / "sweep" / "runs.parquet").to_pydict()
    assert table["dropped_invalid"] == [2, 0]
    assert [json.loads(r) for r in table["dropped_invalid_by_reason"]] == [
        {"run-time <= 0": 2},
        {},
    ]


def test_every_row_invalid_says_so(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival,duration,gpus\n0,0,1\n1,0,1\n")
    line = one_error(*simulate(tmp_path, "--trace", str(path), "--format", "csv", "--drop-invalid"))
    assert line == f"error: {path}: holds no jobs (2 rows dropped as invalid)"


BOM = "\ufeff"
BOM_FILES = [
    ("tiresias", "tiresias/trace-60.csv", None),
    ("helios", "helios/sense-500.json", None),
    ("itp", "itp/cluster10.csv", "itp-cluster10"),
    ("csv", "csv/itp-cluster10.csv", "itp-cluster10"),
    ("alibaba-gpu-2023", "alibaba-gpu-2023/openb_pod_list_default-every4.csv", None),
    ("philly-raw", "philly-raw/jobs_pass_ge4gpu-every10.json", None),
    ("philly", "philly/0e4a51.trace", None),
]


@pytest.mark.parametrize(("fmt", "relative", "cluster"), BOM_FILES)
def test_a_byte_order_mark_is_read_past(
    tmp_path: Path, fmt: str, relative: str, cluster: str | None
) -> None:
    source = bundled(relative)
    path = tmp_path / source.name
    path.write_text(BOM + source.read_text(encoding="utf-8"), encoding="utf-8")
    want, _ = load_jobs(RunSpec(trace=str(source), format=fmt, cluster=cluster))
    got, _ = load_jobs(RunSpec(trace=str(path), format=fmt, cluster=cluster))
    assert len(got) == len(want) > 0 and got.model == want.model
    assert (got.arrival_s == want.arrival_s).all() and (got.gpus == want.gpus).all()


def test_a_byte_order_mark_in_cluster_and_config_toml(tmp_path: Path) -> None:
    cluster = tmp_path / "c.toml"
    cluster.write_text(BOM + "[cluster]\nracks = 2\nmachines_per_rack = 3\n", encoding="utf-8")
    assert load_cluster(str(cluster)).machines == 6
    config = tmp_path / "run.toml"
    config.write_text(BOM + "[engine]\nround_s = 60\n", encoding="utf-8")
    assert load_toml(config) == {"engine": {"round_s": 60}}


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("csv", "arrival,duration,gpus\n0,10,1\n5,10,2\n\n\n  \n,,\n"),
        ("tiresias", TIRESIAS + "a,1,0,100,vgg16,50\nb,2,5,100,vgg16,50\n\n \n\n"),
        ("itp", "job_id,submission_time,duration,num_gpu\na,0,10,1\nb,5,10,2\n\n\n"),
        ("alibaba-gpu-2023", "name,num_gpu,gpu_milli,creation_time,scheduled_time,"
         "deletion_time\na,1,1000,0,0,100\nb,2,1000,5,5,100\n\n  \n"),
    ],
)  # fmt: skip
def test_trailing_blank_lines(tmp_path: Path, fmt: str, text: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    jobs, _ = load_jobs(RunSpec(trace=str(path), format=fmt))
    assert list(jobs.gpus) == [1, 2] and list(jobs.arrival_s) == [0.0, 5.0]


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("tiresias", TIRESIAS + "a,1,1585000000,100,vgg16,50\nb,2,1585000030,100,vgg16,50\n"),
        ("csv", "arrival,duration,gpus\n1585000030,10,2\n1585000000,10,1\n"),
    ],
)
def test_unix_epoch_arrivals_are_rebased_to_the_first_job(
    tmp_path: Path, fmt: str, text: str
) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    jobs, _ = load_jobs(RunSpec(trace=str(path), format=fmt))
    assert list(jobs.arrival_s) == [0.0, 30.0] and list(jobs.gpus) == [1, 2]


@pytest.mark.parametrize(
    ("rows", "line", "why"),
    [
        ("0,10,1\n1585000000,10,1\n", 3, "'1585000000' is over 10 years after the first job"),
        ("1e12,10,1\n", 2, "or Unix-epoch seconds before 2100, got '1e12'"),
    ],
)
def test_epoch_times_that_cannot_be(tmp_path: Path, rows: str, line: int, why: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival,duration,gpus\n" + rows)
    with pytest.raises(TraceFormatError) as err:
        load_jobs(RunSpec(trace=str(path), format="csv"))
    assert err.value.line == line and why in str(err.value)


@pytest.mark.parametrize(
    ("fmt", "text", "line"),
    [
        ("csv", "arrival,duration,gpus\n0,10,1\n5,10,2,7\n", 3),
        ("tiresias", TIRESIAS + "z,1,0,100,vgg16,50\na,1,0,100,vgg16,50,extra\n", 3),
        ("alibaba-gpu-2023", "name,num_gpu,gpu_milli,creation_time,scheduled_time,"
         "deletion_time\na,1,1000,0,0,100\nb,1,1000,0,0,100,9\n", 3),
    ],
)  # fmt: skip
def test_a_row_with_extra_fields(tmp_path: Path, fmt: str, text: str, line: int) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    msg = one_error(*simulate(tmp_path, "--trace", str(path), "--format", fmt))
    assert msg.startswith(f"error: {path}:{line}: has ") and "the header has" in msg
    jobs, _ = load_jobs(dropping_invalid(RunSpec(trace=str(path), format=fmt)))
    assert jobs.dropped_invalid == {"too many fields": 1}


def test_a_nul_byte_anywhere_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival,duration,gpus,note\n0,10,1,ok\n5,10,2,b\x00d\n")
    line = one_error(*simulate(tmp_path, "--trace", str(path), "--format", "csv"))
    assert line == f"error: {path}:3: holds a NUL byte: not a text trace"


@pytest.mark.parametrize(
    ("fmt", "record", "key"),
    [
        ("helios", '{"job_id": "a", "max_parallelism": 1, "arrival_time": 0, "duration": 9, '
         '"model": "m", "duration": 90}', "duration"),
        ("philly-raw", '{"id": "a", "num_gpus": 4, "submitted_time": "2017-10-03 10:00:00", '
         '"attempts": [{"start_time": "2017-10-03 10:00:00", "end_time": "2017-10-03 11:00:00",'
         ' "end_time": "2017-10-03 12:00:00"}]}', "end_time"),
    ],
)  # fmt: skip
def test_json_records_with_a_repeated_key(tmp_path: Path, fmt: str, record: str, key: str) -> None:
    path = tmp_path / "t.json"
    first = record.replace('"a"', '"z"')
    path.write_text(f"[\n{first},\n{record}\n]\n")
    line = one_error(*simulate(tmp_path, "--trace", str(path), "--format", fmt))
    assert line.startswith(f"error: {path}:2: field {key!r} appears twice")


@pytest.mark.parametrize(
    ("toml", "why"),
    [
        ("[cluster]\nracks = 2\n[clster]\nracks = 3\n", "unknown section [clster] beside"),
        ("racks = 3\n[cluster]\nracks = 2\n", "unknown key 'racks' beside [cluster]"),
        ("[cluster]\nrackz = 2\n", "unknown key 'rackz'"),
        ("[clster]\nracks = 2\n", "unknown key 'clster'"),
    ],
)
def test_a_cluster_file_with_unknown_sections_or_keys(tmp_path: Path, toml: str, why: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=re.escape(why)):
        load_cluster(str(path))
    line = one_error(*simulate(tmp_path, "--trace", "tiresias-60", "--cluster", str(path)))
    assert line.startswith(f"error: {path}: ")


def test_cluster_list_says_what_each_bundled_trace_drops() -> None:
    code, text = cli("cluster", "list")
    assert code == 0, text
    flat = " ".join(text.split())
    files = [name for name, trace in BUNDLED.items() if trace.format != "synthetic"]
    for name in files:
        assert f"{name} (" in flat
    assert flat.count("; 0 rows dropped as invalid)") == len(files)


def test_the_report_says_what_a_trace_dropped() -> None:
    run = run_trace(dropping_invalid(RunSpec(trace="tiresias-60")), ("fifo",))
    section = section_from_runs([run])
    assert section.data["traces"]["tiresias-60"]["dropped_invalid"] == 0
    assert "0 trace rows dropped as invalid" in section.html
