"""Progress off a terminal: plain timestamped lines on stderr, so long work is never silent."""

from __future__ import annotations

import re

import pytest

from recperf.core import progress


def test_off_a_terminal_progress_is_timestamped_lines(capsys: pytest.CaptureFixture[str]) -> None:
    with progress.progress_bar("building report") as bar:
        for i in range(1, 101):
            bar(i / 100)
    lines = capsys.readouterr().err.splitlines()
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d building report: .+", line) for line in lines)
    said = [line.split(": ", 1)[1] for line in lines]
    assert said[0] == "started" and re.fullmatch(r"done in \d+\.\d s", said[-1])
    assert said[1:-1] == [f"{p}%" for p in range(10, 100, 10)]  # one line per tenth


def test_a_slow_step_still_prints_after_the_interval(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter([0.0, 1.0, 100.0, 101.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    with progress.progress_bar("tuning") as bar:
        bar(0.01)  # 1 s in, 1%: too soon and too little
        bar(0.02)  # 100 s in: the interval has passed
    said = [line.split(": ", 1)[1] for line in capsys.readouterr().err.splitlines()]
    assert said == ["started", "2%", "done in 101.0 s"]


def test_disabled_progress_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with progress.progress_bar("x", enabled=False) as bar:
        bar(0.5)
    assert capsys.readouterr().err == ""


def test_a_failure_prints_no_done_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError), progress.progress_bar("x") as bar:
        bar(0.5)
        raise RuntimeError("boom")
    assert "done" not in capsys.readouterr().err
