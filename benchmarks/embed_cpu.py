"""The embedding stage on the CPU, measured. Default mode (issue 6): the ``torch`` reference
against ``torch-hot`` (the same pooling over tables whose hottest rows were moved to the front)
for the ``paper`` tables (12 x 500,000 x 128, 150 ids per bag). ``--peers`` (issue 18): the
``paper`` and ``mlperf`` stages (rows capped) with the CPU peers a careful user would call:
``nn.EmbeddingBag`` (one per table, or one over the concatenated tables), FBGEMM's table-batched
operators (the inference one, fp32 rows, and the training one on CPU), TorchRec's
``EmbeddingBagCollection`` and FBGEMM on the hot-first tables, against recperf's ``torch`` and
``torch-hot``, each checked equal to the reference first. Both modes run on the bundled reuse
trace and on uniform ids; calls are interleaved over rotating batches (the order rotates each
round) and compared by their medians, so machine noise hits every variant alike.

    python benchmarks/embed_cpu.py [--batch-size 64] [--calls 60] [--hot-fraction 0.02,0.1,0.3]
    python benchmarks/embed_cpu.py --peers [--threads 1,2] [--rows-cap 60000] [--calls 60]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

import recperf.embed.bench as eb
from recperf.embed import locality, traces
from recperf.embed.kernels import KERNELS, Lookup, Tables
from recperf.embed.kernels.base import magnitude, mismatch
from recperf.embed.kernels.torch_hot import hot_first_order
from recperf.embed.model import EmbedConfig, config, random_tables
from recperf.embed.timing import copy_bandwidth, lookup_bytes

PEERS_OUT = Path("benchmarks/results/embed_cpu_peers.json")
PEERS_BUNDLE = Path("src/recperf/data/embedding/cpu_peers.json")
DTYPES = {"float32": torch.float32, "float16": torch.float16}
PEER_BATCH = {"paper": 64, "mlperf": 512}
"""Batch per config in ``--peers`` mode: each batch moves ~57 MB of rows (above the 32 MB L3)."""
KINDS = {"torch": "recperf", "torch-hot": "recperf", "fbgemm TBE inference + hot remap": "hybrid"}
"""recperf's variants and the hybrid (recperf's remap on FBGEMM); every other one is a peer."""


def interleaved_samples(fns: list[Any], inputs: list[list[Any]], calls: int) -> list[list[float]]:
    """Seconds of each of ``calls`` calls of each fn (after 3 warm-up rounds), calling them in
    turn on the same rotating batch index, the first fn of a round rotating too."""
    times: list[list[float]] = [[] for _ in fns]
    for i in range(calls + 3):
        for j in range(len(fns)):
            k = (i + j) % len(fns)
            x = inputs[k][i % len(inputs[k])]
            t0 = time.perf_counter()
            fns[k](x)
            if i >= 3:
                times[k].append(time.perf_counter() - t0)
    return times


def interleaved(fns: list[Any], inputs: list[list[Any]], calls: int) -> list[float]:
    """Median seconds of each fn (``interleaved_samples``)."""
    return [statistics.median(t) for t in interleaved_samples(fns, inputs, calls)]


def run(trace_name: str, fraction: float, args: argparse.Namespace) -> dict[str, Any]:
    cfg = config("paper", batch_size=args.batch_size)
    rows = None if trace_name == "reuse-medium-500k" else 500_000
    trace = traces.resolve(trace_name, rows=rows, tables=cfg.num_tables, seed=args.seed)
    tables = random_tables(cfg, torch.float32, "cpu", args.seed)
    lookups = eb.make_lookups(cfg, trace, args.inputs, "cpu")
    eb.CPU_HOT_FRACTION = fraction
    hot = eb.hot_rows_for(cfg, trace, tables)
    ref = KERNELS.build("torch", None, tables)
    hot_kernel = KERNELS.build("torch-hot", None, tables, hot_rows=hot)
    remapped = [
        Lookup(
            indices=torch.cat(
                [
                    hot_kernel._remap[t][s]  # type: ignore[attr-defined]
                    for t, s in enumerate(hot_kernel._segments(lk))  # type: ignore[attr-defined]
                ]
            ),
            offsets=lk.offsets,
            batch_size=lk.batch_size,
        )
        for lk in lookups
    ]
    pool = super(type(hot_kernel), hot_kernel).__call__  # the reference pooling, permuted tables
    assert torch.allclose(pool(remapped[0]), ref(lookups[0]), rtol=1e-5, atol=1e-6)
    t_ref, t_pool, t_all = interleaved(
        [ref, pool, hot_kernel], [lookups, remapped, lookups], args.calls
    )
    return {
        "trace": trace_name,
        "hot_fraction": fraction,
        "hot_rows_per_table": int(hot[0].numel()),
        "reference_ms": t_ref * 1e3,
        "remapped_pooling_ms": t_pool * 1e3,
        "remap_and_pooling_ms": t_all * 1e3,
        "pooling_speedup": t_ref / t_pool,
        "speedup_with_remap": t_ref / t_all,
    }


# -- the peers ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Peer:
    """One way to run the embedding stage: ``fn`` on its own prepared inputs (one per batch,
    as the data path would hand them over), and ``as_btd`` turning its output into the
    reference's ``[B, T, D]``."""

    name: str
    fn: Callable[[Any], Any]
    inputs: list[Any]
    as_btd: Callable[[Any], torch.Tensor]


