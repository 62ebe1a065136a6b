"""Stall figures from traces: exposed vs overlapped all-reduce, per-run means, the
differential decomposition and the cross-check, on hand-built traces."""

from __future__ import annotations

from typing import Any

import pytest

from recperf.core.errors import ConfigError
from recperf.stalls.run import differential, ranktrace
from recperf.stalls.run.ddptimers import CommWindow
from recperf.stalls.run.hook import TRACE_FORMAT, IterRecord, Profiler
from recperf.stalls.run.profile import ddp_buckets
from recperf.stalls.run.ranktrace import RunMeta, read_rank_run
from recperf.stalls.run.spec import RunSpec
from recperf.stalls.trace import breakdown, kineto
from recperf.stalls.trace.intervals import length, merge


def _trace(records: list[IterRecord], warmup: int = 0, **meta: Any) -> dict[str, Any]:
    p = Profiler(cuda=False)
    p.records = records
    base = {
        "warmup": warmup,
        "grad_bytes": 100,
        "param_bytes": 100,
        "num_param_tensors": 2,
        "flops_per_iter": 1e6,
        "device_name": "cpu",
        "instrumented": True,
    }
    return p.trace(0, base | meta)


def _rec(
    t: float,
    wait: float,
    step: float,
    comm: list[tuple[float, float]] = (),
    bwd: tuple[float, float] | None = None,
) -> IterRecord:  # type: ignore[assignment]
    r = IterRecord(start=t, data_end=t + wait, end=t + wait + step)
    r.comm = [(t + a, t + b, 10) for a, b in comm]
    if bwd:
        r.phases = [("backward", t + bwd[0], t + bwd[1])]
    return r


def test_busy_time_is_the_union_of_the_spans() -> None:
    assert length(merge([(0, 2), (1, 3), (5, 6)])) == pytest.approx(4.0)
    assert length(merge([])) == 0.0


def test_exposed_is_from_last_launch_to_last_completion() -> None:
    # step 0.1..0.5; buckets (0.2, 0.35) and (0.3, 0.45): last launch 0.3, last done 0.45
    rec = _rec(0.0, 0.1, 0.4, comm=[(0.2, 0.35), (0.3, 0.45)], bwd=(0.15, 0.46))
    it = ranktrace._iterations(_trace([rec]))[0]
    f = ranktrace._iteration_figures(it)
    assert f["data_wait_s"] == pytest.approx(0.1)
    assert f["exposed_comm_s"] == pytest.approx(0.15)
    assert f["comm_busy_s"] == pytest.approx(0.25)
    assert f["overlapped_comm_s"] == pytest.approx(0.10)
    assert f["compute_s"] == pytest.approx(0.4 - 0.15)
    assert f["backward_s"] == pytest.approx(0.31 - 0.15)
    assert f["buckets"] == 2


def test_a_ddp_timers_window_counts_from_its_last_launch_in_both_readers() -> None:
    """One window per iteration (``comm="ddp-timers"``): first launch 0.2, the backward (so
    the last launch) ends 0.3, every bucket done 0.45. Exposed is the tail after the last
    launch, as with per-bucket spans; both readers agree."""
    rec = _rec(0.0, 0.1, 0.4, bwd=(0.15, 0.46))
    rec.window = CommWindow(start=0.2, last_launch=0.3, end=0.45, nbytes=10, buckets=3)
    trace = _trace([rec])
    f = ranktrace._iteration_figures(ranktrace._iterations(trace)[0])
    assert f["exposed_comm_s"] == pytest.approx(0.15)
    assert f["comm_busy_s"] == pytest.approx(0.25)
    assert f["compute_s"] == pytest.approx(0.4 - 0.15)
    assert f["buckets"] == 3
    (k,) = breakdown.iteration_figures(kineto.normalise(trace, "rank0.json", 0))
    assert k.exposed_comm_s == pytest.approx(0.15) and k.compute_s == pytest.approx(0.25)


