"""The decode kernels and the stage chain read → dense → sparse → collate against a plain
Python parser of the Criteo text, bit for bit; and the errors a bad row or file gives."""

from __future__ import annotations

import gzip
import itertools
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from recperf.core.errors import TraceFormatError
from recperf.ingest.data import decode as dec
from recperf.ingest.data import kernels
from recperf.ingest.data import rowgroup as rg
from recperf.ingest.data import stages as st
from recperf.ingest.data.criteo import (
    CARDINALITIES,
    GenerateConfig,
    generate,
    read_table,
)

Row = tuple[int, list[int | None], list[int | None]]

# ----------------------------------------------------------------------------- the reference


def parse_reference(text: str) -> list[Row]:
    """(label, 13 ints or None, 26 table ids or None) per line, with nothing but str methods."""
    rows = []
    for line in text.split("\n"):
        if not line:
            continue  # the empty tail after the last newline
        fields = line.rstrip("\r").split("\t")
        assert len(fields) == 40
        ints = [int(f) if f else None for f in fields[1:14]]
        cats = [
            int(f, 16) % card if f else None
            for f, card in zip(fields[14:], CARDINALITIES, strict=True)
        ]
        rows.append((int(fields[0]), ints, cats))
    return rows


def expected_batch(rows: Sequence[Row], first_row: int) -> dict[str, np.ndarray]:
    """The collated batch of ``rows``; dense through the formula the stage has always used."""
    dense = np.array([[math.nan if v is None else float(v) for v in r[1]] for r in rows])
    x = np.nan_to_num(dense.reshape(len(rows), 13), nan=0.0)
    np.maximum(x, 0.0, out=x)
    values, lengths = [], []
    for j in range(26):
        for r in rows:
            lengths.append(0 if r[2][j] is None else 1)
            values += [] if r[2][j] is None else [r[2][j]]
    return {
        "row_id": np.arange(first_row, first_row + len(rows), dtype=np.int64),
        "labels": np.array([r[0] for r in rows], np.float32),
        "dense": np.log1p(x).astype(np.float32),
        "values": np.array(values, np.int64),
        "lengths": np.array(lengths, np.int32),
        "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
    }


def chain(splits: Sequence[st.Split], reader: st.SplitReader) -> list[dict[str, np.ndarray]]:
    """The batches of consecutive splits read as one chunk, through the stages."""
    return st.collate(st.sparse_transform(st.dense_transform(reader.read_chunk(splits))))


