"""SkyPilot-format catalogs in the advisor: rows reduced to the cheapest price per instance
type (on-demand or spot, anywhere or in one region), bandwidths from recperf's own table, what is
skipped counted and named, advise end to end on a small catalog, and each kind of bad row named
by file, line and column."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.core.errors import ConfigError, TraceFormatError
from recperf.stalls.cost.advisor import (
    DEFAULT_MODEL,
    AdvisorConfig,
    ProfileSummary,
    advise,
    comm_seconds,
    predict_candidate,
)
from recperf.stalls.cost.catalog import Instance, load_catalog, load_gpu_models, load_instances
from recperf.stalls.cost.skypilot import gpu_memory_gib, gpu_name, load_links, load_skypilot

VMS = Path(__file__).parent.parent / "data" / "skypilot" / "vms.csv"
GPUS = load_gpu_models()
HEADER = VMS.read_text().splitlines()[0]
cli = CliRunner()
SUMMARY: dict[str, Any] = {
    "workload": "mlp", "compute_s": 0.5, "backward_s": 0.3, "data_fetch_stall_s": 0.01,
    "data_prep_stall_s": 0.02, "grad_bytes": 100_000_000, "num_layers": 10,
    "param_bytes": 100_000_000, "flops_per_iter": 1e12, "batch_size": 256, "device": "cpu",
    "device_name": "x86_64",
}  # fmt: skip
PROFILE = ProfileSummary.from_mapping(SUMMARY)


def test_cheapest_on_demand_price_per_type_and_what_is_skipped() -> None:
    instances, report = load_skypilot(VMS, GPUS)
    got = {i.instance: (i.gpus, i.gpu_model, i.gpu_mem_gib, i.usd_per_hour, i.location)
           for i in instances}  # fmt: skip
    assert got == {
        "g4dn.xlarge": (1, "T4", 15.0, 0.526, "us-east-1/use1-az1"),
        "g5.12xlarge": (4, "A10G", 24.0, 5.672, "us-east-1/use1-az1"),
        "p3.2xlarge": (1, "V100", 16.0, 3.06, "us-east-1/use1-az1"),
        "p3.8xlarge": (4, "V100", 16.0, 12.24, "us-east-1/use1-az1"),
        "p4d.24xlarge": (8, "A100", 40.0, 21.957642, "us-east-1/use1-az2"),
        "p4de.24xlarge": (8, "A100", 80.0, 40.9657, "us-east-1/use1-az2"),
    }
    p4d = next(i for i in instances if i.instance == "p4d.24xlarge")
    assert (p4d.intra_node_link, p4d.intra_node_gb_per_s, p4d.network_gbps) == ("nvlink3", 600, 400)
    assert (report.rows, report.instance_types, report.cpu_only, report.regions) == (18, 10, 1, 5)
    assert report.skipped == {
        "unknown_gpu": ["g6.xlarge (L4)", "inf2.xlarge (Inferentia2)"],
        "no_bandwidth": ["g5.2xlarge"],
        "no_price": ["p5.48xlarge"],
    }
    notes = report.notes()
    assert notes[0].startswith(f"catalog {VMS}: 6 of 10 GPU instance types used")
    assert "skipped 1 CPU-only instance type(s)" in notes
    assert "skipped 1 instance type(s) not in the bandwidth table: g5.2xlarge" in notes
    assert "skipped 1 instance type(s) without a on-demand price: p5.48xlarge" not in notes
    assert "skipped 1 instance type(s) without an on-demand price: p5.48xlarge" in notes


def test_spot_prices_and_one_region() -> None:
    spot = {i.instance: i.usd_per_hour for i in load_skypilot(VMS, GPUS, spot=True)[0]}
    assert spot["p3.2xlarge"] == 0.918 and spot["p5.48xlarge"] == 12.5  # empty spot cell skipped
    assert "p4de.24xlarge" not in spot  # no spot price
    eu, report = load_skypilot(VMS, GPUS, region="eu-west-1")
    assert {i.instance: i.usd_per_hour for i in eu} == {
        "p3.2xlarge": 3.305, "p3.8xlarge": 13.22, "g5.12xlarge": 7.09}  # fmt: skip
    assert report.region == "eu-west-1" and report.instance_types == 3
    with pytest.raises(ConfigError, match=r"--region mars-1: not in .*regions: ap-south-1, eu-"):
        load_skypilot(VMS, GPUS, region="mars-1")


@pytest.mark.parametrize(("name", "expected"), [
    ("A100", "A100"), ("A100-80GB", "A100"), ("a10g", "A10G"), ("V100-32GB", "V100"),
    ("H100-MEGA", None), ("L4", None), ("", None),
])  # fmt: skip
def test_gpu_names_map_to_the_gpu_table(name: str, expected: str | None) -> None:
    assert gpu_name(name, GPUS) == expected


@pytest.mark.parametrize(("info", "name", "gib"), [
    ("{'Gpus': [{'Name': 'A100', 'MemoryInfo': {'SizeInMiB': 40960}}]}", "A100", 40.0),
    ('{"Gpus": [{"Name": "T4", "MemoryInfo": {"SizeInMiB": 15360}}]}', "T4", 15.0),
    ("", "A100-80GB", 80.0), ("not a dict", "V100", None), ("{'Gpus': []}", "H100", None),
])  # fmt: skip
def test_gpu_memory_from_gpuinfo_or_name(info: str, name: str, gib: float | None) -> None:
    assert gpu_memory_gib(info, name) == gib


def test_bandwidth_table_agrees_with_the_bundled_catalog() -> None:
    links = load_links()
    bundled = {i.instance: i for i in load_instances()}
    assert set(bundled) <= set(links)
    for name, inst in bundled.items():
        link = links[name]
        assert (link.intra_node_link, link.network_gbps) == (inst.intra_node_link,
                                                             inst.network_gbps)  # fmt: skip
        assert link.source.startswith("network: aws.amazon.com/ec2/instance-types/")
        gpu = GPUS[inst.gpu_model]
        per_gpu = {"none": 0.0, "pcie3": gpu.pcie_gb_per_s, "pcie4": gpu.pcie_gb_per_s}
        assert link.intra_node_gb_per_s == per_gpu.get(link.intra_node_link,
                                                       gpu.nvlink_gb_per_s_per_gpu)  # fmt: skip


def test_advise_on_a_skypilot_catalog(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))
    out = tmp_path / "advice"
    res = cli.invoke(app, ["stalls", "advise", "--profile", str(tmp_path), "--budget-h", "2",
                           "--catalog", str(VMS), "--max-instances", "4", "--out", str(out),
                           "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data == json.loads((out / "advice.json").read_text())
    assert data["catalog"]["format"] == "skypilot" and data["catalog"]["price"] == "on-demand"
    assert any("g6.xlarge (L4)" in n for n in data["notes"]) and "note: skipped" in res.output
    # 400 MB per GPU fits everywhere: the six used types x 1..4 instances
    assert data["candidates_evaluated"] == 6 * 4
    instances, report = load_skypilot(VMS, GPUS)
    again = advise(PROFILE, AdvisorConfig(budget_h=2, epoch_samples=1_000_000, max_instances=4),
                   instances=instances, notes=report.notes())  # fmt: skip
    assert data["recommendation"] == json.loads(json.dumps(again.to_json()))["recommendation"]
    rec = again.recommendation
    assert rec is not None and rec.meets_budget
    assert rec.cost_usd == min(c.cost_usd for c in again.candidates if c.meets_budget)
    # p4de is p4d with more memory at a higher price: same time, never on the frontier
    by = {(c.instance, c.count): c for c in again.candidates}
    assert by[("p4de.24xlarge", 2)].total_h == by[("p4d.24xlarge", 2)].total_h
    assert all(c.instance != "p4de.24xlarge" for c in again.pareto)
    assert by[("g4dn.xlarge", 3)].usd_per_hour == pytest.approx(3 * 0.526)


BAD_ROWS = [
    ("p3.2xlarge,V100,1.0,8.0,61.0,,abc,0.9,us-east-1,use1-az1,x86_64", "Price",
     "expected a finite number > 0 or empty, got 'abc'"),
    ("p3.2xlarge,V100,1.0,8.0,61.0,,inf,0.9,us-east-1,use1-az1,x86_64", "Price", "got 'inf'"),
    ("p3.2xlarge,V100,1.0,8.0,61.0,,0,0.9,us-east-1,use1-az1,x86_64", "Price", "got '0'"),
    ("p3.2xlarge,V100,1.0,8.0,61.0,,3.06,-1,us-east-1,use1-az1,x86_64", "SpotPrice", "got '-1'"),
    ("p3.2xlarge,V100,four,8.0,61.0,,3.06,0.9,us-east-1,use1-az1,x86_64", "AcceleratorCount",
     "expected a number >= 0 or empty, got 'four'"),
    ("p3.2xlarge,V100,2.0,8.0,61.0,,3.06,0.9,us-east-1,use1-az1,x86_64", "AcceleratorCount",
     "'p3.2xlarge' has 2.0 here but 1.0 at line 2"),
    ("p3.2xlarge,A100,1.0,8.0,61.0,,3.06,0.9,us-east-1,use1-az1,x86_64", "AcceleratorName",
     "'p3.2xlarge' has 'A100' here but 'V100' at line 2"),
]  # fmt: skip
GOOD_ROW = "p3.2xlarge,V100,1.0,8.0,61.0,,3.06,0.9,us-west-2,usw2-az1,x86_64"


@pytest.mark.parametrize(("row", "column", "why"), BAD_ROWS)
def test_bad_rows_name_file_line_and_column(
    tmp_path: Path, row: str, column: str, why: str
) -> None:
    path = tmp_path / "vms.csv"
    path.write_text(f"{HEADER}\n{GOOD_ROW}\n{row}\n")
    with pytest.raises(TraceFormatError, match=why) as err:
        load_skypilot(path, GPUS)
    assert (err.value.file, err.value.line, err.value.field) == (str(path), 3, column)


def test_bad_row_is_one_line_in_the_cli(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))
    path = tmp_path / "vms.csv"
    path.write_text(f"{HEADER}\n{GOOD_ROW}\n{BAD_ROWS[0][0]}\n")
    res = cli.invoke(app, ["stalls", "advise", "--profile", str(tmp_path), "--budget-h", "1",
                           "--catalog", str(path)])  # fmt: skip
    assert res.exit_code == 2
    assert res.output.strip() == (f"error: {path}:3: field 'Price' expected a finite number > 0 "
                                  "or empty, got 'abc'")  # fmt: skip


def test_missing_column_fractional_gpus_and_nothing_usable(tmp_path: Path) -> None:
    path = tmp_path / "vms.csv"
    path.write_text(HEADER.replace(",SpotPrice", "") + "\n" + GOOD_ROW.replace(",0.9", "") + "\n")
    with pytest.raises(TraceFormatError, match="column missing") as err:
        load_skypilot(path, GPUS)
    assert (err.value.line, err.value.field) == (1, "SpotPrice")
    path.write_text(f"{HEADER}\nStandard_NV4as_v4,MI25,0.125,4.0,14.0,,0.17,,eastus,,x86_64\n"
                    ",A100,1.0,,,,2.93,0.88,us-central1,us-central1-a,x86_64\n")  # fmt: skip
    with pytest.raises(ConfigError, match=r"no usable GPU instance type: skipped 1 row\(s\) "
                       r"without an InstanceType; skipped 1 .* fraction of a GPU"):  # fmt: skip
        load_skypilot(path, GPUS)


def test_region_and_spot_need_a_skypilot_catalog() -> None:
    assert load_catalog(None, GPUS).notes == []
    with pytest.raises(ConfigError, match="--spot: only for a SkyPilot catalog"):
        load_catalog(None, GPUS, spot=True)
    with pytest.raises(ConfigError, match="--region: only for a SkyPilot catalog"):
        load_catalog(None, GPUS, region="us-east-1")
    with pytest.raises(ConfigError, match="--links: only for a SkyPilot catalog"):
        load_catalog(None, GPUS, links=VMS)
    assert load_catalog(VMS, GPUS, region="ap-south-1").report is not None


def test_own_bandwidth_table(tmp_path: Path) -> None:
    links = tmp_path / "links.csv"
    links.write_text("instance,intra_node_link,intra_node_gb_per_s,network_gbps,source\n"
                     "g5.2xlarge,none,0,10,my notes\n")  # fmt: skip
    cat = load_catalog(VMS, GPUS, links=links)
    assert [i.instance for i in cat.instances] == ["g5.2xlarge"]
    assert cat.instances[0].network_gbps == 10 and cat.instances[0].usd_per_hour == 1.212
    links.write_text("instance,intra_node_link,intra_node_gb_per_s,network_gbps,source\n"
                     "g5.2xlarge,warp,0,10,x\n")  # fmt: skip
    with pytest.raises(TraceFormatError, match="'warp' is not one of") as err:
        load_catalog(VMS, GPUS, links=links)
    assert (err.value.line, err.value.field) == (2, "intra_node_link")


def test_the_tables_link_figure_is_used_for_the_link() -> None:
    base = Instance(instance="x", gpus=8, gpu_model="A100", gpu_mem_gib=40,
                    intra_node_link="nvlink3", network_gbps=400, usd_per_hour=1.0)  # fmt: skip
    config = AdvisorConfig(budget_h=1, epoch_samples=10**6)
    for inst, link in ((base, 600e9), (dataclasses.replace(base, intra_node_gb_per_s=50.0), 50e9)):
        got = predict_candidate(PROFILE, inst, 1, GPUS, DEFAULT_MODEL, config).comm_s
        assert got == pytest.approx(comm_seconds(DEFAULT_MODEL, 1e8, 10, 8, 1, link, 50e9))
        assert got > 10 * (50e-6 + 14 * 25e-6)  # the per-byte term is there
