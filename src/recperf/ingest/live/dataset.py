"""Drop-in use of the live pipeline from a training loop: a ``torch.utils.data.IterableDataset``
(wrap it in ``DataLoader(ds, batch_size=None)`` or iterate it directly) and a plain iterator.

    for batch in recperf.ingest.batches("data/criteo", PipelineConfig(batch_size=4096)):
        loss = model(batch.dense, batch.kjt(), batch.labels)   # instead of: for batch in loader

Batches from worker processes are views into the pipeline's shared-memory ring; a slot is reused
once its Batch is dropped. ``copy=True`` gives batches that own their memory (about 0.05 µs per
row more); batches made by threads of the consumer's process (an allocation's threads = 0)
always own theirs.

``engine="ray"`` runs the same stages as Ray Data operators (``raydata.dataset.ray_batches``:
a local Ray instance of ``cores`` logical CPUs, shut down when the iteration ends); its batches
own their memory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from torch.utils.data import IterableDataset, get_worker_info

from recperf.core.errors import ConfigError
from recperf.ingest.base import Allocation, check_cores
from recperf.ingest.live.batch import Batch, PipelineConfig
from recperf.ingest.live.executor import Pipeline

ENGINES = ("native", "ray")


class PipelineDataset(IterableDataset[Batch]):
    """Each ``iter()`` starts a pipeline over ``data`` (its own workers) and closes it
    when the iteration ends or is abandoned. ``allocation``: ``fused`` (one segment, a worker
    per core; the default), ``even``, ``auto`` (a short live tuning first, ``tune_s`` seconds
    with ``tuner``) or an Allocation. ``engine``: ``native`` (recperf's own workers) or ``ray``
    (Ray Data; fused, even or an Allocation)."""

    def __init__(
        self,
        data: str | Path,
        config: PipelineConfig | None = None,
        allocation: Allocation | str = "fused",
        *,
        cores: int | None = None,
        copy: bool = False,
        tuner: str = "plumber",
        tune_s: float = 8.0,
        engine: str = "native",
    ) -> None:
        if engine not in ENGINES:
            raise ConfigError(f"engine = {engine!r}: expected {' or '.join(ENGINES)}")
        if engine == "ray" and allocation == "auto":
            raise ConfigError("allocation = 'auto' is not available with engine='ray' yet: "
                              "give fused, even or an Allocation")  # fmt: skip
        if isinstance(allocation, str) and allocation not in ("fused", "even", "auto"):
            raise ConfigError(f"allocation = {allocation!r}: expected fused, even, auto or an "
                              "Allocation")  # fmt: skip
        check_cores(cores)
        self.data = data
        self.config = config or PipelineConfig()
        self.allocation = allocation
        self.cores = cores
        self.copy = copy
        self.tuner = tuner
        self.tune_s = tune_s
        self.engine = engine

    def __iter__(self) -> Iterator[Batch]:
        if get_worker_info() is not None:
            raise ConfigError(
                "PipelineDataset runs its own worker processes: use DataLoader(dataset, "
                "batch_size=None, num_workers=0)"
            )
        alloc = self.allocation
        if self.engine == "ray":
            yield from _ray(self.data, self.config, alloc, self.cores)
            return
        if alloc == "auto":
            from recperf.ingest.api import auto_allocation

            alloc = auto_allocation(self.data, self.config, self.tuner, self.tune_s, self.cores)
        with Pipeline(self.data, self.config, alloc, self.cores, copy=self.copy) as p:
            yield from p


def batches(
    data: str | Path,
    config: PipelineConfig | None = None,
    allocation: Allocation | str = "fused",
    *,
    cores: int | None = None,
    copy: bool = False,
    engine: str = "native",
) -> Iterator[Batch]:
    """The pipeline's batches as a plain iterator (closed when exhausted or garbage-collected)."""
    ds = PipelineDataset(data, config, allocation, cores=cores, copy=copy, engine=engine)
    return iter(ds)


def _ray(
    data: str | Path, config: PipelineConfig, alloc: Allocation | str, cores: int | None
) -> Iterator[Batch]:
    """Ray Data's batches: a local Ray instance of ``cores`` logical CPUs (all: None)."""
    from recperf.ingest.raydata.dataset import ray_batches
    from recperf.ingest.raydata.runtime import ClusterSpec

    return ray_batches(data, config, alloc, cluster=ClusterSpec(cpus_per_node=cores))
