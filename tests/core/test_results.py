"""Result writers: deterministic JSON, and atomic writes that never leave a partial result."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recperf.core.errors import OutputError
from recperf.core.results import atomic_path, dumps_json, write_json, write_parquet, write_text


def test_write_json_is_deterministic_whatever_the_key_order(tmp_path) -> None:
    a = write_json(tmp_path / "a.json", {"b": 1, "a": {"y": 2.5, "x": [1, 2]}})
    b = write_json(tmp_path / "b.json", {"a": {"x": [1, 2], "y": 2.5}, "b": 1})
    assert a.read_bytes() == b.read_bytes()
    assert (
        a.read_text()
        == '{\n  "a": {\n    "x": [\n      1,\n      2\n    ],\n    "y": 2.5\n  },\n  "b": 1\n}\n'
    )


def test_json_values_are_made_safe() -> None:
    data = {"nan": math.nan, "inf": -math.inf, "i": np.int64(3), "f": np.float32(0.5), "t": (1, 2)}
    assert json.loads(dumps_json(data)) == {"nan": None, "inf": None, "i": 3, "f": 0.5, "t": [1, 2]}


def test_write_json_leaves_no_temporary_file(tmp_path) -> None:
    out = tmp_path / "deep" / "summary.json"
    write_json(out, {"k": 1})
    write_json(out, {"k": 2})  # overwrite
    assert sorted(p.name for p in out.parent.iterdir()) == ["summary.json"]
    assert json.loads(out.read_text()) == {"k": 2}


def test_failure_inside_atomic_path_leaves_no_target(tmp_path) -> None:
    out = tmp_path / "summary.json"
    with pytest.raises(RuntimeError, match="half-way"), atomic_path(out) as tmp:
        tmp.write_text("partial")
        raise RuntimeError("half-way")
    assert list(tmp_path.iterdir()) == []


def test_failure_inside_atomic_path_keeps_the_previous_result(tmp_path) -> None:
    out = write_text(tmp_path / "r.txt", "old\n")
    with pytest.raises(KeyError), atomic_path(out) as tmp:
        tmp.write_text("new")
        raise KeyError("boom")
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["r.txt"]


def test_unserialisable_json_leaves_nothing(tmp_path) -> None:
    with pytest.raises(TypeError):
        write_json(tmp_path / "s.json", {"bad": object()})
    assert list(tmp_path.iterdir()) == []


def test_write_parquet_round_trips_and_is_atomic(tmp_path) -> None:
    out = write_parquet(tmp_path / "t.parquet", {"x": np.arange(3), "s": ["a", "b", "c"]})
    assert pq.read_table(out).to_pydict() == {"x": [0, 1, 2], "s": ["a", "b", "c"]}
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]
    with pytest.raises(pa.ArrowInvalid):
        write_parquet(tmp_path / "u.parquet", {"x": [1, 2], "y": [1]})
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_write_files_is_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from recperf.core import results

    results.write_files(tmp_path, {"a.html": "old a", "a.json": "old j"})
    real = results.os.fdopen
    calls = iter(range(10))

    def full_disk(fd: int, *args: Any, **kwargs: Any) -> Any:
        if next(calls) == 1:  # the second file of the set
            results.os.close(fd)
            raise OSError(28, "No space left on device")
        return real(fd, *args, **kwargs)

    monkeypatch.setattr(results.os, "fdopen", full_disk)
    with pytest.raises(OutputError, match=r"a\.json: cannot write: no space left on device$"):
        results.write_files(tmp_path, {"a.html": "new a", "a.json": "new j"})
    assert (tmp_path / "a.html").read_text() == "old a"  # the previous set, whole
    assert (tmp_path / "a.json").read_text() == "old j"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html", "a.json"]  # no temporaries
    monkeypatch.undo()
    written = results.write_files(tmp_path, {"a.html": "new a", "a.json": "new j"})
    assert [p.read_text() for p in written] == ["new a", "new j"]


def test_a_full_disk_is_one_output_error_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(self: Path, *args: Any, **kwargs: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OutputError, match=r"summary\.json: cannot write: no space left on device$"):
        write_json(tmp_path / "summary.json", {"a": 1})
    assert list(tmp_path.iterdir()) == []


def test_temporary_names_hold_the_process_id(tmp_path: Path) -> None:
    import os

    with atomic_path(tmp_path / "x.json") as tmp:
        assert tmp.name.startswith(f".x.json.{os.getpid()}.") and tmp.name.endswith(".tmp")
        tmp.write_text("1")
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_a_directory_held_by_another_run_is_refused(tmp_path: Path) -> None:
    import subprocess
    import sys

    from recperf.core.results import exclusive_dir

    holder = subprocess.Popen(  # another process holding the directory
        [sys.executable, "-c", "import sys, time\nfrom recperf.core.results import exclusive_dir\n"
         f"with exclusive_dir({str(tmp_path)!r}):\n    print('held', flush=True)\n"
         "    time.sleep(60)"], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with (
            pytest.raises(OutputError, match="another run is writing into this directory"),
            exclusive_dir(tmp_path),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()
    with exclusive_dir(tmp_path):  # free again once the holder is gone
        pass
    assert list(tmp_path.iterdir()) == []
