"""The live pipeline against the tools people already use, side by side in one sitting: recperf
(tuned: ``--alloc auto``; its best fixed allocation: fused processes, consumer threads, one
process of threads, the even split) against a well-written PyTorch DataLoader (best
num_workers of 0-4), torchdata.nodes, tf.data AUTOTUNE and SPDL, on the same 1M generated rows
(TSV and Parquet, 8 shards), the same transforms, with and without shuffle, and with 20 ms
emulated reads; and the decode kernels' bound (``ingest_decode.py`` on one core, times the
cores) measured in the same sitting. Every configuration runs in a fresh process under one
harness (rows/s, cores used, peak PSS of the process tree; ``benchmarks/ingest_peers.py``): each
peer's configurations are screened once, then the best of each is re-measured in interleaved
rounds; medians.

    python benchmarks/ingest_live.py --out benchmarks/results/ingest_live.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import ingest_peers

from recperf.ingest.data.criteo import GenerateConfig, generate

SETTINGS = ("tsv", "tsv+shuffle", "parquet", "parquet+shuffle", "parquet+20ms")
PEERS = ("recperf", "recperf_fixed", "dataloader", "torchdata_nodes", "tfdata", "spdl")
PACKAGED = Path(__file__).resolve().parent.parent / "src/recperf/data/ingest/bench_live.json"


def ensure_data(root: Path, rows: int, shards: int) -> None:
    for fmt in ("tsv", "parquet"):
        if not (root / fmt / "manifest.json").exists():
            print(f"generating {rows:,} rows as {fmt} in {root / fmt}", file=sys.stderr)
            generate(GenerateConfig(rows=rows, shards=shards, seed=0, format=fmt), root / fmt)


def ratios(best: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per setting: each peer's best configuration and recperf's ratio to each."""
    out: dict[str, dict[str, Any]] = {}
    for row in best:
        out.setdefault(row["setting"], {})[row["peer"]] = row
    for rows in out.values():
        ours = rows.get("recperf", {}).get("rows_per_s")
        for row in rows.values():
            if ours and row.get("rows_per_s"):
                row["recperf_ratio"] = ours / row["rows_per_s"]
    return out


def table(by_setting: dict[str, dict[str, Any]]) -> str:
    lines = ["| setting | peer | best config | rows/s (median) | cores used | peak PSS MiB | "
             "recperf tuned / this |", "|---|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for s, rows in by_setting.items():
        for p, r in sorted(rows.items(), key=lambda kv: -kv[1].get("rows_per_s", 0)):
            if "error" in r:
                lines.append(f"| {s} | {p} | error: {r['error'][:60]} | | | | |")
                continue
            cfg = f"{r['variant'] or '-'} / {r['workers']}"
            lines.append(
                f"| {s} | {p} | {cfg} | {r['rows_per_s']:,.0f} | {r['cores_used']:.2f} | "
                f"{r['peak_pss_mib']:,.0f} | {r.get('recperf_ratio', float('nan')):.2f} |"
            )
    return "\n".join(lines)


def plot(by_setting: dict[str, dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return
    settings = list(by_setting)
    peers = [p for p in PEERS if any(p in r for r in by_setting.values())]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / max(1, len(peers))
    for i, p in enumerate(peers):
        ys = [by_setting[s].get(p, {}).get("rows_per_s", 0) / 1e3 for s in settings]
        ax.bar([k + i * width for k in range(len(settings))], ys, width, label=p)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(settings))], settings)
    ax.set_ylabel("k rows/s (median)")
    ax.set_title("Ingestion on this 2-core machine, one sitting")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-root", type=Path, default=Path("/tmp/recperf-bench-ingest"))
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--cores",
        type=int,
        default=os.cpu_count() or 1,
        help="cores the decode bound counts (this machine's)",
    )
    ap.add_argument("--decode-repeats", type=int, default=3)
    ap.add_argument("--screen-s", type=float, default=2.5)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/ingest_live.json"))
    ap.add_argument("--figure", type=Path, default=Path("benchmarks/figures/ingest_live.png"))
    ap.add_argument("--package", action="store_true",
                    help="copy the results into recperf/data/ingest for the report")  # fmt: skip
    args = ap.parse_args()
    ensure_data(args.data_root, args.rows, args.shards)
    print("decode bound: benchmarks/ingest_decode.py on core 0", file=sys.stderr)
    bound = decode_bound(args.data_root, args.cores, args.decode_repeats)
    print(json.dumps(bound), file=sys.stderr)
    raw = args.out.with_name(args.out.stem + "_runs.json")
    t0 = time.monotonic()
    ingest_peers.main(
        ["sweep", "--data-root", str(args.data_root), "--settings", args.settings,
         "--peers", args.peers, "--seconds", str(args.seconds), "--warmup-s", str(args.warmup_s),
         "--reps", str(args.reps), "--screen-s", str(args.screen_s), "--out", str(raw)]
    )  # fmt: skip
    sweep = json.loads(raw.read_text())
    by_setting = ratios(sweep["best"])
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": sweep["machine"],
        "command": "python benchmarks/ingest_live.py " + " ".join(sys.argv[1:]),
        "rows": args.rows,
        "shards": args.shards,
        "seconds": args.seconds,
        "reps": args.reps,
        "wall_s": time.monotonic() - t0,
        "settings": by_setting,
        "decode_bound": bound,
        "targets": targets(by_setting, bound),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    if args.package:
        shutil.copyfile(args.out, PACKAGED)
    print(table(by_setting))
    print(json.dumps(result["targets"], indent=1))
    plot(by_setting, args.figure)


