from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from recperf.cli.main import app
from recperf.core.errors import ConfigError, TraceFormatError
from recperf.ingest.data.criteo import (
    CARDINALITIES,
    CAT_FEATURES,
    COLUMNS,
    LABEL_RATE,
    MISSING_GROUPS,
    SCHEMA,
    GenerateConfig,
    count_rows,
    generate,
    read_batches,
    read_table,
    scramble,
    zipf_ids,
)

ROWS = 50_000
runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("criteo")
    out = {}
    for name, fmt, gz in [("parquet", "parquet", False), ("tsv", "tsv", False),
                          ("gz", "tsv", True)]:  # fmt: skip
        out[name] = root / name
        generate(GenerateConfig(rows=ROWS, shards=3, seed=7, format=fmt, gzip=gz), out[name])
    return out


@pytest.fixture(scope="module")
def table(data: dict[str, Path]) -> pa.Table:
    return read_table(data["parquet"])


def test_schema_and_tsv_field_count(data: dict[str, Path], table: pa.Table) -> None:
    assert table.schema == SCHEMA and table.num_rows == ROWS
    assert len(COLUMNS) == 40
    line = (data["tsv"] / "part-00000.tsv").read_text().splitlines()[0]
    assert len(line.split("\t")) == 40
    assert count_rows(data["tsv"]) == count_rows(data["parquet"]) == count_rows(data["gz"]) == ROWS


def test_label_and_missing_rates_near_targets(table: pa.Table) -> None:
    assert table["label"].to_numpy().mean() == pytest.approx(LABEL_RATE, abs=0.01)
    for names, rate in MISSING_GROUPS:
        for name in names:
            assert table[name].null_count / ROWS == pytest.approx(rate, abs=0.01), name
    assert table["C1"].null_count == 0 and table["I2"].null_count == 0
    assert pc.min(table["I2"]).as_py() == -1
    assert pc.min(table["I5"]).as_py() >= 0 and pc.max(table["I5"]).as_py() > 100_000


def test_hex_strings_are_8_lowercase_hex(table: pa.Table) -> None:
    for name in CAT_FEATURES:
        values = table[name].drop_null().to_pylist()
        assert all(re.fullmatch(r"[0-9a-f]{8}", v) for v in values[:2000]), name
        assert pc.all(pc.equal(pc.utf8_length(table[name].drop_null()), 8)).as_py()


