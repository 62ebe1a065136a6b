"""What one profiled run is (``RunSpec``): the workload, the topology, the data, and whether
ranks communicate; saved as JSON beside the run's traces so a rank process (or ``torchrun``)
can load it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from recperf.core.config import check_range, from_mapping, load_json_object
from recperf.core.errors import ConfigError

DataMode = Literal["synthetic", "real"]
CacheMode = Literal["warm", "cold"]


def data_batches(warmup: int, iters: int) -> int:
    """Real-data batches per rank for a run: every step's batch plus the pipeline's read-ahead."""
    return warmup + iters + 8


@dataclass(kw_only=True, slots=True, frozen=True)
class RunSpec:
    """One run of a differential profile."""

    name: str
    """Run name (compute, control, intra, network, warm, cold, or a user's)."""
    workload: str
    """Registered workload name or ``package.module:attr``."""
    workload_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the workload's factory."""
    ranks: int = 1
    """World size (>= 1)."""
    nodes: int = 1
    """Emulated machines the ranks are spread over (1..ranks, dividing ranks)."""
    bandwidth: str | None = None
    """Per-node link bandwidth between emulated machines (e.g. 1gbit); needed when nodes > 1."""
    data: DataMode = "synthetic"
    """synthetic (in memory) or real (read and prepared from files)."""
    cache: CacheMode = "warm"
    """For real data: files read into the page cache first (warm) or evicted (cold)."""
    comm: bool = True
    """Wrap the model in DDP (False: ranks train alone, the contention control)."""
    instrument: bool = True
    """Direct instrumentation on (False: the plain loop, for overhead measurement)."""
    iters: int = 20
    """Timed iterations (>= 1)."""
    warmup: int = 3
    """Untimed iterations first (>= 0)."""
    batch_size: int = 256
    """Samples per rank per iteration (>= 1)."""
    seed: int = 0
    """Model initialisation and data seed."""
    threads: int = 1
    """torch intra-op threads per rank (>= 1)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """cpu (gloo) or cuda (NCCL, one GPU per rank)."""
    data_dir: str | None = None
    """Where real data lives (required for data = real)."""
    delay_ms: float = 0.0
    """Injected data stall: a sleep in the data iterator per batch (>= 0)."""
    microbench_bytes: tuple[int, ...] = ()
    """All-reduce sizes timed after training (communicating multi-rank runs only)."""
    microbench_reps: int = 5
    """Repetitions per microbenchmark size (>= 1)."""
    torch_trace_iters: int = 0
    """Timed iterations also captured by torch.profiler (torch_rank{R}.json); 0: none."""
    timeout_s: float = 600.0
    """Give up on the run after this long (> 0)."""

    def __post_init__(self) -> None:
        check_range("ranks", self.ranks, 1, None)
        check_range("nodes", self.nodes, 1, self.ranks)
        if self.ranks % self.nodes:
            raise ConfigError(f"ranks = {self.ranks}: must be a multiple of nodes = {self.nodes}")
        if self.nodes > 1 and not self.bandwidth:
            raise ConfigError("bandwidth: required when nodes > 1 (e.g. 1gbit)")
        if self.data not in ("synthetic", "real"):
            raise ConfigError(f"data = {self.data!r}: expected synthetic or real")
        if self.cache not in ("warm", "cold"):
            raise ConfigError(f"cache = {self.cache!r}: expected warm or cold")
        if self.data == "real" and not self.data_dir:
            raise ConfigError("data_dir: required for real data")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device = {self.device!r}: expected cpu or cuda")
        check_range("iters", self.iters, 1, None)
        check_range("warmup", self.warmup, 0, None)
        check_range("batch_size", self.batch_size, 1, None)
        check_range("threads", self.threads, 1, None)
        check_range("delay_ms", self.delay_ms, 0.0, None)
        check_range("microbench_reps", self.microbench_reps, 1, None)
        check_range("torch_trace_iters", self.torch_trace_iters, 0, self.iters)
        check_range("timeout_s", self.timeout_s, 0.0, None, lo_open=True)

    @property
    def data_batches(self) -> int:
        """Batches of real data per rank: enough that no batch is read twice in one run."""
        return data_batches(self.warmup, self.iters)

    def save(self, path: Path) -> Path:
        data = asdict(self)
        data["microbench_bytes"] = list(self.microbench_bytes)
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        return path

    @staticmethod
    def load(path: Path) -> RunSpec:
        """A spec written by ``save``; anything else is one ConfigError naming the file and
        the field."""
        data = load_json_object(path, "a run spec")
        known = {f.name for f in fields(RunSpec)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{path}: unknown field {unknown[0]!r}")
        if not isinstance(data.get("workload_options", {}), dict):
            raise ConfigError(f"{path}: workload_options: expected an object")
        return from_mapping(RunSpec, data, str(path))
