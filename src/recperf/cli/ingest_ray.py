"""``recperf ingest run|tune --engine ray``: the flags that choose the engine and the Ray cluster,
their checks (every one before Ray is imported or started), and the Ray engine's result table.
The work itself is ``recperf.ingest.raydata.api`` (``spec_run``, ``data_run``)."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table
from rich.text import Text
from typer._click.core import ParameterSource
from typer._click.globals import get_current_context

from recperf.cli.common import err_console, show
from recperf.cli.options import Settings
from recperf.core.config import check_range, from_mapping
from recperf.core.errors import ConfigError
from recperf.core.files import check_input
from recperf.ingest.data.limits import BUNDLED_SPECS

if TYPE_CHECKING:
    from recperf.ingest.base import Allocation
    from recperf.ingest.live.batch import PipelineConfig
    from recperf.ingest.raydata.runtime import ClusterSpec

ENGINES = ("native", "ray")
RAY_ONLY = ("address", "spec", "nodes", "cpus_per_node", "link_gbps")
"""Parameters of ``run`` and ``tune`` that only the Ray engine reads."""
TUNE_BUDGET_S = 120.0
"""The tuning budget on the Ray engine unless --budget-s says (each allocation rebuilds the
dataset and waits for its actors: 60 s, the native default, allows too few windows)."""
SPEC_KEEPS = frozenset({"seed"})
"""The pipeline settings a ``--spec`` run reads (the spec gives its own shape)."""

ENGINE = typer.Option("native", help="native (recperf's worker processes) or ray (Ray Data).")
ADDRESS = typer.Option(
    None, help="--engine ray: join this Ray cluster (host:port of its GCS, or auto) and leave it "
    "running; default: start a local one and shut it down at the end.",
)  # fmt: skip
SPEC = typer.Option(
    None, help="--engine ray: run a simulator spec (a bundled name or a TOML file, as `ingest "
    "simulate` takes) as a synthetic pipeline instead of --data.",
)  # fmt: skip
NODES = typer.Option(
    None, help="--engine ray: start a local cluster of N nodes (needs --cpus-per-node; 1..64)."
)
CPUS_PER_NODE = typer.Option(
    None, help="--engine ray: logical CPUs of each node started here (1..256; default: this "
    "machine's cores, one node).",
)  # fmt: skip
LINK_GBPS = typer.Option(
    None, help="--engine ray --spec: each node's NIC, Gbit/s, for the placement bound "
    "(default: no limit).",
)  # fmt: skip


def given(param: str) -> bool:
    """Whether the user gave parameter ``param`` (not its default) in this invocation."""
    ctx = get_current_context(silent=True)
    if ctx is None:
        return False
    return ctx.get_parameter_source(param) not in (None, ParameterSource.DEFAULT)


def flag(param: str) -> str:
    return f"--{param.replace('_', '-')}"


@dataclass(frozen=True, slots=True)
class RayFlags:
    """What ``--engine`` and the Ray-only flags say for one invocation."""

    engine: str
    address: str | None = None
    spec: str | None = None
    nodes: int | None = None
    cpus_per_node: int | None = None
    link_gbps: float | None = None

    def check(self, native_only: Sequence[str], ray_only: Sequence[str] = ()) -> bool:
        """One line for an unknown engine or a flag the engine does not read (``native_only``
        and ``ray_only``: the command's own such parameters, checked by ``given``); whether
        the engine is Ray."""
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine {self.engine}: expected native or ray")
        ray = self.engine == "ray"
        if not ray:
            for p in (*RAY_ONLY, *ray_only):
                if getattr(self, p, None) is not None or (p in ray_only and given(p)):
                    raise ConfigError(f"{flag(p)}: only with --engine ray (the native engine "
                                      "runs --data on this machine's cores)")  # fmt: skip
            return False
        for p in native_only:
            if given(p):
                why = (" (Ray workers are single-threaded processes)"
                       if p in ("threads", "inflight") else "")  # fmt: skip
                raise ConfigError(f"{flag(p)}: only with --engine native, not --engine ray{why}")
        return True

    def cluster(self) -> ClusterSpec:
        from recperf.ingest.raydata.runtime import ClusterSpec

        return ClusterSpec(address=self.address, nodes=1 if self.nodes is None else self.nodes,
                           cpus_per_node=self.cpus_per_node)  # fmt: skip

    def link_bytes_per_s(self) -> float:
        if self.link_gbps is None:
            return math.inf
        check_range("--link-gbps", self.link_gbps, 0.0, 1e6, lo_open=True)
        return self.link_gbps * 1e9 / 8


@dataclass(frozen=True, slots=True)
class Job:
    """A Ray engine run, checked: a spec's synthetic pipeline or the Criteo data's."""

    flags: RayFlags
    cluster: ClusterSpec
    spec: Any = None
    """The PipelineSpec of a --spec run."""
    data: Path | None = None
    config: PipelineConfig | None = None
    seed: int = 0

    @property
    def stage_names(self) -> tuple[str, ...]:
        if self.config is not None:
            return tuple(self.config.stage_names())
        return tuple(self.spec.stage_names)

    def run(self, alloc: str | Allocation, **kw: Any) -> dict[str, Any]:
        """``spec_run`` or ``data_run`` of this job."""
        from recperf.ingest.raydata import api

        if self.spec is not None:
            return api.spec_run(self.spec, self.cluster, alloc, seed=self.seed,
                                link_bytes_per_s=self.flags.link_bytes_per_s(), **kw)  # fmt: skip
        assert self.data is not None and self.config is not None
        return api.data_run(self.data, self.config, self.cluster, alloc, seed=self.seed, **kw)


def prepare(settings: Settings, flags: RayFlags, data: Path | None) -> Job:
    """The job ``--spec`` or ``--data`` names on the Ray engine, every flag checked, Ray not yet
    imported; then Ray's presence (one line naming the install)."""
    from recperf.ingest.sim.model import load_spec

    cluster = flags.cluster()
    pipeline = settings.resolve(["pipeline"])["pipeline"]
    if flags.spec is not None and data is not None:
        raise ConfigError("--spec and --data: give one (a spec's synthetic pipeline, or data)")
    if flags.spec is None and data is None:
        raise ConfigError("--data or --spec: give one (Criteo data, or with --engine ray a "
                          "simulator spec)")  # fmt: skip
    if flags.spec is not None:
        extra = sorted(set(pipeline) - SPEC_KEEPS)
        if extra:
            raise ConfigError(f"{flag(extra[0])} (pipeline.{extra[0]}): a --spec run takes its "
                              "pipeline from the spec; give it with --data")  # fmt: skip
        if flags.spec not in BUNDLED_SPECS and not Path(flags.spec).is_file():
            raise ConfigError(f"--spec {flags.spec}: expected a bundled spec "
                              f"({', '.join(BUNDLED_SPECS)}) or a TOML file")  # fmt: skip
        seed = int(pipeline.get("seed", 0))
        flags.link_bytes_per_s()
        job = Job(flags=flags, cluster=cluster, spec=load_spec(flags.spec), seed=seed)
    else:
        assert data is not None
        if flags.link_gbps is not None:
            raise ConfigError("--link-gbps: bounds a --spec run across nodes; not with --data")
        from recperf.ingest.live.batch import PipelineConfig  # torch: only for data

        cfg = from_mapping(PipelineConfig, pipeline, "pipeline")
        job = Job(flags=flags, cluster=cluster, data=check_input(data, "--data", max_bytes=None,
                  want="any"), config=cfg, seed=cfg.seed)  # fmt: skip
    probe(cluster)
    return job


def probe(cluster: ClusterSpec) -> None:
    """An ``--address`` that answers, else one line (exit 2); checked before anything heavy is
    imported (Ray takes 3-10 s on a busy machine, and a dead address is one line in 15 s)."""
    from recperf.ingest.raydata.runtime import probe

    if cluster.address is not None:
        probe(cluster.address)


def require() -> None:
    """Ray Data importable and of the pinned version, else one line naming the install."""
    from recperf.ingest.raydata.runtime import require_ray

    require_ray()


def allocation(job: Job, alloc: str) -> str | Allocation:
    """``--alloc`` on the Ray engine: a name of ``api.ALLOCS`` or an allocation file (read now,
    against the job's stages; Ray workers run one thread)."""
    from recperf.ingest.live.allocfile import read_allocation
    from recperf.ingest.raydata import api

    api.check_alloc(alloc)
    if alloc in api.ALLOCS:
        return alloc
    a = read_allocation(Path(alloc), job.stage_names)
    if any(t != 1 for t in a.segment_threads()):
        raise ConfigError(f"--alloc {alloc}: threads other than 1; Ray workers are "
                          "single-threaded processes (--engine ray)")  # fmt: skip
    return a


def tuner_of(alloc: str | Allocation) -> str | None:
    """The tuner ``--alloc`` names on the Ray engine (``auto`` is plumber), else None."""
    from recperf.ingest.raydata import api

    if not isinstance(alloc, str) or alloc not in ("auto", *api.TUNED):
        return None
    return "plumber" if alloc == "auto" else alloc


def run(settings: Settings, job: Job, alloc: str | Allocation, seconds: float,
        budget_s: float | None) -> None:  # fmt: skip
    """``ingest run --engine ray``: choose, measure, emit, show."""
    tuner = tuner_of(alloc)
    if budget_s is not None and tuner is None:
        raise ConfigError(f"--budget-s: a tuning budget, but --alloc {alloc} names no tuner "
                          "(auto, plumber, autotune, intune, oracle, static)")  # fmt: skip
    budget = TUNE_BUDGET_S if budget_s is None else budget_s
    check_range("--budget-s", budget, 0.0, 86_400.0, lo_open=True)
    check_range("--seconds", seconds, 0.0, 86_400.0, lo_open=True)
    options = settings.resolve(["pipeline", tuner])[tuner] if tuner else None
    with _ray_prints_on_stderr():
        require()
        doc = job.run(alloc, seconds=seconds, budget_s=budget, options=options)
    settings.emit(doc)
    show_document(doc)


def tune(settings: Settings, job: Job, tuner: str, budget_s: float, final_s: float) -> None:
    """``ingest tune --engine ray``: the tuner's allocation measured for ``final_s``, written
    as allocation.toml (and summary.json) under --out."""
    from recperf.ingest.base import Allocation
    from recperf.ingest.live.allocfile import write_allocation
    from recperf.ingest.raydata import api

    if tuner not in api.TUNED:
        raise ConfigError(f"--tuner {tuner}: expected {', '.join(api.TUNED)} (--engine ray)")
    check_range("--budget-s", budget_s, 0.0, 86_400.0, lo_open=True)
    check_range("--final-s", final_s, 0.0, 86_400.0, lo_open=True)
    options = settings.resolve(["pipeline", tuner], {"tuner": tuner})[tuner]
    out = settings.out
    assert out is not None
    with _ray_prints_on_stderr():
        require()
        doc = job.run(tuner, seconds=final_s, budget_s=budget_s, options=options)
    a = doc["allocation"]
    chosen = Allocation(workers=tuple(a["workers"]), cuts=tuple(a["cuts"]))
    names = doc.get("stages") or job.stage_names
    write_allocation(out / "allocation.toml", names, chosen,
                     f"recperf ingest tune --engine ray --tuner {tuner}: "
                     f"{doc['throughput_rows_per_s']:,.0f} rows/s")  # fmt: skip
    settings.emit(doc)
    show_document(doc)
    err_console.print(f"wrote {out / 'allocation.toml'}", highlight=False)


def _ray_prints_on_stderr() -> contextlib.AbstractContextManager[object]:
    """While Ray runs, what it prints goes to stderr: its driver prints the raylet's error
    messages (a retried task, an actor killed on a rebuild) to ``sys.stdout``, whatever
    ``log_to_driver`` says, which would break the document ``--json`` prints there."""
    return contextlib.redirect_stdout(sys.stderr)


def show_document(doc: Mapping[str, Any]) -> None:
    """The per-operator table and one line of Ray's side of the run."""
    from recperf.cli.ingest import _ci

    alloc = doc["allocation"]
    label = alloc if isinstance(alloc, str) else alloc["label"]
    title = (f"{doc['throughput_rows_per_s']:,.0f} rows/s{_ci(doc)} over {doc['seconds']:.1f} s;"
             f" {label} (chosen by {doc['chosen_by']})")  # fmt: skip
    table = Table(title=Text(title))
    ops = doc["operators"]
    nodes = any("nodes" in op for op in ops)
    for col in ("operator", "workers", "workers seen", *(("nodes",) if nodes else ())):
        table.add_column(col, justify="left" if col in ("operator", "nodes") else "right")
    for op in ops:
        where = " ".join(f"{n}:{k}" for n, k in op.get("nodes", {}).items() if k)
        table.add_row(Text(op["operator"]), str(op["workers"]), str(op["workers_seen"]),
                      *((where,) if nodes else ()))  # fmt: skip
    show(table)
    err_console.print(_ray_line(doc), highlight=False)


def _ray_line(doc: Mapping[str, Any]) -> str:
    parts = []
    if "lp_bound_rows_per_s" in doc:
        parts.append(f"{doc['fraction_of_bound']:.3f} of the LP bound "
                     f"({doc['lp_bound_rows_per_s']:,.0f} rows/s)")  # fmt: skip
    idle = doc.get("idle_logical_cpus")
    parts.append(f"idle logical CPUs {'-' if idle is None else f'{idle:.1f}'} of "
                 f"{doc.get('logical_cpus', '-')}")  # fmt: skip
    gap = doc.get("ray_overhead_ms_per_task")
    parts.append(f"Ray overhead {'-' if gap is None else f'{gap:.1f}'} ms/task")
    first = doc.get("time_to_first_block_s")
    parts.append(f"first block after {'-' if first is None else f'{first:.1f}'} s")
    if doc.get("tuning_s") is not None:
        parts.append(f"tuned {doc['tuning_s']:.0f} s ({doc.get('tuning_steps', '?')} steps)")
    return "; ".join(parts)
