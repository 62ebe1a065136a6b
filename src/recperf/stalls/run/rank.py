"""One rank of a profiled training run: ``python -m recperf.stalls.run.rank SPEC.json``. Reads its
rank, world size and rendezvous from the environment (as ``torchrun`` sets it, or as
``runner`` does locally), trains the workload for warmup + iters steps, times a few
synchronous all-reduces, and writes ``rank{R}.json`` (a Chrome trace) next to the spec."""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from recperf.stalls.base import WORKLOADS, DataSpec, Workload, grad_bytes
from recperf.stalls.run.hook import IterRecord, Profiler
from recperf.stalls.run.spec import RunSpec


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple | list):
        return type(batch)(_to(b, device) for b in batch)
    return batch


def _delayed(it: Iterator[Any], delay_s: float) -> Iterator[Any]:
    for item in it:
        time.sleep(delay_s)
        yield item


def _batches(workload: Workload, spec: RunSpec, rank: int, world: int) -> Iterator[Any]:
    data = DataSpec(
        batch_size=spec.batch_size,
        rank=rank,
        world=world,
        batches=spec.data_batches,
        seed=spec.seed,
    )
    if spec.data == "real":
        it = workload.real(Path(spec.data_dir or "."), data)
    else:
        it = workload.synthetic(data)
    return _delayed(it, spec.delay_ms / 1e3) if spec.delay_ms > 0 else it


def _flops(workload: Workload, model: nn.Module, batch: Any) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        workload.loss(model, batch).backward()  # type: ignore[no-untyped-call]
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def _train(
    workload: Workload,
    model: nn.Module,
    it: Iterator[Any],
    spec: RunSpec,
    device: torch.device,
    torch_trace: Path | None = None,
) -> tuple[list[IterRecord], Profiler | None]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    steps = spec.warmup + spec.iters
    if not spec.instrument:  # the plain loop the overhead is measured against
        records = []
        for _ in range(steps):
            t0 = time.perf_counter()
            batch = _to(next(it), device)
            workload.loss(model, batch).backward()  # type: ignore[no-untyped-call]
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            records.append(IterRecord(start=t0, data_end=t0, end=t1))
        return records, None
    window = (spec.warmup, spec.warmup + spec.torch_trace_iters) if torch_trace else (-1, -1)
    # per-bucket spans (the Chakra export replays each bucket), not the leaner DDP timers
    prof = Profiler(
        model, cuda=device.type == "cuda", annotate=torch_trace is not None, comm="hook"
    )
    capture = _TorchCapture(device) if torch_trace else None
    if capture is not None and window[0] == 0:
        capture.start()
    for i, batch in enumerate(prof.data(it)):
        if i == steps:
            break
        with prof.step():
            with prof.phase("forward"):
                loss = workload.loss(model, _to(batch, device))
            with prof.phase("backward"):
                loss.backward()  # type: ignore[no-untyped-call]
            with prof.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        if capture is not None and torch_trace is not None:
            if i + 1 == window[0]:
                capture.start()
            elif i + 1 == window[1]:
                capture.stop(torch_trace)
    return prof.records, prof


class _TorchCapture:
    """torch.profiler over a window of iterations, exported as a Chrome trace."""

    def __init__(self, device: torch.device) -> None:
        acts = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=acts)

    def start(self) -> None:
        self.prof.__enter__()  # type: ignore[no-untyped-call]

    def stop(self, path: Path) -> None:
        self.prof.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        self.prof.export_chrome_trace(str(path))


def _microbench(spec: RunSpec, device: torch.device) -> list[dict[str, float]]:
    """Median time of a synchronous all-reduce of each size (one bucket, no compute beside)."""
    out = []
    for size in spec.microbench_bytes:
        t = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        dist.all_reduce(t)
        times = []
        for _ in range(spec.microbench_reps):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out.append({"bytes": float(t.numel() * 4), "seconds": statistics.median(times)})
    return out


def run_rank(spec: RunSpec, out_dir: Path) -> Path:
    """Train this rank and write its trace; returns the trace path."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.set_num_threads(spec.threads)
    cuda = spec.device == "cuda"
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    workload = WORKLOADS.build(spec.workload, spec.workload_options)
    it = _batches(workload, spec, rank, world)  # before the process group: pipelines fork
    if world > 1:
        dist.init_process_group(
            "nccl" if cuda else "gloo", timeout=timedelta(seconds=spec.timeout_s)
        )
    model = workload.build(spec.seed).to(device)
    flops = _flops(
        workload,
        model,
        _to(workload.synthetic(DataSpec(batch_size=spec.batch_size)).__next__(), device),
    )
    meta: dict[str, Any] = {
        "run": spec.name,
        "world": world,
        "warmup": spec.warmup,
        "iters": spec.iters,
        "instrumented": spec.instrument,
        "grad_bytes": grad_bytes(model),
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "num_param_tensors": sum(1 for _ in model.parameters()),
        "flops_per_iter": flops,
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
    }
    if world > 1 and spec.comm:
        model = nn.parallel.DistributedDataParallel(model)
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    torch_trace = out_dir / f"torch_rank{rank}.json" if spec.torch_trace_iters else None
    records, prof = _train(workload, model, it, spec, device, torch_trace)
    meta["wall_s"] = time.perf_counter() - t0
    if world > 1:
        dist.barrier()
        meta["microbench"] = _microbench(spec, device) if spec.comm else []
        dist.barrier()
        del model  # DDP's reducer goes before the process group it uses
        gc.collect()
        dist.destroy_process_group()
    close = getattr(it, "close", None)
    if close is not None:
        close()
    prof = prof or Profiler(cuda=False)
    prof.records = records
    return prof.write_trace(
        out_dir / f"rank{rank}.json",
        rank,
        meta,
        world_size=world,
        backend="nccl" if cuda else "gloo",
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m recperf.stalls.run.rank SPEC.json", file=sys.stderr)
        return 2
    path = Path(args[0])
    run_rank(RunSpec.load(path), path.parent)
    sys.stdout.flush()
    sys.stderr.flush()
    # The trace is written and renamed; skip interpreter teardown, where gloo's and DDP's C++
    # destructors can race ("terminate called without an active exception") and fail the run.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