def test_run_stats_drops_warmup_and_averages_ranks() -> None:
    spec = RunSpec(name="intra", workload="mlp", ranks=2, warmup=1)
    slow = _trace([_rec(0, 0.5, 5.0), _rec(10, 0.1, 1.0), _rec(20, 0.1, 1.2)], warmup=1)
    fast = _trace([_rec(0, 0.5, 5.0), _rec(10, 0.2, 0.8), _rec(20, 0.2, 0.8)], warmup=1)
    s = differential.run_stats(spec, [read_rank_run(slow), read_rank_run(fast)])
    assert s.iteration_s == pytest.approx(((1.1 + 1.3) / 2 + 1.0) / 2)
    assert s.data_wait_s == pytest.approx(0.15)
    assert s.meta.grad_bytes == 100 and s.meta.flops_per_iter == 1e6


def test_not_a_trace_is_rejected() -> None:
    with pytest.raises(ConfigError, match="not a recperf stall trace"):
        ranktrace._iterations({"traceEvents": [], "recperf": {"format": "x"}})
    assert TRACE_FORMAT.startswith("recperf")


def _stats(name: str, it: float, **kw: float) -> differential.RunStats:
    base = {
        "iteration_median_s": it,
        "data_wait_s": 0.0,
        "compute_s": it,
        "backward_s": 0.0,
        "exposed_comm_s": 0.0,
        "overlapped_comm_s": 0.0,
        "comm_busy_s": 0.0,
        "buckets": 0.0,
    }
    return differential.RunStats(
        name=name,
        ranks=2,
        nodes=1,
        iteration_s=it,
        meta=RunMeta(
            grad_bytes=1,
            param_bytes=1,
            num_param_tensors=1,
            flops_per_iter=0.0,
            device_name="cpu",
            instrumented=True,
        ),
        **(base | kw),
    )


def test_differential_decomposes_and_sums_to_iteration() -> None:
    runs = {
        "compute": _stats("compute", 1.0),
        "control": _stats("control", 1.2),
        "intra": _stats("intra", 1.5, exposed_comm_s=0.25),
        "network": _stats("network", 2.5, exposed_comm_s=1.2),
        "warm": _stats("warm", 2.9, data_wait_s=0.4, exposed_comm_s=1.2),
        "cold": _stats("cold", 3.0, data_wait_s=0.5, exposed_comm_s=1.2),
    }
    d = differential.differential(runs)
    assert d.compute_s == pytest.approx(1.2) and d.contention_s == pytest.approx(0.2)
    assert d.interconnect_stall_s == pytest.approx(0.3)
    assert d.network_stall_s == pytest.approx(1.0)
    assert d.data_prep_stall_s == pytest.approx(0.4)
    assert d.data_fetch_stall_s == pytest.approx(0.1)
    assert d.unexplained_s == pytest.approx(0.0)
    assert "run 'network' - run 'intra'" in d.method["network_stall_s"]
    c = differential.cross_check(d, differential.direct(runs))
    assert c["network_stall_s"].direct_s == pytest.approx(0.95)
    assert c["network_stall_s"].rel_diff == pytest.approx(0.05)
    assert c["data_stall_s"].direct_s == pytest.approx(0.5)


def test_differential_without_comm_runs_says_not_measured() -> None:
    d = differential.differential({"compute": _stats("compute", 1.0)})
    assert d.iteration_s == 1.0 and d.network_stall_s == 0.0
    assert d.method["network_stall_s"].startswith("not measured") and not d.measured(
        "network_stall_s"
    )
    # the direct figures leave out what no run measured, in summary.json too
    dirc = differential.direct({"compute": _stats("compute", 1.0)})
    assert dirc.network_stall_s is None and "network_stall_s" not in dirc.to_json()
    assert differential.cross_check(d, dirc) == {}


def test_negative_noise_is_clipped() -> None:
    d = differential.differential({"compute": _stats("compute", 1.0), "warm": _stats("warm", 0.9)})
    assert d.data_prep_stall_s == 0.0
    assert d.unexplained_s == pytest.approx(-0.1)


