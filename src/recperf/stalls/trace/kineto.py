"""Reads torch.profiler (Kineto) Chrome traces as any training script writes them, one file per
rank (``.json`` or gzipped), CPU (gloo) or GPU (NCCL), and recperf's own rank traces, into
``breakdown.RankTrace``; ``analyze_paths`` turns them into the ``StallSummary``.

    summary = analyze_paths(find_traces([Path("traces/")]), ranks_per_node=8, skip_steps=1)

Finding and reading the files is ``files``'s (``find_traces`` is here too, for that example).
"""

from __future__ import annotations

import bisect
import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.stalls.result import StallSummary
from recperf.stalls.trace.breakdown import Comm, RankTrace, Step, iteration_figures, summarise
from recperf.stalls.trace.check import Span, check_one_run, check_order, check_ranks
from recperf.stalls.trace.files import find_traces, read_trace
from recperf.stalls.trace.intervals import merge, subtract

__all__ = ["analyze_paths", "find_traces", "load_rank_traces", "normalise", "read_trace"]

STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
COMM_KERNEL_RE = re.compile(r"^nccl|ncclKernel|ncclDevKernel|^hccl")
MEMORY_KERNEL_RE = re.compile(r"^(hip)?(Memcpy|Memset)|^dma")
COMM_OP_PREFIXES = ("c10d::", "record_param_comms", "gloo:", "nccl:")
DTYPE_BYTES = {"float": 4, "int": 4, "double": 8, "long": 8, "half": 2, "bfloat16": 2,
               "short": 2, "char": 1, "byte": 1, "bool": 1, "int8": 1, "uint8": 1,
               "float8": 1, "complexfloat": 8, "complexdouble": 16}  # fmt: skip
V1_NAMES = ("data_wait", "step", "allreduce")


def _events(doc: Mapping[str, Any], source: str) -> list[dict[str, Any]]:
    """The complete (``ph: X``) events as new dicts: name, cat, pid, tid, args, ts and end in
    seconds, and their index in ``traceEvents``, each checked (one ConfigError naming the event
    and the field; a negative duration is one)."""
    out = []
    for i, ev in enumerate(doc["traceEvents"]):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        ts, dur, name, args = ev.get("ts"), ev.get("dur"), ev.get("name"), ev.get("args")
        if not (_finite(ts) and _finite(dur)):
            key, v = ("dur", dur) if _finite(ts) else ("ts", ts)
            raise ConfigError(f"{source}: traceEvents[{i}].{key} = {v!r}: expected a number")
        if type(name) is not str:
            raise ConfigError(f"{source}: traceEvents[{i}].name = {name!r}: expected a string")
        if dur < 0:
            raise ConfigError(f"{source}: traceEvents[{i}] ({name}).dur = {dur!r}: negative")
        out.append({"name": name, "cat": ev.get("cat"), "pid": ev.get("pid"),
                    "tid": ev.get("tid"), "ts": ts / 1e6, "end": (ts + dur) / 1e6,
                    "args": args if type(args) is dict else {}, "index": i})  # fmt: skip
    return out


def _finite(v: Any) -> TypeGuard[float]:
    """A finite int or float (not a bool: ``type`` is exact); NaN - NaN is NaN, inf - inf too."""
    return type(v) in (int, float) and v - v == 0


def _kind(name: str) -> str:
    """allreduce, broadcast, allgatherbase, ... from any recorded collective name."""
    if "Kernel_" in name:
        name = name.split("Kernel_", 1)[1].split("_")[0]
    return re.sub(r"[^a-z]", "", name.split(":")[-1].lower())


def _dtype_bytes(dtype: Any) -> int | None:
    key = re.sub(r"^(c10::|at::)|[^a-z0-9:]", "", str(dtype).lower()).replace("c10::", "")
    key = {"signedchar": "char", "unsignedchar": "byte", "longint": "long"}.get(key, key)
    return DTYPE_BYTES.get(key)


def _msg_bytes(args: Mapping[str, Any]) -> int | None:
    """Message bytes from record_param_comms / kernel args, or record_shapes' first input."""
    if isinstance(args.get("In msg nelems"), int | float) and "dtype" in args:
        size = _dtype_bytes(args["dtype"])
        return None if size is None else int(args["In msg nelems"]) * size
    dims, types = args.get("Input Dims"), args.get("Input type")
    if isinstance(dims, list) and isinstance(types, list) and dims and types:
        shape = dims[0]
        while isinstance(shape, list) and shape and isinstance(shape[0], list):
            shape = shape[0]  # TensorList: the first tensor
        size = _dtype_bytes(types[0])
        if isinstance(shape, list) and shape and size is not None:
            return math.prod(int(d) for d in shape) * size
    return None


