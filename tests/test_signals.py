"""Signals during real CLI runs leave nothing behind: SIGTERM, SIGINT and SIGHUP (a closed
terminal or ssh session) unwind a command like Ctrl-C (one line ``interrupted``, exit 128 +
signal, no traceback), also while its modules are still being imported, and the processes,
shared memory, namespaces and temporary files it made are gone; after a SIGKILL of the ingest
coordinator its workers exit by themselves and remove the pipeline's shared memory."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from recperf.ingest.data.criteo import GenerateConfig, generate
from recperf.ingest.live.dispatch import sweep_stale_items
from recperf.ingest.live.items import SHM_DIR
from recperf.stalls.run import netem

RECPERF = [sys.executable, str(Path(sys.executable).parent / "recperf")]


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process, None if gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), fields[19]


def _descendants(root: int) -> dict[int, str]:
    """Live descendants of ``root``: pid to start time (to tell a reused pid apart)."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            parents[int(entry)] = st
    out: dict[int, str] = {}
    frontier = {root}
    while frontier:
        frontier = {p for p, (pp, _) in parents.items() if pp in frontier and p not in out}
        out.update((p, parents[p][1]) for p in frontier)
    return out


def _alive(procs: dict[int, str]) -> list[int]:
    return [p for p, start in procs.items() if (st := _stat(p)) is not None and st[1] == start]


