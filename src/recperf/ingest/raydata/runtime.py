"""Where the Ray engine runs: a Ray instance recperf starts on this machine (one node, or a local
multi-node cluster from ``ray.cluster_utils.Cluster`` whose nodes carry a ``recperf-node``
label), or an existing cluster joined by address. recperf shuts down what it started, and only
that: a cluster given by address is left running.

Ray is imported here and nowhere else at module level (``require_ray``), so that the rest of
recperf runs without it and ``--engine ray`` without it is one line naming the install."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from recperf.core.errors import ConfigError, RecperfError

RAY_MINOR = (2, 60)
"""The Ray minor version the engine is built and tested on (pinned by the ``ray`` extra): it
relies on Ray Data's ActorPoolStrategy / TaskPoolStrategy, ``map_batches``'
``ray_remote_args_fn`` (an operator with one is never fused with its neighbours, so a cut stays
an operator boundary) and node labels."""
INSTALL = "pip install 'recperf[ray]'"
NODE_LABEL = "recperf-node"
"""The label each node of a local multi-node cluster carries (``n0``, ``n1``, ...)."""
ADDRESS_TIMEOUT_S = 15.0
"""How long ``--address`` may take to answer before it is one line, exit 2."""
START_ATTEMPTS = 3
"""Ray gives a new node fixed waits (30 s to register, about 15 s for its agent); on a loaded
machine a start is tried up to this many times."""
MAX_NODES = 64
MAX_CPUS_PER_NODE = 256


def require_ray() -> ModuleType:
    """``ray`` with Ray Data importable and of the pinned minor version, else one line."""
    try:
        ray = importlib.import_module("ray")
        importlib.import_module("ray.data")
    except ImportError:
        raise ConfigError(
            f"--engine ray needs Ray Data, which is not installed: {INSTALL}"
        ) from None
    found = tuple(int(x) for x in str(ray.__version__).split(".")[:2])
    if found != RAY_MINOR:
        raise ConfigError(
            f"--engine ray: Ray {ray.__version__} is installed; the engine is built for Ray "
            f"{RAY_MINOR[0]}.{RAY_MINOR[1]}.x: {INSTALL}"
        )
    return ray


@dataclass(kw_only=True, slots=True, frozen=True)
class ClusterSpec:
    """The Ray cluster to run on."""

    address: str | None = None
    """An existing cluster (``host:port`` of its GCS, or ``auto``); None: start one here."""
    nodes: int = 1
    """Nodes of the cluster started here (1: a plain local instance; more: a local
    ``ray.cluster_utils.Cluster`` of that many logical nodes plus a head without CPUs)."""
    cpus_per_node: int | None = None
    """Logical CPUs of each node started here (None: this machine's cores, for one node)."""
    object_store_mib: int = 512
    """Object store of each node started here, MiB (Ray's minimum is 75)."""

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise ConfigError(f"--nodes {self.nodes}: expected 1..{MAX_NODES}")
        cpn = self.cpus_per_node
        if cpn is not None and not 1 <= cpn <= MAX_CPUS_PER_NODE:
            raise ConfigError(f"--cpus-per-node {cpn}: expected 1..{MAX_CPUS_PER_NODE}")
        if self.address is not None and (self.nodes != 1 or cpn is not None):
            flag = "--nodes" if self.nodes != 1 else "--cpus-per-node"
            raise ConfigError(f"{flag}: it shapes a cluster recperf starts; --address joins "
                              "one that exists (give one or the other)")  # fmt: skip
        if self.nodes > 1 and cpn is None:
            raise ConfigError("--nodes N needs --cpus-per-node C (the logical CPUs of each node)")
        if not 75 <= self.object_store_mib <= 1 << 20:
            raise ConfigError(f"object_store_mib = {self.object_store_mib}: expected 75..1048576")

    def node_cpus(self) -> tuple[int, ...]:
        """Logical CPUs of each node recperf starts (this machine's cores for one node)."""
        return (self.cpus_per_node or os.cpu_count() or 1,) * self.nodes


def probe(address: str) -> None:
    """One line within ADDRESS_TIMEOUT_S unless ``address`` names a GCS that accepts a
    connection (``auto``: the cluster this machine's Ray last started)."""
    target = address
    if address == "auto":
        current = Path("/tmp/ray/ray_current_cluster")
        try:
            target = current.read_text().strip()
        except OSError:
            raise ConfigError("--address auto: no Ray cluster was started on this machine "
                              "(start one with `ray start --head`)") from None  # fmt: skip
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--address {address!r}: expected host:port of a Ray GCS, or auto")
    try:
        with socket.create_connection((host, int(port)), timeout=ADDRESS_TIMEOUT_S / 3):
            pass
    except OSError as exc:
        raise ConfigError(
            f"--address {address}: no Ray cluster answers there ({exc.strerror or exc})"
        ) from None


def _quiet(ray: Any) -> None:
    """Ray Data's progress bars and per-execution INFO lines off (recperf reports its own)."""
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.WARNING)


