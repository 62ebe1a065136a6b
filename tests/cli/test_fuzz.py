"""A fuzzer over the whole CLI: for every command, hypothesis puts a bad value into one option
(NaN, infinities, negatives, zero, huge numbers, wrong types, empty strings, odd paths with
brackets, spaces and non-ASCII) or feeds a corrupted copy of a bundled input, and every run must
exit 0 or 2, print no traceback and at most one error line, and leave nothing behind: no new
file outside --out, no new shared-memory file and no child process. Budgets are tiny so it fits
the suite's time; the count of inputs tried is printed (``-s``) and recorded in RESULTS.md."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.ingest.live.items import SHM_DIR

runner = CliRunner()
TRIED: dict[str, int] = {}
"""Runs per command, for the summary line."""

BAD_VALUES = [
    "nan", "NaN", "inf", "-inf", "-1", "0", "-0.5", "1e308", "1e23", "99999999999999999999",
    "abc", "", " ", "[x]", "[/]", "[bold]x[/bold]", ":100:", "1,,2", "0-", "ü", "x=1", "a.b=c",
]  # fmt: skip
ODD_NAMES = ["has space", "br[ack]et", "[/]", "ünï", "-dash", "a" * 200]


@dataclass(frozen=True)
class Case:
    """One command, the arguments that make it cheap and valid, and options not to fuzz."""

    path: tuple[str, ...]
    base: tuple[str, ...]
    skip: frozenset[str] = frozenset()
    examples: int = 25


def _cases(data: Path, prof: Path, model: Path) -> list[Case]:
    tiny_mlp = ("--set", "mlp.features=8", "--set", "mlp.hidden=4")
    return [
        Case(
            ("cluster", "simulate"), ("--trace", "tiresias-60", "--scheduler", "fifo"), examples=20
        ),
        Case(("cluster", "compare"), ("--trace", "tiresias-60", "--schedulers", "fifo,sjf")),
        Case(
            ("cluster", "sweep"),
            ("--traces", "tiresias-60", "--schedulers", "fifo", "--backend", "serial"),
            skip=frozenset({"--address", "--workers"}),
        ),
        Case(("ingest", "generate"), ("--rows", "2000"), examples=15),
        Case(
            ("ingest", "simulate"), ("--spec", "criteo-16", "--tuner", "static", "--budget-s", "3")
        ),
        Case(("ingest", "run"), ("--data", str(data), "--seconds", "0.3"), examples=6),
        Case(
            ("ingest", "tune"),
            (
                "--data",
                str(data),
                "--tuner",
                "static",
                "--budget-s",
                "1",
                "--warmup-s",
                "0.2",
                "--final-s",
                "0.3",
            ),
            examples=4,
        ),
        Case(("ingest", "pretrain"), ("--episodes", "1"), examples=4),
        Case(
            ("stalls", "profile"),
            (
                "--workload",
                "mlp",
                "--ranks",
                "1",
                "--iters",
                "1",
                "--warmup",
                "0",
                "--no-real-data",
                "--batch-size",
                "4",
                *tiny_mlp,
            ),
            skip=frozenset({"--nodes", "--device"}),
            examples=4,
        ),
        Case(("stalls", "analyze"), ("--run", str(prof / "runs" / "compute"))),
        Case(("stalls", "fit"), ("--profiles", str(prof))),
        Case(
            ("stalls", "predict"),
            ("--model", str(model), "--grad-bytes", "1e6", "--layers", "2", "--ranks", "2"),
            examples=20,
        ),
        Case(("stalls", "advise"), ("--profile", str(prof), "--budget-h", "2"), examples=15),
        Case(
            ("embed", "stats"),
            ("--trace", "uniform", "--rows", "1000", "--batch-lookups", "100", "--top-k", "10"),
            examples=15,
        ),
        Case(("embed", "check"), ("--variants", "torch", "--device", "cpu")),
        Case(
            ("embed", "bench"),
            (
                "--config",
                "small",
                "--variants",
                "torch",
                "--batch-size",
                "16",
                "--reps",
                "1",
                "--trace",
                "uniform",
            ),
            examples=8,
        ),
        Case(
            ("embed", "compile"),
            ("--block-n", "16", "--num-warps", "4", "--bags", "1", "--prefetch", "0"),
            examples=4,
        ),
    ]


def fuzz_settings(examples: int) -> settings:
    """Deterministic, no deadline (a run may take seconds), no example database."""
    return settings(
        max_examples=examples, deadline=None, derandomize=True, database=None,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip


def _options(path: tuple[str, ...]) -> list[Any]:
    """The command's options (typer's own click objects: read by duck typing)."""
    cmd: Any = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return [p for p in cmd.params if p.param_type_name == "option" and "--help" not in p.opts]


def _children() -> set[int]:
    """Processes whose parent is this one."""
    me, kids = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            kids.add(int(stat.parent.name))
    return kids


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")} if root.exists() else set()


def _shm() -> set[str]:
    """This process's shared-memory files (an in-process run's pipeline is named after its
    coordinator's pid, ``rp<pid>x<n>-...``): another run on the machine is not ours to count."""
    return {p.name for p in SHM_DIR.glob(f"rp{os.getpid()}x*")}