def _mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions ``text`` (this test's unique tmp path)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if text.encode() in cmdline and _stat(int(entry)) is not None:
            out.append(int(entry))
    return out


def _shm_of(pid: int) -> list[str]:
    return sorted(p.name for p in SHM_DIR.glob(f"rp{pid}x*-*"))


def _until(cond: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


@dataclass
class Run:
    proc: subprocess.Popen[bytes]
    tmp: Path
    seen: dict[int, str]
    """Every descendant seen while it ran."""

    def watch(self) -> None:
        self.seen.update(_descendants(self.proc.pid))

    def stderr(self) -> str:
        return (self.tmp / "stderr.txt").read_text(errors="replace")

    def finish(self, timeout_s: float = 30) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {timeout_s} s after the signal") from None


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[[list[str]], Run]]:
    runs: list[Run] = []

    def _start(args: list[str]) -> Run:
        with (
            (tmp_path / "stdout.txt").open("wb") as out,
            (tmp_path / "stderr.txt").open("wb") as err,
        ):
            proc = subprocess.Popen([*RECPERF, *args], stdout=out, stderr=err,
                                    start_new_session=True)  # fmt: skip
        runs.append(Run(proc, tmp_path, {}))
        return runs[-1]

    yield _start
    for run in runs:  # a failed test must not leave its run behind either
        for pid in [run.proc.pid, *_alive(run.seen)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        run.proc.wait()


def _work_started(run: Run, cond: Callable[[], object], timeout_s: float, what: str) -> None:
    def ready() -> object:
        assert run.proc.poll() is None, f"exited early with {run.proc.returncode}: {run.stderr()}"
        run.watch()
        return cond()

    _until(ready, timeout_s, what)
    time.sleep(0.3)  # inside the work, not at its first step
    run.watch()


def _interrupt(run: Run, sig: signal.Signals) -> None:
    if sig in (signal.SIGINT, signal.SIGHUP):  # a terminal's Ctrl-C or hang-up: to the group
        os.killpg(run.proc.pid, sig)
    else:  # as kill(1), a supervisor or a batch system: to the command only
        run.proc.send_signal(sig)


def _check_interrupted(run: Run, sig: signal.Signals, gone_s: float = 5) -> None:
    rc = run.finish()
    err = run.stderr()
    assert rc == 128 + sig, err
    lines = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    _until(lambda: not _alive(run.seen), gone_s, f"processes {_alive(run.seen)} to exit")
    assert _mentioning(str(run.tmp)) == []


def _name(sig: signal.Signals) -> str:
    return sig.name


def _tmp_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.rglob(".*.tmp"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("signals-data")
    generate(GenerateConfig(rows=200_000), out)
    return out


def _ingest_run(start: Callable[[list[str]], Run], data: Path, tmp: Path) -> Run:
    run = start(["ingest", "run", "--data", str(data), "--seconds", "60", "--cores", "2",
                 "--out", str(tmp / "out")])  # fmt: skip
    _work_started(
        run, lambda: run.seen and _shm_of(run.proc.pid), 30, "ingest workers and shared memory"
    )
    assert _alive(run.seen), "no worker process seen"
    return run


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()  # reaped: its pid names no process now
    return child.pid


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_ingest_run_interrupted_leaves_nothing(
    start: Callable[[list[str]], Run], dataset: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    # what a pipeline killed with all its workers at once (e.g. by the OOM killer) would leave:
    # the next run's start removes it
    stale = SHM_DIR / f"rp{_dead_pid()}x0-ring-0"
    stale.write_bytes(b"x" * 16)
    run = _ingest_run(start, dataset, tmp_path)
    assert not stale.exists()
    assert _shm_of(run.proc.pid) != []
    _interrupt(run, sig)
    _check_interrupted(run, sig)
    assert _shm_of(run.proc.pid) == []
    assert _tmp_files(tmp_path) == []


def test_ingest_coordinator_killed_workers_exit_and_clean(
    start: Callable[[list[str]], Run], dataset: Path, tmp_path: Path
) -> None:
    run = _ingest_run(start, dataset, tmp_path)
    workers = dict(run.seen)
    run.proc.send_signal(signal.SIGKILL)
    assert run.finish() == -signal.SIGKILL
    # the kernel's parent-death signal tells each worker, which removes the pipeline's files
    _until(lambda: not _alive(workers), 5, f"workers {_alive(workers)} to exit")
    _until(lambda: not _shm_of(run.proc.pid), 5, "the killed pipeline's shared memory to go")


def test_sweep_removes_only_shared_memory_of_dead_pipelines() -> None:
    dead = _dead_pid()
    stale = [SHM_DIR / f"rp{dead}x0-ring-0", SHM_DIR / f"rp{dead}x0-c3-s1-0"]
    mine = SHM_DIR / f"rp{os.getpid()}x999-ring-0"  # a live pipeline's: kept
    for path in [*stale, mine]:
        path.write_bytes(b"x" * 16)
    try:
        assert sweep_stale_items() >= 2
        assert [p.exists() for p in stale] == [False, False]
        assert mine.exists()
    finally:
        for path in [*stale, mine]:
            path.unlink(missing_ok=True)


def test_ingest_generate_sigterm_removes_temporary_shard(
    start: Callable[[list[str]], Run], tmp_path: Path
) -> None:
    out = tmp_path / "gen"
    run = start(["ingest", "generate", "--rows", "50000000", "--out", str(out)])

    def writing() -> bool:
        return any(p.stat().st_size > 0 for p in out.glob(".*.tmp")) if out.exists() else False

    _work_started(run, writing, 30, "the temporary shard to grow")
    run.proc.send_signal(signal.SIGTERM)
    _check_interrupted(run, signal.SIGTERM)
    assert sorted(p.name for p in out.iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=_name)
def test_cluster_sweep_interrupted_stops_the_pool(
    start: Callable[[list[str]], Run], tmp_path: Path, sig: signal.Signals
) -> None:
    out = tmp_path / "sweep"
    run = start(["cluster", "sweep", "--traces", "tiresias-480", "--schedulers",
                 "fifo,sjf,tiresias", "--seeds", "0-20", "--out", str(out)])  # fmt: skip

    def pool_workers() -> bool:  # forked by the forkserver, a child of the command
        return any((st := _stat(p)) is not None and st[0] != run.proc.pid for p in run.seen)

    _work_started(run, pool_workers, 60, "the process pool's workers")
    _interrupt(run, sig)
    _check_interrupted(run, sig)
    assert _tmp_files(tmp_path) == []
    assert not (out / "sweep.json").exists()


@pytest.mark.skipif(netem.available() is not None, reason=f"netem: {netem.available()}")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=_name)
def test_stalls_profile_interrupted_removes_namespaces_and_ranks(
    start: Callable[[list[str]], Run], tmp_path: Path, sig: signal.Signals
) -> None:
    out = tmp_path / "prof"
    run = start(["stalls", "profile", "--nodes", "2", "--ranks", "2", "--iters", "50",
                 "--out", str(out)])  # fmt: skip
    tag = netem.tag_of(run.proc.pid)

    def ranks_in_namespaces() -> bool:
        return bool(netem.leftovers(tag)[0]) and len(_mentioning(str(tmp_path))) >= 2

    _work_started(run, ranks_in_namespaces, 90, "ranks running in emulated nodes")
    _interrupt(run, sig)
    _check_interrupted(run, sig)
    assert netem.leftovers(tag) == ([], [])
    assert _tmp_files(tmp_path) == []


@pytest.mark.skipif(netem.available() is not None, reason=f"netem: {netem.available()}")
def test_stalls_launch_sighup_removes_namespaces_and_ranks(
    start: Callable[[list[str]], Run], tmp_path: Path
) -> None:
    # a user's training command that runs long: the ranks mention tmp_path in their arguments
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)", str(tmp_path)]
    run = start(["stalls", "launch", "--nodes", "2", "--ranks", "2", "--out",
                 str(tmp_path / "launch"), "--", *sleeper])  # fmt: skip
    tag = netem.tag_of(run.proc.pid)

    def ranks_in_namespaces() -> bool:
        return bool(netem.leftovers(tag)[0]) and len(_mentioning(str(tmp_path))) >= 2

    _work_started(run, ranks_in_namespaces, 90, "ranks running in emulated nodes")
    _interrupt(run, signal.SIGHUP)
    _check_interrupted(run, signal.SIGHUP)
    assert netem.leftovers(tag) == ([], [])
    assert _tmp_files(tmp_path) == []


def _catches(pid: int, sigs: tuple[signal.Signals, ...]) -> bool:
    """Whether process ``pid`` has handlers installed for all of ``sigs`` (/proc's SigCgt)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(next(ln for ln in status.splitlines() if ln.startswith("SigCgt:")).split()[1], 16)
    return all(mask >> (s - 1) & 1 for s in sigs)


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


@pytest.mark.parametrize("phase", ["app", "torch"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=_name)
def test_a_signal_while_the_cli_imports_is_one_line(
    start: Callable[[list[str]], Run], tmp_path: Path, sig: signal.Signals, phase: str
) -> None:
    # the handlers go in first in main(); the app, then the command's own modules (torch for
    # embed stats) load after them
    run = start(["embed", "stats", "--trace", "uniform", "--rows", "1000", "--batch-lookups",
                 "100", "--top-k", "10", "--out", str(tmp_path / "out")])  # fmt: skip
    _until(lambda: _catches(run.proc.pid, (signal.SIGTERM, signal.SIGHUP)), 30, "the handlers")
    if phase == "app":
        assert "torch" not in _maps(run.proc.pid)  # the app's modules are still loading
    else:
        _until(lambda: "torch/lib" in _maps(run.proc.pid), 30, "torch to start loading")
    _interrupt(run, sig)
    _check_interrupted(run, sig)
    assert not (tmp_path / "out" / "summary.json").exists()


def _threads_of(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_ingest_run_of_thread_workers_interrupted_leaves_nothing(
    start: Callable[[list[str]], Run],
    dataset: Path,
    tmp_path: Path,
    sig: signal.Signals,
    threads: int,
) -> None:
    """Two worker threads in the consumer's process (no worker process, no shared memory), or
    two worker processes of two threads each: a signal mid-run unwinds all of it."""
    run = start(["ingest", "run", "--data", str(dataset), "--seconds", "60", "--cores", "2",
                 "--threads", str(threads), "--out", str(tmp_path / "out")])  # fmt: skip
    if threads == 0:  # the main thread, the coordinator and two workers at least
        _work_started(run, lambda: _threads_of(run.proc.pid) >= 4, 30, "worker threads")
        assert not _alive(run.seen), "no worker process: the shape is applied before the start"
    else:
        _work_started(run, lambda: len(run.seen) >= 2 and _shm_of(run.proc.pid), 30,
                      "worker processes and shared memory")  # fmt: skip
        assert all(_threads_of(pid) >= 3 for pid in _alive(run.seen)), "two compute threads"
    _interrupt(run, sig)
    _check_interrupted(run, sig)
    assert _shm_of(run.proc.pid) == []
    assert _tmp_files(tmp_path) == []


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _foreign_shm(name: str, mine: set[int]) -> bool:
    """A shared-memory file another engineer's native pipeline made meanwhile (rp<pid>x...)."""
    m = re.match(r"rp(\d+)x", name)
    return m is not None and int(m.group(1)) not in mine


def test_ingest_run_on_ray_sigterm_shuts_ray_down(
    start: Callable[[list[str]], Run], tmp_path: Path
) -> None:
    """A local Ray instance (GCS, raylet, an actor pool of the spec pipeline) unwinds like the
    native engine: one line, 143, and every Ray process and object-store file gone."""
    shm = set(os.listdir("/dev/shm"))
    out = str(tmp_path / "out")
    run = start(["ingest", "run", "--engine", "ray", "--spec", "live-2", "--cpus-per-node", "2",
                 "--alloc", "fused", "--seconds", "120", "--out", out])  # fmt: skip

    def streaming() -> bool:  # the operator's actors run: the dataset is executing
        names = {_comm(p) for p in run.seen}
        return {"raylet", "gcs_server"} <= names and any(
            n.startswith("ray::MapWorker") for n in names
        )

    _work_started(run, streaming, 240, "Ray's GCS, raylet and the operator's actors")
    run.proc.send_signal(signal.SIGTERM)
    _check_interrupted(run, signal.SIGTERM, gone_s=10)
    mine = {run.proc.pid, *run.seen}
    assert [n for n in set(os.listdir("/dev/shm")) - shm if not _foreign_shm(n, mine)] == []
    assert not (tmp_path / "out" / "summary.json").exists()
