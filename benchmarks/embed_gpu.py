"""GPU benchmark of the embedding kernels (issue 6), one call of under 8 minutes on an H200.

Checks every kernel against the reference on the device (compiled Triton, the L2 window), then
measures the device copy bandwidth; then, for the ``paper`` configuration (12 tables x
500,000 rows x dim 128, 150 ids per bag, batch 2048) and the uniform, Zipf and reuse traces,
autotunes each variant (a reduced grid, on the reuse trace) and times it with CUDA events
(median of many calls, rotating inputs larger than L2): ms per batch, achieved GB/s, % of the
copy bandwidth, speedup over ``torch``; FBGEMM's table-batched embedding where installed; and
the whole inference model's stage breakdown; and each winner's registers and theoretical
occupancy, compiled for this device's architecture. Then every row format (fp32, fp16, bf16,
fp8, int8, int4) x every Triton variant on one trace (``--formats-trace``, uniform ids by
default: no reuse, so bytes over time is the bandwidth the rows were read at): bytes moved per
batch at each format's row size (``Tables.row_bytes``: codes plus scale and bias) against the
measured copy bandwidth, the speedup over ``torch`` on fp32 rows, and the error against the
dequantized reference and against fp32.

    python benchmarks/embed_gpu.py [--reps 50] [--out benchmarks/results/embed_gpu.json]
        [--formats fp32,int8,...] [--formats-trace uniform]

On the lent H200 (its python3 has torch and Triton; recperf runs from the source tree):

    PYTHONPATH=src PYTHONUNBUFFERED=1 python3 benchmarks/embed_gpu.py --out $OUT/embed_gpu.json

Targets: ``combined`` >= 1.5x ``torch`` on the reuse trace; >= 70% of copy bandwidth on uniform.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from recperf.core.errors import RecperfError
from recperf.embed import traces
from recperf.embed.autotune import Space
from recperf.embed.bench import bench, bench_trace, hot_rows_for, make_lookups
from recperf.embed.kernels import KERNELS, Lookup, Tables, check_kernel
from recperf.embed.kernels.base import build_kernel, magnitude, mismatch
from recperf.embed.kernels.compiled import ARCHS, compile_tbe
from recperf.embed.kernels.formats import ROW_FORMATS, quantize
from recperf.embed.kernels.triton_tbe import GPU_SPACE, TBEConfig, launch_config
from recperf.embed.model import EmbedConfig, config, random_tables
from recperf.embed.timing import copy_bandwidth, lookup_bytes, median_s

VARIANTS = ("triton", "triton-prefetch", "hot-l2", "combined")
TRACES = ("uniform", "zipf:1.05", "reuse-medium-500k")
CHECK_CASES = 4
"""Random cases per row format in the device check (as tests/embed/test_kernels.py's GPU test)."""
BUDGET_S = 240.0
"""No trace is started after this many seconds (a trace takes one to two minutes on an H200)."""


def fbgemm_ms(trace_name: str, reps: int) -> dict[str, Any]:
    """FBGEMM's training TBE forward on the same shapes, where fbgemm_gpu imports."""
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception as exc:  # not installed, or no CUDA build
        return {"skipped": f"fbgemm_gpu unavailable: {exc}".splitlines()[0]}
    cfg = config("paper")
    specs = [
        (rows, cfg.dim, EmbeddingLocation.DEVICE, ComputeDevice.CUDA) for rows in cfg.table_rows
    ]
    tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, optimizer=EmbOptimType.EXACT_SGD).cuda()
    trace = traces.resolve(
        trace_name,
        rows=500_000 if "reuse-medium" not in trace_name else None,
        tables=cfg.num_tables,
    )
    lookups = make_lookups(cfg, trace, 2, "cuda")
    with torch.no_grad():
        t = median_s(lambda lk: tbe(lk.indices, lk.offsets), lookups, reps, torch.device("cuda"))
    return {"ms_per_batch": t * 1e3}


