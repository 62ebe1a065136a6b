"""Every registered scheduler, placement policy and loader passes its check; broken ones fail."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from recperf.cluster import api
from recperf.cluster.base import (
    PLACEMENTS,
    SCHEDULERS,
    Allocation,
    Decision,
    SchedulerView,
)
from recperf.cluster.checks import SMALL, check_loader, check_placement, check_scheduler
from recperf.cluster.jobs import JobTable
from recperf.cluster.placement import BestFit, FirstFit
from recperf.cluster.topology import Cluster, Level
from recperf.core.errors import ConfigError, ContractError, RegistryError

TOP = 3  # the widest level of a racks x machines cluster: across racks


@pytest.mark.parametrize("name", SCHEDULERS.names())
def test_registered_scheduler_conforms(name: str) -> None:
    check_scheduler(lambda: SCHEDULERS.build(name))


@pytest.mark.parametrize("name", PLACEMENTS.names())
def test_registered_placement_conforms(name: str) -> None:
    check_placement(PLACEMENTS.build(name))


@pytest.mark.parametrize(
    "options",
    [
        {"order": "las", "timers": "0,0", "lease_s": "0"},
        {"order": "las", "timers": "300,900", "lease_s": "60", "reclaim_after_s": "0"},
        {"timers": "auto", "auto_min_samples": "1", "auto_initial_s": "60,120", "lease_s": "60"},
    ],
    ids=["las-0,0", "las-300,900", "fifo-auto"],
)
def test_netsens_conforms_with_options(options: dict[str, str]) -> None:
    check_scheduler(lambda: api.build_scheduler("netsens", options))


def test_registries_hold_the_built_in_plug_ins() -> None:
    assert {"fifo", "sjf", "srtf", "tiresias", "consolidate", "netsens"} <= set(SCHEDULERS.names())
    assert {"best-fit", "first-fit", "random"} <= set(PLACEMENTS.names())


# ---------------------------------------------------------------- broken schedulers


class _Base:
    name: ClassVar[str] = "broken"
    preemptive: ClassVar[bool] = False

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        pass


class Twice(_Base):
    def schedule(self, view: SchedulerView) -> Decision:
        waiting = view.active[~view.running]
        return Decision(order=np.concatenate([waiting, waiting[:1]]))


class NotActive(_Base):
    def schedule(self, view: SchedulerView) -> Decision:
        return Decision(order=np.append(view.active[~view.running], len(view.jobs) + 5))


class WakesInThePast(_Base):
    def schedule(self, view: SchedulerView) -> Decision:
        return Decision(order=view.active[~view.running], wake_at=view.now - 1.0)


class WakesNow(_Base):
    def schedule(self, view: SchedulerView) -> Decision:
        return Decision(order=view.active[~view.running], wake_at=view.now)


class FloatOrder(_Base):
    def schedule(self, view: SchedulerView) -> Decision:
        return Decision(order=view.active[~view.running].astype(np.float64))


class BadLevels(_Base):
    def schedule(self, view: SchedulerView) -> Decision:
        order = view.active[~view.running]
        return Decision(order=order, max_level=np.full(order.size + 1, 3, dtype=np.int8))


class ReturnsDict(_Base):
    def schedule(self, view: SchedulerView) -> Decision:
        return {"order": view.active}  # type: ignore[return-value]


class NoSchedule:
    name: ClassVar[str] = "no-schedule"
    preemptive: ClassVar[bool] = False

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        pass


class NeverSchedules(_Base):
    def schedule(self, view: SchedulerView) -> Decision:
        return Decision(order=view.active[:0])


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (Twice, "lists a job twice"),
        (NotActive, "names a job that is not active"),
        (WakesInThePast, "is not after now"),
        (WakesNow, "is not after now"),
        (FloatOrder, "must be a 1-D integer array"),
        (BadLevels, "max_level must align with order"),
        (ReturnsDict, "returned dict, not Decision"),
        (NoSchedule, "NoSchedule is no Scheduler: it has no schedule"),
    ],
)
def test_broken_scheduler_is_rejected(broken: type, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        check_scheduler(broken)


def test_scheduler_that_starves_every_job_is_rejected() -> None:
    with pytest.raises(ContractError):
        check_scheduler(NeverSchedules)


# ---------------------------------------------------------------- broken placement policies


class _Placement:
    name: ClassVar[str] = "broken-placement"


class GrantsBusy(_Placement):
    """Ignores ``free``: always machine 0."""

    def place(
        self,
        gpus: int,
        free: np.ndarray,
        cluster: Cluster,
        max_level: Level,
        rng: np.random.Generator,
    ) -> Allocation | None:
        if gpus > cluster.gpus_per_machine:
            return BestFit().place(gpus, free, cluster, max_level, rng)
        return Allocation.of([0], [gpus], cluster)


class Mutates(_Placement):
    def place(
        self,
        gpus: int,
        free: np.ndarray,
        cluster: Cluster,
        max_level: Level,
        rng: np.random.Generator,
    ) -> Allocation | None:
        alloc = BestFit().place(gpus, free, cluster, max_level, rng)
        if alloc is not None:
            free[list(alloc.machines)] -= np.asarray(alloc.counts)
        return alloc


class ShortChanges(_Placement):
    def place(
        self,
        gpus: int,
        free: np.ndarray,
        cluster: Cluster,
        max_level: Level,
        rng: np.random.Generator,
    ) -> Allocation | None:
        alloc = BestFit().place(gpus, free, cluster, max_level, rng)
        if alloc is None or alloc.gpus < 2:
            return alloc
        return Allocation.of(
            list(alloc.machines), [*alloc.counts[:-1], alloc.counts[-1] - 1], cluster
        )


class TooWide(_Placement):
    def place(
        self,
        gpus: int,
        free: np.ndarray,
        cluster: Cluster,
        max_level: Level,
        rng: np.random.Generator,
    ) -> Allocation | None:
        return FirstFit().place(gpus, free, cluster, TOP, rng)


class Refuses(_Placement):
    def place(
        self,
        gpus: int,
        free: np.ndarray,
        cluster: Cluster,
        max_level: Level,
        rng: np.random.Generator,
    ) -> Allocation | None:
        return None


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (GrantsBusy, "granted GPUs that are not free"),
        (Mutates, "modified the free-GPU array"),
        (ShortChanges, "granted a wrong allocation"),
        (TooWide, "exceeded max_level"),
        (Refuses, "refused a job that fits"),
    ],
)
def test_broken_placement_is_rejected(broken: type, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        check_placement(broken())


def _fits_within(gpus: int, free: np.ndarray, cluster: Cluster, level: Level) -> bool:
    if gpus == 1:
        return bool(free.sum() >= 1)
    if level == Level.MACHINE:
        return bool(free.max() >= gpus)
    if level == Level.RACK:
        return bool(free.reshape(cluster.racks, -1).sum(axis=1).max() >= gpus)
    return level == TOP and bool(free.sum() >= gpus)


@pytest.mark.parametrize(
    "name",
    PLACEMENTS.names(),
)
def test_placement_finds_a_fit_within_max_level(name: str) -> None:
    policy = PLACEMENTS.build(name)
    rng = np.random.default_rng(3)
    for _ in range(300):
        free = rng.integers(0, SMALL.gpus_per_machine + 1, size=SMALL.machines).astype(np.int64)
        gpus = int(rng.integers(1, SMALL.gpus_per_rack + 1))
        level = Level(int(rng.integers(1, 3)))
        if _fits_within(gpus, free, SMALL, level):
            alloc = policy.place(gpus, free, SMALL, level, rng)
            assert alloc is not None, (free.tolist(), gpus, level.name)
            assert alloc.level <= level


def test_best_fit_consolidates() -> None:
    # Racks of 2 machines x 4 GPUs; free: rack 0 = [1, 3], rack 1 = [4, 2].
    free = np.array([1, 3, 4, 2], dtype=np.int64)
    rng = np.random.default_rng(0)
    place = BestFit().place
    assert place(2, free, SMALL, TOP, rng) == Allocation((3,), (2,), Level.MACHINE)
    assert place(3, free, SMALL, TOP, rng) == Allocation((1,), (3,), Level.MACHINE)
    assert place(5, free, SMALL, TOP, rng) == Allocation((2, 3), (4, 1), Level.RACK)
    assert place(5, free, SMALL, Level.MACHINE, rng) is None
    assert place(7, free, SMALL, Level.RACK, rng) is None
    alloc = place(7, free, SMALL, TOP, rng)
    assert alloc is not None and alloc.level == TOP and alloc.gpus == 7
    assert alloc.machines[:2] == (2, 3)  # the emptier rack first, its emptiest machine first


# ---------------------------------------------------------------- user plug-ins


class LastComeFirst:
    """A user's scheduler: the newest waiting job first."""

    name: ClassVar[str] = "lcfs"
    preemptive: ClassVar[bool] = False

    def reset(self, jobs: JobTable, cluster: Cluster) -> None:
        self.calls = 0

    def schedule(self, view: SchedulerView) -> Decision:
        self.calls += 1
        return Decision(order=view.active[~view.running][::-1])


