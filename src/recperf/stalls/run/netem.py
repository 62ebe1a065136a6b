"""Emulated machines on one host: a network namespace per node, joined through a bridge by veth
pairs, each node's uplink shaped to a bandwidth with ``tc`` (tbf). Every name starts with the
tag of the run that made it, ``rp`` + the owning process's pid + ``x`` (``tag_of``), and
everything is removed on exit, on error, or by ``cleanup()``, which removes the leftovers of
killed runs and spares a network whose owner, or any process inside it, still lives. Needs root
(CAP_NET_ADMIN)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from recperf.core.config import check_range
from recperf.core.errors import ConfigError, RecperfError

PREFIX = "rp"
_TAG = re.compile(r"^rp(\d+)x")
PID_MAX = 1 << 22
"""Linux's largest pid: ``rp4194304xh199`` (a node's veth) fits IFNAMSIZ's 15 characters."""
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_UNIT = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def parse_bandwidth(text: str) -> float:
    """``1gbit``, ``500mbit``, ... in bits per second."""
    m = _RATE.match(text.strip().lower())
    if not m:
        raise ConfigError(
            f"bandwidth {text!r}: expected a number and bit|kbit|mbit|gbit, e.g. 1gbit"
        )
    bits = float(m.group(1)) * _UNIT[m.group(2)]
    if bits <= 0:
        raise ConfigError(f"bandwidth {text!r}: must be > 0")
    return bits


class NetemError(RecperfError):
    """A command that sets up or tears down the emulated network failed."""


def tag_of(owner_pid: int) -> str:
    """The prefix of every namespace and link of the network process ``owner_pid`` makes."""
    return f"{PREFIX}{owner_pid}x"


def available() -> str | None:
    """None if namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "emulated nodes need root (CAP_NET_ADMIN) for network namespaces and tc"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"emulated nodes need the {' and '.join(missing)} command(s) (iproute2)"
    return None


def _run(args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetemError(f"{' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


@dataclass(kw_only=True, slots=True, frozen=True)
class NodeNet:
    """One emulated node: its namespace and address."""

    namespace: str
    address: str

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.namespace, *args]


class EmulatedNetwork:
    """``nodes`` namespaces on one bridge, each node's egress limited to ``bandwidth``; its
    names carry ``run_id``, the pid of the process that owns it (by default this one)."""

    def __init__(self, nodes: int, bandwidth: str, run_id: int | None = None) -> None:
        check_range("nodes", nodes, 2, 200)
        self.bandwidth_bits = parse_bandwidth(bandwidth)
        self.bandwidth = bandwidth
        self.nodes_count = nodes
        self.run_id = os.getpid() if run_id is None else run_id
        check_range("run_id", self.run_id, 1, PID_MAX)
        self.tag = tag_of(self.run_id)
        self.bridge = f"{self.tag}br"
        self.nodes = [
            NodeNet(namespace=f"{self.tag}n{k}", address=f"10.{200 + self.run_id % 50}.0.{k + 1}")
            for k in range(nodes)
        ]

    def __enter__(self) -> EmulatedNetwork:
        why = available()
        if why:
            raise NetemError(why)
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def _build(self) -> None:
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "link", "set", self.bridge, "up"])
        rate = f"{self.bandwidth_bits / 1e3:.0f}kbit"
        burst = f"{max(32_000, int(self.bandwidth_bits / 8 / 250))}"  # ~4 ms of traffic
        for k, node in enumerate(self.nodes):
            host, peer = f"{self.tag}h{k}", f"{self.tag}p{k}"
            _run(["ip", "netns", "add", node.namespace])
            _run(["ip", "link", "add", host, "type", "veth", "peer", "name", peer])
            _run(["ip", "link", "set", host, "master", self.bridge, "up"])
            _run(["ip", "link", "set", peer, "netns", node.namespace])
            ns = ["ip", "netns", "exec", node.namespace]
            _run([*ns, "ip", "link", "set", "lo", "up"])
            _run([*ns, "ip", "link", "set", peer, "name", "eth0"])
            _run([*ns, "ip", "addr", "add", f"{node.address}/24", "dev", "eth0"])
            _run([*ns, "ip", "link", "set", "eth0", "up"])
            _run([*ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate,
                  "burst", burst, "latency", "100ms"])  # fmt: skip

    def teardown(self) -> None:
        """Remove this network's namespaces, veths and bridge (missing ones are fine)."""
        cleanup(self.tag)


def leftovers(tag: str = PREFIX) -> tuple[list[str], list[str]]:
    """Namespaces and links of one network (``tag`` such as ``rp1234x``, see ``tag_of``), or of
    every recperf network by default."""
    mine = _TAG if tag == PREFIX else re.compile(rf"^{re.escape(tag)}")
    ns_out = _run(["ip", "netns", "list"], check=False).stdout
    namespaces = [line.split()[0] for line in ns_out.splitlines() if line.strip()]
    link_out = _run(["ip", "-o", "link", "show"], check=False).stdout
    links = [m.group(1).split("@")[0] for m in re.finditer(r"^\d+: ([^:]+):", link_out, re.M)]
    return [n for n in namespaces if mine.match(n)], [x for x in links if mine.match(x)]


def _owner_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a reused pid keeps a dead run's network until it ends)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pids_in(namespace: str) -> bool:
    """Whether any process runs inside ``namespace``."""
    return bool(_run(["ip", "netns", "pids", namespace], check=False).stdout.strip())


def _live_tags(namespaces: Sequence[str], links: Sequence[str]) -> set[str]:
    """Tags of the networks of a live run: its owner lives (it may be between two runs, with
    nobody inside), or a process still runs inside one of its namespaces."""
    live = set()
    for name in [*namespaces, *links]:
        m = _TAG.match(name)
        if m and m.group(0) not in live and _owner_alive(int(m.group(1))):
            live.add(m.group(0))
    for ns in namespaces:
        m = _TAG.match(ns)
        if m and m.group(0) not in live and _pids_in(ns):
            live.add(m.group(0))
    return live


def cleanup(tag: str = PREFIX) -> int:
    """Delete every namespace and link under ``tag``; by default every recperf one of a run
    that is gone (its owner dead and nobody inside), not the network of a run still going."""
    if available() is not None:
        return 0
    namespaces, links = leftovers(tag)
    if tag == PREFIX:
        live = _live_tags(namespaces, links)
        namespaces = [n for n in namespaces if not n.startswith(tuple(live))]
        links = [x for x in links if not x.startswith(tuple(live))]
    for ns in namespaces:
        _run(["ip", "netns", "del", ns], check=False)
    for link in links:
        _run(["ip", "link", "del", link], check=False)
    return len(namespaces) + len(links)


@contextlib.contextmanager
def machines(nodes: int, bandwidth: str) -> Iterator[EmulatedNetwork | None]:
    """``nodes`` emulated machines for the duration of the block, or None for one machine (the
    ranks then talk over loopback and nothing needs root)."""
    if nodes < 2:
        yield None
        return
    with EmulatedNetwork(nodes, bandwidth) as net:
        yield net
