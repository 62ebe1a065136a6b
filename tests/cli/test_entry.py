"""The installed ``recperf`` entry point: a flag click cannot parse is one line and exit 2, like
recperf's own errors; help and a group without a command still print the help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RECPERF = str(Path(sys.executable).with_name("recperf"))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RECPERF, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["stalls", "predict", "--model", "m.json", "--grad-bytes", "abc", "--layers", "1",
             "--ranks", "1"],
            "error: Invalid value for '--grad-bytes': ",
        ),
        (["cluster", "simulate", "--bogus"], "error: No such option: --bogus"),
        (["cluster", "simulate", "--trace", "x"], "error: Missing option '--scheduler'."),
    ],
)  # fmt: skip
def test_a_usage_error_is_one_line(args: list[str], line: str) -> None:
    res = run(*args)
    assert res.returncode == 2
    assert res.stderr.startswith(line) and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.rstrip().endswith(f"(recperf {' '.join(args[:2])} --help)")
    assert res.stdout == ""


def test_help_and_a_bare_group_still_print_the_help() -> None:
    res = run("cluster", "simulate", "--help")
    assert res.returncode == 0 and "--scheduler" in res.stdout
    res = run("cluster")
    assert res.returncode == 2 and "simulate" in res.stdout + res.stderr
    assert "error:" not in res.stderr


HEAVY = ("torch", "pyarrow", "pandas", "plotly", "ray", "triton")
"""Modules only the commands that use them may import."""


@pytest.mark.parametrize(
    "args",
    [["version"], ["--help"], ["cluster", "--help"], ["ingest", "generate", "--help"],
     ["embed", "--help"]],
)  # fmt: skip
def test_version_and_help_import_no_heavy_module(args: list[str]) -> None:
    code = (
        "import sys\nfrom recperf.cli.main import main\n"
        f"sys.argv = ['recperf', *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == "[]", res.stdout[-400:]


def test_python_dash_m_still_runs_the_cli() -> None:
    res = subprocess.run([sys.executable, "-m", "recperf.cli.main", "version"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0 and res.stdout.strip() == __import__("recperf").__version__


def test_a_signal_inside_a_class_body_is_still_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A signal whose handler raises in a descriptor's ``__set_name__`` (a class being made while
    a module imports) reaches main wrapped in a RuntimeError (Python 3.11): still the one line."""
    import signal

    from recperf.cli import main as entry

    class Slow:
        def __set_name__(self, owner: type, name: str) -> None:
            entry._on_signal(signal.SIGINT, None)  # the signal lands here

    def run_app() -> int:
        type("Made", (), {"field": Slow()})
        return 0

    monkeypatch.setattr(entry, "_run_app", run_app)
    monkeypatch.setattr(entry, "_catch_signals", lambda: None)
    monkeypatch.setattr(entry, "_ignore_signals", lambda: None)
    monkeypatch.setattr(entry, "_received", None)
    with pytest.raises(SystemExit) as exc:
        entry.main()
    assert exc.value.code == 128 + signal.SIGINT
    assert capsys.readouterr().err == "interrupted\n"
