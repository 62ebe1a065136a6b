"""Live ingestion tuning on this machine: every tuner tunes the real multi-process pipeline
within a time budget, then all chosen allocations are re-measured in interleaved rounds on one
pipeline and compared with the best the exhaustive ``oracle`` found; a PyTorch DataLoader doing
the same per-batch work at each num_workers is the outside baseline.

    python benchmarks/ingest_live.py --budget-s 60 --out out/bench/ingest_live.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from recperf.ingest import api
from recperf.ingest.base import Allocation
from recperf.ingest.data import stages as st
from recperf.ingest.data.criteo import GenerateConfig, generate
from recperf.ingest.live.batch import PipelineConfig
from recperf.ingest.live.executor import Pipeline
from recperf.ingest.live.target import LiveTarget

TUNERS = ("static", "autotune", "plumber", "intune", "oracle")


class SameWork(IterableDataset[dict[str, torch.Tensor]]):
    """The pipeline's per-batch work (read, decode, dense, sparse, a row shuffle, collate) in
    DataLoader workers, each taking every num_workers-th split, repeating forever."""

    def __init__(self, data: Path, batch_size: int, read_latency_s: float = 0.0) -> None:
        self.splits, _ = st.plan_splits(data, batch_size)
        self.read_latency_s = read_latency_s

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        wid, n = (0, 1) if info is None else (info.id, info.num_workers)
        reader = st.SplitReader()
        rng = np.random.default_rng(wid)
        while True:
            for split in self.splits[wid::n]:
                if self.read_latency_s:
                    time.sleep(self.read_latency_s)  # the same emulated storage latency
                cols = st.decode(reader.read(split), split.first_row)
                cols = st.sparse_transform(st.dense_transform(cols))
                (cols,) = st.shuffle([cols], int(rng.integers(1 << 30)), 0)
                yield {k: torch.from_numpy(v) for k, v in st.collate(cols).items()}


def dataloader_rate(
    data: Path, batch_size: int, workers: int, seconds: float, read_latency_s: float = 0.0
) -> float:
    work = SameWork(data, batch_size, read_latency_s)
    loader = DataLoader(work, batch_size=None, num_workers=workers)
    it = iter(loader)
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        next(it)
    rows = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        rows += len(next(it)["labels"])
    rate = rows / (time.monotonic() - t0)
    del it, loader
    return rate


def interleaved(data: Path, cfg: PipelineConfig, allocs: list[Allocation], rounds: int,
                window_s: float) -> dict[tuple[int, ...], list[float]]:  # fmt: skip
    """Every allocation measured ``rounds`` times, in turn, on one running pipeline."""
    out: dict[tuple[int, ...], list[float]] = {a.workers: [] for a in allocs}
    with Pipeline(data, cfg) as p:
        target = LiveTarget(p, settle_s=1.0)
        for _ in range(rounds):
            for a in allocs:
                out[a.workers].append(target.measure(a, window_s).throughput_rows_per_s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="Criteo data (default: 1M generated rows)")
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--oracle-budget-s", type=float, default=150.0)
    ap.add_argument("--tuners", default=",".join(TUNERS))
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window-s", type=float, default=3.0)
    ap.add_argument("--dataloader-workers", default="0,1,2,3,4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--read-latency-ms", type=float, default=0.0,
                    help="emulated remote-storage latency per batch read")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("out/bench/ingest_live.json"))
    ap.add_argument("--figure", type=Path, default=Path("benchmarks/figures/ingest_live.png"))
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="recperf-ingest-")
    data = args.data
    if data is None:
        data = Path(tmp.name) / "criteo"
        generate(GenerateConfig(rows=1_000_000, shards=4, seed=args.seed), data)
    cfg = PipelineConfig(batch_size=args.batch_size, seed=args.seed, epochs=None,
                         read_latency_ms=args.read_latency_ms)  # fmt: skip
    results: dict[str, Any] = {
        "data": str(args.data or "generated 1M rows, 4 parquet shards"),
        "read_latency_ms": args.read_latency_ms,
        "batch_size": args.batch_size,
        "budget_s": args.budget_s,
    }
    tuned: dict[str, Any] = {}
    for name in args.tuners.split(","):
        budget = args.oracle_budget_s if name == "oracle" else args.budget_s
        t0 = time.monotonic()
        s = api.tune(data, name, budget, cfg, Path(tmp.name) / name, seed=args.seed)
        s["wall_s"] = time.monotonic() - t0
        tuned[name] = s
        print(f"{name:9s} {s['allocation']} {s['throughput_rows_per_s']:>10,.0f} rows/s "
              f"after {s['tuning_s']:.0f} s, {s['tuning_steps']} steps", flush=True)  # fmt: skip
    allocs = list({tuple(s["allocation"].values()): None for s in tuned.values()})
    rates = interleaved(data, cfg, [Allocation(workers=a) for a in allocs], args.rounds,
                        args.window_s)  # fmt: skip
    med = {a: statistics.median(v) for a, v in rates.items()}
    oracle = med[tuple(tuned["oracle"]["allocation"].values())] if "oracle" in tuned else None
    best = max(med.values())
    for s in tuned.values():
        a = tuple(s["allocation"].values())
        s["steady_rows_per_s"] = med[a]
        s["steady_samples"] = rates[a]
        s["fraction_of_oracle"] = med[a] / oracle if oracle else None
        s["fraction_of_best"] = med[a] / best
    dl = {}
    for k in (int(x) for x in args.dataloader_workers.split(",") if x):
        dl[k] = dataloader_rate(data, args.batch_size, k, args.window_s * 2,
                                args.read_latency_ms / 1e3)  # fmt: skip
        print(f"DataLoader num_workers={k}: {dl[k]:,.0f} rows/s", flush=True)
    results.update(tuners=tuned, dataloader_rows_per_s=dl, oracle_steady_rows_per_s=oracle)
    print(
        "\n| tuner | allocation | steady rows/s (median) | fraction of oracle | tuning s | steps |"
    )
    print("|---|---|---|---|---|---|")
    for name, s in tuned.items():
        frac = "" if s["fraction_of_oracle"] is None else f"{s['fraction_of_oracle']:.3f}"
        print(f"| {name} | {list(s['allocation'].values())} | {s['steady_rows_per_s']:,.0f} | "
              f"{frac} | {s['tuning_s']:.0f} | {s['tuning_steps']} |")  # fmt: skip
    if dl:
        k = max(dl, key=lambda x: dl[x])
        print(f"| DataLoader best (num_workers={k}) | | {dl[k]:,.0f} | "
              f"{dl[k] / oracle if oracle else float('nan'):.3f} | | |")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    print(f"\nwrote {args.out}")
    plot(tuned, oracle, args.figure)


def plot(tuned: dict[str, Any], oracle: float | None, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, s in tuned.items():
        h = s["history"]
        ax.plot([x["elapsed_s"] for x in h], [x["throughput_rows_per_s"] / 1e3 for x in h],
                marker=".", label=name)  # fmt: skip
    if oracle:
        ax.axhline(oracle / 1e3, color="k", ls="--", lw=1, label="oracle (steady)")
    ax.set_xlabel("tuning time, s")
    ax.set_ylabel("measured throughput, k rows/s")
    ax.set_title("Live pipeline on this machine: throughput while tuning")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