def _run(args: list[str], cwd: Path, out: Path | None, limit_s: int = 0) -> Any:
    """One fuzzed invocation and every check on it (within ``limit_s`` seconds when given: a
    read that blocks, say on a FIFO, is cut by SIGALRM and fails the check); its result."""
    before_files, before_shm, before_kids = _files(cwd), _shm(), _children()
    with _time_limit(limit_s, args):
        res = runner.invoke(app, args)
    text = res.stdout + res.stderr
    where = f"recperf {' '.join(args)}"
    assert res.exit_code in (0, 2), (
        f"{where}: exit {res.exit_code}: {text[-800:]} {res.exception!r}"
    )
    if res.exit_code == 2:
        assert res.exception is None or isinstance(res.exception, SystemExit), where
    assert "Traceback" not in text, f"{where}: {text[-800:]}"
    errors = [line for line in text.splitlines() if line.startswith("error")]
    assert len(errors) <= 1, f"{where}: {errors}"
    if res.exit_code == 2:  # click's own usage errors print a box; ours one line
        assert errors or "Usage:" in text, f"{where}: exit 2 without a message: {text[-400:]}"
    new = {p for p in _files(cwd) - before_files if out is None or out not in (p, *p.parents)}
    assert not new, f"{where}: left {sorted(map(str, new))[:5]}"
    deadline = time.monotonic() + 10
    while (_shm() - before_shm or _children() - before_kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _shm() - before_shm, f"{where}: left /dev/shm {sorted(_shm() - before_shm)[:5]}"
    assert not _children() - before_kids, f"{where}: left child processes"
    return res


@contextlib.contextmanager
def _time_limit(seconds: int, args: list[str]) -> Iterator[None]:
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"recperf {' '.join(args)}: still running after {seconds} s")

    if seconds <= 0:
        yield
        return
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    root = tmp_path_factory.mktemp("fuzz-inputs")
    data = root / "data"
    for args in (
        ["--rows", "20000", "--out", str(data)],
        ["--rows", "2000", "--format", "tsv", "--gzip", "--out", str(root / "tsv")],
    ):
        assert runner.invoke(app, ["ingest", "generate", *args]).exit_code == 0
    prof = root / "prof"
    res = runner.invoke(
        app,
        ["stalls", "profile", "--workload", "mlp", "--ranks", "1", "--iters", "2", "--warmup", "0",
         "--no-real-data", "--batch-size", "4", "--set", "mlp.features=8", "--set",
         "mlp.hidden=4", "--out", str(prof)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    model = root / "model.json"
    model.write_text(
        '{"alpha_s": 1e-4, "bucket_s": 1e-5, "beta_intra_s_per_byte": 1e-10, '
        '"net_efficiency": 0.8, "beta_net_s_per_byte": 1e-8, "samples": 3}'
    )
    yield data, prof, model
    total = sum(TRIED.values())
    print(f"\ncli fuzzer: {total} bad inputs over {len(TRIED)} commands and inputs: {TRIED}")


def _case_ids() -> list[str]:
    return [" ".join(c.path) for c in _cases(Path("d"), Path("p"), Path("m"))]


@pytest.mark.parametrize("index", range(len(_case_ids())), ids=_case_ids())
def test_a_bad_option_value_is_one_line_or_accepted(
    index: int, inputs: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = _cases(*inputs)[index]
    options = [o for o in _options(case.path) if not set(o.opts) & case.skip]
    monkeypatch.chdir(tmp_path)
    counter = iter(range(10**6))

    @fuzz_settings(case.examples)
    @given(st.data())
    def fuzz(data: st.DataObject) -> None:
        work = tmp_path / f"run{next(counter)}"
        work.mkdir()
        out = work / data.draw(st.sampled_from(["out", *ODD_NAMES]), label="out name")
        option = data.draw(st.sampled_from(options), label="option")
        flag = data.draw(st.sampled_from([o for o in option.opts if o.startswith("--")]))
        if option.is_flag:
            args = [*case.base, flag]
        else:
            value = data.draw(
                st.sampled_from([*BAD_VALUES, str(work), str(work / ODD_NAMES[1] / "x")]),
                label="value",
            )
            args = [*case.base, flag, value]
        if any(o.name == "out_path" for o in _options(case.path)) and flag != "--out":
            args += ["--out", str(out / "w.pt" if case.path[-1] in ("pretrain", "fit") else out)]
        TRIED[" ".join(case.path)] = TRIED.get(" ".join(case.path), 0) + 1
        if flag == "--out":  # whatever the value names is where results may go
            out = tmp_path / args[-1] if args[-1].strip() else tmp_path
        _run(args, tmp_path, out)
        shutil.rmtree(work, ignore_errors=True)

    fuzz()


CORRUPTIBLE = {
    "tiresias": ("cluster/tiresias/trace-60.csv", ("cluster", "simulate", "--format", "tiresias",
                 "--scheduler", "fifo", "--trace")),
    "helios": ("cluster/helios/sense-500.json", ("cluster", "simulate", "--format", "helios",
               "--scheduler", "fifo", "--trace")),
    "philly": ("cluster/philly/23dbec.trace", ("cluster", "simulate", "--format", "philly",
               "--scheduler", "fifo", "--trace")),
    "spec": ("ingest/criteo-16.toml", ("ingest", "simulate", "--tuner", "static", "--budget-s",
             "2", "--spec")),
    "catalog": ("cloud/aws-gpu-instances.csv", ("stalls", "advise", "--budget-h", "2",
                "--catalog")),
    "gpus": ("cloud/gpu-models.csv", ("stalls", "advise", "--budget-h", "2", "--gpus")),
    "embed-trace": ("embedding/reuse-medium-500k.txt", ("embed", "stats", "--batch-lookups",
                    "100", "--top-k", "10", "--trace")),
    "parquet": ("data/part-00000.parquet", ("ingest", "run", "--seconds", "0.3", "--data")),
    "tsv-gz": ("tsv/part-00000.tsv.gz", ("ingest", "run", "--seconds", "0.3", "--data")),
}  # fmt: skip
"""Input kind -> (bundled file, or one the fixture generated; the command that reads it)."""


def _source(relative: str, root: Path) -> bytes:
    """The file's bytes: generated inputs under ``root``, else bundled (the embedding trace cut
    to its first 5,000 ids, so a run stays short)."""
    from importlib import resources

    if relative.startswith(("data/", "tsv/")):
        return (root / relative).read_bytes()
    raw = (resources.files("recperf") / "data" / relative).read_bytes()
    return b"\n".join(raw.split(b"\n")[:5000]) if relative.startswith("embedding/") else raw


def _corrupt(raw: bytes, data: st.DataObject) -> bytes:
    kind = data.draw(st.sampled_from(["truncate", "flip", "drop-line", "garble-field", "binary"]))
    if kind == "truncate":
        return raw[: data.draw(st.integers(0, max(len(raw) - 1, 0)))]
    if kind == "flip":
        i = data.draw(st.integers(0, len(raw) - 1))
        return raw[:i] + bytes([raw[i] ^ data.draw(st.integers(1, 255))]) + raw[i + 1 :]
    lines = raw.split(b"\n")
    i = data.draw(st.integers(0, len(lines) - 1))
    if kind == "drop-line":
        return b"\n".join(lines[:i] + lines[i + 1 :])
    if kind == "binary":
        return bytes(range(256)) * 4
    sep = b"," if b"," in lines[i] else b" "
    parts = lines[i].split(sep)
    j = data.draw(st.integers(0, len(parts) - 1))
    parts[j] = data.draw(st.sampled_from([b"nan", b"-1", b"1e308", b"", b"x\xff", b"[/]"]))
    lines[i] = sep.join(parts)
    return b"\n".join(lines)


@pytest.mark.parametrize("kind", sorted(CORRUPTIBLE))
def test_a_corrupted_bundled_input_is_one_line_or_accepted(
    kind: str, inputs: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    relative, args = CORRUPTIBLE[kind]
    data_dir, prof, _ = inputs
    raw = _source(relative, data_dir.parent)
    monkeypatch.chdir(tmp_path)
    counter = iter(range(10**6))

    @fuzz_settings(6 if "run" in args else 25)
    @given(st.data())
    def fuzz(data: st.DataObject) -> None:
        work = tmp_path / f"run{next(counter)}"
        work.mkdir()
        bad = work / Path(relative).name
        bad.write_bytes(_corrupt(raw, data))
        extra = ["--profile", str(prof)] if args[0] == "stalls" else []
        out = work / "out"
        TRIED[f"corrupt {kind}"] = TRIED.get(f"corrupt {kind}", 0) + 1
        _run([*args, str(bad), *extra, "--out", str(out)], tmp_path, out)

    fuzz()


# ------------------------------------------- special files, long names, full disks, hang-ups

INPUT_FLAGS = {
    "trace": ("cluster", "simulate", "--scheduler", "fifo", "--format", "tiresias", "--trace"),
    "cluster": ("cluster", "simulate", "--scheduler", "fifo", "--trace", "tiresias-60",
                "--cluster"),
    "config": ("cluster", "simulate", "--scheduler", "fifo", "--trace", "tiresias-60",
               "--config"),
    "sweep-traces": ("cluster", "sweep", "--schedulers", "fifo", "--backend", "serial",
                     "--traces"),
    "spec": ("ingest", "simulate", "--tuner", "static", "--budget-s", "1", "--spec"),
    "data": ("ingest", "run", "--seconds", "0.3", "--data"),
    "alloc": ("ingest", "run", "--seconds", "0.3", "--data", "{data}", "--alloc"),
    "model": ("stalls", "predict", "--grad-bytes", "1e6", "--layers", "2", "--ranks", "2",
              "--model"),
    "kineto": ("stalls", "analyze", "--traces"),
    "run": ("stalls", "analyze", "--run"),
    "profile": ("stalls", "advise", "--budget-h", "2", "--profile"),
    "catalog": ("stalls", "advise", "--budget-h", "2", "--profile", "{prof}", "--catalog"),
    "profiles": ("stalls", "fit", "--profiles"),
    "export": ("stalls", "export", "--profile"),
    "embed-trace": ("embed", "stats", "--rows", "1000", "--batch-lookups", "100", "--top-k",
                    "10", "--trace"),
}  # fmt: skip
"""Every option that names an input file or directory, with what makes the rest valid."""
SPECIAL = ("fifo", "dev-zero", "directory", "long-name")


def _special(kind: str, work: Path) -> str:
    """A path of ``kind``: a FIFO nobody writes, a device that never ends, a directory, or a
    name with a 300-byte component (the usual limit is 255)."""
    if kind == "fifo":
        os.mkfifo(work / "in.csv")
        return str(work / "in.csv")
    if kind == "directory":
        (work / "in.d").mkdir()
        return str(work / "in.d")
    return "/dev/zero" if kind == "dev-zero" else str(work / ("n" * 300) / "in.csv")


@pytest.mark.parametrize("flag", sorted(INPUT_FLAGS))
def test_a_special_file_or_long_name_as_input_is_one_line_at_once(
    flag: str, inputs: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, prof, _ = inputs
    monkeypatch.chdir(tmp_path)
    for kind in SPECIAL:
        work = tmp_path / kind
        work.mkdir()
        base = [a.format(data=data, prof=prof) for a in INPUT_FLAGS[flag]]
        args = [*base, _special(kind, work), "--out", str(work / "out")]
        TRIED[f"special {kind}"] = TRIED.get(f"special {kind}", 0) + 1
        res = _run(args, tmp_path, work / "out", limit_s=30)
        if kind != "directory":  # a directory is what some of these options take
            assert res.exit_code == 2, f"{kind}: {res.output[-400:]}"


@pytest.mark.parametrize(
    "args",
    [("cluster", "simulate", "--scheduler", "fifo", "--trace", "tiresias-60"),
     ("ingest", "generate", "--rows", "100"),
     ("stalls", "fit", "--profiles", "{prof}")],
    ids=lambda a: " ".join(a[:2]),
)  # fmt: skip
def test_an_overlong_out_name_is_one_line(
    args: tuple[str, ...], inputs: tuple[Path, Path, Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    out = tmp_path / ("o" * 300) / "x"
    res = _run([*(a.format(prof=inputs[1]) for a in args), "--out", str(out)], tmp_path, None, 30)
    assert res.exit_code == 2 and "300 bytes, over the file system's limit" in res.output


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, filled: every write on it fails with ENOSPC (needs root to mount)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                           capture_output=True, text=True)  # fmt: skip
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mount.stderr.strip()}")
    try:
        with contextlib.suppress(OSError), (disk / "filler").open("wb") as fh:
            fh.write(b"x" * (1 << 20))
        (disk / "out").mkdir(exist_ok=True)
        yield disk
    finally:  # lazily: a writer that failed may hold a descriptor until it is collected
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


@pytest.mark.parametrize(
    "args",
    [("cluster", "simulate", "--scheduler", "fifo", "--trace", "tiresias-60"),
     ("stalls", "advise", "--budget-h", "2", "--profile", "{prof}")],
    ids=lambda a: " ".join(a[:2]),
)  # fmt: skip
def test_a_full_disk_is_one_line_and_leaves_no_temporary(
    args: tuple[str, ...], inputs: tuple[Path, Path, Path], full_disk: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(full_disk.parent)
    out = full_disk / "out"
    TRIED["full disk"] = TRIED.get("full disk", 0) + 1
    res = _run([*(a.format(prof=inputs[1]) for a in args), "--out", str(out)], full_disk, out, 60)
    assert res.exit_code == 2, res.output[-400:]
    assert "cannot write: no space left on device" in res.output, res.output[-400:]
    assert sorted(p.name for p in out.iterdir()) == []  # no result, no temporary


def test_two_generate_runs_into_one_out_the_second_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    first = subprocess.Popen(
        [sys.executable, "-m", "recperf.cli.main", "ingest", "generate", "--rows", "30000000",
         "--out", str(out)], stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and any(out.glob(".part-*.tmp"))):
            assert first.poll() is None and time.monotonic() < deadline, "first run not writing"
            time.sleep(0.05)
        res = runner.invoke(app, ["ingest", "generate", "--rows", "100", "--out", str(out)])
        assert res.exit_code == 2
        assert "another run is writing into this directory" in res.output, res.output
        assert first.poll() is None and any(out.glob(".part-*.tmp"))  # untouched, still going
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 128 + signal.SIGTERM
    assert sorted(p.name for p in out.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "delay_s"),
    [(("ingest", "generate", "--rows", "30000000"), 0.0),
     (("cluster", "simulate", "--scheduler", "fifo", "--trace", "synthetic", "--jobs",
       "20000"), 1.5),
     (("ingest", "generate", "--rows", "30000000"), 3.0)],
    ids=["importing", "simulating", "generating"],
)  # fmt: skip
def test_a_hang_up_at_any_moment_leaves_nothing(
    args: tuple[str, ...], delay_s: float, tmp_path: Path
) -> None:
    """``delay_s`` after the CLI's handlers are in (0: at once, while the app imports)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "recperf.cli.main", *args, "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while not _catches_hangup(proc.pid) and proc.poll() is None:
        assert time.monotonic() < deadline, "the CLI never installed its SIGHUP handler"
        time.sleep(0.005)
    time.sleep(delay_s)
    os.killpg(proc.pid, signal.SIGHUP)  # what a closed terminal sends its process group
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"{args}: still running 30 s after SIGHUP") from None
    TRIED["sighup"] = TRIED.get("sighup", 0) + 1
    assert proc.returncode in (0, 2, 128 + signal.SIGHUP), err
    assert "Traceback" not in err and err.count("interrupted") <= 1, err
    left = sorted(p.name for p in tmp_path.rglob("*") if p.name.endswith(".tmp"))
    assert left == [], left


def _catches_hangup(pid: int) -> bool:
    """Whether ``pid`` has a SIGHUP handler installed (bit 0 of /proc's SigCgt mask)."""
    with contextlib.suppress(OSError, StopIteration):
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        return bool(int(next(ln for ln in status if ln.startswith("SigCgt:")).split()[1], 16) & 1)
    return False


# ------------------------------------------- byte-order marks and contradictory settings

BOM_INPUTS = {
    kind: CORRUPTIBLE[kind]
    for kind in ("tiresias", "helios", "philly", "spec", "catalog", "gpus", "embed-trace")
    if kind in CORRUPTIBLE
}
"""The text inputs: what a spreadsheet export writes (a UTF-8 byte-order mark first, Windows
line ends, trailing blank lines) must be read as the plain file is."""


@pytest.mark.parametrize("kind", sorted(BOM_INPUTS))
def test_a_byte_order_mark_and_windows_lines_read_as_the_plain_file(
    kind: str, inputs: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    relative, args = BOM_INPUTS[kind]
    data_dir, prof, _ = inputs
    raw = _source(relative, data_dir.parent)
    extra = ["--profile", str(prof)] if args[0] == "stalls" else []
    results = []
    for variant in ("plain", "bom", "crlf"):
        work = tmp_path / variant
        work.mkdir()
        monkeypatch.chdir(work)  # the same relative name in every run: the summaries compare
        text = raw.replace(b"\n", b"\r\n") + b"\r\n\r\n" if variant == "crlf" else raw
        Path(Path(relative).name).write_bytes(
            (b"\xef\xbb\xbf" if variant != "plain" else b"") + text
        )
        TRIED[f"bom {kind}"] = TRIED.get(f"bom {kind}", 0) + 1
        res = _run([*args, Path(relative).name, *extra, "--out", "out"], work, work / "out")
        assert res.exit_code == 0, f"{kind} {variant}: {res.output[-400:]}"
        summary = work / "out" / "summary.json"
        results.append(summary.read_bytes() if summary.exists() else b"")
    if kind in ("tiresias", "helios", "philly", "spec"):  # deterministic summaries
        assert results[1] == results[0] and results[2] == results[0], kind


CONTRADICTIONS = [
    ("--jobs", "synthetic.jobs"),
    ("--congestion", "engine.congestion"),
]
"""Shortcut flags and the ``--set`` key each is an alias of."""


@fuzz_settings(12)
@given(
    pair=st.sampled_from(CONTRADICTIONS),
    first=st.integers(1, 4),
    second=st.integers(1, 4),
    how=st.sampled_from(["flag+set", "set+set"]),
)
def test_two_values_for_one_setting_are_refused_unless_they_agree(
    pair: tuple[str, str],
    first: int,
    second: int,
    how: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    work = tmp_path_factory.mktemp("contradiction")
    flag, key = pair
    given_twice = [flag, str(first)] if how == "flag+set" else ["--set", f"{key}={first}"]
    args = ["cluster", "simulate", "--trace", "synthetic", "--scheduler", "fifo",
            "--set", "synthetic.jobs=20" if flag != "--jobs" else "synthetic.load=0.5",
            *given_twice, "--set", f"{key}={second}", "--out", str(work / "out")]  # fmt: skip
    TRIED["contradiction"] = TRIED.get("contradiction", 0) + 1
    res = _run(args, work, work / "out")
    if first == second:
        assert res.exit_code == 0, res.output[-400:]
    else:
        assert res.exit_code == 2, res.output[-400:]
        assert key in res.stderr and str(first) in res.stderr and str(second) in res.stderr


@pytest.mark.parametrize(
    ("table", "value"),
    [("synthetic", 'jobs = "20"'), ("engine", 'congestion = "2"'), ("fifo", "backfill = 1")],
)
def test_a_config_value_of_the_wrong_type_is_refused(
    table: str, value: str, tmp_path: Path
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(f"[{table}]\n{value}\n", encoding="utf-8")
    # no flag for the same key: a flag given on the command line overrides the file's value
    args = ["cluster", "simulate", "--trace", "synthetic", "--scheduler", "fifo",
            "--config", str(config), "--out", str(tmp_path / "out")]  # fmt: skip
    TRIED["config type"] = TRIED.get("config type", 0) + 1
    res = _run(args, tmp_path, tmp_path / "out")
    assert res.exit_code == 2 and str(config) in res.stderr and f"[{table}]" in res.stderr