def check_all(device: str) -> dict[str, str]:
    """Every registered kernel against the reference on random shapes on ``device``."""
    results = {}
    for name in KERNELS.names():
        try:  # the cases the GPU tests ran (so their compiled kernels are in Triton's cache)
            check_kernel(name, device=device, cases=CHECK_CASES)
            results[name] = "ok"
        except RecperfError as exc:
            results[name] = f"FAILED: {exc}"
        print(f"check {name}: {results[name]}", flush=True)
    return results


def resources(variant: str, params: dict[str, Any], dim: int, fmt: str = "fp32") -> dict[str, Any]:
    """Registers, spills and theoretical occupancy of a tuned launch shape on this GPU, reading
    ``fmt`` rows."""
    major, minor = torch.cuda.get_device_capability() if torch.cuda.is_available() else (9, 0)
    cc = 10 * major + minor
    if cc not in ARCHS:
        return {"skipped": f"no occupancy table for sm_{cc}"}
    try:
        res = compile_tbe(launch_config(KERNELS.config(variant, params), dim), cc=cc, fmt=fmt)
    except RecperfError as exc:
        return {"skipped": str(exc)}
    keep = ("registers", "spill_bytes", "shared_bytes", "occupancy", "limiter")
    return {k: v for k, v in res.to_json().items() if k in keep}


def quantized_tables(base: Tables, fmt: str) -> Tables:
    """``base``'s float32 rows in row format ``fmt`` (FBGEMM's row-wise int8/int4)."""
    coded = [quantize(w, fmt) for w in base.weights]
    sbs = tuple(sb for _, sb in coded if sb is not None)
    return Tables(weights=tuple(w for w, _ in coded), pooling=base.pooling, fmt=fmt,
                  scale_bias=sbs or None)  # fmt: skip


def batch_bytes(lookup: Lookup, tables: Tables) -> int:
    """Bytes a kernel must move for one batch at ``tables``' row size (codes plus scale and
    bias): ``lookup_bytes``' ids, offsets, weights and output, and every looked-up row."""
    rest = lookup_bytes(lookup, tables.dim, 0, tables.num_tables)
    return rest + int(lookup.indices.numel()) * tables.row_bytes


@dataclass(frozen=True, slots=True)
class FormatRun:
    """One variant on one row format."""

    format: str
    variant: str
    params: dict[str, Any]
    row_bytes: int
    bytes_per_batch: int
    ms_per_batch: float
    gb_per_s: float
    pct_of_copy_bw: float
    speedup_vs_torch_fp32: float
    matches_reference: bool
    """Equal to the ``torch`` reference on the same (dequantized) rows, within ``RTOL``."""
    max_err_vs_fp32_of_max: float
    """Largest |pooled - pooled from the fp32 rows|, over the largest |pooled| (quantization)."""