@pytest.fixture(params=["compiled", "numpy"], autouse=True)
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs on the compiled kernels and on the numpy / pyarrow path without
    them (as on a machine without numba): both must give the same bytes."""
    if request.param == "compiled" and not kernels.AVAILABLE:
        pytest.skip("numba is not installed")
    if request.param == "numpy":
        monkeypatch.setattr(kernels, "AVAILABLE", False)
    return str(request.param)


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for key, w in want.items():
        assert got[key].dtype == w.dtype and got[key].shape == w.shape, key
        assert got[key].tobytes() == w.tobytes(), key


def check_against_reference(data: Path, rows: list[Row], rows_per_split: int) -> int:
    """Every split alone, and runs of up to three consecutive splits of one file and row group
    read as one chunk, against the reference batch of each split."""
    splits, counts = st.plan_splits(data, rows_per_split)
    reader = st.SplitReader()
    runs: list[list[int]] = []
    for i, s in enumerate(splits):
        last = splits[runs[-1][0]] if runs else None
        if last is not None and len(runs[-1]) < 3 and (last.file, last.group) == (s.file, s.group):
            runs[-1].append(i)
        else:
            runs.append([i])
    for run in [[i] for i in range(len(splits))] + runs:
        got = chain([splits[i] for i in run], reader)
        assert len(got) == len(run)
        for i, batch in zip(run, got, strict=True):
            split = splits[i]
            want = rows[split.first_row : split.first_row + counts[i]]
            assert_same(batch, expected_batch(want, split.first_row))
    return len(splits)


def text_of(path: Path) -> str:
    raw = path.read_bytes()
    return (gzip.decompress(raw) if path.name.endswith(".gz") else raw).decode()


# --------------------------------------------------------------------- generated and odd data


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gen")
    out = {}
    for name, fmt, gz in [
        ("tsv", "tsv", False),
        ("gz", "tsv", True),
        ("parquet", "parquet", False),
    ]:
        out[name] = root / name
        generate(GenerateConfig(rows=3000, shards=2, seed=11, format=fmt, gzip=gz), out[name])
    return out


@pytest.mark.parametrize("name", ["tsv", "gz", "parquet"])
def test_generated_data_matches_the_reference(generated: dict[str, Path], name: str) -> None:
    tsv = generated["tsv"]
    rows = [r for f in sorted(tsv.glob("part-*")) for r in parse_reference(text_of(f))]
    assert len(rows) == 3000
    # 700 rows a split: Parquet splits cut its row groups, so their dictionaries get compacted
    assert check_against_reference(generated[name], rows, 700) == 6


def test_read_columns_follow_the_contract(generated: dict[str, Path]) -> None:
    for name in ("tsv", "parquet"):
        splits, counts = st.plan_splits(generated[name], 700)
        cols = st.SplitReader().read(splits[1])
        n = counts[1]
        assert cols["row_id"].tolist() == list(range(700, 700 + n))
        assert cols["label"].dtype == np.int8 and set(np.unique(cols["label"])) == {0, 1}
        assert cols["dense"].dtype == np.float64 and cols["dense"].shape == (13, n)
        if name == "parquet" or kernels.AVAILABLE:  # decoded at read: sparse passes it through
            assert list(cols) == ["row_id", "label", "dense", "ids", "present"]
            assert cols["ids"].dtype == np.int32 and cols["ids"].shape == (26, n)
            assert cols["present"].dtype == bool and cols["present"].shape == (26, n)
            assert not cols["ids"][~cols["present"]].any() and not cols["present"].all()
            block = st.Block(cols, (n,))
            assert st.sparse_transform(block) is block
            continue
        assert list(cols) == ["row_id", "label", "dense", *dec.DICT_KEYS]  # row_id first
        codes, entries, offsets = (cols[k] for k in dec.DICT_KEYS)
        assert codes.dtype == np.int32 and codes.shape == (26, n) and codes.min() == -1
        assert entries.dtype == np.uint8 and entries.shape[1] == 8
        assert offsets.dtype == np.int64 and offsets.shape == (27,)
        assert offsets[0] == 0 and offsets[-1] == len(entries)
        assert (codes < np.diff(offsets)[:, None]).all()


ODD_ROWS = [
    ["1", *[""] * 13, *[""] * 26],  # everything missing
    [
        "0",
        "-3",
        "-1",
        str(2**40),
        str(2**40 - 1),
        "0",
        *["7"] * 8,
        "DEADBEEF",
        "deadbeef",
        "0123ABcd",
        *["FFFFFFFF"] * 23,
    ],
    ["1", "5", "", "12", *[""] * 10, *["68fd1e64", ""] * 13],
    ["0", *[str(2**53 + 1)] * 13, *["00000000"] * 26],
]


def odd_text() -> str:
    lines = ["\t".join(r) for r in ODD_ROWS * 3]
    # CRLF on some lines, and no newline after the last
    return "".join(f"{line}\r\n" if i % 2 else f"{line}\n" for i, line in enumerate(lines))[:-1]


@pytest.mark.parametrize("rows_per_split", [1, 5, 100])
def test_odd_tsv_rows_match_the_reference(tmp_path: Path, rows_per_split: int) -> None:
    text = odd_text()
    (tmp_path / "day_0").mkdir()
    (tmp_path / "day_0" / "part.tsv").write_text(text)
    with gzip.open(tmp_path / "day_0" / "part2.tsv.gz", "wt") as fh:
        fh.write(text)
    rows = parse_reference(text) * 2
    assert len(rows) == 24 and rows[1][1][:2] == [-3, -1] and rows[0][2] == [None] * 26
    check_against_reference(tmp_path / "day_0", rows, rows_per_split)


def test_odd_rows_through_parquet_dictionaries(tmp_path: Path) -> None:
    (tmp_path / "a.tsv").write_text(odd_text())
    table = read_table(tmp_path / "a.tsv")
    # "" rather than null in C1: a dictionary entry that means missing
    table = table.set_column(14, "C1", table["C1"].fill_null(""))
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=5)
    (tmp_path / "a.tsv").unlink()
    check_against_reference(tmp_path / "a.parquet", parse_reference(odd_text()), 3)


def test_non_string_categoricals_and_narrow_ints_are_cast(tmp_path: Path) -> None:
    table = read_table(_write(tmp_path, [_good(), _good()]))
    table = table.set_column(1, "I1", table["I1"].cast(pa.int32()))
    table = table.set_column(20, "C7", table["C7"].cast(pa.large_string()))
    pq.write_table(table, tmp_path / "b.parquet")
    (tmp_path / "day.tsv").unlink()
    rows = parse_reference("\n".join(["\t".join(_good())] * 2))
    check_against_reference(tmp_path / "b.parquet", rows, 1)


# -------------------------------------------------------------------------------- the kernels

NIBBLE = {c: int(c, 16) for c in "0123456789abcdefABCDEF"}


def test_hex_values_rejects_every_non_hex_byte_at_every_position() -> None:
    for pos in range(8):
        entries = np.tile(np.frombuffer(b"0123abCD", np.uint8), (256, 1))
        entries[:, pos] = np.arange(256)
        value, bad = dec.hex_values(entries)
        assert bad is not None
        assert [i for i in range(256) if bad[i]] == [i for i in range(256) if chr(i) not in NIBBLE]
        good = np.flatnonzero(~bad)
        assert value[good].tolist() == [int(bytes(e).decode(), 16) for e in entries[good]]


@settings(max_examples=50, deadline=None)
@given(hs.lists(hs.text("0123456789abcdefABCDEFgx \x10", min_size=8, max_size=8), max_size=40))
def test_hex_values_is_int_base_16(strings: list[str]) -> None:
    entries = np.frombuffer("".join(strings).encode(), np.uint8).reshape(-1, 8)
    value, bad = dec.hex_values(entries)
    flags = [not all(c in NIBBLE for c in s) for s in strings]
    assert (bad.tolist() if bad is not None else [False] * len(strings)) == flags
    assert [int(v) for v, f in zip(value, flags, strict=True) if not f] == [
        int(s, 16) for s, f in zip(strings, flags, strict=True) if not f
    ]


@settings(max_examples=60, deadline=None)
@given(hs.data())
def test_row_group_splits_are_its_rows_decoded(data: hs.DataObject) -> None:
    n = data.draw(hs.integers(1, 30))
    hexes = hs.text("0123456789abcdefABCDEF", min_size=8, max_size=8)
    values = hs.one_of(hs.none(), hs.just(""), hexes, hs.sampled_from(["68fd1e6g", "zzzzzzzz"]))
    cats = [data.draw(hs.lists(values, min_size=n, max_size=n)) for _ in range(26)]
    as_dict = data.draw(hs.lists(hs.booleans(), min_size=26, max_size=26))
    columns = {"label": pa.array([0] * n, pa.int8()), **{f"I{k}": pa.nulls(n, pa.int64())
               for k in range(1, 14)}}  # fmt: skip
    for k, (col, d) in enumerate(zip(cats, as_dict, strict=True)):
        arr = pa.array(col, pa.string())
        columns[f"C{k + 1}"] = arr.dictionary_encode() if d else arr
    group = rg.RowGroup(pa.table(columns), 100, "<t>")
    a = data.draw(hs.integers(0, n - 1))
    b = data.draw(hs.integers(a + 1, n))
    used = [(r, j) for r in range(a, b) for j in range(26) if cats[j][r]]
    bad = [(r, j) for r, j in used if any(c not in NIBBLE for c in cats[j][r])]
    if bad:
        with pytest.raises(dec.BadRow) as exc:
            group.rows(a, b)
        assert (exc.value.row_id, exc.value.field) == (100 + bad[0][0], f"C{bad[0][1] + 1}")
        return
    out = group.rows(a, b)
    assert out["row_id"].tolist() == list(range(100 + a, 100 + b))
    for r in range(a, b):
        for j in range(26):
            want = int(cats[j][r], 16) % CARDINALITIES[j] if cats[j][r] else 0
            assert (out["ids"][j, r - a], out["present"][j, r - a]) == (want, bool(cats[j][r]))
    for key in ("label", "dense", "ids", "present"):  # views of the cached group, read-only
        assert not out[key].flags.writeable, key


def test_dense_transform_gives_the_old_float32_bits() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.integers(-5, 2**40, 5000), [0, -1, 2**53 + 1, 2**62, 1, 2]])
    dense = x.astype(np.float64)
    dense[rng.random(len(dense)) < 0.2] = np.nan
    dense = dense[: len(dense) // 13 * 13].reshape(-1, 13)
    old = np.log1p(np.maximum(np.nan_to_num(dense, nan=0.0), 0.0)).astype(np.float32)
    got = st.dense_transform(st.Block({"dense": dense.T}, (len(dense),))).cols["dense"]
    assert got.dtype == np.float32 and got.T.tobytes() == old.tobytes()


def _rows(cols: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[..., idx] for k, v in cols.items()}  # the row axis is the last


def test_shuffle_and_downsample_match_their_old_formulas(generated: dict[str, Path]) -> None:
    splits, _ = st.plan_splits(generated["parquet"], 700)
    reader = st.SplitReader()
    block = st.sparse_transform(st.dense_transform(reader.read_chunk(splits[:3])))
    assert block.batch_rows == (700, 700, 100)
    cols = block.cols
    # one window of all three batches, seeded by the seed and its first batch's seq
    perm = np.random.default_rng([5, 2]).permutation(1500)
    got = st.shuffle(block, [2, 3, 4], 5, 3)
    assert got.batch_rows == block.batch_rows
    assert_same(got.cols, _rows(cols, perm))
    # windows of two batches: rows never leave their window
    got = st.shuffle(block, [2, 3, 4], 5, 2)
    perm = np.concatenate(
        [
            np.random.default_rng([5, 2]).permutation(1400),
            1400 + np.random.default_rng([5, 4]).permutation(100),
        ]
    )
    assert_same(got.cols, _rows(cols, perm))
    kept = st.downsample(block, 0.3, 1)
    assert (kept.cols["label"] == 1).sum() == (cols["label"] == 1).sum()
    assert 0 < (kept.cols["label"] == 0).sum() < 0.5 * (cols["label"] == 0).sum()
    mask = np.isin(cols["row_id"], kept.cols["row_id"])
    assert_same(kept.cols, _rows(cols, np.flatnonzero(mask)))
    ends = [0, 700, 1400, 1500]
    assert kept.batch_rows == tuple(int(mask[a:b].sum()) for a, b in itertools.pairwise(ends))
    assert_same(st.downsample(block, 0.3, 1).cols, kept.cols)


@settings(max_examples=40, deadline=None)
@given(hs.lists(hs.integers(0, 40), min_size=1, max_size=8), hs.integers(0, 2**31))
def test_collate_of_a_chunk_is_each_batch_collated_alone(sizes: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    present = rng.random((26, n)) < 0.7
    cols = {
        "row_id": np.arange(n, dtype=np.int64) + 10,
        "label": rng.integers(0, 2, n).astype(np.int8),
        "dense": rng.random((13, n)).astype(np.float32),
        "ids": np.where(present, rng.integers(0, 2**31 - 1, (26, n)), 0).astype(np.int32),
        "present": present,
    }
    got = st.collate(st.Block(cols, tuple(sizes)))
    assert len(got) == len(sizes)
    ends = np.cumsum([0, *sizes])
    for batch, a, b in zip(got, ends[:-1], ends[1:], strict=True):
        pres = present[:, a:b]
        lengths = pres.astype(np.int32).reshape(-1)
        want = {
            "row_id": cols["row_id"][a:b],
            "labels": cols["label"][a:b].astype(np.float32),
            "dense": np.ascontiguousarray(cols["dense"][:, a:b].T),
            "values": cols["ids"][:, a:b][pres].astype(np.int64),
            "lengths": lengths,
            "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
        }
        assert_same(batch, want)


def test_gzip_splits_read_out_of_order(generated: dict[str, Path]) -> None:
    splits, _ = st.plan_splits(generated["gz"] / "part-00000.tsv.gz", 300)
    reader = st.SplitReader()
    key = "ids" if kernels.AVAILABLE else "cat_dict"
    forward = [reader.read(s)[key].tobytes() for s in splits]
    backward = [reader.read(s)[key].tobytes() for s in reversed(splits)]
    assert backward[::-1] == forward and len(set(forward)) == len(forward)


# ---------------------------------------------------------------------------------- the errors


def _good() -> list[str]:
    return ["1", *["3"] * 13, *["68fd1e64"] * 26]


def _write(tmp_path: Path, lines: list[list[str]]) -> Path:
    path = tmp_path / "day.tsv"
    path.write_text("".join("\t".join(f) + "\n" for f in lines))
    return path


@pytest.mark.parametrize(
    ("edit", "field", "needle"),
    [
        (lambda f: f[:-1], "C26", "40 tab-separated fields"),
        (lambda f: [*f[:5], "1.5", *f[6:]], "I5", "not an integer"),
        (lambda f: ["2", *f[1:]], "label", "label must be 0 or 1"),
        (lambda f: [*f[:16], "68fd1e6", *f[17:]], "C3", "8 hex digits"),
    ],
)
def test_malformed_tsv_row_names_file_line_field(
    tmp_path: Path, edit: object, field: str, needle: str
) -> None:
    lines = [_good() for _ in range(9)]
    lines[6] = edit(lines[6])  # type: ignore[operator]
    path = _write(tmp_path, lines)
    splits, _ = st.plan_splits(path, 4)
    reader = st.SplitReader()
    assert reader.read(splits[0])["row_id"].tolist() == [0, 1, 2, 3]
    with pytest.raises(TraceFormatError) as exc:
        reader.read(splits[1])
    assert (exc.value.file, exc.value.line, exc.value.field) == (str(path), 7, field)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("fmt", ["tsv", "parquet"])
def test_non_hex_categorical_names_its_row_and_field(tmp_path: Path, fmt: str) -> None:
    lines = [_good() for _ in range(9)]
    lines[5][14 + 7] = "68fd1e6g"  # C8 of line 6
    path = _write(tmp_path, lines)
    if fmt == "parquet":
        pq.write_table(read_table(path), tmp_path / "day.parquet", row_group_size=4)
        path.unlink()
        path = tmp_path / "day.parquet"
    splits, _ = st.plan_splits(path, 2)
    split = next(s for s in splits if s.first_row <= 5 < s.first_row + 2)
    with pytest.raises(st.BadRow) as exc:  # Parquet: at read, its row group decoded once
        st.sparse_transform(st.SplitReader().read_chunk([split]))
    assert (exc.value.row_id, exc.value.field) == (5, "C8")
    assert exc.value.why == "not a hexadecimal string"
    assert split.first_line + exc.value.row_id - split.first_row == 6  # the coordinator's map
    ok = next(s for s in splits if s.first_row == 6)  # same row group, bad entry unused
    assert st.sparse_transform(st.SplitReader().read_chunk([ok])).cols["ids"].shape == (26, 2)


def test_parquet_bad_label_or_length_is_a_bad_row(tmp_path: Path) -> None:
    table = read_table(_write(tmp_path, [_good() for _ in range(6)]))
    labels = pa.array([1, 0, 0, 3, 1, 1], pa.int8())
    pq.write_table(table.set_column(0, "label", labels), tmp_path / "l.parquet")
    c3 = pa.array(["68fd1e64"] * 4 + ["68fd1e6", "68fd1e64"])
    pq.write_table(table.set_column(16, "C3", c3), tmp_path / "c.parquet", row_group_size=3)
    for name, row, field in [("l", 3, "label"), ("c", 4, "C3")]:
        splits, _ = st.plan_splits(tmp_path / f"{name}.parquet", 2)
        with pytest.raises(st.BadRow) as exc:
            st.SplitReader().read(splits[-1])
        assert (exc.value.row_id, exc.value.field) == (row, field)


def test_broken_parquet_files_name_file_and_column(tmp_path: Path) -> None:
    table = read_table(_write(tmp_path, [_good() for _ in range(50)]))
    pq.write_table(table, tmp_path / "ok.parquet")
    blob = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(blob[: len(blob) // 2])
    pq.write_table(table.drop_columns(["C9"]), tmp_path / "nocol.parquet")
    bad_type = table.set_column(3, "I3", pa.array(["x"] * 50))
    pq.write_table(bad_type, tmp_path / "type.parquet")
    cases = [("cut", None, "not a Parquet file"), ("nocol", "C9", "missing"),
             ("type", "I3", "cannot cast")]  # fmt: skip
    for name, field, needle in cases:
        path = tmp_path / f"{name}.parquet"
        with pytest.raises(TraceFormatError) as exc:
            st.SplitReader().read(st.Split(str(path), "parquet", 0, 0, 50, 0, 1))
        assert exc.value.file == str(path) and exc.value.field == field, name
        assert needle in exc.value.why, name
    ok = st.SplitReader().read(st.Split(str(tmp_path / "ok.parquet"), "parquet", 0, 0, 50, 0, 1))
    assert ok["label"].tolist() == [1] * 50


def test_truncated_gzip_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "day_1.gz"
    path.write_bytes(gzip.compress(("\t".join(_good()) + "\n").encode() * 500)[:-40])
    with pytest.raises(TraceFormatError) as exc:
        st.plan_splits(path, 100)
    assert exc.value.file == str(path) and "end-of-stream" in exc.value.why


FIELDS = ["", "0", "7", "-3", "+5", " 5", "-", "1.5", "12345678901234567890", str(2**62)]
CATS = ["", "68fd1e64", "DEADBEEF", "0123abCD", "68fd1e6", "68fd1e6g", "68fd1e640", "\x1068fd1e6"]


@settings(max_examples=40, deadline=None)
@given(hs.data())
def test_the_compiled_tsv_parser_agrees_with_pyarrow(data: hs.DataObject) -> None:
    """Random lines, odd fields among them: the compiled parser's columns (or its hand-off to
    pyarrow, where a line is outside its plain layout) equal pyarrow's, or the same error."""
    lines = []
    for _ in range(data.draw(hs.integers(1, 6))):
        label = data.draw(hs.sampled_from(["0", "1", "1", "2", ""]))
        ints = [
            data.draw(hs.sampled_from(FIELDS[:4] if data.draw(hs.booleans()) else FIELDS))
            for _ in range(13)
        ]
        cats = [
            data.draw(hs.sampled_from(CATS[:4] if data.draw(hs.booleans()) else CATS))
            for _ in range(data.draw(hs.sampled_from([26, 26, 26, 25])))
        ]
        lines.append("\t".join([label, *ints, *cats]))
    end = data.draw(hs.sampled_from(["\n", "", "\r\n"]))
    text = ("\n".join(lines) + end).encode()

    def parse(compiled: bool) -> dict[str, np.ndarray] | str:
        saved = kernels.AVAILABLE
        kernels.AVAILABLE = compiled and saved
        try:
            cols = dec.parse_tsv(text, "f.tsv", 1, 0)
            return st.sparse_transform(st.Block(cols, (len(cols["row_id"]),))).cols
        except (TraceFormatError, dec.BadRow) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            kernels.AVAILABLE = saved

    got, want = parse(True), parse(False)
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
        return
    assert_same(got, want)


def test_importing_the_stages_does_not_import_numba() -> None:
    """numba (about 0.3 s to import) loads when a kernel first runs, not with the stages."""
    import subprocess
    import sys

    code = "import sys, recperf.ingest.data.stages; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
