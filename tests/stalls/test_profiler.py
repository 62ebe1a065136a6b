"""The direct instrumentation: data wait and phases timed, every DDP bucket's all-reduce seen
by the hook with the same result as DDP's default, the trace round-trips into the analysis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from recperf.core.errors import ConfigError
from recperf.stalls.run import ranktrace
from recperf.stalls.run.hook import Profiler
from recperf.stalls.run.runner import free_port
from recperf.stalls.run.spec import RunSpec


def _slow(n: int, delay: float) -> Iterator[int]:
    for i in range(n):
        time.sleep(delay)
        yield i


def test_data_wait_and_phases_are_timed(tmp_path: Path) -> None:
    prof = Profiler(cuda=False)
    seen = []
    for item in prof.data(_slow(3, 0.02)):
        with prof.step():
            with prof.phase("forward"):
                time.sleep(0.01)
            seen.append(item)
    assert seen == [0, 1, 2] and len(prof.records) == 3
    for r in prof.records:
        assert 0.02 <= r.data_end - r.start < 0.2
        assert r.end - r.data_end >= 0.01
        ((name, a, b),) = r.phases
        assert name == "forward" and b - a >= 0.01
    trace = prof.write_trace(tmp_path / "rank0.json", meta={"warmup": 0})
    assert trace.is_file()
    its = ranktrace._iterations(prof.trace(0, {"warmup": 1}))
    assert len(its) == 2


@pytest.fixture()
def group(tmp_path: Path) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _twins() -> tuple[nn.Module, nn.Module, Any, Any]:
    """Two copies of one MLP, each under DDP with small buckets (several per step)."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 600))
    timed = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 600))
    timed.load_state_dict(plain.state_dict())
    ddp = nn.parallel.DistributedDataParallel
    return plain, timed, ddp(plain, bucket_cap_mb=0.5), ddp(timed, bucket_cap_mb=0.5)


