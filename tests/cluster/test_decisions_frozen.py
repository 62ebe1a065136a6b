"""Every scheduling decision, frozen: a digest of each run's per-job outcomes on the bundled
traces, recorded before the engine's hot paths were optimised. A change to the loop, the
bookkeeping or a scheduler that moves any job's start, finish or progress by one bit fails here.

Regenerate (only for an intended change of behaviour) with
``PYTHONPATH=src python tests/cluster/test_decisions_frozen.py``.
"""

from __future__ import annotations

import hashlib
from functools import cache

import numpy as np
import pytest

from recperf.cluster import api
from recperf.cluster.jobs import JobTable
from recperf.cluster.outcome import EngineConfig, SimResult
from recperf.cluster.topology import Cluster, load_cluster
from recperf.cluster.traces.synthetic import SyntheticConfig, SyntheticTrace

SCHEDULERS = ("fifo", "sjf", "srtf", "tiresias", "consolidate", "netsens")
TRACES = ("tiresias-480", "tiresias-60", "helios-500", "synthetic-2000", "philly-1000")
PER_JOB = (
    "first_start_s",
    "finish_s",
    "run_s",
    "progress_s",
    "comm_s",
    "locality_wait_s",
    "preemptions",
    "widest_level",
)


@cache
def loaded(trace: str) -> tuple[JobTable, Cluster]:
    """The trace's jobs and cluster; the synthetic one and the Philly slice are loaded enough
    (on 128 GPUs) that jobs queue, preempt and wait for locality."""
    small = Cluster(name="small-128", racks=4, machines_per_rack=4, gpus_per_machine=8)
    small = small.with_(oversubscription=2.0)
    if trace == "synthetic-2000":
        cfg = SyntheticConfig(jobs=2000, load=0.9)
        return SyntheticTrace(cfg).load(None, small, np.random.default_rng(0)), small
    if trace == "philly-1000":
        jobs, _ = api.load_jobs(api.RunSpec(trace="philly"))
        return jobs.subset(np.arange(1000)), load_cluster("philly-third").with_(racks=2)
    return api.load_jobs(api.RunSpec(trace=trace))


def run(trace: str, scheduler: str, congestion: float, **spec: object) -> SimResult:
    engine = EngineConfig(
        congestion=congestion,
        round_s=float(spec.pop("round_s", 300.0)),
        rounds_s=float(spec.pop("rounds_s", 0.0)),
        network=str(spec.pop("network", "on")),
    )
    rs = api.RunSpec(trace="synthetic", scheduler=scheduler, engine=engine, **spec)
    return api.simulate(rs, loaded=loaded(trace))


def digest(res: SimResult) -> str:
    """SHA-256 over the exact bytes of every per-job outcome and the busy-GPU step function."""
    h = hashlib.sha256()
    for name in PER_JOB:
        arr = np.ascontiguousarray(getattr(res, name))
        h.update(name.encode() + arr.dtype.str.encode() + arr.tobytes())
    h.update(np.ascontiguousarray(res.busy_t).tobytes())
    h.update(np.ascontiguousarray(res.busy_gpus).tobytes())
    return h.hexdigest()[:16]


CASES: list[tuple[str, str, float, dict[str, object]]] = [
    (t, s, c, {}) for t in TRACES for s in SCHEDULERS for c in (1.0, 4.0)
] + [
    ("tiresias-480", "fifo", 1.0, {"placement": "random", "seed": 3}),
    ("tiresias-480", "tiresias", 1.0, {"placement": "random", "seed": 3}),
    ("helios-500", "fifo", 1.0, {"placement": "first-fit"}),
    ("helios-500", "tiresias", 1.0, {"placement": "first-fit"}),
    ("tiresias-480", "tiresias", 1.0, {"round_s": 0.0}),
    ("synthetic-2000", "fifo", 1.0, {"scheduler_options": {"backfill": True}}),
    ("synthetic-2000", "netsens", 1.0, {"scheduler_options": {"order": "las"}}),
    ("helios-500", "tiresias", 1.0, {"rounds_s": 360.0, "network": "off"}),
    ("philly-1000", "fifo", 1.0, {"rounds_s": 360.0}),
]