def test_ids_within_cardinality_and_skewed() -> None:
    rng = np.random.default_rng(0)
    card = CARDINALITIES[2]  # C3, ~10M ids
    ids = zipf_ids(rng, ROWS, card, 1.1)
    assert ids.min() >= 0 and ids.max() < card
    top = np.sort(np.bincount(ids - ids.min()))[::-1]
    distinct = np.count_nonzero(top)
    assert top[: max(1, distinct // 100)].sum() > 0.2 * ROWS  # top 1% of seen ids >> 1% of rows
    small = zipf_ids(rng, ROWS, 3, 1.1)
    assert set(np.unique(small)) == {0, 1, 2}


def test_generated_c_column_distinct_count_bounded_by_cardinality(table: pa.Table) -> None:
    for name, card in zip(CAT_FEATURES, CARDINALITIES, strict=True):
        assert pc.count_distinct(table[name]).as_py() <= card, name
    assert pc.count_distinct(table["C9"]).as_py() == 3


def test_scramble_is_a_bijection() -> None:
    ids = np.arange(1 << 20, dtype=np.int64)
    for f in (0, 25):
        out = scramble(ids, f)
        assert len(np.unique(out)) == len(ids)
        assert np.array_equal(out, scramble(ids, f))
    assert not np.array_equal(scramble(ids, 0), scramble(ids, 1))


def test_tsv_parquet_and_gzip_read_back_identical(data: dict[str, Path], table: pa.Table) -> None:
    assert read_table(data["tsv"]).equals(table)
    assert read_table(data["gz"]).equals(table)
    assert read_table(data["tsv"] / "part-00001.tsv").equals(
        read_table(data["parquet"] / "part-00001.parquet")
    )


def test_batches_have_the_requested_size(data: dict[str, Path]) -> None:
    sizes = [b.num_rows for b in read_batches(data["tsv"], batch_rows=7_000)]
    assert sizes == [7_000] * 7 + [1_000]
    assert all(b.schema == SCHEMA for b in read_batches(data["parquet"], batch_rows=7_000))


def test_rows_do_not_depend_on_shards(tmp_path: Path, table: pa.Table) -> None:
    generate(GenerateConfig(rows=ROWS, shards=1, seed=7), tmp_path)
    assert read_table(tmp_path).equals(table)


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path, data: dict[str, Path]) -> None:
    for seed, same in [(7, True), (8, False)]:
        out = tmp_path / str(seed)
        generate(GenerateConfig(rows=ROWS, shards=3, seed=seed, format="tsv", gzip=True), out)
        for name in ("part-00000.tsv.gz", "part-00002.tsv.gz"):
            assert ((out / name).read_bytes() == (data["gz"] / name).read_bytes()) is same


def test_manifest_hashes_match(data: dict[str, Path]) -> None:
    manifest = json.loads((data["gz"] / "manifest.json").read_text())
    assert manifest["rows"] == ROWS and manifest["seed"] == 7 and manifest["format"] == "tsv"
    assert len(manifest["schema"]) == 40 and manifest["cardinalities"]["C3"] == 10131227
    assert sum(s["rows"] for s in manifest["shards"]) == ROWS
    for shard in manifest["shards"]:
        blob = (data["gz"] / shard["file"]).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == shard["sha256"]
        assert len(blob) == shard["bytes"]


def _good_line() -> list[str]:
    return ["1"] + ["3"] * 13 + ["68fd1e64"] * 26


@pytest.mark.parametrize(
    ("line_no", "edit", "field"),
    [
        (3, lambda f: f[:-1], "C26"),
        (2, lambda f: [*f[:5], "abc", *f[6:]], "I5"),
        (4, lambda f: ["2", *f[1:]], "label"),
        (1, lambda f: [*f, "x"], None),
    ],
)
def test_malformed_tsv_names_file_line_field(
    tmp_path: Path, line_no: int, edit: object, field: str | None
) -> None:
    lines = [_good_line() for _ in range(5)]
    lines[line_no - 1] = edit(lines[line_no - 1])  # type: ignore[operator]
    bad = tmp_path / "day_0.gz"
    with gzip.open(bad, "wt") as fh:
        fh.write("".join("\t".join(f) + "\n" for f in lines))
    with pytest.raises(TraceFormatError) as exc:
        read_table(bad)
    msg = str(exc.value)
    assert exc.value.line == line_no and exc.value.field == field
    assert msg.startswith(f"{bad}:{line_no}:") and "\n" not in msg


def test_real_criteo_style_row_reads(tmp_path: Path) -> None:
    row = ["0", "", "-3", *[""] * 10, "12", "05db9164", "", *["a8cd5504"] * 24]
    path = tmp_path / "train.txt"
    path.write_text("\t".join(row) + "\n")
    t = read_table(path)
    assert t.num_rows == 1 and t["I1"][0].as_py() is None and t["I2"][0].as_py() == -3
    assert t["C2"][0].as_py() is None and t["C1"][0].as_py() == "05db9164"


@pytest.mark.parametrize(
    "kwargs", [{"rows": 0}, {"rows": 5, "shards": 0}, {"rows": 5, "format": "csv"},
               {"rows": 5, "gzip": True}, {"rows": 5, "zipf_exponent": 0.0}],
)  # fmt: skip
def test_bad_config_raises(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        GenerateConfig(**kwargs)  # type: ignore[arg-type]


def test_cli_generate_json(tmp_path: Path) -> None:
    out = tmp_path / "o"
    res = runner.invoke(app, ["ingest", "generate", "--rows", "1000", "--format", "tsv",
                              "--shards", "2", "--seed", "3", "--gzip", "--out", str(out),
                              "--json"])  # fmt: skip
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["rows"] == 1000 and summary["throughput_rows_per_s"] > 0
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "part-00000.tsv.gz",
        "part-00001.tsv.gz",
    ]
    assert count_rows(out) == 1000 and "rows/s" in res.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--format", "csv"], "format"), (["--rows", "0"], "rows"), (["--shards", "0"], "shards")],
)
def test_cli_bad_flag_is_one_line_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    base = {"--rows": "100", "--format": "parquet", "--shards": "1"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    flat = [x for kv in base.items() for x in kv]
    res = runner.invoke(app, ["ingest", "generate", *flat, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "manifest.json").exists()