class RayRuntime:
    """A context: Ray up on enter (joined or started), shut down on exit if recperf started it.
    ``node_ids`` lists the nodes with CPUs in label order (``n0``, ``n1``, ...; a joined
    cluster's in Ray's order)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.ray = require_ray()
        self._cluster: Any = None
        self._started = False
        self.node_ids: tuple[str, ...] = ()
        self.node_cpus: tuple[int, ...] = ()
        self.address = ""
        """The GCS address (``host:port``) others may join by (``--address``)."""

    def __enter__(self) -> RayRuntime:
        ray = self.ray
        if ray.is_initialized():
            raise RecperfError("Ray is already initialised in this process; recperf's Ray "
                               "engine starts or joins its own")  # fmt: skip
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        common = {"log_to_driver": False, "logging_level": logging.WARNING,
                  "configure_logging": False}  # fmt: skip
        try:
            with _keep_signal_handlers():
                for attempt in range(START_ATTEMPTS):
                    try:
                        self._init(common)
                        break
                    except Exception as exc:  # Ray raises a bare Exception for this
                        if (
                            "timed out during startup" not in str(exc)
                            or attempt + 1 == START_ATTEMPTS
                        ):
                            raise
                        self.__exit__(None, None, None)  # a loaded machine: once more
            _quiet(ray)
            self._read_nodes()
            self.address = str(ray.get_runtime_context().gcs_address)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _init(self, common: dict[str, Any]) -> None:
        ray, spec = self.ray, self.spec
        if spec.address is not None:
            probe(spec.address)
            ray.init(address=spec.address, **common)
        elif spec.nodes == 1:
            self._started = True
            ray.init(address="local", num_cpus=spec.node_cpus()[0], include_dashboard=False,
                     object_store_memory=spec.object_store_mib << 20, **common)  # fmt: skip
        else:
            self._started = True
            self._start_cluster()
            ray.init(address=self._cluster.address, **common)

    def _start_cluster(self) -> None:
        from ray.cluster_utils import Cluster

        store = self.spec.object_store_mib << 20
        self._cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "include_dashboard": False,
                "object_store_memory": store,
            },
        )
        for i, cpus in enumerate(self.spec.node_cpus()):
            self._cluster.add_node(num_cpus=cpus, object_store_memory=store,
                                   labels={NODE_LABEL: f"n{i}"})  # fmt: skip
        self._cluster.wait_for_nodes()

    def _read_nodes(self) -> None:
        nodes = [n for n in self.ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0)]
        nodes.sort(key=lambda n: (n.get("Labels", {}).get(NODE_LABEL, "~"), n["NodeID"]))
        self.node_ids = tuple(n["NodeID"] for n in nodes)
        self.node_cpus = tuple(int(n["Resources"]["CPU"]) for n in nodes)
        if not nodes:
            raise RecperfError("the Ray cluster has no node with CPUs")

    @property
    def cpus(self) -> int:
        """Logical CPUs of the cluster's nodes."""
        return sum(self.node_cpus)

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(Exception):
            self.ray.shutdown()
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                self._cluster.shutdown()
            self._cluster = None
        if self._started:
            _wait_gone(time.monotonic() + 10.0)


@contextlib.contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """Put back the caller's SIGTERM, SIGINT and SIGHUP handlers after starting or joining Ray:
    ``ray.init`` installs its own SIGTERM handlers (the driver's ``sys.exit(15)``, a head node's
    that kills its processes and exits 1) and its core worker absl's failure-signal handler,
    which turns SIGTERM into an abort (exit -6); either bypasses the caller's unwinding, so Ray
    would not be shut down through ``__exit__``. ``signal.signal`` reinstalls the handler at
    the C level too. Only the main thread can set handlers."""
    main = threading.current_thread() is threading.main_thread()
    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    saved = {s: signal.getsignal(s) for s in sigs} if main else {}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def _wait_gone(deadline: float) -> None:
    """Wait (up to ``deadline``) until this process has no Ray child processes left: Ray's
    shutdown signals them and returns before they have exited."""
    me = os.getpid()
    while time.monotonic() < deadline and _children(me):
        time.sleep(0.1)


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[1]) != pid or fields[0] in ("Z", "X"):
            continue
        with contextlib.suppress(OSError):
            if b"ray" in Path(f"/proc/{entry}/cmdline").read_bytes():
                out.append(int(entry))
    return out
