"""Bad input to ``recperf stalls``: each case is one error line naming what is wrong and the
allowed values, exit code 2, no traceback, and nothing computed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recperf.cli.stalls import app
from recperf.stalls.cost.catalog import INSTANCE_COLUMNS
from recperf.stalls.run.spec import RunSpec

cli = CliRunner()
GOOD_MODEL = {"alpha_s": 1e-5, "bucket_s": 1e-5, "beta_intra_s_per_byte": 1e-9,
              "net_efficiency": 1.0, "beta_net_s_per_byte": 0.0}  # fmt: skip
SUMMARY = {"compute_s": 0.5, "backward_s": 0.3, "data_fetch_stall_s": 0.01,
           "data_prep_stall_s": 0.02, "grad_bytes": 10**8, "num_layers": 10,
           "param_bytes": 10**8, "flops_per_iter": 1e12, "batch_size": 256, "device": "cpu",
           "device_name": "x86_64", "workload": "dlrm"}  # fmt: skip
SAMPLE = {"grad_bytes": 1e6, "buckets": 1, "ranks": 2, "seconds": 0.01}


def one_line_error(args: list[str]) -> str:
    res = cli.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error: ")
    return lines[0].removeprefix("error: ")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--delay-ms", "nan"], "profile: delay_ms: expected a finite number, got nan"),
        (["--delay-ms", "-5"], "profile: delay_ms = -5.0 is outside the allowed range [0, inf]"),
        (["--warmup", "-1"], "profile: warmup = -1 is outside the allowed range [0, inf]"),
        (["--set", "profile.timeout_s=-1"],
         "profile: timeout_s = -1.0 is outside the allowed range (0, inf]"),
        (["--torch-trace-iters", "-1"],
         "profile: torch_trace_iters = -1 is outside the allowed range [0, 20]"),
        (["--workload", "mlp", "--option", "foo=1"],
         "stall workload 'mlp': unknown key 'foo'; allowed: classes, features, hidden, name"),
    ],
)  # fmt: skip
def test_profile_rejects_before_any_run(tmp_path: Path, flags: list[str], message: str) -> None:
    out = tmp_path / "out"
    assert one_line_error(["profile", "--out", str(out), *flags]) == message
    assert list(out.iterdir()) == []  # no run started


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--budget-h", "nan"], "budget_h = nan: expected a finite number in (0, inf]"),
        (["--budget-h", "inf"], "budget_h = inf: expected a finite number in (0, inf]"),
        (["--budget-h", "0"], "budget_h = 0.0 is outside the allowed range (0, inf]"),
        (["--budget-h", "-1"], "budget_h = -1.0 is outside the allowed range (0, inf]"),
        (["--budget-h", "1", "--epochs", "nan"],
         "epochs = nan: expected a finite number in (0, inf]"),
        (["--budget-h", "1", "--efficiency", "nan"],
         "efficiency = nan: expected a finite number in (0, 1]"),
        (["--budget-h", "1", "--epoch-samples", "0"],
         "epoch_samples = 0 is outside the allowed range [1, inf]"),
        (["--budget-h", "1e308", "--epochs", "1e308"],
         "epochs = 1e+308, epoch_samples = 45840617: the predicted time or cost is too large "
         "to represent"),
    ],
)  # fmt: skip
def test_advise_numbers(tmp_path: Path, flags: list[str], message: str) -> None:
    write(tmp_path / "prof" / "summary.json", json.dumps(SUMMARY))
    assert one_line_error(["advise", "--profile", str(tmp_path / "prof"), *flags]) == message
    assert not (tmp_path / "prof" / "advice.json").exists()


@pytest.mark.parametrize(
    ("price", "why"),
    [("nan", "'nan'"), ("inf", "'inf'"), ("0", "'0'"), ("-3", "'-3'"), ("", "''")],
)
def test_advise_catalog_price_must_be_finite_and_positive(
    tmp_path: Path, price: str, why: str
) -> None:
    write(tmp_path / "prof" / "summary.json", json.dumps(SUMMARY))
    catalog = write(
        tmp_path / "cat [1] ü.csv", ",".join(INSTANCE_COLUMNS) + f"\nx,1,V100,16,none,10,{price}\n"
    )
    args = ["advise", "--profile", str(tmp_path / "prof"), "--budget-h", "1"]
    message = one_line_error([*args, "--catalog", str(catalog)])
    assert message == f"{catalog}:2: field 'usd_per_hour' expected a finite number > 0, got {why}"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--grad-bytes", "nan"], "--grad-bytes = nan: expected a finite number in [0, inf]"),
        (["--grad-bytes", "-1"], "--grad-bytes = -1.0 is outside the allowed range [0, inf]"),
        (["--layers", "0"], "--layers = 0 is outside the allowed range [1, inf]"),
        (["--ranks", "0"], "--ranks = 0 is outside the allowed range [1, inf]"),
        (["--ranks", "2", "--nodes", "3"], "--nodes = 3 is outside the allowed range [1, 2]"),
        (["--nodes", "3", "--bandwidth", "1gbit"],
         "--ranks = 4: must be a multiple of --nodes = 3"),
        (["--nodes", "2"], "--nodes 2: more than one machine needs --bandwidth, e.g. 1gbit"),
        (["--backward-s", "-1"], "--backward-s = -1.0 is outside the allowed range [0, inf]"),
        (["--backward-s", "nan"], "--backward-s = nan: expected a finite number in [0, inf]"),
        (["--bandwidth", ""],
         "bandwidth '': expected a number and bit|kbit|mbit|gbit, e.g. 1gbit"),
    ],
)  # fmt: skip
def test_predict_checks_its_inputs(tmp_path: Path, flags: list[str], message: str) -> None:
    model = write(tmp_path / "m.json", json.dumps(GOOD_MODEL))
    base = {"--grad-bytes": "1e6", "--layers": "2", "--ranks": "4"}
    given = dict(zip(flags[::2], flags[1::2], strict=True))
    args = [x for k, v in {**base, **given}.items() for x in (k, v)]
    assert one_line_error(["predict", "--model", str(model), *args]) == message


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ({**GOOD_MODEL, "alpha_s": -1}, "alpha_s = -1.0 is outside the allowed range [0, inf]"),
        ({**GOOD_MODEL, "net_efficiency": "x"},
         "net_efficiency: expected a finite number, got 'x'"),
        (json.dumps({**GOOD_MODEL, "alpha_s": float("nan")}),
         "alpha_s: expected a finite number, got nan"),
        ([1, 2], "not a communication model file: expected a JSON object, got list"),
    ],
)  # fmt: skip
def test_predict_checks_the_model_on_load(tmp_path: Path, text: object, why: str) -> None:
    model = write(tmp_path / "m.json", text if isinstance(text, str) else json.dumps(text))
    args = ["predict", "--model", str(model), "--grad-bytes", "1", "--layers", "1", "--ranks", "2"]
    assert one_line_error(args) == f"{model}: {why}"


@pytest.mark.parametrize(
    ("trace", "why"),
    [
        ("{garbled", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ("{}", "'recperf.format' is None, expected 'recperf-stall-trace/3' "
         "(or 'recperf-stall-trace/1' or 'recperf-stall-trace/2')"),
        ("[1]", "the document is a JSON list, expected an object"),
        ('{"recperf": {"format": "recperf-stall-trace/1", "grad_bytes": 1, "param_bytes": 1, '
         '"num_param_tensors": 1, "flops_per_iter": 0, "device_name": "cpu", '
         '"instrumented": true}, "traceEvents": [{"name": "step", "ts": 0}]}',
         "'traceEvents[0].dur' = None, expected float"),
        ('{"recperf": {"format": "recperf-stall-trace/1"}}',
         "'recperf.grad_bytes' = None, expected int"),
        ('{"recperf": {"format": "recperf-stall-trace/2", "grad_bytes": 1, "param_bytes": 1, '
         '"num_param_tensors": 1, "flops_per_iter": 0, "device_name": "cpu", '
         '"instrumented": true}, "traceEvents": [{"ph": "M", "name": "thread_name"}, '
         '{"ph": "B", "name": "recperf:step", "ts": 0}]}',
         "'traceEvents[1].ph' = 'B', expected 'X' or 'M'"),
        ('{"recperf": {"format": "recperf-stall-trace/3", "grad_bytes": 1, "param_bytes": 1, '
         '"num_param_tensors": 1, "flops_per_iter": 0, "device_name": "cpu", '
         '"instrumented": true}, "traceEvents": [{"name": "recperf:allreduce", "ts": 0, '
         '"dur": 1, "args": {"iteration": 0, "last_launch": "soon"}}]}',
         "'traceEvents[0].args.last_launch' = 'soon', expected float"),
    ],
)  # fmt: skip
def test_analyze_names_a_garbled_rank_trace(tmp_path: Path, trace: str, why: str) -> None:
    run = tmp_path / "run [0]"
    run.mkdir()
    RunSpec(name="x", workload="mlp", ranks=1).save(run / "spec.json")
    rank0 = write(run / "rank0.json", trace)
    assert one_line_error(["analyze", "--run", str(run)]) == (
        f"{rank0}: not a recperf stall trace: {why}"
    )


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        (
            '{"name": "x", "workload": "mlp", "ranks": "two"}',
            "ranks: expected an integer, got 'two'",
        ),
        ("[1]", "not a run spec: expected a JSON object, got list"),
    ],
)
def test_analyze_names_a_bad_spec(tmp_path: Path, spec: str, why: str) -> None:
    path = write(tmp_path / "run" / "spec.json", spec)
    assert one_line_error(["analyze", "--run", str(path.parent)]) == f"{path}: {why}"


@pytest.mark.parametrize(
    ("samples", "why"),
    [
        (5, "comm_samples: expected a list, got int"),
        ([1], "comm_samples[0]: expected an object, got 1"),
        ([{**SAMPLE, "grad_bytes": "x"}],
         "comm_samples[0]: grad_bytes: expected a finite number, got 'x'"),
        ([SAMPLE, {**SAMPLE, "buckets": 1.5}],
         "comm_samples[1]: buckets: expected an integer, got 1.5"),
        ([{k: v for k, v in SAMPLE.items() if k != "seconds"}],
         "comm_samples[0]: missing required key 'seconds'; allowed: bandwidth_bytes_per_s, "
         "buckets, grad_bytes, nodes, ranks, seconds"),
        ([{**SAMPLE, "colour": 1}], "comm_samples[0]: unknown key 'colour'; allowed: "
         "bandwidth_bytes_per_s, buckets, grad_bytes, nodes, ranks, seconds"),
    ],
)  # fmt: skip
def test_fit_names_file_and_field_of_bad_comm_samples(
    tmp_path: Path, samples: object, why: str
) -> None:
    summary = write(
        tmp_path / "p" / "summary.json", json.dumps({**SUMMARY, "comm_samples": samples})
    )
    out = tmp_path / "m.json"
    args = ["fit", "--profiles", str(summary.parent), "--out", str(out)]
    assert one_line_error(args) == f"{summary}: {why}"
    assert not out.exists()


def test_fit_refuses_network_samples_at_one_bandwidth(tmp_path: Path) -> None:
    net = [{**SAMPLE, "grad_bytes": g, "nodes": 2, "bandwidth_bytes_per_s": 62.5e6,
            "seconds": 0.01 + g / 62.5e6} for g in (1e5, 1e6, 4e6, 1.6e7)]  # fmt: skip
    summary = write(tmp_path / "p" / "summary.json",
                    json.dumps({**SUMMARY, "comm_samples": [SAMPLE, SAMPLE, *net]}))  # fmt: skip
    out = tmp_path / "m.json"
    args = ["fit", "--profiles", str(summary.parent), "--hold", "alpha_s=1e-3", "--out", str(out)]
    assert one_line_error(args) == (
        "fit: net_efficiency and beta_net_s_per_byte cannot be told apart: every multi-node "
        "sample was measured at one bandwidth (500 Mbit/s); profiles at two or more bandwidths "
        "are needed (or hold one, e.g. --hold net_efficiency=1)"
    )
    assert not out.exists()