def _host(doc: Mapping[str, Any], meta: Mapping[str, Any]) -> str | None:
    di = _obj(doc, "distributedInfo")
    for v in (doc.get("host_name"), di.get("host_name"), di.get("hostname"), meta.get("host")):
        if isinstance(v, str) and v:
            return v
    return None


def _obj(doc: Mapping[str, Any], key: str) -> dict[str, Any]:
    v = doc.get(key)
    return v if isinstance(v, dict) else {}


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def normalise(doc: Mapping[str, Any], source: str, order: int) -> RankTrace:
    """One loaded trace as a RankTrace (``order``: its rank when the trace names none)."""
    meta = _obj(doc, "recperf")
    di: dict[str, Any] = _obj(doc, "distributedInfo")
    events = _events(doc, source)
    rank = _int_or_none(di.get("rank"))
    rank = rank if rank is not None else _int_or_none(meta.get("rank"))
    world = _int_or_none(di.get("world_size")) or _int_or_none(meta.get("world"))
    kernels = [e for e in events if e.get("cat") == "kernel"]
    backend = str(di.get("backend") or ("nccl" if kernels else _meta_backend(meta)))
    gpu_kernels: list[tuple[float, float, float]] = []
    if str(meta.get("format", "")).endswith("/1"):
        steps, data, comm, compute, ops = _v1(events, source)
    else:
        steps, main = _steps(events, source)
        data = merge((e["ts"], e["end"]) for e in events if _is_data(e["name"]))
        if kernels:
            comm, gpu_kernels = _gpu(events, kernels)
            compute, ops = merge((a, b) for _, a, b in gpu_kernels), True
        elif backend == "nccl" and any(e["name"].startswith("nccl:") for e in events):
            raise ConfigError(
                f"{source}: an NCCL trace without GPU kernels: record it with "
                "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]"
            )
        else:
            comm = _cpu_comm(events, main)
            compute, ops = _cpu_compute(events, main)
    warmup = _int_or_none(meta.get("warmup")) or 0
    props = doc.get("deviceProperties")
    gpu_name = (
        props[0].get("name")
        if isinstance(props, list) and props and isinstance(props[0], dict)
        else None
    )
    device_name = str(meta.get("device_name") or gpu_name or ("cuda" if kernels else "cpu"))
    return RankTrace(
        source=source,
        rank=order if rank is None else rank,
        world_size=world,
        backend=backend,
        host=_host(doc, meta),
        device="cuda" if kernels or meta.get("clock") == "cuda-events" else "cpu",
        device_name=device_name,
        steps=[st for st in steps if st.index >= warmup],
        data=data,
        comm=comm,
        compute=compute,
        ops_recorded=ops,
        kernels=gpu_kernels,
        meta=dict(meta),
        epoch_s=_epoch_s(doc, meta),
        run_id=_run_id(di, meta),
    )


def _epoch_s(doc: Mapping[str, Any], meta: Mapping[str, Any]) -> float | None:
    """Seconds to add to the trace's times for Unix time: recperf's ``t0_unix_ns``, Kineto's
    ``baseTimeNanoseconds``, or 0 when the times are already Unix microseconds (after 2001)."""
    for base in (
        _int_or_none(meta.get("t0_unix_ns")),
        _int_or_none(doc.get("baseTimeNanoseconds")),
    ):
        if base is not None:
            return base / 1e9
    if meta:
        return None  # an older recperf trace: times from its first record, anchor unknown
    return 0.0 if _first_ts(doc) > 1e15 else None


def _first_ts(doc: Mapping[str, Any]) -> float:
    for ev in doc["traceEvents"]:
        if isinstance(ev, dict) and ev.get("ph") == "X" and _finite(ev.get("ts")):
            return float(ev["ts"])
    return 0.0


def _run_id(di: Mapping[str, Any], meta: Mapping[str, Any]) -> str | None:
    """recperf's run name, or Kineto's process groups (name and size of each)."""
    if isinstance(meta.get("run"), str):
        return f"run {meta['run']!r}"
    groups = di.get("pg_config")
    if isinstance(groups, list) and all(isinstance(g, dict) for g in groups) and groups:
        return "process groups " + ", ".join(
            f"{g.get('pg_name')}:{g.get('pg_size')}" for g in groups
        )
    return None


def _meta_backend(meta: Mapping[str, Any]) -> str:
    """What a recperf trace's metadata implies: NCCL on CUDA clocks, else gloo (one rank: none)."""
    if not meta or (_int_or_none(meta.get("world")) or 1) < 2:
        return "unknown"
    return "nccl" if meta.get("clock") == "cuda-events" else "gloo"


def _is_data(name: str) -> bool:
    return name == "recperf:data_wait" or ("DataLoader" in name and name.endswith("__next__"))