class WithOptions(LastComeFirst):
    """A user's scheduler with a Config."""

    from recperf.cluster.schedulers.fifo import FifoConfig as Config

    def __init__(self, config: object | None = None) -> None:
        self.config = config


def test_user_scheduler_by_module_attr() -> None:
    ref = f"{__name__}:LastComeFirst"
    sched = api.build_scheduler(ref)
    assert isinstance(sched, LastComeFirst)
    check_scheduler(lambda: api.build_scheduler(ref))
    res = api.simulate(api.RunSpec(trace="tiresias-60", scheduler=ref))
    assert res.scheduler == "lcfs"
    assert not np.isnan(res.finish_s).any()


def test_user_placement_by_module_attr() -> None:
    ref = f"{__name__}:GrantsBusy"
    assert isinstance(PLACEMENTS.build(ref), GrantsBusy)


def test_scheduler_options_build_its_config() -> None:
    sched = api.build_scheduler(f"{__name__}:WithOptions", {"backfill": "true"})
    assert sched.config.backfill is True  # type: ignore[attr-defined]
    tiresias = api.build_scheduler("tiresias", {"thresholds_gpu_s": "100,200", "min_run_s": "0"})
    assert tiresias.config.thresholds_gpu_s == (100.0, 200.0)  # type: ignore[attr-defined]


