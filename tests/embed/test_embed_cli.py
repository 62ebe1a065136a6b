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


def test_quantize_tables_file_json_and_saved_tables(tmp_path: Path) -> None:
    import torch

    from recperf.embed.kernels.formats import dequantize

    g = torch.Generator().manual_seed(0)
    weights = {"a": torch.randn(30, 8, generator=g), "b": torch.randn(12, 4, generator=g).half()}
    path = tmp_path / "tables.pt"
    torch.save(weights, path)
    out, ids = tmp_path / "out", tmp_path / "ids.txt"
    ids.write_text("\n".join(str(i * 7 % 40) for i in range(100)))
    code, stdout, err = run("quantize", "--tables", str(path), "--dtype", "int4", "--bags", "16",
                            "--pooling-factor", "3", "--trace", str(ids), "--out", str(out),
                            "--save", "--json")  # fmt: skip
    assert code == 0, err
    data = json.loads(stdout)
    assert data == json.loads((out / "quantize.json").read_text())
    assert (data["row_format"], data["trace"], data["pooling_factor"]) == (
        "int4",
        str(ids),
        [3, 3],
    )
    rows = [(t["table"], t["rows"], t["dim"], t["bytes_per_row_before"], t["bytes_per_row_after"],
             t["bags"]) for t in data["tables"]]  # fmt: skip
    assert rows == [("table 'a'", 30, 8, 32, 8, 16), ("table 'b'", 12, 4, 8, 6, 16)]
    assert all(0 < t["mean_rel_err"] <= t["max_rel_err"] < 0.5 for t in data["tables"])
    saved = torch.load(out / "quantized.pt", weights_only=True)
    assert saved["row_format"] == "int4" and [t["table"] for t in saved["tables"]] == [
        "table 'a'",
        "table 'b'",
    ]
    a = saved["tables"][0]
    assert a["weight"].shape == (30, 4) and a["scale_bias"].shape == (30, 4)
    back = dequantize(a["weight"], a["scale_bias"], "int4")
    assert float((back - weights["a"]).abs().max()) < 0.5  # within a 4-bit step of the row's range
    assert "fewer bytes" in err


def test_quantize_a_configuration_prints_the_table() -> None:
    code, stdout, err = run("quantize", "--config", "small", "--dtype", "fp16", "--bags", "8")
    assert code == 0, err
    assert "tables[3]" in stdout and "20000" in stdout and "config small in fp16" in stdout
    assert "2.00x fewer bytes" in err