def _steps(events: list[dict[str, Any]], source: str) -> tuple[list[Step], tuple[Any, Any]]:
    """The iterations and the critical thread's (pid, tid)."""
    marks = [(e, m) for e in events if (m := STEP_RE.match(e["name"]))]
    if marks:
        lanes: dict[tuple[Any, Any], int] = defaultdict(int)
        for e, _ in marks:
            lanes[(e.get("pid"), e.get("tid"))] += 1
        main = max(lanes, key=lambda k: lanes[k])
        spans = sorted(Span(e["ts"], e["end"], int(m.group(1)), e["index"], e["name"])
                       for e, m in marks if (e.get("pid"), e.get("tid")) == main)  # fmt: skip
    else:
        waits = sorted((e["ts"], e["end"]) for e in events if e["name"] == "recperf:data_wait")
        steps = [e for e in events if e["name"] == "recperf:step"]
        if not steps:
            raise ConfigError(
                f"{source}: no ProfilerStep#N spans (record with "
                "torch.profiler.profile(schedule=...) and call prof.step() every "
                "iteration) and no recperf:step ranges"
            )
        main = (steps[0].get("pid"), steps[0].get("tid"))
        spans = []
        for k, e in enumerate(sorted(steps, key=lambda e: e["ts"])):
            i = bisect.bisect_right(waits, (e["ts"], math.inf)) - 1
            start = waits[i][0] if i >= 0 else e["ts"]
            spans.append(Span(start, e["end"], k, e["index"], e["name"]))
    check_order(spans, source)
    phases = [
        (e["name"].removeprefix("recperf:"), e["ts"], e["end"])
        for e in events
        if e["name"] in ("recperf:forward", "recperf:backward", "recperf:optimizer")
    ]
    flop_ev = [(e["ts"], float(e["args"]["flops"])) for e in events
               if isinstance(e["args"].get("flops"), int | float)]  # fmt: skip
    out = []
    for span in spans:
        a, b = span.start, span.end
        ph = {name: (s, t) for name, s, t in phases if a <= s < b}
        flops = sum(f for t, f in flop_ev if a <= t < b) if flop_ev else None
        out.append(Step(index=span.number, start=a, end=b, phases=ph, flops=flops))
    return out, main


def _gpu(
    events: list[dict[str, Any]], kernels: list[dict[str, Any]]
) -> tuple[list[Comm], list[tuple[float, float, float]]]:
    """NCCL kernels, placed at their launch (matched by correlation), with message bytes from
    their args or from the CPU-side collective range around the launch; and the compute
    kernels (not NCCL, memcpy or memset) as (launch, start, end)."""
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e["args"]
    }
    ranges = _size_ranges(events)
    out, compute = [], []
    for k in kernels:
        launch = launches.get(k["args"].get("correlation"))
        at = launch["ts"] if launch is not None else k["ts"]
        if not COMM_KERNEL_RE.search(k["name"]):
            if not MEMORY_KERNEL_RE.search(k["name"]):
                compute.append((at, k["ts"], k["end"]))
            continue
        nbytes = _msg_bytes(k["args"])
        if nbytes is None and launch is not None:
            nbytes = _enclosing_bytes(ranges, (launch.get("pid"), launch.get("tid")), at)
        kind = str(k["args"].get("Collective name") or _kind(k["name"]))
        out.append(Comm(start=k["ts"], end=k["end"], launch=at, kind=_kind(kind), nbytes=nbytes))
    return sorted(out, key=lambda c: c.start), compute


def _size_ranges(events: list[dict[str, Any]]) -> dict[Any, list[tuple[float, float, int]]]:
    """CPU collective ranges that carry message sizes, per thread, sorted by start."""
    out: dict[Any, list[tuple[float, float, int]]] = defaultdict(list)
    for e in events:
        if e["name"].startswith(("record_param_comms", "nccl:", "c10d::")):
            n = _msg_bytes(e["args"])
            if n is not None:
                out[(e.get("pid"), e.get("tid"))].append((e["ts"], e["end"], n))
    for v in out.values():
        v.sort()
    return out


def _enclosing_bytes(
    ranges: Mapping[Any, list[tuple[float, float, int]]], lane: Any, t: float
) -> int | None:
    spans = ranges.get(lane, [])
    i = bisect.bisect_right(spans, (t, math.inf, 0)) - 1
    while i >= 0 and i >= len(spans) - 64:  # the innermost open range holding t
        a, b, n = spans[i]
        if a <= t <= b:
            return n
        i -= 1
    return None


