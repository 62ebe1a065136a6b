"""The CPU peers benchmark (``benchmarks/embed_cpu.py --peers``) compares equal work: on tiny
shapes, in every row format, every peer and recperf's ``auto`` (kernel and drop-in) pool what
the reference pools (empty bags and one-row tables included), a peer that differs is caught,
int8/int4 tables are TorchRec's own rows, and the report's table renders from the bundled
JSON."""

from __future__ import annotations

import html
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from recperf.embed.kernels import Tables
from recperf.embed.kernels.base import magnitude, make_lookup, mismatch
from recperf.embed.kernels.formats import FLOAT_DTYPES, quantize
from recperf.report import embed_peers

pytest.importorskip("fbgemm_gpu")
pytest.importorskip("torchrec")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "embed_cpu.py"
RECPERF = {"torch", "recperf auto kernel", "EmbeddingBags(auto)"}
PEERS = {
    "fp32": {"nn.EmbeddingBag x T", "nn.EmbeddingBag concat", "fbgemm TBE inference",
             "fbgemm TBE training op", "torchrec EBC", "nn.EmbeddingBag concat, per-bag input"},
    "fp16": {"nn.EmbeddingBag x T", "nn.EmbeddingBag concat", "fbgemm TBE inference",
             "torchrec EBC", "nn.EmbeddingBag concat, per-bag input"},
    "bf16": {"nn.EmbeddingBag x T", "nn.EmbeddingBag concat",
             "nn.EmbeddingBag concat, per-bag input"},
    "fp8": {"fbgemm TBE inference"},
    "int8": {"fbgemm TBE inference", "torchrec quantized EBC"},
    "int4": {"fbgemm TBE inference", "torchrec quantized EBC"},
}  # fmt: skip


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("embed_cpu_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


def _stage(bench: ModuleType, fmt: str, seed: int, row_alignment: int = 1) -> Any:
    g = torch.Generator().manual_seed(seed)
    rows = (50, 7, 1, 33)
    fp32 = Tables(weights=tuple(torch.randn(r, 8, generator=g) for r in rows))
    lookups = [
        make_lookup(fp32, batch_size=3, pooling_factor=2, seed=seed * 10 + i, skew=1.0)
        for i in range(2)
    ]
    if fmt in ("int8", "int4"):
        qebc = bench.torchrec_quantized(fp32, fmt, row_alignment)
        return bench.Stage(fmt, bench.quantized_tables(qebc, fmt), fp32, lookups, qebc)
    if fmt == "fp8":
        tables = Tables(weights=tuple(quantize(w, "fp8")[0] for w in fp32.weights), fmt="fp8")
        return bench.Stage(fmt, tables, fp32, lookups)
    weights = tuple(w.to(FLOAT_DTYPES[fmt]) for w in fp32.weights)
    return bench.Stage(fmt, Tables(weights=weights), fp32, lookups)


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "bf16", "fp8", "int8", "int4", "int8/16"])
def test_every_peer_pools_what_the_reference_pools(bench: ModuleType, fmt: str) -> None:
    """Every variant, checked equal; ``int8/16``: TorchRec's rows 16-byte aligned (its
    ``from_float`` default), where an unpadded copy of them is measured beside them."""
    fmt, _, align = fmt.partition("/")
    st = _stage(bench, fmt, seed=len(fmt), row_alignment=int(align or 1))
    assert bench.padded(st.tables) is (align == "16")
    lookups = st.lookups
    assert any(int(n) == 0 for n in lookups[0].offsets.diff())  # empty bags are covered
    with torch.no_grad():
        built = bench.build_peers(st, "test")
        errors = bench.check_peers(built.peers, st.tables, lookups[0])
        extra = {bench.FLAT} | ({bench.COPIED} if align else set())
        assert set(errors) == RECPERF | PEERS[fmt] | extra
        assert built.auto.source == "measured" and built.auto.kernel in built.auto.note
        assert all(g["source"] == "measured" for m in built.modules for g in m.describe())
        calls = bench.settle(built.peers, built.modules)  # then the kernel each settled on
        assert len(calls) == len(built.modules) and not any(m.on_trial for m in built.modules)
        # The second batch too: each peer's prepared inputs belong to their own batch.
        bound = magnitude(st.tables, lookups[1])
        ref = built.peers[0].fn(lookups[1])
        for p in built.peers:
            got = p.as_btd(p.fn(p.inputs[1]))
            assert mismatch(got, ref, bound, st.tables.row_format) == "", p.name


def test_int_tables_are_torchrecs_own_rows(bench: ModuleType) -> None:
    st = _stage(bench, "int8", seed=4)
    (tbe,) = st.qebc._emb_modules
    buffer = tbe.weights_host
    inside = (
        buffer.data_ptr() <= st.tables.weights[0].data_ptr() < buffer.data_ptr() + (buffer.numel())
    )
    assert inside and st.tables.row_bytes == 8 + 4
    own = st.fresh_tables()  # another variant's rows: the same codes, storage of their own
    assert own.weights[0].data_ptr() != st.tables.weights[0].data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(own.weights, st.tables.weights, strict=True))
    err = bench.format_error(st)
    assert 0 < err["pooled_rel_err_median"] <= err["pooled_rel_err_max"] < 0.05