def _segments(lk: Lookup) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per table its ids and its own ``B + 1`` offsets, as a model holding one bag per table
    receives them."""
    b = lk.batch_size
    starts = lk.offsets[::b].tolist()
    return [
        (lk.indices[s:e], lk.offsets[t * b : (t + 1) * b + 1] - s)
        for t, (s, e) in enumerate(itertools.pairwise(starts))
    ]


def _as_float(y: torch.Tensor) -> torch.Tensor:
    return y.float()  # nn.EmbeddingBag pools float16 rows into float16


def bags_per_table(tables: Tables, lookups: Sequence[Lookup]) -> Peer:
    """``nn.EmbeddingBag`` per table (own weights), called table by table."""
    bags = [
        nn.EmbeddingBag.from_pretrained(
            w.clone(), freeze=True, mode="sum", include_last_offset=True
        )
        for w in tables.weights
    ]

    def fn(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        return torch.stack(
            [bag(ids, off) for bag, (ids, off) in zip(bags, parts, strict=True)], dim=1
        )

    return Peer("nn.EmbeddingBag x T", fn, [_segments(lk) for lk in lookups], _as_float)


def bag_concat(tables: Tables, lookups: Sequence[Lookup]) -> Peer:
    """One ``nn.EmbeddingBag`` over the tables stacked row-wise; each table's ids shifted by its
    first row (the shift is part of the timed call), table-major bags."""
    bag = nn.EmbeddingBag.from_pretrained(
        torch.cat(tables.weights), freeze=True, mode="sum", include_last_offset=True
    )
    first = torch.tensor([0, *tables.rows[:-1]], dtype=torch.int64).cumsum(0)
    b, t, d = lookups[0].batch_size, tables.num_tables, tables.dim
    inputs = []
    for lk in lookups:
        per_bag = (lk.offsets[1:] - lk.offsets[:-1]).view(t, b).sum(1)
        inputs.append((lk.indices, lk.offsets, torch.repeat_interleave(first, per_bag)))

    def fn(x: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        pooled: torch.Tensor = bag(x[0] + x[2], x[1])
        return pooled

    return Peer(
        "nn.EmbeddingBag concat", fn, inputs, lambda y: y.view(t, b, d).transpose(0, 1).float()
    )


def fbgemm_inference(
    tables: Tables, lookups: Sequence[Lookup], orders: Sequence[torch.Tensor] | None = None
) -> Peer:
    """FBGEMM's inference TBE (``IntNBitTableBatchedEmbeddingBagsCodegen``, the CPU operator
    TorchRec's quantized inference modules call) with fp32 rows, int32 ids and offsets. With
    ``orders`` its tables are stored hot-first and each call remaps the ids (as ``torch-hot``)."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen,
    )

    d, b = tables.dim, lookups[0].batch_size
    precision = SparseType.FP16 if tables.dtype == torch.float16 else SparseType.FP32
    specs = [("", r, d, precision, EmbeddingLocation.HOST) for r in tables.rows]
    op = IntNBitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=specs,
        device="cpu",
        pooling_mode=PoolingMode.SUM,
        output_dtype=SparseType.FP32,
    )
    op.initialize_weights()
    for t, ((dst, _), w) in enumerate(
        zip(op.split_embedding_weights(), tables.weights, strict=True)
    ):
        src = w if orders is None else w[orders[t]]
        dst[:, : d * w.element_size()].view(w.dtype).copy_(src)  # rows are padded to 16 B
        del src
    as_btd = lambda y: y.view(b, tables.num_tables, d)  # noqa: E731
    if orders is None:
        inputs = [(lk.indices.int(), lk.offsets.int()) for lk in lookups]
        return Peer("fbgemm TBE inference", lambda x: op(x[0], x[1]), inputs, as_btd)
    remap = []
    for o in orders:
        inverse = torch.empty_like(o, dtype=torch.int32)
        inverse[o] = torch.arange(o.numel(), dtype=torch.int32)
        remap.append(inverse)

    def hot_fn(x: tuple[Lookup, torch.Tensor]) -> torch.Tensor:
        lk, offsets = x
        starts = lk.offsets[::b].tolist()
        ids = torch.cat(
            [
                torch.index_select(remap[t], 0, lk.indices[starts[t] : starts[t + 1]])
                for t in range(len(remap))
            ]
        )
        out: torch.Tensor = op(ids, offsets)
        return out

    inputs_hot = [(lk, lk.offsets.int()) for lk in lookups]
    return Peer("fbgemm TBE inference + hot remap", hot_fn, inputs_hot, as_btd)


