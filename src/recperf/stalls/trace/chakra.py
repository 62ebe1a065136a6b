"""Chakra execution-trace export of a measured profile: per rank one ``.et`` file (Chakra's
length-prefixed protobuf, see ``chakra_schema``) of the timed iterations' compute nodes (forward,
backward cut at each gradient bucket's launch, optimizer) and ALL_REDUCE collective nodes with
their bytes, with the measured durations and dependencies in the order the run really had, for
simulators such as ASTRA-sim.

What is and is not in the files: every node has ``is_cpu_op`` False (it is the simulated
device's work; ASTRA-sim would treat a CPU collective as compute), ``duration_micros`` as
measured and ``start_time_micros`` from the first exported forward; collectives carry
``comm_type`` and ``comm_size`` (int64, as Chakra's feeder reads them). The wait for data is
not a node (no simulator models the input pipeline; it is in the profile's summary), and compute
nodes have no ``num_ops``: the trace has one FLOP count per iteration (GlobalMetadata
``flops_per_iteration``), not one per phase, so simulators use the measured durations."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recperf.core.errors import ConfigError
from recperf.core.files import check_input
from recperf.stalls.trace.chakra_schema import (
    ALL_REDUCE,
    SCHEMA_VERSION,
    AttrValue,
    EtNode,
    encode_trace,
)

PHASES = ("forward", "backward", "optimizer")
Span = tuple[float, float]


@dataclass(kw_only=True, slots=True, frozen=True)
class Iteration:
    """One timed iteration of one rank, in seconds on the rank's clock."""

    number: int
    forward: Span
    backward: Span
    optimizer: Span
    comm: tuple[tuple[float, float, int], ...]
    """Each all-reduce bucket: (launched, completed, bytes), by launch time."""


@dataclass(kw_only=True, slots=True, frozen=True)
class RankRead:
    """What the export takes from one rank trace."""

    iterations: tuple[Iteration, ...]
    """The timed iterations, in order."""
    grad_bytes: int
    """Trainable parameter bytes (the trace's ``recperf.grad_bytes``)."""
    flops_per_iter: float
    """FLOPs of one iteration (the trace's ``recperf.flops_per_iter``)."""


def read_rank(path: Path) -> RankRead:
    """The timed iterations of one rank trace (read with ``run.ranktrace``, any trace
    format) and the figures of its ``recperf`` metadata the export writes."""
    from recperf.stalls.run import ranktrace

    trace = ranktrace.load_trace(path)
    its = ranktrace._iterations(trace)
    events = [e for e in trace["traceEvents"] if isinstance(e.get("args"), dict)]
    numbers = sorted({int(e["args"]["iteration"]) for e in events if "iteration" in e["args"]})
    sizes: dict[int, list[tuple[float, int]]] = {}
    for e in events:
        a = e["args"]
        if str(e.get("name", "")).endswith("allreduce") and "last_launch" in a:
            raise ConfigError(f"{path}: the all-reduces are one window per iteration (DDP's own "
                              "timers); the Chakra export replays each bucket: record with "
                              "Profiler(..., comm='hook') or `recperf stalls profile`")  # fmt: skip
        if str(e.get("name", "")).endswith("allreduce") and "bytes" in a and "bucket" in a:
            sizes.setdefault(int(a["iteration"]), []).append((float(e["ts"]), int(a["bytes"])))
    out = []
    for number, it in zip(numbers[len(numbers) - len(its) :], its, strict=True):
        phases = {str(k).removeprefix("recperf:"): v for k, v in it["phases"].items()}
        missing = [p for p in PHASES if p not in phases]
        if missing:
            why = "the export needs the forward, backward and optimizer phases"
            raise ConfigError(f"{path}: iteration {number} has no {missing[0]!r} span: {why}")
        comm = sorted((float(c[0]), float(c[1])) for c in it["comm"])
        nbytes = [n for _, n in sorted(sizes.get(number, []))]
        if len(nbytes) != len(comm):
            raise ConfigError(f"{path}: iteration {number}: {len(comm)} all-reduce spans but "
                              f"{len(nbytes)} carry args.bytes")  # fmt: skip
        out.append(Iteration(
            number=number, forward=phases["forward"], backward=phases["backward"],
            optimizer=phases["optimizer"],
            comm=tuple((a, b, n) for (a, b), n in zip(comm, nbytes, strict=True)),
        ))  # fmt: skip
    if not out:
        raise ConfigError(f"{path}: the rank trace has no timed iterations")
    meta = trace["recperf"]
    return RankRead(iterations=tuple(out), grad_bytes=int(meta["grad_bytes"]),
                    flops_per_iter=float(meta["flops_per_iter"]))  # fmt: skip