def test_scheduler_option_errors() -> None:
    with pytest.raises(ConfigError, match=r"scheduler 'sjf': takes no options \(got backfill\)"):
        api.build_scheduler("sjf", {"backfill": "true"})
    with pytest.raises(
        ConfigError, match=r"scheduler 'fifo': unknown key 'size'; allowed: backfill"
    ):
        api.build_scheduler("fifo", {"size": 3})
    with pytest.raises(
        RegistryError, match=r"unknown scheduler 'lifo'; allowed: consolidate, fifo"
    ):
        api.build_scheduler("lifo")


# ---------------------------------------------------------------- loaders


class _Loader:
    name: ClassVar[str] = "broken-loader"
    default_cluster: ClassVar[str] = "helios"


class Empty(_Loader):
    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable:
        return JobTable.build(
            name=[], model=[], arrival_s=[], gpus=[], total_iters=[], compute_s=[], grad_bytes=[]
        )


class Unseeded(_Loader):
    """Draws from its own generator instead of the one it is given."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng()

    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable:
        return JobTable.build(
            name=["a", "b"], model=["m", "m"], arrival_s=[0.0, 1.0], gpus=[1, 1],
            total_iters=self.rng.uniform(1, 10, 2), compute_s=[1.0, 1.0], grad_bytes=[0.0, 0.0],
        )  # fmt: skip


@pytest.mark.parametrize(
    ("broken", "message"),
    [(Empty, "returned no jobs"), (Unseeded, "column total_iters differs between loads")],
)
def test_broken_loader_is_rejected(broken: type, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        check_loader(broken(), None, SMALL)