def fbgemm_split(tables: Tables, lookups: Sequence[Lookup]) -> Peer:
    """FBGEMM's training TBE (``SplitTableBatchedEmbeddingBagsCodegen``) on the CPU, int64."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    d, b = tables.dim, lookups[0].batch_size
    specs = [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r in tables.rows]
    op = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=specs,
        pooling_mode=PoolingMode.SUM,
        weights_precision=SparseType.FP16 if tables.dtype == torch.float16 else SparseType.FP32,
    )
    with torch.no_grad():
        for dst, w in zip(op.split_embedding_weights(), tables.weights, strict=True):
            dst.copy_(w)
    inputs = [(lk.indices, lk.offsets) for lk in lookups]
    as_btd = lambda y: y.view(b, tables.num_tables, d)  # noqa: E731
    return Peer("fbgemm TBE training op", lambda x: op(x[0], x[1]), inputs, as_btd)


def torchrec_ebc(tables: Tables, lookups: Sequence[Lookup]) -> Peer:
    """TorchRec's ``EmbeddingBagCollection`` (one feature per table); each call builds the
    ``KeyedJaggedTensor`` from values and lengths, as a fresh batch arrives (a KJT caches its
    split, so reusing one would skip work)."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.modules.embedding_configs import DataType

    dtype = DataType.FP16 if tables.dtype == torch.float16 else DataType.FP32
    configs = [
        EmbeddingBagConfig(name=f"t{t}", embedding_dim=tables.dim, num_embeddings=r,
                           feature_names=[f"f{t}"], data_type=dtype)
        for t, r in enumerate(tables.rows)
    ]  # fmt: skip
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    with torch.no_grad():
        for t, w in enumerate(tables.weights):
            ebc.embedding_bags[f"t{t}"].weight.copy_(w)
    keys = [f"f{t}" for t in range(tables.num_tables)]
    b, d = lookups[0].batch_size, tables.dim

    def fn(x: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        pooled: torch.Tensor = ebc(KeyedJaggedTensor(keys, x[0], lengths=x[1], stride=b)).values()
        return pooled

    inputs = [(lk.indices, lk.offsets[1:] - lk.offsets[:-1]) for lk in lookups]
    return Peer("torchrec EBC", fn, inputs, lambda y: y.view(b, tables.num_tables, d).float())


def hot_rows_of(tables: Tables, trace: traces.Trace, fraction: float) -> tuple[torch.Tensor, ...]:
    """Per table the trace's ``fraction`` of its rows most used, most used first (the trace's
    ids folded modulo the table's rows, as the batches are): an offline profile of the trace."""
    hot = locality.hot_rows(trace, max(1, int(max(tables.rows) * fraction)))
    return tuple(
        hot_first_order(r, hot[t % len(hot)] % r)[: max(1, int(r * fraction))]
        for t, r in enumerate(tables.rows)
    )


def build_peers(
    tables: Tables, lookups: Sequence[Lookup], hot: Sequence[torch.Tensor]
) -> list[Peer]:
    """Every variant, recperf's first: they all pool the same batches out of the same rows;
    ``torch-hot`` and FBGEMM's hot variant reorder the tables by the same ``hot`` rows."""
    ref = KERNELS.build("torch", None, tables)
    torch_hot = KERNELS.build("torch-hot", None, tables, hot_rows=tuple(hot))
    orders = [hot_first_order(r, h) for r, h in zip(tables.rows, hot, strict=True)]
    same = lambda y: y  # noqa: E731
    return [
        Peer("torch", ref, list(lookups), same),
        Peer("torch-hot", torch_hot, list(lookups), same),
        bags_per_table(tables, lookups),
        bag_concat(tables, lookups),
        fbgemm_inference(tables, lookups),
        fbgemm_split(tables, lookups),
        torchrec_ebc(tables, lookups),
        fbgemm_inference(tables, lookups, orders),
    ]


def check_peers(peers: Sequence[Peer], tables: Tables, lookup: Lookup) -> dict[str, float]:
    """Each peer's largest absolute difference from the reference on ``lookup``; raise
    AssertionError naming the first peer outside the reference's tolerance (``RTOL``)."""
    want = KERNELS.build("torch", None, tables)(lookup)
    bound = magnitude(tables, lookup)
    errors = {}
    for p in peers:
        got = p.as_btd(p.fn(p.inputs[0]))
        why = mismatch(got.contiguous(), want, bound, tables.row_format)
        if why:  # not an assert: the check must hold under python -O too
            raise AssertionError(f"{p.name} differs from the reference: {why}")
        errors[p.name] = float((got - want).abs().max())
    return errors


def peer_config(name: str, rows_cap: int, batch_size: int | None) -> EmbedConfig:
    """``name``'s stage with every table capped at ``rows_cap`` rows, at its peers batch."""
    cfg = config(name, rows_cap=rows_cap, batch_size=batch_size or PEER_BATCH[name])
    return replace(cfg, table_rows=tuple(min(r, rows_cap) for r in cfg.table_rows))


def tables_mib(tables: Tables) -> float:
    return sum(w.numel() * w.element_size() for w in tables.weights) / 2**20


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def measure(peers: Sequence[Peer], nbytes: int, threads: int, calls: int) -> dict[str, Any]:
    """One thread count: the copy bandwidth, then every peer interleaved."""
    torch.set_num_threads(threads)
    # The best of three medians: on a shared machine a neighbour's burst only ever lowers it.
    copy_gbps = max(copy_bandwidth(torch.device("cpu"), nbytes=1 << 27) for _ in range(3)) / 1e9
    load = os.getloadavg()[0]
    samples = interleaved_samples([p.fn for p in peers], [p.inputs for p in peers], calls)
    variants: list[dict[str, Any]] = []
    for p, xs in zip(peers, samples, strict=True):
        q1, med, q3 = _quartiles([x * 1e3 for x in xs])
        gbps = nbytes / (med / 1e3) / 1e9
        variants.append({
            "variant": p.name, "kind": KINDS.get(p.name, "peer"),
            "ms_per_batch": med, "ms_q1": q1, "ms_q3": q3, "gb_per_s": gbps,
            "pct_of_copy_bw": 100.0 * gbps / copy_gbps,
        })  # fmt: skip
    ref_ms = variants[0]["ms_per_batch"]
    best = min((v for v in variants if v["kind"] == "peer"), key=lambda v: v["ms_per_batch"])
    for v in variants:
        v["speedup_vs_torch"] = ref_ms / v["ms_per_batch"]
        v["speedup_vs_best_peer"] = best["ms_per_batch"] / v["ms_per_batch"]
    return {
        "threads": threads,
        "copy_gb_per_s": copy_gbps,
        "load_avg_1m": [load, os.getloadavg()[0]],
        "best_peer": best["variant"],
        "variants": variants,
    }


def peers_setting(
    name: str, trace_name: str, dtype: torch.dtype, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """One config on one trace with ``dtype`` rows: build every variant once, check it, time it
    per thread count."""
    cfg = peer_config(name, args.rows_cap, args.batch_size)
    trace = eb.bench_trace(cfg, trace_name, args.seed)
    tables = random_tables(cfg, dtype, "cpu", args.seed)
    lookups = eb.make_lookups(cfg, trace, args.inputs, "cpu")
    fraction = float(args.hot_fraction or "0.1")
    peers = build_peers(tables, lookups, hot_rows_of(tables, trace, fraction))
    with torch.no_grad():  # not inference_mode: FBGEMM's training op has no kernel under it
        errors = check_peers(peers, tables, lookups[0])
        nbytes = lookup_bytes(lookups[0], cfg.dim, tables.weights[0].element_size(), cfg.num_tables)
        head: dict[str, Any] = {
            "config": name, "trace": trace_name, "dtype": str(dtype).removeprefix("torch."),
            "batch_size": cfg.batch_size,
            "tables": cfg.num_tables, "rows": sum(cfg.table_rows),
            "table_mib": tables_mib(tables), "hot_fraction": fraction,
            "lookups_per_batch": int(lookups[0].indices.numel()), "bytes_per_batch": nbytes,
        }  # fmt: skip
        out: list[dict[str, Any]] = []
        for threads in (int(t) for t in args.threads.split(",")):
            row = head | measure(peers, nbytes, threads, args.calls)
            for v in row["variants"]:
                v["max_abs_err"] = errors[v["variant"]]
            out.append(row)
            _print_row(row)
    return out


def _print_row(row: dict[str, Any]) -> None:
    where = f"{row['config']} / {row['trace']} / {row['dtype']} / {row['threads']} thread(s)"
    load = row["load_avg_1m"][0]
    print(f"{where}: copy {row['copy_gb_per_s']:.1f} GB/s, load {load:.2f}", flush=True)
    for v in row["variants"]:
        print(
            f"  {v['variant']:34s} {v['ms_per_batch']:8.2f} ms [{v['ms_q1']:.2f}, "
            f"{v['ms_q3']:.2f}] {v['gb_per_s']:6.2f} GB/s ({v['pct_of_copy_bw']:4.1f}% of copy) "
            f"{v['speedup_vs_torch']:5.2f}x torch {v['speedup_vs_best_peer']:5.2f}x best peer",
            flush=True,
        )


def machine() -> dict[str, Any]:
    import fbgemm_gpu
    import torchrec

    model = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
         if ln.startswith("model name")), platform.processor(),
    )  # fmt: skip
    return {
        "cpu": model, "cpus": os.cpu_count(), "memory_gib": round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "torch": torch.__version__, "fbgemm_gpu": fbgemm_gpu.__version__,
        "torchrec": getattr(torchrec, "__version__", "1.8.0"),
    }  # fmt: skip