def backward_segments(it: Iteration) -> tuple[list[Span], Span | None]:
    """The backward pass cut at each bucket's launch (segment k ends when bucket k is handed to
    the all-reduce), and the compute left after the last all-reduce completed (None if none).
    The wait for the all-reduces in between is communication, not compute: the segments add
    up to ``run.differential``'s backward_s (backward less the exposed all-reduce)."""
    b0, b1 = it.backward
    if not it.comm:
        return [(b0, b1)], None
    segments, prev = [], b0
    for launch, _, _ in it.comm:
        at = min(max(launch, prev), b1)
        segments.append((prev, at))
        prev = at
    done = max(prev, max(end for _, end, _ in it.comm))
    return segments, ((done, b1) if b1 > done else None)


def _us(seconds: float) -> int:
    return max(0, round(seconds * 1e6))


def build_nodes(iterations: Sequence[Iteration]) -> list[EtNode]:
    """Chakra nodes of one rank's iterations, ids from 0 in topological order. Data deps (what
    must finish first): backward segment k on the one before (the first on the forward);
    all-reduce k on backward segment k; the compute after the all-reduces and the optimizer on
    the last backward segment and every all-reduce of the step; the next forward on the
    optimizer. Ctrl deps: the node issued before on the same thread."""
    nodes: list[EtNode] = []
    t0 = iterations[0].forward[0] if iterations else 0.0

    def add(name: str, kind: str, span: Span, deps: Sequence[int], **attrs: AttrValue) -> int:
        nodes.append(EtNode(
            id=len(nodes), name=name, type=kind, data_deps=tuple(deps), ctrl_deps=tuple(deps[:1]),
            start_time_micros=_us(span[0] - t0), duration_micros=_us(span[1] - span[0]),
            attrs={"is_cpu_op": False, **attrs},
        ))  # fmt: skip
        return len(nodes) - 1

    prev_opt: list[int] = []
    for it in iterations:
        i = it.number
        prev = add(f"forward#{i}", "COMP_NODE", it.forward, prev_opt, iteration=i,
                   phase="forward")  # fmt: skip
        segments, tail = backward_segments(it)
        reduces = []
        for k, seg in enumerate(segments):
            prev = add(f"backward#{i}.{k}", "COMP_NODE", seg, [prev], iteration=i,
                       phase="backward", segment=k)  # fmt: skip
            if k < len(it.comm):
                a, b, n = it.comm[k]
                reduces.append(add(
                    f"allreduce#{i}.{k}", "COMM_COLL_NODE", (a, b), [prev], iteration=i,
                    bucket=k, comm_type=ALL_REDUCE, comm_size=n,
                ))  # fmt: skip
        if tail is not None:
            prev = add(f"backward#{i}.{len(segments)}", "COMP_NODE", tail, [prev, *reduces],
                       iteration=i, phase="backward", segment=len(segments))  # fmt: skip
        prev_opt = [add(f"optimizer#{i}", "COMP_NODE", it.optimizer, [prev, *reduces],
                        iteration=i, phase="optimizer")]  # fmt: skip
    return nodes


# -- the export of one profile ------------------------------------------------------------

COMM_RUNS = ("network", "intra")
"""Runs tried in order when none is named: the communicating runs of a profile."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ExportConfig:
    """Which run of a profile to export and how to name the files."""

    run: str | None = None
    """Run under PROFILE/runs (default: network, else intra)."""
    prefix: str = "recperf"
    """File name prefix: ranks go to PREFIX.RANK.et, as Chakra's tools and ASTRA-sim expect."""

    def __post_init__(self) -> None:
        bad = not self.prefix or self.prefix.startswith(".") or any(
            c in self.prefix for c in "/\\ \t\n"
        )  # fmt: skip
        if bad:
            raise ConfigError(f"prefix = {self.prefix!r}: expected a file name without "
                              "slashes or spaces that does not start with '.'")  # fmt: skip


