"""Single-core cost per row of the ingestion chain read → dense → sparse → collate (no shuffle)
over Criteo TSV and Parquet shards, for the stage functions in ``recperf.ingest.data.stages``
and, with ``--baseline``, for another copy of that module (e.g. the previous commit's); medians of
interleaved repeats, each a full pass with a fresh SplitReader as one worker would read, over
read tasks of ``--chunk-rows`` rows (a stages module that works per split runs each split).

    .venv/bin/recperf ingest generate --rows 1000000 --shards 8 --format tsv \\
        --out /tmp/decode-bench/tsv
    .venv/bin/recperf ingest generate --rows 1000000 --shards 8 --format parquet \\
        --out /tmp/decode-bench/parquet
    git show HEAD:src/recperf/ingest/data/stages.py > /tmp/decode-bench/old_stages.py
    git show HEAD:src/recperf/ingest/data/decode.py > /tmp/decode-bench/decode.py
    git show HEAD:src/recperf/ingest/data/rowgroup.py > /tmp/decode-bench/rowgroup.py
    taskset -c 0 .venv/bin/python benchmarks/ingest_decode.py --data /tmp/decode-bench \\
        --baseline /tmp/decode-bench/old_stages.py --out out/bench/ingest_decode.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa

from recperf.ingest.data import stages

STAGES = ("read", "dense", "sparse", "collate")


def _exec(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def load_module(path: Path) -> ModuleType:
    """A stages module from a file, under a name of its own; a ``decode.py`` (and a
    ``rowgroup.py``) beside it are the modules it imports (so a baseline copied from a commit
    uses that commit's kernels)."""
    package = sys.modules["recperf.ingest.data"]
    saved: dict[str, ModuleType] = {}
    try:
        for name in ("decode", "rowgroup"):
            beside = path.with_name(f"{name}.py")
            if beside.exists():
                saved[name] = sys.modules[f"recperf.ingest.data.{name}"]
                old = _exec(f"baseline_{name}", beside)
                sys.modules[f"recperf.ingest.data.{name}"] = old
                setattr(package, name, old)  # what `from ... import decode` finds
        return _exec("baseline_stages", path)
    finally:
        for name, mod in saved.items():
            sys.modules[f"recperf.ingest.data.{name}"] = mod
            setattr(package, name, mod)


def one_pass(mod: ModuleType, tasks: list[list[Any]]) -> dict[str, float]:
    """Seconds spent in each stage over all read tasks (each a chunk of consecutive splits),
    and the rows: a module whose stages take a whole chunk (``Block``) runs each stage once
    per task; an older one, once per split."""
    reader = mod.SplitReader()
    spent = dict.fromkeys(STAGES, 0.0)
    rows = 0
    chunked = hasattr(mod, "Block")
    for task in tasks:
        for part in [task] if chunked else [[s] for s in task]:
            t0 = time.perf_counter()
            cols = reader.read_chunk(part) if chunked else reader.read(part[0])
            t1 = time.perf_counter()
            cols = mod.dense_transform(cols)
            t2 = time.perf_counter()
            cols = mod.sparse_transform(cols)
            t3 = time.perf_counter()
            out = mod.collate(cols)
            t4 = time.perf_counter()
            for stage, dt in zip(STAGES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                spent[stage] += dt
            rows += sum(len(b["row_id"]) for b in out) if chunked else len(out["row_id"])
    return {**spent, "rows": float(rows)}


def read_tasks(data: Path, rows_per_split: int, per_task: int) -> list[list[Any]]:
    """The splits in runs of ``per_task`` consecutive ones of one file and row group, as the
    live pipeline's plan deals them (without its shuffled order)."""
    splits = stages.plan_splits(data, rows_per_split)[0]
    tasks: list[list[Any]] = []
    for s in splits:
        last = tasks[-1] if tasks else None
        if last and len(last) < per_task and (last[0].file, last[0].group) == (s.file, s.group):
            last.append(s)
        else:
            tasks.append([s])
    return tasks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/tmp/decode-bench"))
    ap.add_argument("--formats", nargs="+", default=["tsv", "parquet"])
    ap.add_argument("--rows-per-split", type=int, default=4096)
    ap.add_argument("--chunk-rows", type=int, default=65_536, help="rows of one read task")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", type=Path, default=None, help="a stages.py to compare with")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    pa.set_cpu_count(1)  # one worker is one core: no hidden thread pool for either version
    impls: dict[str, ModuleType] = {"new": stages}
    if args.baseline is not None:
        impls = {"baseline": load_module(args.baseline), **impls}
    per_task = max(1, args.chunk_rows // args.rows_per_split)
    plans = {f: read_tasks(args.data / f, args.rows_per_split, per_task) for f in args.formats}
    for splits in plans.values():  # warm the page cache and every code path once
        for mod in impls.values():
            one_pass(mod, splits)
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(args.repeats):
        for fmt, splits in plans.items():
            for name, mod in impls.items():
                res = one_pass(mod, splits)
                runs.setdefault((fmt, name), []).append(res)
                total = sum(res[s] for s in STAGES) / res["rows"] * 1e6
                print(f"repeat {r}: {fmt:8s} {name:9s} {total:.3f} µs/row", file=sys.stderr)
    results = []
    for (fmt, name), rs in runs.items():
        row: dict[str, Any] = {"format": fmt, "impl": name, "rows": int(rs[0]["rows"])}
        row["total_us_per_row"] = statistics.median(
            sum(x[s] for s in STAGES) / x["rows"] * 1e6 for x in rs
        )
        for s in STAGES:
            row[f"{s}_us_per_row"] = statistics.median(x[s] / x["rows"] * 1e6 for x in rs)
        results.append(row)
        parts = ", ".join(f"{s} {row[f'{s}_us_per_row']:.3f}" for s in STAGES)
        print(f"{fmt:8s} {name:9s} {row['total_us_per_row']:.3f} µs/row ({parts})")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "rows_per_split": args.rows_per_split,
            "chunk_rows": args.chunk_rows,
            "repeats": args.repeats,
        }
        args.out.write_text(json.dumps({**meta, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
