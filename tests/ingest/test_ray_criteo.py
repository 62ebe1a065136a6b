"""The live pipeline on Ray Data: every row of an epoch exactly once, in the same batches (rows,
order and content) as the native engine, also when a Ray worker is killed mid-epoch. The Ray
tests share the package's Ray instance (``conftest.ray_runtime``)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation
from recperf.ingest.data.criteo import GenerateConfig, generate
from recperf.ingest.live.batch import Batch, PipelineConfig
from recperf.ingest.live.dataset import PipelineDataset, batches
from recperf.ingest.raydata.criteo import CriteoPipeline
from recperf.ingest.raydata.engine import ITEM
from recperf.ingest.raydata.runtime import RayRuntime

pytest.importorskip("ray.data")

ROWS = 3_000
# 250-row batches in chunks of 4 (shuffle windows of 2): 12 batches in 4 read tasks an epoch
CFG = PipelineConfig(batch_size=250, chunk_rows=1_000, shuffle_window=2, seed=1)
Content = dict[int, list[tuple[bytes, float, tuple[int, ...]]]]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for fmt in ("parquet", "tsv"):
        out[fmt] = tmp_path_factory.mktemp(fmt)
        generate(GenerateConfig(rows=ROWS, shards=2, seed=2, format=fmt), out[fmt])
    return out


def native(path: Path, cfg: PipelineConfig) -> list[Batch]:
    return [b.clone() for b in batches(path, cfg, cores=1)]


def layout(got: list[Batch]) -> list[tuple[int, ...]]:
    """Each batch's row ids in order, batches sorted: equal lists mean the same batches."""
    return sorted(tuple(b.row_ids.tolist()) for b in got)


def content(got: list[Batch]) -> Content:
    """Per row id: its dense features, label and sparse ids, once per delivery (sorted)."""
    out: Content = {}
    for b in got:
        n, offs, vals = b.size, b.offsets.numpy(), b.values.numpy()
        for r, rid in enumerate(b.row_ids.tolist()):
            ends = [(offs[f * n + r], offs[f * n + r + 1]) for f in range(26)]
            bags = tuple(int(v) for a, e in ends for v in vals[a:e])
            row = (b.dense[r].numpy().tobytes(), float(b.labels[r]), bags)
            out.setdefault(rid, []).append(row)
    return {k: sorted(v) for k, v in out.items()}


def assert_same(got: list[Batch], want: list[Batch], epochs: int) -> None:
    """The same batches (rows in order) and row contents, each row ``epochs`` times."""
    have = content(got)
    assert {len(v) for v in have.values()} == {epochs}
    assert layout(got) == layout(want)
    assert have == content(want)


def test_segments_run_in_process_give_the_native_batches(data: dict[str, Path]) -> None:
    """No Ray: the source items through CriteoWork segments (fused, and cut at 2 and 4) by
    hand; the rows of every batch are the native engine's, downsampling included."""
    cfg = PipelineConfig(batch_size=250, chunk_rows=1_000, shuffle_window=2, seed=3,
                         downsample_rate=0.5, epochs=2)  # fmt: skip
    want = native(data["tsv"], cfg)
    for segs in (((0, 6),), ((0, 2), (2, 4), (4, 6))):
        pipe = CriteoPipeline(data["tsv"], cfg)
        fns = [w.open() for w in pipe.works(segs)]
        got: list[Batch] = []
        pipe.on_batch = got.append
        for item in range(pipe.items()):
            block = {ITEM: np.array([item])}
            for fn in fns:
                block, times = fn(block)
                assert len(times.cpu_s) == len(times.rows)
            pipe.consume(block)
        assert_same(got, want, 2)


def test_the_ray_engine_is_wired_and_refuses_bad_choices(data: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="expected native or ray"):
        PipelineDataset(data["parquet"], CFG, engine="spark")
    with pytest.raises(ConfigError, match="not available with engine='ray'"):
        PipelineDataset(data["parquet"], CFG, "auto", engine="ray")


@pytest.fixture(scope="module")
def parquet_epoch(data: dict[str, Path], ray_runtime: RayRuntime) -> list[Batch]:
    """One epoch of the Parquet data through one fused operator (a worker per logical CPU)."""
    from recperf.ingest.raydata.dataset import ray_batches

    return list(ray_batches(data["parquet"], CFG, "fused", runtime=ray_runtime))


def test_one_fused_epoch_on_ray_is_the_native_epoch(
    data: dict[str, Path], parquet_epoch: list[Batch]
) -> None:
    assert_same(parquet_epoch, native(data["parquet"], CFG), 1)
    assert sum(b.size for b in parquet_epoch) == ROWS


def test_an_epoch_cut_into_two_operators_is_the_native_epoch(
    data: dict[str, Path], ray_runtime: RayRuntime
) -> None:
    from recperf.ingest.raydata.dataset import ray_batches

    alloc = Allocation(workers=(1, 1), cuts=(3,))  # read+dense+sparse | shuffle+collate
    got = list(ray_batches(data["tsv"], CFG, alloc, runtime=ray_runtime))
    assert_same(got, native(data["tsv"], CFG), 1)
    assert sum(b.size for b in got) == ROWS


def test_a_ray_batch_gives_a_keyed_jagged_tensor(parquet_epoch: list[Batch]) -> None:
    torchrec = pytest.importorskip("torchrec")
    b = parquet_epoch[0]
    kjt = b.kjt()
    assert isinstance(kjt, torchrec.KeyedJaggedTensor)
    assert kjt.keys() == list(b.keys)
    assert kjt.values().numel() == int(b.lengths.sum()) > 0


def _busy_worker(root: int) -> int | None:
    """A Ray Data map actor below process ``root`` (this one: its raylets' workers) that is
    running a block now (Ray titles a worker ``ray::<actor>.<method>`` while it runs one)."""
    parent: dict[int, int] = {}
    title: dict[int, bytes] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parent[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
                title[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0]

    def below(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == root:
                return True
        return False

    for pid, t in title.items():
        if t.startswith(b"ray::MapWorker") and t.endswith(b".submit") and below(pid):
            return pid
    return None


def test_a_worker_killed_mid_block_is_retried_and_rows_arrive_once(
    data: dict[str, Path], ray_runtime: RayRuntime
) -> None:
    from recperf.ingest.raydata.dataset import ray_batches

    # storage latency makes each of the 12 read tasks take ~0.8 s, so blocks are still being
    # made when the first batch arrives; the worker killed is one inside a block
    cfg = PipelineConfig(batch_size=250, chunk_rows=1_000, shuffle_window=2, seed=1, epochs=3,
                         read_latency_ms=200, read_concurrency=1)  # fmt: skip
    it = ray_batches(data["parquet"], cfg, "fused", runtime=ray_runtime)
    got = [next(it)]
    deadline = time.monotonic() + 10
    while (victim := _busy_worker(os.getpid())) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert victim is not None, "no Ray Data worker was running a block"
    os.kill(victim, signal.SIGKILL)
    got += list(it)
    assert_same(got, native(data["parquet"], cfg), 3)
    assert sum(b.size for b in got) == 3 * ROWS