@dataclass(kw_only=True, slots=True, frozen=True)
class RankExport:
    """What one rank's ``.et`` file holds."""

    rank: int
    path: Path
    iterations: int
    comp_nodes: int
    comm_nodes: int
    comm_bytes_per_iteration: float
    """Bytes all-reduced per iteration (sum of comm_size)."""
    compute_s_per_iteration: float
    """Mean compute seconds per iteration (sum of the compute nodes' durations)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ChakraExport:
    """The files written for one run of a profile."""

    run: str
    world_size: int
    nodes: int
    ranks: list[RankExport]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "chakra", "schema_version": SCHEMA_VERSION, "run": self.run,
            "world_size": self.world_size, "nodes": self.nodes,
            "ranks": [{**{k: getattr(r, k) for k in RankExport.__slots__ if k != "path"},
                       "file": str(r.path)} for r in self.ranks],
        }  # fmt: skip


def pick_run(profile: Path, run: str | None) -> Path:
    """The run directory to export: ``run``, else the first of COMM_RUNS the profile has."""
    runs = profile / "runs"
    if not runs.is_dir():
        raise ConfigError(f"{profile}: no runs/ directory: not a profile directory "
                          "(what `recperf stalls profile --out DIR` writes)")  # fmt: skip
    have = sorted(p.name for p in runs.iterdir() if (p / "spec.json").is_file())
    wanted = [run] if run is not None else [r for r in COMM_RUNS if r in have]
    if not wanted or wanted[0] not in have:
        what = f"no run {run!r}" if run is not None else "no communicating run (network, intra)"
        raise ConfigError(f"{runs}: {what}; runs: {', '.join(have) or 'none'} (choose with --run)")
    return runs / wanted[0]


def _check_ranks(paths: Sequence[Path], ranks: Sequence[Sequence[Iteration]]) -> None:
    """Every rank must issue the same collectives, or a simulator replaying them deadlocks."""
    first = [[n for _, _, n in it.comm] for it in ranks[0]]
    for path, its in zip(paths[1:], ranks[1:], strict=True):
        sizes = [[n for _, _, n in it.comm] for it in its]
        if sizes != first:
            raise ConfigError(f"{path}: its iterations' all-reduce buckets {sizes[:2]}... differ "
                              f"from {paths[0].name}'s {first[:2]}...")  # fmt: skip


def export_chakra(profile: Path, out: Path, config: ExportConfig) -> ChakraExport:
    """Write ``out/PREFIX.RANK.et`` for every rank of the chosen run of ``profile``. All files
    are encoded before any is written, each written atomically; stale PREFIX.N.et files of a
    larger world are removed."""
    from recperf.core.results import atomic_path
    from recperf.stalls.run.spec import RunSpec

    check_input(profile, "--profile", want="any")
    if profile.is_file() and profile.name == "summary.json":
        profile = profile.parent
    run_dir = pick_run(profile, config.run)
    spec = RunSpec.load(run_dir / "spec.json")
    paths = [run_dir / f"rank{r}.json" for r in range(spec.ranks)]
    absent = [p for p in paths if not p.is_file()]
    if absent:
        raise ConfigError(f"{absent[0]}: missing ({len(paths) - len(absent)} of {spec.ranks} "
                          "rank traces present)")  # fmt: skip
    loaded = [read_rank(p) for p in paths]
    ranks = [r.iterations for r in loaded]
    _check_ranks(paths, ranks)
    blobs, results = [], []
    for r, its in enumerate(ranks):
        nodes = build_nodes(its)
        meta: dict[str, AttrValue] = {
            "schema": "recperf-chakra/1", "producer": "recperf stalls export", "run": spec.name,
            "workload": spec.workload, "rank": r, "world_size": spec.ranks,
            "nodes": spec.nodes, "bandwidth": spec.bandwidth or "", "device": spec.device,
            "iterations": len(its), "source": str(paths[r]),
            "grad_bytes": loaded[r].grad_bytes,
            "flops_per_iteration": loaded[r].flops_per_iter,
        }  # fmt: skip
        blobs.append(encode_trace(meta, nodes))
        comp = [n for n in nodes if n.type == "COMP_NODE"]
        results.append(RankExport(
            rank=r, path=out / f"{config.prefix}.{r}.et", iterations=len(its),
            comp_nodes=len(comp), comm_nodes=len(nodes) - len(comp),
            comm_bytes_per_iteration=sum(n for it in its for _, _, n in it.comm) / len(its),
            compute_s_per_iteration=sum(n.duration_micros for n in comp) / 1e6 / len(its),
        ))  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    for res, blob in zip(results, blobs, strict=True):
        with atomic_path(res.path) as tmp:
            tmp.write_bytes(blob)
    for stale in out.glob(f"{config.prefix}.*.et"):
        index = stale.name[len(config.prefix) + 1 : -3]
        if index.isdigit() and int(index) >= spec.ranks:
            stale.unlink()
    return ChakraExport(run=spec.name, world_size=spec.ranks, nodes=spec.nodes, ranks=results)
