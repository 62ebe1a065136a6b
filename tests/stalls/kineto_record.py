"""Records real torch.profiler traces for the Kineto reader's tests: a 2-rank gloo DDP run of
a tiny MLP fed by a DataLoader whose collate sleeps ``SLEEP_S`` per batch, profiled with a
warm-up step and ``record_shapes`` (for message sizes). ``record(OUT)`` (or ``python
kineto_record.py OUT``) forks one process per rank and writes ``OUT/traces/rank{0,1}.json``
and ``OUT/meta.json`` (gradient bytes, sleep, steps)."""

from __future__ import annotations

import gc
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

SLEEP_S = 0.03
WORLD = 2
WARMUP, ACTIVE = 1, 4
SEED = 0


def _rank(rank: int, out: Path, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    def collate(items: list[tuple[Any, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(SLEEP_S)  # the injected data stall
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    grad = sum(p.numel() * p.element_size() for p in net.parameters())
    model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(SEED + rank)
    data = TensorDataset(torch.randn(64, 32, generator=gen), torch.randn(64, 1, generator=gen))
    loader = DataLoader(data, batch_size=8, collate_fn=collate)
    schedule = torch.profiler.schedule(wait=0, warmup=WARMUP, active=ACTIVE, repeat=1)

    def save(p: Any) -> None:
        p.export_chrome_trace(str(out / "traces" / f"rank{rank}.json"))

    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
        on_trace_ready=save, record_shapes=True,
    ) as prof:  # fmt: skip
        for i, (x, y) in enumerate(loader):
            if i == WARMUP + ACTIVE:
                break
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    dist.barrier()
    del model, opt, prof  # DDP's reducer goes before the process group it uses
    gc.collect()
    dist.destroy_process_group()
    if rank == 0:
        meta = {"grad_bytes": grad, "sleep_s": SLEEP_S, "active_steps": ACTIVE, "world": WORLD}
        (out / "meta.json").write_text(json.dumps(meta))


def record(out: Path, timeout_s: float = 300) -> None:
    """Run the ranks as forked processes (no second torch import: the tests stay fast) and
    wait for both."""
    import multiprocessing

    (out / "traces").mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_rank, args=(r, out, port)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout_s)
    for p in procs:
        if p.exitcode != 0:
            p.kill()
            raise RuntimeError(f"a recording rank failed (exit code {p.exitcode})")


if __name__ == "__main__":
    record(Path(sys.argv[1]))
