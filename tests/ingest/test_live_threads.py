"""The live pipeline's thread shapes: threads of the consumer's process (T = 0) and processes of
T threads give the batches of the process-only run (same rows in the same order, same bytes),
also across a live resize of W and T and a killed worker; a raising thread stops the run with
its one error; bad thread and in-flight counts are one line; memory counts each shape; storage
requests overlap inside a worker; nothing is left running after close."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from recperf.core.errors import ConfigError, TraceFormatError
from recperf.ingest.base import Allocation, AllocationRefused
from recperf.ingest.data.criteo import GenerateConfig, generate
from recperf.ingest.live import items
from recperf.ingest.live.batch import Batch, PipelineConfig
from recperf.ingest.live.executor import Pipeline
from recperf.ingest.live.target import window_measurement

CFG = PipelineConfig(batch_size=500, shuffle_window=2, chunk_rows=1000, seed=7)
PROCS = Allocation(workers=(1, 1, 1, 1, 1))
SHAPES = {
    "consumer threads": Allocation(workers=(2,), cuts=(), threads=(0,)),
    "2-thread processes": Allocation(workers=(1,), cuts=(), threads=(2,)),
    "threads then processes": Allocation(workers=(2, 1), cuts=(3,), threads=(0, 2)),
    "processes then threads": Allocation(workers=(2, 1, 1), cuts=(1, 3), threads=(1, 0, 0)),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("threads")
    generate(GenerateConfig(rows=9_000, shards=2, seed=5), out)
    return out


def digest(batches: list[Batch]) -> tuple[list[list[int]], str]:
    """Each batch's row ids in order, and one hash of every tensor's bytes in order."""
    h = hashlib.sha256()
    for b in batches:
        for t in (b.dense, b.labels, b.values, b.lengths, b.offsets, b.row_ids):
            h.update(t.numpy().tobytes())
    return [b.row_ids.tolist() for b in batches], h.hexdigest()


def run(data: Path, alloc: Allocation, cfg: PipelineConfig = CFG) -> list[Batch]:
    with Pipeline(data, cfg, allocation=alloc, cores=2, copy=True) as p:
        return list(p)


def our_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("recperf")]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_gives_the_batches_of_the_process_run(data: Path, shape: str) -> None:
    want = digest(run(data, PROCS))
    assert sum(len(r) for r in want[0]) == 9_000
    assert digest(run(data, SHAPES[shape])) == want


def test_tsv_through_consumer_threads_and_thread_processes(tmp_path: Path) -> None:
    generate(GenerateConfig(rows=3_000, shards=2, seed=8, format="tsv"), tmp_path)
    want = digest(run(tmp_path, PROCS))
    for alloc in SHAPES.values():
        assert digest(run(tmp_path, alloc)) == want


def test_live_resizes_of_workers_and_threads_change_no_batch(data: Path) -> None:
    want = digest(run(data, PROCS))
    plan = [
        Allocation(workers=(2,), cuts=(), threads=(0,)),
        Allocation(workers=(1,), cuts=(), threads=(2,)),
        Allocation(workers=(2, 1), cuts=(3,), threads=(0, 2)),
        Allocation(workers=(1, 2), cuts=(3,), threads=(2, 0)),
        Allocation(workers=(3,), cuts=(), threads=(0,)),
        Allocation(workers=(2,), cuts=(), threads=(1,)),
    ]
    batches = []
    with Pipeline(data, CFG, allocation=PROCS, cores=2, copy=True) as p:
        for i, b in enumerate(p):
            batches.append(b)
            if i % 2 == 1 and plan:
                p.resize(plan.pop(0))
                assert settled(p)
    assert not plan
    assert digest(batches) == want


def settled(p: Pipeline, timeout_s: float = 10.0) -> bool:
    """The coordinator has applied the latest resize: each segment has its workers."""
    n = len(p.stage_names)
    want = {"+".join(p.stage_names[a:b]): [max(t, 0)] * w for w, t, (a, b) in zip(
        p.allocation.workers, p.allocation.segment_threads(), p.allocation.segments(n),
        strict=True)}  # fmt: skip
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if p.workers_now() == want:
            return True
        time.sleep(0.01)
    return False


def test_a_killed_thread_process_is_replaced_beside_consumer_threads(data: Path) -> None:
    want = digest(run(data, PROCS))
    alloc = Allocation(workers=(2, 1), cuts=(3,), threads=(0, 2))
    batches = []
    with Pipeline(data, CFG, allocation=alloc, cores=2, copy=True) as p:
        for i, b in enumerate(p):
            batches.append(b)
            if i in (2, 6):
                (pid,) = [x for v in p.worker_pids().values() for x in v]
                os.kill(pid, signal.SIGKILL)
                end = time.monotonic() + 10
                while sum(s.restarts for s in p.snapshot().stages) < (i > 2) + 1:
                    assert time.monotonic() < end, "the kill was not noticed"
                    time.sleep(0.01)
    assert digest(batches) == want


def bad_tsv(tmp_path: Path) -> Path:
    bad = tmp_path / "day_3.tsv"
    good = "\t".join(["1"] + ["2"] * 13 + ["68fd1e64"] * 26)
    broken = "\t".join(["0", "3"] + ["2"] * 12 + ["zz"] + ["68fd1e64"] * 25)
    bad.write_text("\n".join([good] * 2500 + [broken] + [good] * 100) + "\n")
    return bad


@pytest.mark.parametrize("threads", [0, 2])
def test_a_raising_worker_thread_stops_the_run_with_its_one_error(
    tmp_path: Path, threads: int
) -> None:
    cfg = PipelineConfig(batch_size=100, shuffle_window=0, chunk_rows=200, shuffle_splits=False)
    alloc = Allocation(workers=(2,), cuts=(), threads=(threads,))
    seen: list[int] = []
    p = Pipeline(bad_tsv(tmp_path), cfg, allocation=alloc, cores=2)
    with pytest.raises(TraceFormatError) as err, p:
        for b in p:
            seen += b.row_ids.tolist()
    assert err.value.line == 2501 and err.value.field == "C1" and "day_3.tsv" in str(err.value)
    assert len(seen) == len(set(seen)) and seen == sorted(seen)  # in order, none twice
    assert max(seen, default=-1) < 2500
    assert _gone()


def _gone() -> bool:
    """No thread of a pipeline is left (a worker thread ends its task first)."""
    end = time.monotonic() + 5
    while time.monotonic() < end:
        if not our_threads():
            return True
        time.sleep(0.05)
    return False


def test_bad_thread_and_inflight_counts_are_one_line(data: Path) -> None:
    with pytest.raises(ConfigError, match=r"threads of segment 0 = 65: expected 0\.\.64"):
        Allocation(workers=(1,), cuts=(), threads=(65,))
    with pytest.raises(ConfigError, match=r"inflight = 300: expected 1\.\.256"):
        Allocation(workers=(1,), cuts=(), inflight=300)
    bad = Allocation(workers=(1,), cuts=())
    object.__setattr__(bad, "threads", (-1,))  # past the constructor: the pipeline checks too
    line = r"segment 'read\+.*collate' = -1: expected 0\.\.64"
    with pytest.raises(AllocationRefused, match=line):
        Pipeline(data, CFG, allocation=bad)
    worse = Allocation(workers=(1,), cuts=())
    object.__setattr__(worse, "inflight", 999)
    with Pipeline(data, CFG, allocation=PROCS, cores=2) as p:
        with pytest.raises(AllocationRefused, match=r"inflight = 999: expected 1\.\.256"):
            p.resize(worse)
        assert p.allocation == PROCS


def test_memory_counts_processes_threads_and_requests(data: Path) -> None:
    cfg = PipelineConfig(batch_size=500, worker_memory_mib=100, read_latency_ms=10)
    p = Pipeline(data, cfg, allocation=PROCS, cores=2)
    chunk = p.dispatcher.chunk_bytes

    def mem(w: int, t: int, inflight: int = 0) -> float:
        return p.memory_bytes(Allocation(workers=(w,), cuts=(), threads=(t,), inflight=inflight))

    assert mem(2, 1) - mem(2, 0) == pytest.approx(2 * 100 * 2**20 - 2 * chunk, rel=0.01)
    # a process of 4 threads: one process, three more chunks, and a bigger output ring
    assert mem(1, 4) - mem(1, 1) == pytest.approx(3 * chunk + 3 * p.dispatcher.chunk_bytes)
    # 60 more requests' raw bytes, and output room for the tasks the worker holds ahead
    d = p.dispatcher

    def ahead(inflight: int) -> int:
        return d.read_ahead(Allocation(workers=(1,), cuts=(), inflight=inflight))

    assert ahead(64) > ahead(4)
    assert mem(1, 1, inflight=64) - mem(1, 1, inflight=4) == (
        60 * d.slot_bytes + (ahead(64) - ahead(4)) * chunk
    )
    p.close()


def test_storage_requests_overlap_inside_one_consumer_thread(data: Path) -> None:
    cfg = PipelineConfig(batch_size=200, read_latency_ms=40.0, shuffle_window=0, chunk_rows=800,
                         epochs=None, read_concurrency=1)  # fmt: skip

    def rows_per_s(inflight: int) -> float:
        alloc = Allocation(workers=(1,), cuts=(), threads=(0,), inflight=inflight)
        with Pipeline(data, cfg, allocation=alloc, cores=2) as p:
            it = iter(p)
            next(it)
            t, rows = time.monotonic(), 0
            while time.monotonic() - t < 1.5:
                rows += next(it).size
            return rows / (time.monotonic() - t)

    one, many = rows_per_s(1), rows_per_s(16)
    assert one < 5_300  # one request of 40 ms per 200-row batch: at most 5,000 rows/s
    assert many > 3 * one


def test_a_window_with_consumer_threads_estimates_their_gil(data: Path) -> None:
    cfg = PipelineConfig(batch_size=500, epochs=None, shuffle_window=0)
    alloc = Allocation(workers=(2, 1), cuts=(3,), threads=(0, 1))
    with Pipeline(data, cfg, allocation=alloc, cores=2) as p:
        it = iter(p)
        for _ in range(20):
            next(it)
        a = p.snapshot()
        t = time.monotonic()
        while time.monotonic() - t < 1.0:
            next(it)
        b = p.snapshot()
        prefix = p._prefix
    m = window_measurement(a, b, alloc)
    assert len(m.stage_wall_s) == 4 and all(w > 0 for w in m.stage_wall_s)
    assert m.gil_frac[3] != m.gil_frac[3], "one single-threaded process ran collate: NaN"
    for g in m.gil_frac[:3]:  # NaN if the two threads were not both busy in this window
        assert g != g or 0.0 <= g <= 1.0
    assert not list(items.SHM_DIR.glob(f"{prefix}-*"))
    assert _gone()


def test_a_failed_hand_off_from_consumer_threads_to_a_process_stops_the_run(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recperf.core.errors import RecperfError

    def full(*args: object, **kwargs: object) -> None:
        raise RecperfError("/dev/shm is full (test)")

    monkeypatch.setattr(items, "write_item", full)
    alloc = Allocation(workers=(2, 1), cuts=(3,), threads=(0, 1))
    with pytest.raises(RecperfError, match="is full"), Pipeline(data, CFG, allocation=alloc) as p:
        for _ in p:
            pass
    assert _gone()
