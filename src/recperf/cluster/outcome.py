"""What a simulation is configured with and what it returns: engine settings and results."""

from __future__ import annotations

from dataclasses import dataclass

from recperf.cluster.base import F64, I64, Allocation
from recperf.cluster.jobs import JobTable
from recperf.cluster.topology import Cluster
from recperf.core.config import check_range
from recperf.core.errors import ConfigError

NETWORK_MODES = ("on", "off")


@dataclass(kw_only=True, slots=True, frozen=True)
class EngineConfig:
    """How the simulation charges preemption, congestion and when it decides."""

    checkpoint_s: float = 10.0
    """GPUs stay held this long after a preemption while the job checkpoints."""
    restore_s: float = 20.0
    """A resumed job holds its GPUs this long before progressing again."""
    round_s: float = 300.0
    """Preemptions happen at most once per round (as in round-based schedulers); in between,
    waiting jobs only start on free GPUs. 0: preempt at any event."""
    congestion: float = 1.0
    """Extra factor on rack-uplink oversubscription (1 = the cluster's own)."""
    network: str = "on"
    """``off``: every job runs at its consolidated rate wherever it is placed and no link is
    shared (the assumption of round-based simulators such as Gavel); ``on``: the network model."""
    rounds_s: float = 0.0
    """> 0: decisions only at multiples of this many seconds (Gavel's rounds): arrivals wait for
    the next boundary and a finished job's GPUs stay idle until it. 0: decide at every event."""
    record_segments: bool = False
    """Keep every GPU-holding and progress interval (for checks; costs memory)."""

    def __post_init__(self) -> None:
        check_range("checkpoint_s", self.checkpoint_s, 0.0, 86_400.0)
        check_range("restore_s", self.restore_s, 0.0, 86_400.0)
        check_range("round_s", self.round_s, 0.0, 86_400.0)
        check_range("congestion", self.congestion, 1.0, 1_000.0)
        if self.network not in NETWORK_MODES:
            raise ConfigError(f"network = {self.network!r}; allowed: {', '.join(NETWORK_MODES)}")
        check_range("rounds_s", self.rounds_s, 0.0, 86_400.0)

    @property
    def network_on(self) -> bool:
        return self.network == "on"


@dataclass(frozen=True, slots=True)
class Segment:
    """One interval a job held GPUs (``alloc``), or progressed (``iters`` > 0, alloc None)."""

    job: int
    start_s: float
    end_s: float
    alloc: Allocation | None
    iters: float


@dataclass(frozen=True, slots=True)
class SimResult:
    """Per-job outcomes (arrays indexed by job id) and the cluster's busy-GPU step function."""

    jobs: JobTable
    cluster: Cluster
    scheduler: str
    placement: str
    first_start_s: F64
    finish_s: F64
    run_s: F64
    """Time holding GPUs (including checkpoint and restore)."""
    progress_s: F64
    """Time making progress."""
    comm_s: F64
    """Of progress_s, the time spent in communication."""
    locality_wait_s: F64
    """Time a job waited although free GPUs could hold it, because the scheduler allowed it only
    a tighter placement (measured between decision points)."""
    preemptions: I64
    widest_level: I64
    busy_t: F64
    busy_gpus: I64
    """busy_gpus[i] GPUs are held from busy_t[i] until busy_t[i + 1]."""
    events: int
    """Arrivals, finishes and checkpoint completions processed."""
    decisions: int
    """Times the scheduler was consulted."""
    segments: tuple[Segment, ...]
