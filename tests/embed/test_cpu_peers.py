"""The CPU peers benchmark (``benchmarks/embed_cpu.py --peers``) compares equal work: on tiny
shapes every peer variant pools what the reference pools (empty bags, one-row tables, the hot
remap included), a peer that differs is caught, and the report's table renders from the
bundled JSON."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from recperf.embed import traces
from recperf.embed.kernels import Tables
from recperf.embed.kernels.base import magnitude, make_lookup, mismatch
from recperf.report import embed_peers

pytest.importorskip("fbgemm_gpu")
pytest.importorskip("torchrec")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "embed_cpu.py"
VARIANTS = {
    "torch",
    "torch-hot",
    "nn.EmbeddingBag x T",
    "nn.EmbeddingBag concat",
    "fbgemm TBE inference",
    "fbgemm TBE training op",
    "torchrec EBC",
    "fbgemm TBE inference + hot remap",
}


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("embed_cpu_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


def _case(
    seed: int, dtype: torch.dtype = torch.float32
) -> tuple[Tables, list[Any], tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    rows = (50, 7, 1, 33)
    tables = Tables(weights=tuple(torch.randn(r, 8, generator=g).to(dtype) for r in rows))
    lookups = [
        make_lookup(tables, batch_size=3, pooling_factor=2, seed=seed * 10 + i, skew=1.0)
        for i in range(2)
    ]
    hot = tuple(torch.randperm(r, generator=g)[: max(1, r // 4)] for r in rows)
    return tables, lookups, hot


@pytest.mark.parametrize(("seed", "dtype"), [(0, torch.float32), (1, torch.float32),
                                             (2, torch.float16)])  # fmt: skip
def test_every_peer_pools_what_the_reference_pools(
    bench: ModuleType, seed: int, dtype: torch.dtype
) -> None:
    tables, lookups, hot = _case(seed, dtype)
    assert any(int(n) == 0 for n in lookups[0].offsets.diff())  # empty bags are covered
    peers = bench.build_peers(tables, lookups, hot)
    with torch.no_grad():
        errors = bench.check_peers(peers, tables, lookups[0])
        assert set(errors) == VARIANTS
        assert max(errors.values()) < (1e-5 if dtype == torch.float32 else 2e-2)
        # The second batch too: each peer's prepared inputs belong to their own batch.
        bound = magnitude(tables, lookups[1])
        ref = peers[0].fn(lookups[1])
        for p in peers:
            got = p.as_btd(p.fn(p.inputs[1]))
            assert mismatch(got, ref, bound, tables.row_format) == "", p.name


def test_a_peer_that_differs_is_caught(bench: ModuleType) -> None:
    tables, lookups, hot = _case(3)
    peers = bench.build_peers(tables, lookups, hot)
    wrong = bench.Peer("off by one", lambda x: peers[0].fn(x) + 1e-3, lookups, lambda y: y)
    with torch.no_grad(), pytest.raises(AssertionError, match="off by one differs"):
        bench.check_peers([*peers, wrong], tables, lookups[0])


def test_hot_rows_are_each_tables_most_used(bench: ModuleType) -> None:
    trace = traces.resolve("zipf:1.2", rows=40, tables=2, lookups=2_000, seed=3)
    tables = Tables(weights=(torch.zeros(40, 4), torch.zeros(9, 4)))
    hot = bench.hot_rows_of(tables, trace, 0.25)
    assert [h.numel() for h in hot] == [10, 2]
    counts = torch.bincount(trace.ids[0], minlength=40)
    assert counts[hot[0]].min() >= counts[~torch.isin(torch.arange(40), hot[0])].max()


def test_report_table_renders_the_bundled_run() -> None:
    data = embed_peers.load_bundled()
    assert data is not None, "src/recperf/data/embedding/cpu_peers.json is not bundled"
    json.dumps(data, allow_nan=False)
    settings = data["settings"]
    assert {str(v["variant"]) for s in settings for v in s["variants"]} == VARIANTS
    page = embed_peers.peers_html(data)
    head = page.split("<thead>", 1)[1].split("</thead>", 1)[0]
    assert re.findall(r"<th[^>]*>([^<]+)</th>", head)[6:] == [
        v["variant"] for v in settings[0]["variants"]
    ]
    body = page.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    shown = re.findall(r"<tr>(.*?)</tr>", body)
    assert len(shown) == len(settings)
    for row, s in zip(shown, settings, strict=True):
        cells = re.findall(r"<td[^>]*>(?:<strong>)?([^<]+)", row)
        assert cells[:4] == [s["config"], s["trace"], s["dtype"], str(s["threads"])]
        fastest = min(s["variants"], key=lambda v: v["ms_per_batch"])
        assert f"<strong>{fastest['ms_per_batch']:.2f} (" in row
        assert cells[6] == (
            f"{s['variants'][0]['ms_per_batch']:.2f} "
            f"({s['variants'][0]['speedup_vs_best_peer']:.2f}×)"
        )
    assert page.count("<strong>") == len(settings)
    assert embed_peers.peers_html(None) == ""


def test_embedding_section_shows_the_bundled_peers() -> None:
    from recperf.report import embed_section as es

    data = embed_peers.load_bundled()
    section = es.section_from_results([], [], None, "2026-12-01", None, None, data)
    assert section.html.count('<h3 id="embed-cpu-peers">') == 1
    assert section.data["cpu_peers"]["settings"][0]["variants"][0]["variant"] == "torch"
    without = es.section_from_results([], [], None, "2026-12-01")
    assert "embed-cpu-peers" not in without.html and without.data["cpu_peers"] is None