def format_sweep(
    cfg: EmbedConfig,
    trace_name: str,
    variants: list[str],
    formats: list[str],
    *,
    params: dict[str, dict[str, Any]],
    device: str,
    reps: int,
    inputs: int,
    deadline: float = float("inf"),
) -> dict[str, Any]:
    """Every variant (built with ``params[variant]``) on ``cfg``'s tables in every row format,
    timed on ``inputs`` rotating batches of ``trace_name``: one ``FormatRun`` per (format,
    variant). No format is started after ``deadline`` (a ``time.perf_counter()`` value)."""
    dev = torch.device(device)
    trace = bench_trace(cfg, trace_name)
    base = random_tables(cfg, torch.float32, device, 0)
    lookups = make_lookups(cfg, trace, inputs, device)
    copy_gbps = copy_bandwidth(dev, nbytes=(1 << 30) if dev.type == "cuda" else 1 << 24) / 1e9
    ref32 = KERNELS.build("torch", None, base)
    exact = ref32(lookups[0])
    torch_ms = median_s(ref32, lookups, reps, dev) * 1e3
    out: dict[str, Any] = {"trace": trace.name, "copy_gb_per_s": copy_gbps,
                           "torch_fp32_ms_per_batch": torch_ms, "rows": []}  # fmt: skip
    for fmt in formats:
        if time.perf_counter() > deadline:
            out["rows"].append({"format": fmt, "skipped": "time budget"})
            continue
        tables = quantized_tables(base, fmt)
        hot = hot_rows_for(cfg, trace, tables)
        want = KERNELS.build("torch", None, tables)(lookups[0])
        bound = magnitude(tables, lookups[0])
        nbytes = batch_bytes(lookups[0], tables)
        for name in variants:
            kernel = build_kernel(name, params.get(name), tables, hot)
            got = kernel(lookups[0])
            ms = median_s(kernel, lookups, reps, dev) * 1e3
            gbps = nbytes / (ms / 1e3) / 1e9
            run = FormatRun(
                format=fmt, variant=name, params=params.get(name, {}), row_bytes=tables.row_bytes,
                bytes_per_batch=nbytes, ms_per_batch=ms, gb_per_s=gbps,
                pct_of_copy_bw=100.0 * gbps / copy_gbps, speedup_vs_torch_fp32=torch_ms / ms,
                matches_reference=mismatch(got, want, bound, fmt) == "",
                max_err_vs_fp32_of_max=float((got - exact).abs().max() / exact.abs().max()),
            )  # fmt: skip
            out["rows"].append(asdict(run))
            del kernel
            print(
                f"  {fmt:5s} {name:16s} {ms:8.3f} ms {gbps:8.1f} GB/s {run.pct_of_copy_bw:5.1f}% "
                f"{run.speedup_vs_torch_fp32:5.2f}x ok={run.matches_reference}",
                flush=True,
            )
        del tables, want, bound
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return out