def decode_bound(root: Path, cores: int, repeats: int) -> dict[str, Any]:
    """The decode kernels' cost per row on one core (``ingest_decode.py`` pinned to core 0, in
    this sitting) and the bound it puts on ``cores`` cores, per format."""
    out = root / "decode.json"
    cmd = [sys.executable, str(Path(__file__).with_name("ingest_decode.py")), "--data", str(root),
           "--repeats", str(repeats), "--out", str(out)]  # fmt: skip
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    res = json.loads(out.read_text())["results"]
    return {
        r["format"]: {
            "us_per_row_one_core": r["total_us_per_row"],
            "bound_rows_per_s": cores * 1e6 / r["total_us_per_row"],
        }
        for r in res
        if r["impl"] == "new"
    }


def targets(by_setting: dict[str, dict[str, Any]], bound: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, as measured: tuned / the best peer (>= 1.1), tuned / recperf's best
    fixed allocation (>= 0.95), tuned / the decode bound of its format (>= 0.85, settings without
    storage latency), and peak PSS against the best peer's."""
    out: dict[str, Any] = {}
    for s, rows in by_setting.items():
        ours = rows.get("recperf", {})
        rate = ours.get("rows_per_s")
        peers = [r for p, r in rows.items() if not p.startswith("recperf") and r.get("rows_per_s")]
        best = max(peers, key=lambda r: r["rows_per_s"]) if peers else None
        fixed = rows.get("recperf_fixed", {}).get("rows_per_s")
        fmt = s.split("+")[0]
        b = bound.get(fmt, {}).get("bound_rows_per_s") if "ms" not in s else None
        out[s] = {
            "tuned_rows_per_s": rate,
            "best_peer": best["peer"] if best else None,
            "over_best_peer": rate / best["rows_per_s"] if rate and best else None,
            "over_best_fixed": rate / fixed if rate and fixed else None,
            "best_fixed": rows.get("recperf_fixed", {}).get("variant"),
            "of_decode_bound": rate / b if rate and b else None,
            "peak_pss_mib": ours.get("peak_pss_mib"),
            "best_peer_peak_pss_mib": best["peak_pss_mib"] if best else None,
        }
    return out


if __name__ == "__main__":
    main()