def case_id(case: tuple[str, str, float, dict[str, object]]) -> str:
    trace, scheduler, congestion, extra = case
    flat = {**extra, **dict(extra.get("scheduler_options", {}))}  # type: ignore[call-overload]
    flat.pop("scheduler_options", None)
    more = "".join(f"-{k}={v}" for k, v in sorted(flat.items()))
    return f"{trace}-{scheduler}-c{congestion:g}{more}"


# Digests of the code before the hot paths were optimised (main at 7a1c9ad and at d14a83f give
# the same; the rounds_s and network cases exist from d14a83f on). The synthetic-2000 ones were
# re-recorded once when the generator's draws became exact (recperf.core.exact, issue 24): they
# are the same with and without the CPU's SIMD features (tests/core/test_exact.py).
FROZEN: dict[str, tuple[str, int, int]] = {  # id: (digest, events, decisions)
    "tiresias-480-fifo-c1": ("02a706bc355c95c9", 960, 542),
    "tiresias-480-fifo-c4": ("02a706bc355c95c9", 960, 542),
    "tiresias-480-sjf-c1": ("6befe71c8af0265b", 960, 546),
    "tiresias-480-sjf-c4": ("6befe71c8af0265b", 960, 546),
    "tiresias-480-srtf-c1": ("88f2bd6d46d1c2e8", 973, 561),
    "tiresias-480-srtf-c4": ("88f2bd6d46d1c2e8", 973, 561),
    "tiresias-480-tiresias-c1": ("642443b2003301c2", 970, 612),
    "tiresias-480-tiresias-c4": ("642443b2003301c2", 970, 612),
    "tiresias-480-consolidate-c1": ("3c5936f70e8dee8c", 960, 551),
    "tiresias-480-consolidate-c4": ("3c5936f70e8dee8c", 960, 551),
    "tiresias-480-netsens-c1": ("3c5936f70e8dee8c", 960, 569),
    "tiresias-480-netsens-c4": ("3c5936f70e8dee8c", 960, 569),
    "tiresias-60-fifo-c1": ("97212dc824694227", 120, 60),
    "tiresias-60-fifo-c4": ("97212dc824694227", 120, 60),
    "tiresias-60-sjf-c1": ("97212dc824694227", 120, 60),
    "tiresias-60-sjf-c4": ("97212dc824694227", 120, 60),
    "tiresias-60-srtf-c1": ("97212dc824694227", 120, 60),
    "tiresias-60-srtf-c4": ("97212dc824694227", 120, 60),
    "tiresias-60-tiresias-c1": ("97212dc824694227", 120, 60),
    "tiresias-60-tiresias-c4": ("97212dc824694227", 120, 60),
    "tiresias-60-consolidate-c1": ("97212dc824694227", 120, 60),
    "tiresias-60-consolidate-c4": ("97212dc824694227", 120, 60),
    "tiresias-60-netsens-c1": ("97212dc824694227", 120, 60),
    "tiresias-60-netsens-c4": ("97212dc824694227", 120, 60),
    "helios-500-fifo-c1": ("fd725fba8c57a717", 1000, 841),
    "helios-500-fifo-c4": ("cfc534af72094d31", 1000, 843),
    "helios-500-sjf-c1": ("21b33fd618a0ef0a", 1000, 797),
    "helios-500-sjf-c4": ("2785d13e347be271", 1000, 820),
    "helios-500-srtf-c1": ("f5cdabfe646bf11a", 1243, 1211),
    "helios-500-srtf-c4": ("9fd6caa640f5c160", 1512, 1608),
    "helios-500-tiresias-c1": ("5ce9093f26b36278", 5765, 8925),
    "helios-500-tiresias-c4": ("7cb0637a9dcf2be9", 7115, 11571),
    "helios-500-consolidate-c1": ("71ad61f9208ea8b4", 1000, 875),
    "helios-500-consolidate-c4": ("dc0c746501381d34", 1000, 870),
    "helios-500-netsens-c1": ("0130032ca64a919f", 1089, 1405),
    "helios-500-netsens-c4": ("561e57dbb03f6283", 1046, 1360),
    "synthetic-2000-fifo-c1": ("3a6d12f2d57d4db6", 4000, 3173),
    "synthetic-2000-fifo-c4": ("8012d45de056027f", 4000, 3137),
    "synthetic-2000-sjf-c1": ("a70df1f55b047dbd", 4000, 2920),
    "synthetic-2000-sjf-c4": ("808366ddc3f78c3d", 4000, 2572),
    "synthetic-2000-srtf-c1": ("60b9694b086222eb", 5905, 3062),
    "synthetic-2000-srtf-c4": ("487cb75215000a14", 5513, 3124),
    "synthetic-2000-tiresias-c1": ("59a69b05ce304c36", 4622, 5710),
    "synthetic-2000-tiresias-c4": ("7de0d36d9c02550e", 6196, 4280),
    "synthetic-2000-consolidate-c1": ("8f417d76887ad09c", 4000, 2771),
    "synthetic-2000-consolidate-c4": ("8f417d76887ad09c", 4000, 2771),
    "synthetic-2000-netsens-c1": ("8076340c951b29ab", 4045, 3494),
    "synthetic-2000-netsens-c4": ("1dcdd5647e9ce88f", 4043, 3468),
    "philly-1000-fifo-c1": ("cec44ffdddd4f4fa", 2000, 1776),
    "philly-1000-fifo-c4": ("0d943e6919c9cd48", 2000, 1770),
    "philly-1000-sjf-c1": ("14e0806b8124429b", 2000, 1121),
    "philly-1000-sjf-c4": ("9d76dd000bf2db3d", 2000, 1120),
    "philly-1000-srtf-c1": ("4058c4ed66aea7e1", 2978, 2262),
    "philly-1000-srtf-c4": ("c914bf31a9693826", 2840, 2218),
    "philly-1000-tiresias-c1": ("d2cb42ccd8283fe6", 20969, 19712),
    "philly-1000-tiresias-c4": ("e7f820f93287b767", 21610, 20816),
    "philly-1000-consolidate-c1": ("2f3e941a24426e9f", 2000, 1126),
    "philly-1000-consolidate-c4": ("2f3e941a24426e9f", 2000, 1126),
    "philly-1000-netsens-c1": ("8ae12d8850f6b465", 2100, 2365),
    "philly-1000-netsens-c4": ("8ef33c98465b6808", 2128, 2342),
    "tiresias-480-fifo-c1-placement=random-seed=3": ("8b892d9690b828ef", 960, 549),
    "tiresias-480-tiresias-c1-placement=random-seed=3": ("ccebfe3d0152f84b", 971, 627),
    "helios-500-fifo-c1-placement=first-fit": ("f9a82f1fd7fdf08e", 1000, 858),
    "helios-500-tiresias-c1-placement=first-fit": ("9906dd887765707f", 6569, 10608),
    "tiresias-480-tiresias-c1-round_s=0.0": ("fb01582380b8feeb", 1007, 658),
    "synthetic-2000-fifo-c1-backfill=True": ("ae11edfcbb7b9b81", 4000, 2272),
    "synthetic-2000-netsens-c1-order=las": ("e2f440061605fe79", 4417, 4259),
    "helios-500-tiresias-c1-network=off-rounds_s=360.0": ("bcff2b04162584a6", 3888, 6363),
    "philly-1000-fifo-c1-rounds_s=360.0": ("04dd3c723b0dd31b", 2000, 1206),
}


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_decisions_are_unchanged(case: tuple[str, str, float, dict[str, object]]) -> None:
    trace, scheduler, congestion, extra = case
    res = run(trace, scheduler, congestion, **dict(extra))
    assert not np.isnan(res.finish_s).any()
    assert (digest(res), res.events, res.decisions) == FROZEN[case_id(case)]


if __name__ == "__main__":
    for case in CASES:
        res = run(case[0], case[1], case[2], **dict(case[3]))
        print(f'    "{case_id(case)}": ("{digest(res)}", {res.events}, {res.decisions}),')
