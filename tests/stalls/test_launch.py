"""``recperf stalls launch`` on real scripts: the environment its ranks get (compared with
torchrun's own), the example DDP script end to end at one node and on two emulated nodes (with
root), a script that writes no trace, a failing rank and Ctrl-C, and that none of them leaves a
rank process or an emulated machine behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.core.errors import ConfigError
from recperf.stalls.run import netem, runner
from recperf.stalls.run.launch import LaunchConfig, launch, rank_env, trace_dir, trace_path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp_train.py"
RECPERF = [sys.executable, str(Path(sys.executable).parent / "recperf")]
NO_NETEM = netem.available()
cli = CliRunner()

DUMP = """
import json, os, sys
from pathlib import Path
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
(out / f"env{os.environ['RANK']}.json").write_text(json.dumps(dict(os.environ)))
"""
FAIL = """
import os, sys, time
from pathlib import Path
Path(sys.argv[1], "started" + os.environ["RANK"]).touch()
if os.environ["RANK"] == "1":
    print("loading data"); print("boom: bad shard", file=sys.stderr); sys.exit(3)
time.sleep(60)
"""


def _script(tmp: Path, name: str, body: str) -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(body))
    return path


def _tag(pid: int) -> str:
    """The name prefix of the emulated machines process ``pid`` makes (others' runs may be on)."""
    return netem.tag_of(pid)


def _mentioning(text: str) -> list[int]:
    """Live, non-zombie processes whose command line mentions ``text``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if text.encode() in cmdline and state not in ("Z", "X"):
            out.append(int(entry))
    return out


def test_trace_dir_and_path_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECPERF_TRACE_DIR", raising=False)
    assert trace_dir() is None and trace_path() is None
    monkeypatch.setenv("RECPERF_TRACE_DIR", "/x/traces")
    monkeypatch.setenv("RANK", "3")
    assert trace_dir() == Path("/x/traces")
    assert trace_path() == Path("/x/traces/rank3.json")
    assert trace_path(1) == Path("/x/traces/rank1.json")


def test_torchrun_env_shape() -> None:
    rdzv = runner.Rendezvous(ranks=4, nodes=2, addr="10.0.0.1", port=29500, ifname="eth0",
                             threads=3, run_id="r")  # fmt: skip
    env = runner.torchrun_env(rdzv, 3)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE",
                                "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE")} == {
        "RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
    }  # fmt: skip
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["OMP_NUM_THREADS"] == "3" and env["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def test_each_emulated_machine_gets_its_own_gpus_and_nccl_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    rdzv = runner.Rendezvous(ranks=4, nodes=2, addr="10.0.0.1", port=1, ifname="eth0", threads=1)
    envs = [rank_env(rdzv, r, tmp_path, f"ns{r // 2}") for r in range(4)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["4,5", "4,5", "6,7", "6,7"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["NCCL_HOSTID"] for e in envs] == ["ns0", "ns0", "ns1", "ns1"]
    assert envs[3]["RECPERF_TRACE_DIR"] == str(tmp_path / "traces")
    assert envs[3]["TORCHELASTIC_ERROR_FILE"] == str(tmp_path / "rank3.error.json")
    local = rank_env(rdzv, 3, tmp_path, None)  # on this machine: as given
    assert local["CUDA_VISIBLE_DEVICES"] == "4,5,6,7" and "NCCL_HOSTID" not in local
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # fewer GPUs than ranks: left alone
    assert rank_env(rdzv, 3, tmp_path, "ns1")["CUDA_VISIBLE_DEVICES"] == "0"


def test_threads_follow_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert LaunchConfig(command=("true",), ranks=2).threads_per_rank == 3
    assert LaunchConfig(command=("true",), ranks=2, threads=5).threads_per_rank == 5
    monkeypatch.delenv("OMP_NUM_THREADS")
    cores = os.cpu_count() or 1
    assert LaunchConfig(command=("true",), ranks=2).threads_per_rank == max(1, cores // 2)


def test_ranks_get_the_variables_torchrun_sets(tmp_path: Path) -> None:
    dump = _script(tmp_path, "dump.py", DUMP)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    str(dump), str(tmp_path / "torchrun")], check=True, capture_output=True,
                   timeout=60)  # fmt: skip
    config = LaunchConfig(command=(sys.executable, str(dump), str(tmp_path / "ours")), ranks=2)
    with pytest.raises(ConfigError, match=r"wrote no trace into RECPERF_TRACE_DIR=.*tensorboard"):
        launch(config, tmp_path / "out")
    theirs = [json.loads((tmp_path / "torchrun" / f"env{r}.json").read_text()) for r in (0, 1)]
    ours = [json.loads((tmp_path / "ours" / f"env{r}.json").read_text()) for r in (0, 1)]
    # the agent's own signal list, and the terminal size some library in it exports
    added = (
        set(theirs[0]) - set(os.environ) - {"TORCHELASTIC_SIGNALS_TO_HANDLE", "COLUMNS", "LINES"}
    )
    assert added <= set(ours[0]), added - set(ours[0])
    same = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")  # fmt: skip
    for t, o in zip(theirs, ours, strict=True):
        assert {k: o[k] for k in same} == {k: t[k] for k in same}
    assert (
        ours[0]["MASTER_PORT"] == ours[1]["MASTER_PORT"] and ours[0]["MASTER_ADDR"] == "127.0.0.1"
    )
    assert ours[1]["OMP_NUM_THREADS"] == str(config.threads_per_rank)
    assert ours[1]["RECPERF_TRACE_DIR"] == str(tmp_path / "out" / "runs" / "local" / "traces")
    assert ours[1]["GLOO_SOCKET_IFNAME"] == "lo"
    record = json.loads((tmp_path / "out" / "runs" / "local" / "exit.json").read_text())
    assert record["exit_codes"] == [0, 0]
    assert record["command"] == [sys.executable, str(dump), str(tmp_path / "ours")]
    assert not (tmp_path / "out" / "summary.json").exists()


HIDDEN = 256
"""The example's width: (256*256 + 256 + 256 + 1) * 4 bytes of gradients, ~42 ms at 50 Mbit/s."""


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The example through the CLI: 2 ranks on 2 emulated nodes at 50 Mbit/s (with it, a
    1-node run first), or the 1-node run alone where namespaces cannot be made."""
    out = tmp_path_factory.mktemp("launch") / "out"
    nodes = "2" if NO_NETEM is None else "1"
    script = [sys.executable, str(EXAMPLE), "--steps", "10", "--skip", "2", "--hidden",
              str(HIDDEN), "--layers", "1", "--batch-size", "4", "--sleep-ms", "20"]  # fmt: skip
    res = cli.invoke(app, ["stalls", "launch", "--ranks", "2", "--nodes", nodes, "--bandwidth",
                           "50mbit", "--out", str(out), "--json", "--", *script])  # fmt: skip
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert json.loads((out / "summary.json").read_text()) == s
    assert s["command"] == script and s["ranks"] == 2
    for run in [r["name"] for r in s["runs"]]:
        traces = sorted((out / "runs" / run / "traces").iterdir())
        assert len(traces) == 2 and all(t.name.endswith(".pt.trace.json") for t in traces)
        assert (out / "runs" / run / "rank1.log").is_file()
        assert json.loads((out / "runs" / run / "exit.json").read_text())["exit_codes"] == [0, 0]
    stalls = ("data_fetch_stall_s", "data_prep_stall_s", "interconnect_stall_s", "network_stall_s")
    parts = s["compute_s"] + sum(s[k] for k in stalls)
    assert parts + s["unexplained_s"] == pytest.approx(s["iteration_s"])
    assert len(s["per_rank"]) == 2 and s["interconnect_stall_s"] > 0
    return out, s


def test_example_two_ranks_one_node(example: tuple[Path, dict[str, Any]]) -> None:
    out, s = example
    local = json.loads((out / "runs" / "local" / "analysis.json").read_text())
    assert local["nodes"] == 1 and local["network_stall_s"] == 0.0
    assert local["interconnect_stall_s"] == local["exposed_comm_s"] > 0
    assert local["data_fetch_stall_s"] == pytest.approx(0.020, rel=0.35)  # the injected sleep
    assert local["compute_s"] > 0 and len(local["per_rank"]) == 2
    assert s["runs"][0]["name"] == "local" and s["runs"][0]["iteration_s"] == local["iteration_s"]
    assert s["grad_bytes"] == (HIDDEN * HIDDEN + 2 * HIDDEN + 1) * 4  # the traces' message sizes
    assert s["num_layers"] == 1
    if NO_NETEM is not None:
        assert s["nodes"] == 1 and s["cross_check"] == {} and "need" in s["skipped"]["network"]


@pytest.mark.skipif(NO_NETEM is not None, reason=f"emulated nodes: {NO_NETEM}")
def test_example_on_two_emulated_nodes_gives_the_network_stall_both_ways(
    example: tuple[Path, dict[str, Any]],
) -> None:
    _, s = example
    assert [r["name"] for r in s["runs"]] == ["local", "network"]
    line_rate_s = s["grad_bytes"] / (50e6 / 8)  # 2 ranks: each sends its gradients' bytes once
    figures = (s["network_stall_s"], s["direct"]["network_stall_s"], line_rate_s)
    assert 0.7 * line_rate_s < s["network_stall_s"] < 1.4 * line_rate_s, figures
    assert 0.7 * line_rate_s < s["direct"]["network_stall_s"] < 1.4 * line_rate_s, figures
    assert s["cross_check"]["network_stall_s"]["rel_diff"] < 0.3
    assert s["nodes"] == 2 and s["bandwidth_bits_per_s"] == 50e6
    assert s["method"]["network_stall_s"].startswith("differential")
    assert s["data_fetch_stall_s"] == pytest.approx(0.020, rel=0.35)
    assert netem.leftovers(_tag(os.getpid())) == ([], [])


def test_a_failing_rank_stops_the_run_and_leaves_nothing(tmp_path: Path) -> None:
    fail = _script(tmp_path, "fail.py", FAIL)
    nodes = 2 if NO_NETEM is None else 1
    config = LaunchConfig(command=(sys.executable, str(fail), str(tmp_path)), ranks=2,
                          nodes=nodes, timeout_s=30)  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(
        runner.RunError, match=r"run local: rank 1 exited with 3: .*boom: bad shard"
    ):
        launch(config, tmp_path / "out")
    assert time.monotonic() - t0 < 15  # rank 0's 60 s sleep was cut short
    assert (tmp_path / "started0").exists()
    record = json.loads((tmp_path / "out" / "runs" / "local" / "exit.json").read_text())
    assert record["exit_codes"][1] == 3 and "rank 1 exited with 3" in record["error"]
    assert record["command"] == [sys.executable, str(fail), str(tmp_path)]
    assert _mentioning(str(fail)) == []
    assert not (tmp_path / "out" / "summary.json").exists()
    if NO_NETEM is None:
        assert netem.leftovers(_tag(os.getpid())) == ([], [])


def test_ctrl_c_kills_every_rank_and_removes_the_machines(tmp_path: Path) -> None:
    sig = signal.SIGINT  # SIGTERM unwinds the same way (cli.main; tests/test_signals.py)
    sleeper = _script(tmp_path, "sleep.py", FAIL.replace('"1"', '"never"'))
    nodes = "2" if NO_NETEM is None else "1"
    with (tmp_path / "stderr.txt").open("wb") as err:
        proc = subprocess.Popen([*RECPERF, "stalls", "launch", "--ranks", "2", "--nodes", nodes,
                                 "--out", str(tmp_path / "out"), "--", sys.executable,
                                 str(sleeper), str(tmp_path)], stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)  # fmt: skip
    tag = _tag(proc.pid)
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"started{r}").exists() for r in (0, 1)):
            assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()
            assert time.monotonic() < deadline, "ranks did not start"
            time.sleep(0.05)
        if NO_NETEM is None:
            assert netem.leftovers(tag)[0], "no emulated machine while the ranks run"
        assert len(set(_mentioning(str(sleeper))) - {proc.pid}) == 2  # the ranks
        os.killpg(proc.pid, sig)  # as a terminal's Ctrl-C: to the whole process group
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err_text = (tmp_path / "stderr.txt").read_text()
    assert rc == 128 + sig, err_text
    assert "interrupted" in err_text and "Traceback" not in err_text
    assert _mentioning(str(sleeper)) == []
    if NO_NETEM is None:
        assert netem.leftovers(tag) == ([], [])
    assert not (tmp_path / "out" / "summary.json").exists()


@pytest.mark.skipif(NO_NETEM is not None, reason=f"emulated nodes: {NO_NETEM}")
def test_a_cleanup_sweep_spares_the_machines_of_a_running_launch() -> None:
    owner = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    # a network whose owner has exited: only the rank running inside keeps it alive
    with netem.EmulatedNetwork(2, "1gbit", run_id=int(owner.stdout)) as net:
        rank = subprocess.Popen(net.nodes[1].command([sys.executable, "-c", "import time; "
                                                      "time.sleep(30)"]))  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while not subprocess.run(["ip", "netns", "pids", net.nodes[1].namespace],
                                     capture_output=True, text=True).stdout.strip():  # fmt: skip
                assert time.monotonic() < deadline
                time.sleep(0.05)
            netem.cleanup()  # `recperf stalls cleanup`, or another test, while the run goes on
            namespaces, links = netem.leftovers(net.tag)
            assert sorted(namespaces) == sorted(n.namespace for n in net.nodes)
            assert net.bridge in links
        finally:
            rank.kill()
            rank.wait()
    assert netem.leftovers(net.tag) == ([], [])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "command: give the training command after --"),
        (["--", "no-such-program-xyz"], "command 'no-such-program-xyz': not found"),
        (["--ranks", "3", "--nodes", "2", "--", "true"], "multiple of nodes"),
        (["--nodes", "3", "--", "true"], "nodes = 3 is outside the allowed range [1, 2]"),
        (["--bandwidth", "fast", "--", "true"], "bandwidth 'fast'"),
        (["--timeout", "0", "--", "true"], "timeout_s = 0.0 is outside"),
        (["--set", "launch.gpus=2", "--", "true"], "unknown key 'gpus'; allowed: bandwidth"),
    ],
)
def test_bad_input_is_one_line(args: list[str], needle: str, tmp_path: Path) -> None:
    res = cli.invoke(app, ["stalls", "launch", "--out", str(tmp_path), *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