def test_ddp_hook_times_every_bucket_and_keeps_gradients(group: None) -> None:
    plain, timed, ddp_plain, ddp_timed = _twins()
    prof = Profiler(ddp_timed, cuda=False, comm="hook")
    assert prof.hooked and prof.comm_timing == "hook"
    x = torch.randn(8, 64)
    ddp_plain(x).sum().backward()
    for _ in prof.data([x, x]):  # DDP settles its buckets after the first iteration
        timed.zero_grad()
        with prof.step():
            ddp_timed(x).sum().backward()
    for a, b in zip(plain.parameters(), timed.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        assert torch.allclose(a.grad, b.grad)
    rec = prof.records[-1]
    total = sum(p.numel() * 4 for p in timed.parameters())
    assert len(rec.comm) >= 2  # the buckets
    assert sum(n for _, _, n in rec.comm) == total
    assert all(rec.data_end <= a <= b <= rec.end for a, b, _ in rec.comm)


def test_ddp_timers_time_each_iteration_without_a_hook(group: None) -> None:
    """The default on the CPU: no comm hook (DDP keeps its fused averaging, so gradients are
    bit for bit plain DDP's), and each step gets the window DDP's reducer timed, inside it."""
    plain, timed, ddp_plain, ddp_timed = _twins()
    prof = Profiler(ddp_timed, cuda=False)
    assert prof.comm_timing == "ddp-timers" and not prof.hooked
    assert ddp_timed._get_ddp_logging_data().get("comm_hook") in (None, "")
    x = torch.randn(8, 64)
    for _ in prof.data([x, x, x]):
        plain.zero_grad()
        ddp_plain(x).sum().backward()
        timed.zero_grad()
        with prof.step():
            ddp_timed(x).sum().backward()
        with prof.step():  # a step without a backward has no window (nothing new measured)
            pass
    pairs = zip(plain.parameters(), timed.parameters(), strict=True)
    assert all(torch.equal(a.grad, b.grad) for a, b in pairs)
    total = sum(p.numel() * 4 for p in timed.parameters())
    windows = [r.window for r in prof.records]
    assert windows[1::2] == [None] * 3
    for rec, w in zip(prof.records[::2], windows[::2], strict=True):
        assert w is not None and w.nbytes == total and w.buckets >= 1
        assert rec.data_end - 1e-3 <= w.start <= w.last_launch <= w.end <= rec.end + 1e-3
        assert not rec.comm
    assert windows[-2].buckets >= 2  # DDP settles its buckets after the first iteration
    (span,) = [e for e in prof.trace()["traceEvents"] if e["name"] == "recperf:allreduce"][-1:]
    assert span["args"]["buckets"] == windows[-2].buckets
    assert span["ts"] <= span["args"]["last_launch"] <= span["ts"] + span["dur"]
    figs = ranktrace._iteration_figures(ranktrace._iterations(prof.trace())[-2])
    last = windows[-2]
    assert figs["exposed_comm_s"] == pytest.approx(last.end - last.last_launch, abs=2e-6)
    with pytest.raises(ValueError, match="comm: 'bucket' is not one of auto, ddp-timers, hook"):
        Profiler(ddp_timed, cuda=False, comm="bucket")


def test_run_spec_round_trip_and_errors(tmp_path: Path) -> None:
    spec = RunSpec(name="x", workload="mlp", ranks=4, nodes=2, bandwidth="1gbit",
                   microbench_bytes=(1, 2))  # fmt: skip
    assert RunSpec.load(spec.save(tmp_path / "s.json")) == spec
    (tmp_path / "bad.json").write_text('{"name": "x", "workload": "mlp", "colour": 1}')
    with pytest.raises(ConfigError, match="unknown field 'colour'"):
        RunSpec.load(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="multiple of nodes"):
        RunSpec(name="x", workload="mlp", ranks=3, nodes=2, bandwidth="1gbit")
    with pytest.raises(ConfigError, match="bandwidth"):
        RunSpec(name="x", workload="mlp", ranks=2, nodes=2)
    with pytest.raises(ConfigError, match="data_dir"):
        RunSpec(name="x", workload="mlp", data="real")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_phases_on_a_gpu_are_timed_by_cuda_events() -> None:
    """A phase whose kernel runs ~20 ms but returns to the host at once: a wall clock at the
    phase's end would see microseconds, the CUDA-event clock sees the kernel."""
    prof = Profiler(cuda=True)
    x = torch.ones(1024, device="cuda")
    cycles = int(torch.cuda.get_device_properties(0).clock_rate * 1e3 * 0.02)  # kHz -> 20 ms
    for _ in prof.data(range(3)):
        with prof.step():
            with prof.phase("forward"):
                torch.cuda._sleep(cycles)
            with prof.phase("optimizer"):
                x.mul_(1.0001)
    assert prof.trace()["recperf"]["clock"] == "cuda-events"
    for r in prof.records:
        (fwd_name, fa, fb), (opt_name, oa, ob) = r.phases
        assert (fwd_name, opt_name) == ("forward", "optimizer")
        assert 0.01 <= fb - fa < 0.2
        assert r.data_end <= fa <= fb <= oa <= ob <= r.end + 1e-4


TWO_RANKS = """
import json, sys
import torch, torch.distributed as dist
from torch import nn
from recperf.stalls.run.hook import Profiler

dist.init_process_group("gloo")
rank = dist.get_rank()

def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 600))

plain, timed, windowed = net(), net(), net()
ddp_plain = nn.parallel.DistributedDataParallel(plain, bucket_cap_mb=0.5)
ddp_timed = nn.parallel.DistributedDataParallel(timed, bucket_cap_mb=0.5)
ddp_windowed = nn.parallel.DistributedDataParallel(windowed, bucket_cap_mb=0.5)
prof = Profiler(ddp_timed, cuda=False, comm="hook")
prof_w = Profiler(ddp_windowed, cuda=False)
x = torch.randn(8, 64, generator=torch.Generator().manual_seed(rank))
for _ in range(2):  # DDP settles its buckets after the first iteration
    plain.zero_grad()
    ddp_plain(x).sum().backward()
    for p, m, ddp in ((prof, timed, ddp_timed), (prof_w, windowed, ddp_windowed)):
        for _ in p.data([x]):
            m.zero_grad()
            with p.step():
                ddp(x).sum().backward()
same = [all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), m.parameters()))
        for m in (timed, windowed)]
trace = prof.trace(rank)
comm, window = prof.records[-1].comm, prof_w.records[-1].window
# as recperf.stalls.run.rank ends: both ranks done, then DDP's reducers go before their group
# (a rank that destroyed the group under a live reducer aborted: "terminate called without an
# active exception", exit -6, once in CI)
dist.barrier()
del ddp_plain, ddp_timed, ddp_windowed, prof, prof_w
import gc; gc.collect()
dist.destroy_process_group()
if rank == 0:
    out = {"same": same, "buckets": len(comm), "bytes": sum(n for _, _, n in comm),
           "info": trace["distributedInfo"], "window": [window.nbytes, window.buckets]}
    open(sys.argv[1], "w").write(json.dumps(out))
"""


def test_two_ranks_average_exactly_as_ddp_does(tmp_path: Path) -> None:
    """The hook's 1/world scaling and all-reduce give bit for bit DDP's own averaged
    gradients (2 ranks, different inputs), as do DDP's own with its timers read."""
    script, out = tmp_path / "two.py", tmp_path / "out.json"
    script.write_text(TWO_RANKS)
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")  # fmt: skip
    cmd = [sys.executable, str(script), str(out)]
    procs = [subprocess.Popen(cmd, env=env | {"RANK": str(r)}) for r in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    res = json.loads(out.read_text())
    assert res["same"] == [True, True] and res["buckets"] >= 2
    assert res["bytes"] == 4 * (64 * 512 + 512 + 512 * 600 + 600)
    assert res["window"] == [res["bytes"], res["buckets"]]
    assert res["info"] == {"backend": "gloo", "rank": 0, "world_size": 2}
