"""The embedding section's CPU peers table: recperf's variants (the drop-in with
``kernel="auto"``, the kernel it picks, the reference) against ``nn.EmbeddingBag``, FBGEMM's
table-batched operators and TorchRec's float and quantized collections, by row format,
as ``benchmarks/embed_cpu.py --peers`` measured them in one sitting (bundled as
``recperf/data/embedding/cpu_peers.json``; too long to rerun inside the report)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from recperf.report.section import fmt_num, table_html

BUNDLED = "data/embedding/cpu_peers.json"
SETTING = ("config", "trace", "dtype", "threads", "MB per batch", "copy GB/s")


def load_bundled(resource: Traversable | None = None) -> dict[str, Any] | None:
    """The bundled peers benchmark's JSON, or None when none is bundled."""
    path = resource or resources.files("recperf").joinpath(BUNDLED)
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def peers_html(bench: Mapping[str, Any] | None) -> str:
    """A heading, one line of provenance and the table: a row per setting, a column per variant
    (median ms per batch and its speedup over the fastest peer; the fastest in bold), or nothing
    when no benchmark is bundled."""
    if not bench or not bench.get("settings"):
        return ""
    settings = bench["settings"]
    names = list(dict.fromkeys(str(v["variant"]) for s in settings for v in s["variants"]))
    rows: list[list[str]] = []
    bold: list[tuple[int, int]] = []
    for r, s in enumerate(settings):
        by_name = {str(v["variant"]): v for v in s["variants"]}
        fastest = min(float(v["ms_per_batch"]) for v in s["variants"])
        cells = []
        for c, name in enumerate(names):
            v = by_name.get(name)
            if v is None:
                cells.append("—")
                continue
            ms = float(v["ms_per_batch"])
            spread = (
                f" [{fmt_num(float(v['ms_q1']), 2)}–{fmt_num(float(v['ms_q3']), 2)}]"
                if v.get("ms_q1") is not None and v.get("ms_q3") is not None
                else ""
            )
            speedup = fmt_num(float(v["speedup_vs_best_peer"]), 2)
            cells.append(f"{fmt_num(ms, 2)}{spread} ({speedup}×)")
            if ms == fastest:
                bold.append((r, len(SETTING) + c))
        rows.append([
            str(s["config"]), str(s["trace"]), str(s.get("dtype", "float32")), str(s["threads"]),
            fmt_num(float(s["bytes_per_batch"]) / 1e6, 1), fmt_num(float(s["copy_gb_per_s"]), 1),
            *cells,
        ])  # fmt: skip
    caption = (
        "Median ms per batch of each variant, the quartiles of its timed calls in square "
        "brackets and, in round ones, its speedup over the fastest peer of that setting (above "
        "1× is faster; the fastest variant in bold). GB/s = MB per batch (the bytes the batch "
        "must move) / ms; each variant's GB/s and its share of the copy bandwidth measured at "
        "that thread count are in report.json, with what input each variant was given (the TBE "
        "layout, per bag or a KeyedJaggedTensor). Every variant's output was checked equal to the "
        "reference before timing."
    )
    table = table_html([*SETTING, *names], rows, caption=caption, bold=bold, left_cols=4)
    return (
        '<h3 id="embed-cpu-peers">Against the CPU peers</h3>'
        f"<p>{html.escape(_provenance(bench))}</p>" + table
    )


def _provenance(bench: Mapping[str, Any]) -> str:
    m = bench.get("machine", {})
    settings = bench["settings"]
    loads = [x for s in settings for x in s.get("load_avg_1m", [])]
    load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else "?"
    shapes = "; ".join(
        dict.fromkeys(
            f"{s['config']}: {s['tables']} tables, {s['rows']:,} rows, batch {s['batch_size']}"
            for s in settings
        )
    )
    return (
        f"Measured {bench.get('date', 'undated')} by `{bench.get('command', '?')}` on "
        f"{m.get('cpu', '?')} ({m.get('cpus', '?')} cores; torch {m.get('torch', '?')}, "
        f"fbgemm-gpu-cpu {m.get('fbgemm_gpu', '?')}, torchrec {m.get('torchrec', '?')}), in one "
        f"sitting, {bench.get('calls', '?')} interleaved calls per variant over "
        f"{bench.get('inputs', '?')} rotating batches{_builds(bench)}; 1-minute load average "
        f"{load}. Tables "
        f"capped at {bench.get('rows_cap', 0):,} rows each ({shapes}), sum pooling."
        + _hot_note(settings)
        + _pages_note(m)
        + " Bundled with the package, not rerun by the report."
        + _busy_note(bench)
    )


def _pages_note(machine: Mapping[str, Any]) -> str:
    """Which pages the rows lay in, where the run recorded it (since issue 27)."""
    if "thp_mode" not in machine:
        return ""
    peers = (
        "transparent huge pages as well (THP_MEM_ALLOC_ENABLE=1)"
        if machine.get("torch_thp_alloc")
        else "torch's 4 KiB pages"
    )
    mode = machine["thp_mode"] or "none"
    return (
        f" The peers' rows lay in {peers}; the copies of the rows recperf's kernels make, in "
        f"transparent huge pages where the system offers them (its mode: {mode})."
    )


def _builds(bench: Mapping[str, Any]) -> str:
    """How often every variant was built anew (fresh rows, drop-ins measuring anew)."""
    builds = int(bench.get("builds", 1))
    if builds < 2:
        return ""
    return (
        f", each variant built {builds} times anew (rows of its own in new memory, a drop-in "
        "that measures anew) and its calls pooled over the builds"
    )


def _hot_note(settings: Any) -> str:
    """What the hot variants do, where the sitting has any."""
    if not any("hot" in str(v["variant"]) for s in settings for v in s["variants"]):
        return ""
    return " The hot variants reorder each table by its trace's most used rows."


def _busy_note(bench: Mapping[str, Any]) -> str:
    cpus = bench.get("machine", {}).get("cpus") or 0
    threads = max((int(s["threads"]) for s in bench["settings"]), default=1)
    if threads < cpus or threads < 2:
        return ""
    return (
        f" With {threads} threads on {cpus} cores shared with other work, a descheduled thread "
        "stalls every parallel region, most often in the variants that run one per table: "
        "those rows vary widely between runs (see the quartiles in report.json)."
    )