def peers_main(args: argparse.Namespace) -> None:
    settings = []
    for dtype in (DTYPES[d] for d in args.dtypes.split(",")):
        for name in args.configs.split(","):
            for trace in args.traces.split(","):
                settings += peers_setting(name, trace, dtype, args)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python benchmarks/embed_cpu.py", *sys.argv[1:]]),
        "machine": machine(),
        "calls": args.calls, "inputs": args.inputs, "rows_cap": args.rows_cap,
        "seed": args.seed, "settings": settings,
    }  # fmt: skip
    # The bundled copy is the same data, rounded and compact: the report only shows it.
    texts = (json.dumps(result, indent=1), json.dumps(_rounded(result), separators=(",", ":")))
    for path, text in zip((args.out or PEERS_OUT, args.bundle), texts, strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text + "\n")
        tmp.replace(path)  # a run that fails half-way leaves the previous result whole


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", action="store_true", help="Measure the CPU peers (issue 18).")
    batch_help = "Default 64 (paper); with --peers 64 for paper, 512 for mlperf."
    ap.add_argument("--batch-size", type=int, default=None, help=batch_help)
    ap.add_argument("--calls", type=int, default=None, help="Timed calls per variant (default 60).")
    ap.add_argument("--inputs", type=int, default=8, help="Distinct batches rotated through.")
    ap.add_argument("--hot-fraction", default=None,
                    help="Default 0.02,0.1,0.3; with --peers one value, default 0.1.")  # fmt: skip
    ap.add_argument("--traces", default="reuse-medium-500k,uniform")
    ap.add_argument("--threads", default=None, help="Default 1; with --peers 1,2.")
    ap.add_argument("--configs", default="paper,mlperf", help="With --peers.")
    ap.add_argument("--dtypes", default="float32,float16", help="With --peers: row dtypes.")
    ap.add_argument("--rows-cap", type=int, default=60_000, help="With --peers: rows per table.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--bundle", type=Path, default=PEERS_BUNDLE, help="With --peers: the copy "
                    "the report reads.")  # fmt: skip
    args = ap.parse_args()
    if args.peers:
        args.calls = args.calls or 60
        args.threads = args.threads or "1,2"
        peers_main(args)
        return
    args.calls = args.calls or 60
    args.batch_size = args.batch_size or 64
    args.out = args.out or Path("benchmarks/results/embed_cpu.json")
    torch.set_num_threads(int(args.threads or 1))
    rows = []
    for trace in args.traces.split(","):
        for fraction in (float(f) for f in (args.hot_fraction or "0.02,0.1,0.3").split(",")):
            row = run(trace, fraction, args)
            rows.append(row)
            print(
                f"{trace:18s} hot {fraction:4.2f}: reference {row['reference_ms']:.2f} ms, "
                f"remapped pooling {row['remapped_pooling_ms']:.2f} ms "
                f"({row['pooling_speedup']:.2f}x), with the remap {row['remap_and_pooling_ms']:.2f}"
                f" ms ({row['speedup_with_remap']:.2f}x)",
                flush=True,
            )
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "args": vars(args) | {"out": str(args.out), "bundle": None},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