def targets(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's two targets from the runs so far: ``combined`` >= 1.5x ``torch`` on the reuse
    trace, and the best kernel at >= 70% of copy bandwidth on uniform ids."""
    got: dict[str, Any] = {}
    for run in runs:
        by = {v["variant"]: v for v in run.get("variants", [])}
        if run.get("trace") == "reuse-medium-500k" and "combined" in by:
            x = by["combined"]["speedup_vs_torch"]
            got["combined_speedup_on_reuse"] = {"value": x, "target": 1.5, "met": x >= 1.5}
        if run.get("trace") == "uniform" and by:
            pct = max(v["pct_of_copy_bw"] for n, v in by.items() if n != "torch")
            got["best_pct_of_copy_bw_on_uniform"] = {"value": pct, "target": 70, "met": pct >= 70}
    return got


def run_formats(
    args: argparse.Namespace,
    cfg: EmbedConfig,
    formats: list[str],
    runs: list[dict[str, Any]],
    device: str,
    reps: int,
    t0: float,
) -> dict[str, Any]:
    """The format sweep with the first run's tuned launch fields, each (format, launch shape)'s
    registers and occupancy compiled for this GPU."""
    tuned = {v["variant"]: v["params"] for v in (runs[0].get("variants", []) if runs else [])}
    params = {name: tuned.get(name, {}) for name in VARIANTS}
    print(f"formats on {args.formats_trace}: {', '.join(formats)}", flush=True)
    sweep = format_sweep(
        cfg, args.formats_trace, list(VARIANTS), formats, params=params, device=device,
        reps=reps, inputs=2 if args.dry_run else 16, deadline=t0 + BUDGET_S,
    )  # fmt: skip
    seen: dict[tuple[str, TBEConfig], dict[str, Any]] = {}  # each (format, shape) compiled once
    for row in sweep["rows"]:
        if "variant" in row:
            shape = launch_config(KERNELS.config(row["variant"], row["params"]), cfg.dim)
            key = (row["format"], shape)
            if key not in seen:
                seen[key] = resources(row["variant"], row["params"], cfg.dim, row["format"])
            row["resources"] = seen[key]
    return sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/embed_gpu.json"))
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="check the script's plumbing on the CPU (needs TRITON_INTERPRET=1): small config, "
        "batch 8, one grid point, 2 reps",
    )
    ap.add_argument(
        "--formats",
        default=",".join(ROW_FORMATS),
        help="comma-separated row formats of the format sweep (default: all six; '' for none)",
    )
    ap.add_argument("--formats-trace", default="uniform", help="the format sweep's trace")
    args = ap.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in formats if f not in ROW_FORMATS]
    if bad:
        ap.error(f"--formats: {bad[0]!r} is not a row format; allowed: {', '.join(ROW_FORMATS)}")
    if not torch.cuda.is_available() and not args.dry_run:
        sys.exit("embed_gpu.py needs a CUDA GPU (or --dry-run with TRITON_INTERPRET=1)")
    t0 = time.perf_counter()
    space = {k: v[:1] for k, v in GPU_SPACE.items()} if args.dry_run else GPU_SPACE
    prefetch = {"prefetch": (1, 2)[: 1 if args.dry_run else 2]}
    spaces: dict[str, Space] = {
        name: {**space, **(prefetch if "prefetch" in KERNELS.entry(name).space else {})}
        for name in VARIANTS
    }
    device = "cpu" if args.dry_run else "cuda"
    cfg = config("small", batch_size=8) if args.dry_run else config("paper")
    reps = 2 if args.dry_run else args.reps
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(),
        "config": cfg.name,
        "reps": reps,
        "runs": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every step: a run cut short still leaves its figures
        out["wall_s"] = time.perf_counter() - t0
        out["targets"] = targets(out["runs"])
        args.out.write_text(json.dumps(out, indent=1) + "\n")

    out["check"] = check_all(device)
    save()
    # Tune on the reuse trace first (the winners are cached per trace in the autotune cache);
    # the format sweep follows it, with those winners' launch fields, then the other traces.
    order = ("reuse-medium-500k", *[t for t in TRACES if t != "reuse-medium-500k"])
    for i, trace in enumerate(order):
        if i == 1 and formats:
            out["formats"] = run_formats(args, cfg, formats, out["runs"], device, reps, t0)
            save()
        if time.perf_counter() - t0 > BUDGET_S:
            out["runs"].append({"trace": trace, "skipped": "time budget"})
        else:
            out["runs"].append(run_trace(cfg, trace, spaces, device, reps, args.dry_run))
        save()
    print(json.dumps({"wall_s": out["wall_s"], "targets": out["targets"]}))


def run_trace(
    cfg: EmbedConfig, trace: str, spaces: dict[str, Space], device: str, reps: int, dry: bool
) -> dict[str, Any]:
    """Every variant tuned and timed on ``trace`` (fp32 rows), with FBGEMM's TBE beside them."""
    result = bench(cfg, trace, list(VARIANTS), device=device, reps=reps, tune=True, spaces=spaces)
    fbgemm = {"skipped": "dry run"} if dry else fbgemm_ms(trace, reps)
    run = result.to_json() | {"fbgemm": fbgemm}
    for v in run["variants"]:
        if v["variant"] in VARIANTS:
            v["resources"] = resources(v["variant"], v["params"], cfg.dim)
    print(f"{trace}: copy {result.copy_gb_per_s:.0f} GB/s", flush=True)
    for v in result.variants:
        print(
            f"  {v.variant:16s} {v.ms_per_batch:8.3f} ms {v.gb_per_s:8.1f} GB/s "
            f"{v.pct_of_copy_bw:5.1f}% {v.speedup_vs_torch:5.2f}x {v.params}",
            flush=True,
        )
    print(f"  stages ms: {result.stages_ms}", flush=True)
    return run


if __name__ == "__main__":
    main()