def _cpu_compute(events: list[dict[str, Any]], main: tuple[Any, Any]) -> tuple[list[Any], bool]:
    """The training thread's ops less the collectives' own (which may sit inside them, e.g.
    ``c10d::allreduce_`` inside DDP's AccumulateGrad hook), and whether it records any op."""
    ops = [e for e in events if (e.get("pid"), e.get("tid")) == main and e.get("cat") == "cpu_op"]
    comm = merge((e["ts"], e["end"]) for e in ops if e["name"].startswith(COMM_OP_PREFIXES))
    work = merge((e["ts"], e["end"]) for e in ops if not e["name"].startswith(COMM_OP_PREFIXES))
    return subtract(work, comm), bool(ops)


def _cpu_comm(events: list[dict[str, Any]], main: tuple[Any, Any]) -> list[Comm]:
    """gloo's execution ranges (each matched, in order per collective kind, with its launch
    op on the training thread), else recperf:allreduce spans."""
    runs = sorted((e for e in events if e["name"].startswith("gloo:")), key=lambda e: e["ts"])
    if not runs:
        own = [e for e in events if e["name"] == "recperf:allreduce"]
        return sorted((_own_comm(e) for e in own), key=lambda c: c.start)
    issued: dict[str, list[float]] = defaultdict(list)
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["name"].startswith("c10d::") and (e.get("pid"), e.get("tid")) == main:
            issued[_kind(e["name"])].append(e["ts"])
    seen: dict[str, int] = defaultdict(int)
    out = []
    for e in runs:
        kind = _kind(e["name"])
        k, launches = seen[kind], issued.get(kind, [])
        seen[kind] += 1
        launch = launches[k] if k < len(launches) and launches[k] <= e["ts"] else e["ts"]
        out.append(Comm(start=e["ts"], end=e["end"], launch=launch, kind=kind,
                        nbytes=_msg_bytes(e["args"])))  # fmt: skip
    return out


def _own_comm(e: Mapping[str, Any]) -> Comm:
    """A recperf all-reduce span: a bucket, or a ``run.ddptimers`` window (its last launch)."""
    ts, end, nbytes, last = e["ts"], e["end"], e["args"].get("bytes"), e["args"].get("last_launch")
    launch = min(max(last / 1e6, ts), end) if isinstance(last, int | float) else ts
    return Comm(start=ts, end=end, launch=launch, kind="allreduce", nbytes=_int_or_none(nbytes))


def _v1(events: list[dict[str, Any]], source: str) -> tuple[Any, ...]:
    """A recperf-stall-trace/1 file: data_wait, step, phases and allreduce per iteration."""
    its: dict[int, dict[str, Any]] = defaultdict(dict)
    spans: list[Span] = []
    comm = []
    for i, e in enumerate(events):
        n = _int_or_none(e["args"].get("iteration"))
        if n is None:
            raise ConfigError(f"{source}: event {i} ({e['name']}): args.iteration missing")
        if e["name"] == "allreduce":
            comm.append(_own_comm(e))
        else:
            its[n][e["name"]] = (e["ts"], e["end"])
        if e["name"] == "step":
            spans.append(Span(e["ts"], e["end"], n, e["index"], e["name"]))
    check_order(spans, source)
    steps, data = [], []
    for n in sorted(its):
        it = its[n]
        if "data_wait" not in it or "step" not in it:
            raise ConfigError(f"{source}: iteration {n} lacks its data_wait or step event")
        ph = {k: v for k, v in it.items() if k not in V1_NAMES}
        steps.append(Step(index=n, start=it["data_wait"][0], end=it["step"][1], phases=ph))
        data.append(it["data_wait"])
    return steps, merge(data), sorted(comm, key=lambda c: c.start), [], False


def load_rank_traces(paths: Sequence[Path]) -> list[RankTrace]:
    """Every file read and normalised, sorted by rank; one ConfigError when they cannot be the
    ranks of one run (``check``: a duplicate rank, mismatched world sizes, different
    iterations, run ids or times)."""
    traces = check_ranks([normalise(read_trace(p), str(p), k) for k, p in enumerate(paths)])
    check_one_run(traces)
    return traces


def analyze_paths(
    paths: Sequence[Path], *, ranks_per_node: int | None = None, skip_steps: int = 0
) -> StallSummary:
    """Load one trace per rank and return the stall summary (``breakdown.summarise``)."""
    if ranks_per_node is not None:
        check_range("ranks_per_node", ranks_per_node, 1, None)
    check_range("skip_steps", skip_steps, 0, None)
    traces = load_rank_traces(paths)
    figs = []
    for t in traces:
        f = iteration_figures(t, skip_steps)
        if not f:
            raise ConfigError(
                f"{t.source}: --skip-steps {skip_steps} leaves none of its "
                f"{len(t.steps)} iteration(s)"
            )
        figs.append(f)
    return summarise(traces, figs, ranks_per_node=ranks_per_node, skip_steps=skip_steps)
