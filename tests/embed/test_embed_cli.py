"""``recperf embed stats``: JSON keys and values, the table output, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from recperf.cli.embed import app

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_stats_json_keys_and_values(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("1\n2\n1\n1\n3\n2\n")
    code, out, _ = run("stats", "--trace", str(path), "--batch-lookups", "4", "--top-k", "1",
                       "--rows", "10", "--json")  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert {"accesses", "unique_rows", "top_k_coverage", "unique_frac_per_batch"} <= set(data)
    assert (data["accesses"], data["unique_rows"], data["top_k"]) == (6, 3, 1)
    assert data["top_k_coverage"] == 0.5
    assert data["reuse_distance_hist"][0] == {"bin": "cold", "count": 3}


def test_stats_table_on_bundled_trace() -> None:
    code, out, err = run("stats", "--trace", "reuse-medium-500k")
    assert code == 0  # tables on stdout (no --json), the closing note on stderr
    assert "429951" in out and "0.877" in out and "0.262" in out and "cold" in out
    assert "batch of 307,200 ids; 1 table(s)" in err


def test_stats_bad_trace_name_is_one_line_exit_2() -> None:
    code, out, err = run("stats", "--trace", "no-such-trace", "--json")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "unknown trace 'no-such-trace'" in err
    assert "reuse-medium-500k" in err


def test_stats_bad_file_line_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("1\nx\n")
    code, _, err = run("stats", "--trace", str(path))
    assert code == 2 and f"{path}:2" in err and "row_id" in err
