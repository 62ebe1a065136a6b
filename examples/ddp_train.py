"""A plain DistributedDataParallel training script, as anyone would write it: an MLP on a
synthetic dataset through a DataLoader, profiled with torch.profiler on a schedule. It knows
nothing of recperf except the ``RECPERF_TRACE_DIR`` variable, where it writes one Kineto trace
per rank (``tensorboard_trace_handler``). Run it with torchrun, or let recperf launch it:

    torchrun --nproc-per-node 2 examples/ddp_train.py --steps 20
    recperf stalls launch --ranks 2 --nodes 2 --bandwidth 500mbit --out out/launch \\
        -- python examples/ddp_train.py --steps 20

Gloo on the CPU, NCCL on GPUs (one per rank); run without ``RANK`` in the environment it
trains alone, without DDP.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class RandomRegression(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``size`` samples of ``features`` inputs and one target, each drawn from its own seed."""

    def __init__(self, size: int, features: int, seed: int) -> None:
        self.size, self.features, self.seed = size, features, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x = torch.randn(self.features, generator=g)
        return x, x[:1].clone()


class SlowCollate:
    """Stacks a batch, after sleeping ``ms`` milliseconds: a data stall of known size."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(
        self, items: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ms > 0:
            time.sleep(self.ms / 1e3)
        xs, ys = zip(*items, strict=True)
        return torch.stack(xs), torch.stack(ys)


def mlp(hidden: int, layers: int) -> nn.Sequential:
    """``layers`` square Linear+ReLU blocks of width ``hidden`` and a scalar head."""
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(hidden, 1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--steps", type=int, default=20, help="Training steps (default 20).")
    ap.add_argument("--hidden", type=int, default=1024, help="MLP width (default 1024).")
    ap.add_argument("--layers", type=int, default=2, help="Hidden layers (default 2).")
    ap.add_argument("--batch-size", type=int, default=16, help="Samples per rank per step.")
    ap.add_argument("--sleep-ms", type=float, default=0.0, help="Injected delay per batch, ms.")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes.")
    ap.add_argument("--skip", type=int, default=2, help="Steps before tracing starts (>= 1).")
    ap.add_argument("--seed", type=int, default=0, help="Model and data seed.")
    ap.add_argument(
        "--trace-dir",
        default=os.environ.get("RECPERF_TRACE_DIR"),
        help="Where to write the traces (default $RECPERF_TRACE_DIR; unset: no trace).",
    )
    args = ap.parse_args(argv)
    for name in ("steps", "hidden", "layers", "batch_size", "skip"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.steps <= args.skip:
        ap.error(f"--steps {args.steps} must exceed --skip {args.skip} (no step would be traced)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    distributed = "RANK" in os.environ
    cuda = torch.cuda.is_available()
    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=5))
    torch.manual_seed(args.seed)
    model: nn.Module = mlp(args.hidden, args.layers).to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
    data = RandomRegression(args.steps * args.batch_size * max(1, _world()), args.hidden, args.seed)
    sampler = DistributedSampler(data, seed=args.seed) if distributed else None
    loader = DataLoader(
        data,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        collate_fn=SlowCollate(args.sleep_ms),
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    traced = args.steps - args.skip
    handler = tensorboard_trace_handler(args.trace_dir, worker_name=f"rank{rank}")
    with profile(
        activities=activities,
        record_shapes=True,  # the collectives' message sizes: the gradient bytes
        schedule=schedule(wait=max(0, args.skip - 1), warmup=1, active=traced, repeat=1),
        on_trace_ready=handler if args.trace_dir else None,
    ) as prof:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    if distributed:
        dist.barrier()
        del model, opt  # DDP's reducer goes before the process group it uses
        gc.collect()
        dist.destroy_process_group()
    if rank == 0:
        print(f"trained {args.steps} steps; traces in {args.trace_dir or '(not traced)'}")


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


if __name__ == "__main__":
    main()
