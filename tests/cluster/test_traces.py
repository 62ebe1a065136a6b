"""Trace loaders: bundled traces, calibration against measurements, malformed input, synthetic."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from recperf.cluster.api import RunSpec, load_jobs, resolve_loader
from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.checks import check_loader
from recperf.cluster.network import comm_s
from recperf.cluster.topology import Cluster, Level, load_cluster
from recperf.cluster.traces import BUNDLED, bundled_path
from recperf.cluster.traces.synthetic import SyntheticConfig, SyntheticTrace, parse_mix
from recperf.core.errors import ConfigError, RegistryError, TraceFormatError

PHILLY_DIR = bundled_path(BUNDLED["philly"])
assert PHILLY_DIR is not None


def _histogram(gpus: np.ndarray) -> dict[int, int]:
    return dict(Counter(gpus.tolist()))


# ---------------------------------------------------------------- bundled traces


@pytest.mark.parametrize(
    ("trace", "jobs", "cluster", "histogram"),
    [
        (
            "philly",
            15_264,
            "philly",
            {1: 10480, 2: 463, 4: 2044, 7: 2, 8: 1916, 12: 6, 16: 255, 20: 1, 24: 5, 32: 91, 64: 1},
        ),
        ("tiresias-480", 480, "tiresias-n32g4", {1: 244, 2: 42, 4: 80, 8: 85, 16: 24, 32: 5}),
        ("tiresias-60", 60, "tiresias-n32g4", {1: 30, 2: 10, 4: 10, 8: 10}),
        (
            "helios-500",
            500,
            "helios",
            {1: 270, 8: 109, 4: 52, 16: 42, 2: 13, 32: 11, 40: 1, 48: 1, 56: 1},
        ),
    ],
)
def test_bundled_trace_counts(
    trace: str, jobs: int, cluster: str, histogram: dict[int, int]
) -> None:
    table, cl = load_jobs(RunSpec(trace=trace))
    assert len(table) == jobs
    assert cl.name == cluster
    assert _histogram(table.gpus) == histogram
    assert np.all(np.diff(table.arrival_s) >= 0)
    assert table.arrival_s[0] >= 0


def test_every_format_has_a_bundled_trace() -> None:
    assert {b.format for b in BUNDLED.values()} == set(TRACE_LOADERS.names())


@pytest.mark.parametrize("trace", sorted(BUNDLED))
def test_check_loader_passes_for_each_bundled_trace(trace: str) -> None:
    spec = RunSpec(trace=trace, synthetic=SyntheticConfig(jobs=300))
    loader, path = resolve_loader(spec)
    cluster = load_cluster(loader.default_cluster)
    table = check_loader(loader, path, cluster)
    assert len(table) == len(load_jobs(spec)[0])


def test_philly_loads_a_single_file_and_a_folder() -> None:
    whole, _ = load_jobs(RunSpec(trace="philly"))
    one, _ = load_jobs(RunSpec(trace=str(PHILLY_DIR / "0e4a51.trace"), format="philly"))
    assert 0 < len(one) < len(whole)
    assert all(name.startswith("0e4a51-") for name in one.name)
    assert set(one.name) <= set(whole.name)


def test_tiresias_reference_time_is_the_trace_duration() -> None:
    table, cluster = load_jobs(RunSpec(trace="tiresias-480"))
    levels = cluster.min_levels(table.gpus)
    ref = np.array(
        [
            table.compute_s[i] + comm_s(cluster, Level(int(lv)), table.gpus[i], table.grad_bytes[i])
            for i, lv in enumerate(levels)
        ]
    )
    path = bundled_path(BUNDLED["tiresias-480"])
    assert path is not None
    rows = [line.split(",") for line in path.read_text().splitlines()[1:]]
    duration = {r[0]: float(r[5]) for r in rows}
    expected = np.array([duration[name] for name in table.name])
    np.testing.assert_allclose(table.total_iters * ref, expected, rtol=1e-9)


# ---------------------------------------------------------------- Philly calibration

# For these types the all-reduce solved from the spread measurement is most of the measured
# iteration time (the loader floors compute at 5% of it), so they are checked on their own.
PHILLY_FLOORED = {("LM (batch size 10)", 8), ("LM (batch size 5)", 8)}


def _philly_measured() -> tuple[dict[tuple[str, int], float], dict[tuple[str, int], float]]:
    data = json.loads((PHILLY_DIR / "throughputs.json").read_text())

    def table(raw: dict) -> dict[tuple[str, int], float]:
        out = {}
        for key, entry in raw.items():
            name, _, k = key.strip("()").rpartition(",")
            out[(name.strip().strip("'"), int(k))] = float(entry["null"])
        return out

    return table(data["v100"]), table(data["v100_unconsolidated"])


def _philly_ratios() -> dict[tuple[str, int], tuple[float, float, float]]:
    """Per measured multi-GPU (type, GPUs): (model consolidated s/iter, model spread/consolidated
    iteration-time ratio, measured consolidated s/iter)."""
    table, cluster = load_jobs(RunSpec(trace="philly"))
    t_machine = table.compute_s + comm_s(cluster, Level.MACHINE, table.gpus, table.grad_bytes)
    t_rack = table.compute_s + comm_s(cluster, Level.RACK, table.gpus, table.grad_bytes)
    cons, spread = _philly_measured()
    out = {}
    for i, key in enumerate(zip(table.model, table.gpus.tolist(), strict=True)):
        if key[1] > 1 and key in spread and key not in out:
            out[key] = (float(t_machine[i]), float(t_machine[i] / t_rack[i]), 1.0 / cons[key])
    return out


def test_philly_spread_slowdown_matches_measured_throughput() -> None:
    cons, spread = _philly_measured()
    cluster = load_cluster("philly")
    ratios = _philly_ratios()
    assert len(ratios) >= 40  # most measured multi-GPU types occur in the trace
    checked_exact = 0
    for key, (t_cons, model_ratio, measured_t) in sorted(ratios.items()):
        if key in PHILLY_FLOORED:
            continue
        measured_ratio = min(spread[key] / cons[key], 1.0)
        assert t_cons == pytest.approx(measured_t, rel=1e-9), key
        if measured_ratio < 1.0:
            assert model_ratio == pytest.approx(measured_ratio, rel=1e-9), key
            checked_exact += 1
        else:
            # Spreading measured no slower: no gradient bytes, only the extra per-message
            # latency of the rack link remains.
            extra = 2 * (key[1] - 1) * (cluster.rack_latency_us - cluster.machine_latency_us) * 1e-6
            assert model_ratio == pytest.approx(t_cons / (t_cons + extra), rel=1e-9), key
    assert checked_exact >= 30


@pytest.mark.parametrize("key", sorted(PHILLY_FLOORED))
def test_philly_calibration_when_communication_dominates(key: tuple[str, int]) -> None:
    cons, spread = _philly_measured()
    t_cons, model_ratio, measured_t = _philly_ratios()[key]
    assert t_cons == pytest.approx(measured_t, rel=1e-6)
    assert model_ratio == pytest.approx(spread[key] / cons[key], rel=1e-6)


def test_philly_single_gpu_measured_types_have_no_sensitivity() -> None:
    # A3C and CycleGAN have only 1-GPU measurements: multi-GPU jobs of theirs carry no gradient
    # bytes, so spreading them costs only per-message latency.
    table, _ = load_jobs(RunSpec(trace="philly"))
    mask = np.isin(np.asarray(table.model), ["A3C", "CycleGAN"]) & (table.gpus > 1)
    assert mask.sum() > 0
    assert np.all(table.grad_bytes[mask] == 0.0)


# ---------------------------------------------------------------- malformed input


def _philly_lines() -> list[str]:
    return (PHILLY_DIR / "0e4a51.trace").read_text().splitlines()[:4]


def _with_field(line: str, index: int, value: str) -> str:
    parts = line.split("\t")
    parts[index] = value
    return "\t".join(parts)


def _load(path: Path, fmt: str) -> None:
    load_jobs(RunSpec(trace=str(path), format=fmt))


def _assert_names(err: TraceFormatError, path: Path, line: int, field: str | None) -> None:
    assert (err.file, err.line, err.field) == (str(path), line, field)
    assert str(err).startswith(f"{path}:{line}:")
    if field is not None:
        assert f"field {field!r}" in str(err)


@pytest.mark.parametrize(
    ("index", "value", "field", "why"),
    [
        (4, "many", "total_steps", "not a number: 'many'"),
        (4, "0", "total_steps", "must be > 0"),
        (5, "soon", "arrival_time_s", "not a number: 'soon'"),
        (5, "-1", "arrival_time_s", "must be >= 0"),
        (6, "0", "scale_factor", "must be > 0"),
        (6, "two", "scale_factor", "not a number: 'two'"),
        (0, "NoSuchModel (batch size 1)", "job_type", "is not in throughputs.json"),
    ],
)
def test_philly_bad_field_names_file_line_and_field(
    tmp_path: Path, index: int, value: str, field: str, why: str
) -> None:
    lines = _philly_lines()
    lines[2] = _with_field(lines[2], index, value)
    path = tmp_path / "bad.trace"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError) as err:
        _load(path, "philly")
    _assert_names(err.value, path, 3, field)
    assert why in str(err.value)


def test_philly_wrong_field_count(tmp_path: Path) -> None:
    lines = _philly_lines()
    lines[1] = "\t".join(lines[1].split("\t")[:6])
    path = tmp_path / "short.trace"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError) as err:
        _load(path, "philly")
    _assert_names(err.value, path, 2, None)
    assert "expected 7 tab-separated fields, got 6" in str(err.value)


def test_philly_blank_lines_keep_line_numbers(tmp_path: Path) -> None:
    lines = _philly_lines()
    lines[3] = _with_field(lines[3], 4, "x")
    path = tmp_path / "gaps.trace"
    path.write_text("\n".join([lines[0], "", lines[1], lines[2], "", lines[3]]) + "\n")
    with pytest.raises(TraceFormatError) as err:
        _load(path, "philly")
    _assert_names(err.value, path, 6, "total_steps")


@pytest.mark.parametrize(("index", "field"), [(4, "total_steps"), (5, "arrival_time_s")])
def test_philly_infinite_values_are_rejected(tmp_path: Path, index: int, field: str) -> None:
    from recperf.cluster.api import simulate

    lines = _philly_lines()
    lines[2] = _with_field(lines[2], index, "inf")
    path = tmp_path / "inf.trace"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError) as err:
        simulate(RunSpec(trace=str(path), format="philly"))
    _assert_names(err.value, path, 3, field)


TIRESIAS_HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval"


def _tiresias_rows() -> list[str]:
    return ["0,4,0,271,inception3,128,33", "1,1,33,241,vgg16,211,32", "2,2,40,100,resnet50,90,3"]


@pytest.mark.parametrize("column", ["num_gpu", "duration", "job_id"])
def test_tiresias_missing_header_column(tmp_path: Path, column: str) -> None:
    header = ",".join(c for c in TIRESIAS_HEADER.split(",") if c != column)
    path = tmp_path / "t.csv"
    path.write_text("\n".join([header, *_tiresias_rows()]) + "\n")
    with pytest.raises(TraceFormatError) as err:
        _load(path, "tiresias")
    _assert_names(err.value, path, 1, column)
    assert "missing from the header" in str(err.value)


@pytest.mark.parametrize(
    ("row", "column", "value", "why"),
    [
        (2, "duration", "-5", "must be > 0 and at most 3.15576e+08 s (10 years), got '-5'"),
        (3, "duration", "0", "must be > 0 and at most 3.15576e+08 s (10 years), got '0'"),
        (1, "submit_time", "-1", "must be >= 0 and at most 3.15576e+08 s (10 years), got '-1'"),
        (3, "num_gpu", "2.5", "must be a whole number, got '2.5'"),
        (2, "iterations", "lots", "not a number: 'lots'"),
        (1, "duration", "nan", "must be > 0 and at most 3.15576e+08 s (10 years), got 'nan'"),
    ],
)
def test_tiresias_bad_value_names_line_and_field(
    tmp_path: Path, row: int, column: str, value: str, why: str
) -> None:
    rows = [r.split(",") for r in _tiresias_rows()]
    rows[row - 1][TIRESIAS_HEADER.split(",").index(column)] = value
    path = tmp_path / "t.csv"
    path.write_text("\n".join([TIRESIAS_HEADER, *(",".join(r) for r in rows)]) + "\n")
    with pytest.raises(TraceFormatError) as err:
        _load(path, "tiresias")
    _assert_names(err.value, path, row + 1, column)  # the header is line 1
    assert why in str(err.value)


def _helios_text(records: list[dict]) -> str:
    # One key per line: record i (0-based) starts on line 2 + i * (keys + 2).
    return json.dumps(records, indent=1) + "\n"


def _helios_records() -> list[dict]:
    return [
        {
            "job_id": str(i),
            "max_parallelism": 2,
            "arrival_time": 10 * i,
            "duration": 600,
            "model": "ResNet50",
        }
        for i in range(3)
    ]


def test_helios_record_missing_duration(tmp_path: Path) -> None:
    records = _helios_records()
    del records[1]["duration"]
    path = tmp_path / "h.json"
    text = _helios_text(records)
    path.write_text(text)
    start = 1 + text.splitlines().index(" {", 2)  # the second record's opening brace
    with pytest.raises(TraceFormatError) as err:
        _load(path, "helios")
    _assert_names(err.value, path, start, "duration")
    assert "is missing" in str(err.value)


def test_helios_bad_value_names_its_record(tmp_path: Path) -> None:
    records = _helios_records()
    records[2]["max_parallelism"] = "{0}"  # braces inside a string must not confuse line finding
    records[2]["jobname"] = 'a } [ " {'
    path = tmp_path / "h.json"
    text = _helios_text(records)
    path.write_text(text)
    third = [i + 1 for i, line in enumerate(text.splitlines()) if line == " {"][2]
    with pytest.raises(TraceFormatError) as err:
        _load(path, "helios")
    _assert_names(err.value, path, third, "max_parallelism")


def test_helios_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    path.write_text('[\n {"job_id": "1",\n  "duration": 600,,\n }\n]\n')
    with pytest.raises(TraceFormatError) as err:
        _load(path, "helios")
    assert (err.value.file, err.value.line) == (str(path), 3)
    assert "invalid JSON" in str(err.value)


def test_helios_not_an_array(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    path.write_text('{"job_id": "1"}\n')
    with pytest.raises(TraceFormatError, match="expected a JSON array"):
        _load(path, "helios")


def test_unknown_trace_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        load_jobs(RunSpec(trace="tiresias-999"))
    assert "neither a file nor a bundled name" in str(err.value)
    for name in BUNDLED:
        assert name in str(err.value)


def test_format_that_contradicts_a_bundled_trace_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError, match=r"--format 'helios' does not match bundled trace 'tiresias-480'"
    ):
        load_jobs(RunSpec(trace="tiresias-480", format="helios"))


FORMATS = "alibaba-gpu-2023, csv, helios, itp, philly, philly-raw, synthetic, tiresias"


def test_trace_file_needs_a_format(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("\n".join([TIRESIAS_HEADER, *_tiresias_rows()]) + "\n")
    with pytest.raises(
        ConfigError,
        match=r"--format is required .* allowed: " + FORMATS,
    ):
        _load(path, None)  # type: ignore[arg-type]
    assert len(load_jobs(RunSpec(trace=str(path), format="tiresias"))[0]) == 3


def test_unknown_format_for_a_file_lists_the_formats(tmp_path: Path) -> None:
    # The format is resolved through the loader registry, so the error is a RegistryError (a
    # RecperfError like ConfigError: one line at the CLI), and it lists the known formats.
    path = tmp_path / "t.csv"
    path.write_text("\n".join([TIRESIAS_HEADER, *_tiresias_rows()]) + "\n")
    with pytest.raises(
        RegistryError,
        match=r"unknown trace format 'nosuch'; allowed: " + FORMATS,
    ):
        _load(path, "nosuch")


# ---------------------------------------------------------------- synthetic


def _synthetic(cluster: Cluster, seed: int, **kw: object) -> object:
    return SyntheticTrace(SyntheticConfig(**kw)).load(None, cluster, np.random.default_rng(seed))  # type: ignore[arg-type]


SMALL = Cluster(racks=2, machines_per_rack=2, gpus_per_machine=4)
COLUMNS = ("arrival_s", "gpus", "total_iters", "compute_s", "grad_bytes")


@pytest.mark.parametrize("dist", ["exp", "lognormal"])
def test_synthetic_same_seed_same_table(dist: str) -> None:
    a = _synthetic(SMALL, 3, jobs=200, duration_dist=dist)
    b = _synthetic(SMALL, 3, jobs=200, duration_dist=dist)
    c = _synthetic(SMALL, 4, jobs=200, duration_dist=dist)
    for col in COLUMNS:
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col))
    assert a.model == b.model and a.name == b.name
    for col in ("arrival_s", "total_iters", "compute_s"):
        assert not np.array_equal(getattr(a, col), getattr(c, col))


def test_synthetic_through_run_spec_uses_the_seed() -> None:
    spec = RunSpec(trace="synthetic", cluster="helios", synthetic=SyntheticConfig(jobs=50))
    a, _ = load_jobs(spec)
    b, _ = load_jobs(spec)
    c, _ = load_jobs(spec.replace(seed=1))
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    assert not np.array_equal(a.arrival_s, c.arrival_s)


@pytest.mark.parametrize("load", [0.5, 1.5])
@pytest.mark.parametrize(
    ("cluster", "mix"),
    [
        (Cluster(racks=1, machines_per_rack=4, gpus_per_machine=8), "1:0.6,2:0.1,4:0.15,8:0.15"),
        (Cluster(racks=8, machines_per_rack=16, gpus_per_machine=8), "4"),
    ],
)
def test_synthetic_load_sets_the_arrival_rate(cluster: Cluster, mix: str, load: float) -> None:
    mean_s = 1800.0
    table = _synthetic(
        cluster, 11, jobs=20_000, load=load, gpus_per_job=mix, mean_duration_s=mean_s
    )
    sizes, weights = parse_mix(mix)
    mean_gpus = float(np.dot(sizes, weights))
    expected_gap = mean_gpus * mean_s / (load * cluster.gpus)
    # 19,999 exponential gaps: relative standard error 0.7%, so 5% is ~7 standard errors.
    assert np.mean(np.diff(table.arrival_s)) == pytest.approx(expected_gap, rel=0.05)
    # And the offered load itself: GPU-seconds at the reference placement per GPU-second.
    ref_s = table.total_iters * (table.compute_s + _tightest_comm(table, cluster))
    offered = float(np.sum(table.gpus * ref_s)) / (float(table.arrival_s[-1]) * cluster.gpus)
    assert offered == pytest.approx(load, rel=0.05)
    assert np.mean(ref_s) == pytest.approx(mean_s, rel=0.05)


def _tightest_comm(table: object, cluster: Cluster) -> np.ndarray:
    levels = cluster.min_levels(table.gpus)  # type: ignore[attr-defined]
    out = np.zeros(len(levels))
    for lv in cluster.levels:
        mask = levels == lv
        out[mask] = comm_s(cluster, lv, table.gpus[mask], table.grad_bytes[mask])  # type: ignore[attr-defined]
    return out


def test_synthetic_gpu_mix_frequencies() -> None:
    table = _synthetic(SMALL, 0, jobs=20_000, gpus_per_job="1:0.5,4:0.3,8:0.2")
    freq = {g: n / len(table) for g, n in _histogram(table.gpus).items()}
    assert freq.keys() == {1, 4, 8}
    # binomial standard error <= 0.0036: 0.02 is > 5 standard errors
    assert freq == pytest.approx({1: 0.5, 4: 0.3, 8: 0.2}, abs=0.02)


@pytest.mark.parametrize(
    ("spec", "gpus", "weights"),
    [
        ("4", (4,), (1.0,)),
        ("1:0.6,4:0.3,8:0.1", (1, 4, 8), (0.6, 0.3, 0.1)),
        ("1:2, 2:2", (1, 2), (0.5, 0.5)),
        ("1:3,2:0", (1, 2), (1.0, 0.0)),
        (" 8 ", (8,), (1.0,)),
    ],
)
def test_parse_mix(spec: str, gpus: tuple[int, ...], weights: tuple[float, ...]) -> None:
    got_gpus, got_weights = parse_mix(spec)
    assert got_gpus == gpus
    assert got_weights == pytest.approx(weights)


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("", "expected K or a mix like '1:0.6,4:0.3,8:0.1'"),
        ("x", "expected K or a mix like '1:0.6,4:0.3,8:0.1'"),
        ("1:x", "expected K or a mix like '1:0.6,4:0.3,8:0.1'"),
        ("1.5", "expected K or a mix like '1:0.6,4:0.3,8:0.1'"),
        ("0", "GPUs must be >= 1, weights finite, >= 0, not all 0"),
        ("1:-1,2:3", "GPUs must be >= 1, weights finite, >= 0, not all 0"),
        ("1:0,2:0", "GPUs must be >= 1, weights finite, >= 0, not all 0"),
    ],
)
def test_parse_mix_errors(spec: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_mix(spec)
    assert str(err.value) == f"gpus_per_job = {spec!r}: {why}"
    with pytest.raises(ConfigError):
        SyntheticConfig(gpus_per_job=spec)


@pytest.mark.parametrize("spec", ["1:nan", "1:inf,2:1"])
def test_parse_mix_rejects_non_finite_weights(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_mix(spec)


def test_synthetic_mix_larger_than_the_cluster() -> None:
    with pytest.raises(ConfigError, match=r"gpus_per_job asks for 32 GPUs; the cluster has 16"):
        _synthetic(SMALL, 0, jobs=10, gpus_per_job="1:0.5,32:0.5")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("jobs", 0, "jobs = 0 is outside the allowed range [1, 1e+07]"),
        ("load", 0.0, "load = 0.0 is outside the allowed range [1e-06, 100]"),
        ("iter_s_max", 0.01, "iter_s_max = 0.01 is outside the allowed range [0.05, 3600]"),
    ],
)
def test_synthetic_config_ranges(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        replace(SyntheticConfig(), **{field: value})
    assert str(err.value) == message