@pytest.mark.parametrize(
    ("sizes", "buckets"),
    [
        ([4], 1),
        ([1 << 20], 1),
        ([1 << 20, 1], 1),
        ([1, 1 << 20], 2),
        ([30 << 20, 1 << 20, 8], 2),
        ([30 << 20] * 3, 3),
    ],
)
def test_ddp_buckets(sizes: list[int], buckets: int) -> None:
    assert ddp_buckets(sizes) == buckets


def _x(name: str, a: float, b: float, cat: str = "user_annotation", tid: int = 1) -> dict[str, Any]:
    return {"name": name, "ph": "X", "ts": a * 1e6, "dur": (b - a) * 1e6, "cat": cat, "tid": tid}


def _op(name: str, a: float, b: float) -> dict[str, Any]:
    return _x(name, a, b, "cpu_op")


def test_torch_traces_count_the_wait_from_the_launch_op() -> None:
    """Issue 28, one trace path: a torch.profiler trace of a loop run under
    ``Profiler(annotate=True)`` (recperf ranges, no ProfilerStep) read by the Kineto reader. The
    second bucket waits 50 ms for gloo's worker: exposed from its launch op (0.3) to the last
    completion (0.45), not from gloo's start (0.35), which the removed reader counted from."""
    events = [
        _x("recperf:data_wait", 0.0, 0.1),
        _x("recperf:step", 0.1, 0.5),
        _x("recperf:backward", 0.15, 0.46),
        _op("aten::mm", 0.1, 0.2),
        _op("c10d::allreduce_", 0.2, 0.201),
        _op("aten::mm", 0.201, 0.3),
        _op("c10d::allreduce_", 0.3, 0.301),
        _op("aten::add_", 0.46, 0.5),  # the optimizer, once the wait is over
        _x("gloo:all_reduce", 0.21, 0.35, tid=7),
        _x("gloo:all_reduce", 0.35, 0.45, tid=7),
        _x("recperf:data_wait", 0.5, 0.52),
        _x("recperf:step", 0.52, 0.6),
        _op("c10d::broadcast_", 0.525, 0.526),
        _op("aten::mm", 0.526, 0.53),
        _x("gloo:broadcast", 0.53, 0.55, tid=7),
        _op("aten::add_", 0.55, 0.6),
    ]
    trace = kineto.normalise({"traceEvents": events}, "t.json", 0)
    f, g = breakdown.iteration_figures(trace)
    assert f.data_wait_s == pytest.approx(0.1) and f.iteration_s == pytest.approx(0.5)
    assert f.exposed_comm_s == pytest.approx(0.15) and f.allreduces == 2
    assert f.comm_busy_s == pytest.approx(0.24)
    assert f.overlapped_comm_s == pytest.approx(0.09)  # gloo beside the second aten::mm
    assert f.compute_s == pytest.approx(0.5 - 0.1 - 0.15)
    assert f.backward_s == pytest.approx(0.31 - 0.15)
    # a blocking broadcast: the thread idle until it completes (0.526-0.53 is compute)
    assert (g.allreduces, g.collectives) == (0, 1) and g.data_wait_s == pytest.approx(0.02)
    assert g.exposed_comm_s == pytest.approx(0.001 + 0.02)


def test_each_differential_figure_carries_its_interval() -> None:
    """The half-width of a difference of two runs is 1.96 sqrt(se_a^2 + se_b^2); a figure whose
    runs kept no standard error has none, and the report says when an interval reaches 0."""
    from dataclasses import replace

    from recperf.report.stalls_section import resolved

    runs = {
        "compute": replace(_stats("compute", 0.100), iteration_sem_s=0.003),
        "intra": replace(_stats("intra", 0.130), iteration_sem_s=0.004),
        "network": replace(_stats("network", 0.131), iteration_sem_s=None),
    }
    out = differential.differential(runs)
    half = out.half_width_s
    assert half["interconnect_stall_s"] == pytest.approx(1.96 * 0.005)
    assert half["compute_s"] == pytest.approx(1.96 * 0.003)
    assert "network_stall_s" not in half and "iteration_s" not in half
    assert resolved(0.030, half["interconnect_stall_s"]) == "± 9.800"
    assert resolved(0.005, half["interconnect_stall_s"]).endswith("(not told from 0)")
    assert resolved(0.005, None) == "—"