def test_a_peer_that_differs_is_caught(bench: ModuleType) -> None:
    st = _stage(bench, "fp32", seed=3)
    with torch.no_grad():
        peers = bench.build_peers(st, "test").peers
        wrong = bench.Peer("off by one", lambda x: peers[0].fn(x) + 1e-3, st.lookups, lambda y: y)
        with pytest.raises(AssertionError, match="off by one differs"):
            bench.check_peers([*peers, wrong], st.tables, st.lookups[0])


@pytest.mark.parametrize("fmt", ["fp32", "int8"])
def test_a_setting_pools_the_calls_of_every_build(bench: ModuleType, fmt: str) -> None:
    """``--builds 2``: every variant built twice, each build's calls timed and pooled; each
    build's ratios and choices listed beside the pooled ones."""
    import argparse

    args = argparse.Namespace(rows_cap=40, batch_size=4, seed=0, inputs=2, threads="1", calls=3,
                              builds=2, qebc_row_alignment=1)  # fmt: skip
    (row,) = bench.peers_setting("paper", "uniform", fmt, args)
    assert row["builds"] == 2 and len(row["per_build_choices"]) == 2
    assert set(row["per_build"]) >= {"best_peer", "auto_vs_best_peer"}
    assert all(len(v) == 2 for v in row["per_build"].values())
    dropin = next(v for v in row["variants"] if v["variant"] == "EmbeddingBags(auto)")
    assert dropin["ms_q1"] <= dropin["ms_per_batch"] <= dropin["ms_q3"]
    best = min((v for v in row["variants"] if v["kind"] == "peer"),
               key=lambda v: v["ms_per_batch"])  # fmt: skip
    assert row["best_peer"] == best["variant"]
    assert row["auto_vs_best_peer"] == pytest.approx(best["ms_per_batch"] / dropin["ms_per_batch"])


def test_report_table_renders_the_bundled_run() -> None:
    data = embed_peers.load_bundled()
    assert data is not None, "src/recperf/data/embedding/cpu_peers.json is not bundled"
    json.dumps(data, allow_nan=False)
    settings = data["settings"]
    assert data["builds"] >= 1
    for s in settings:
        quantized = s["dtype"] in ("int8", "int4")
        padded = s["row_stride"] > s["row_bytes"]  # an unpadded copy of padded int rows beside
        copied = {"fbgemm-tbe, rows copied"} if quantized and padded else set()
        variants = {str(v["variant"]) for v in s["variants"]}
        flat = {"EmbeddingBags(auto), TBE-layout input"}  # the drop-in given the TBE layout
        assert variants == RECPERF | flat | PEERS[s["dtype"]] | copied
        assert len(s["per_build"]["auto_vs_best_peer"]) == s["builds"] == data["builds"]
        assert {v["takes"] for v in s["variants"]} <= {"TBE layout", "per bag", "KJT"}
    page = embed_peers.peers_html(data)
    head = page.split("<thead>", 1)[1].split("</thead>", 1)[0]
    columns = list(dict.fromkeys(str(v["variant"]) for s in settings for v in s["variants"]))
    headers = [html.unescape(h) for h in re.findall(r"<th[^>]*>([^<]+)</th>", head)]
    assert headers[6:] == columns
    body = page.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    shown = re.findall(r"<tr>(.*?)</tr>", body)
    assert len(shown) == len(settings)
    for row, s in zip(shown, settings, strict=True):
        cells = re.findall(r"<td[^>]*>(?:<strong>)?([^<]+)", row)
        assert cells[:4] == [s["config"], s["trace"], s["dtype"], str(s["threads"])]
        fastest = min(s["variants"], key=lambda v: v["ms_per_batch"])
        assert f"<strong>{fastest['ms_per_batch']:.2f} [" in row
        v = s["variants"][0]
        assert cells[6] == (
            f"{v['ms_per_batch']:.2f} [{v['ms_q1']:.2f}–{v['ms_q3']:.2f}] "
            f"({v['speedup_vs_best_peer']:.2f}×)"
        )
    assert page.count("<strong>") == len(settings)
    assert embed_peers.peers_html(None) == ""


@pytest.mark.parametrize(
    ("machine", "said"),
    [
        ({"thp_mode": "madvise", "torch_thp_alloc": False}, "lay in torch's 4 KiB pages"),
        ({"thp_mode": "madvise", "torch_thp_alloc": True}, "(THP_MEM_ALLOC_ENABLE=1)"),
        ({"thp_mode": "", "torch_thp_alloc": False}, "(its mode: none)"),
        ({}, None),
    ],
)
def test_the_provenance_says_which_pages_the_rows_lay_in(
    machine: dict[str, object], said: str | None
) -> None:
    data = embed_peers.load_bundled()
    assert data is not None
    page = html.unescape(embed_peers.peers_html(data | {"machine": machine}))
    if said is None:
        assert "huge pages" not in page.split("<table", 1)[0]
    else:
        assert said in page and "offers them" in page


def test_embedding_section_shows_the_bundled_peers() -> None:
    from recperf.report import embed_section as es

    data = embed_peers.load_bundled()
    section = es.section_from_results([], [], None, "2026-12-01", None, None, data)
    assert section.html.count('<h3 id="embed-cpu-peers">') == 1
    assert section.data["cpu_peers"]["settings"][0]["variants"][0]["variant"] == "torch"
    without = es.section_from_results([], [], None, "2026-12-01")
    assert "embed-cpu-peers" not in without.html and without.data["cpu_peers"] is None
