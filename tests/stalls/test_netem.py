"""Emulated nodes: namespaces joined by a bridge, bandwidth shaped by tc, and no leftovers
after a normal exit, an error inside the block, or a run that never tore down, while the
network of a live run (this process's, or another test worker's) is spared. Needs root (skipped
without it); bandwidth parsing, which does not, is in test_bandwidth.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from recperf.stalls.run import netem

pytestmark = pytest.mark.skipif(netem.available() is not None, reason=str(netem.available()))

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5201)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0
while (b := c.recv(1 << 16)): n += len(b)
print(n, flush=True)
"""


CLIENT = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5201)); t = time.perf_counter()
c.sendall(b"x" * int(sys.argv[2])); c.shutdown(socket.SHUT_WR); c.recv(1)
print(time.perf_counter() - t)
"""


def dead_pid() -> int:
    """The pid of a process that has exited: the owner of a killed run's network."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(proc.stdout)


def test_two_nodes_talk_at_the_shaped_bandwidth() -> None:
    nbytes = 2_500_000  # 20 Mbit: 0.2 s at 100 Mbit/s
    with netem.EmulatedNetwork(2, "100mbit") as net:
        assert net.tag == netem.tag_of(os.getpid())
        a, b = net.nodes
        server = subprocess.Popen(b.command([sys.executable, "-c", SERVER, b.address]),
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        t0 = time.perf_counter()
        out = subprocess.run(a.command([sys.executable, "-c", CLIENT, b.address, str(nbytes)]),
                             capture_output=True, text=True, check=True, timeout=30)  # fmt: skip
        wall = time.perf_counter() - t0
        received = int(server.stdout.readline())
        server.wait(timeout=10)
        assert received == nbytes
        rate = nbytes * 8 / float(out.stdout)
        assert 50e6 < rate < 115e6, rate
        assert wall < 10
        assert net.tag in netem.leftovers(net.tag)[0][0]
    assert netem.leftovers(net.tag) == ([], [])


def test_an_error_inside_still_removes_everything() -> None:
    with pytest.raises(RuntimeError), netem.EmulatedNetwork(3, "1gbit") as net:
        assert sorted(netem.leftovers(net.tag)[0]) == sorted(n.namespace for n in net.nodes)
        raise RuntimeError("crash in the middle of a run")
    assert netem.leftovers(net.tag) == ([], [])


def test_cleanup_removes_what_a_killed_run_left() -> None:
    net = netem.EmulatedNetwork(2, "1gbit", run_id=dead_pid())
    net._build()  # as if its owner had been killed before tearing down
    namespaces, links = netem.leftovers(net.tag)
    assert sorted(namespaces) == sorted(n.namespace for n in net.nodes)
    assert net.bridge in links
    assert netem.cleanup() >= 5
    assert netem.leftovers(net.tag) == ([], [])


def test_cleanup_spares_a_live_runs_network_with_nobody_inside() -> None:
    with netem.EmulatedNetwork(2, "1gbit") as net:  # as profile() between two runs
        before = netem.leftovers(net.tag)
        netem.cleanup()  # `recperf stalls cleanup`, or another test, meanwhile
        assert netem.leftovers(net.tag) == before
    assert netem.leftovers(net.tag) == ([], [])
