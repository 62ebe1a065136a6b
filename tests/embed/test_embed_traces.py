"""Trace loaders (text, Meta format), generators, resolve() and the TBE batch layout."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recperf.core.errors import ConfigError, TraceFormatError
from recperf.embed.traces import Trace, batches, load_meta, load_text, resolve, uniform, zipf


def _trace(*streams: list[int], rows: int = 10) -> Trace:
    ids = tuple(torch.tensor(s, dtype=torch.int64) for s in streams)
    return Trace(name="t", ids=ids, rows=(rows,) * len(streams))


def test_load_text_skips_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("# header\n3\n\n0  \n7 # trailing comment\n3\n")
    trace = load_text(path)
    assert trace.ids[0].tolist() == [3, 0, 7, 3]
    assert trace.rows == (8,)
    assert load_text(path, rows=100).rows == (100,)


def test_load_text_reads_gzip(tmp_path: Path) -> None:
    path = tmp_path / "t.txt.gz"
    path.write_bytes(gzip.compress(b"5\n1\n2\n"))
    assert load_text(path).ids[0].tolist() == [5, 1, 2]


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        ("1\n2\nabc\n", 3, "'abc': expected an integer row id in [0, 10)"),
        ("1\n\n-4\n", 3, "row id -4: expected an integer row id in [0, 10)"),
        ("1\n12\n", 2, "row id 12: expected an integer row id in [0, 10)"),
        ("1\n1e23\n", 2, "'1e23': expected an integer row id in [0, 10)"),
    ],
)
def test_load_text_bad_line_names_file_and_line(
    tmp_path: Path, text: str, line: int, why: str
) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(TraceFormatError) as info:
        load_text(path, rows=10)
    assert (info.value.file, info.value.line, info.value.field) == (str(path), line, "row_id")
    assert why in info.value.why
    assert f"bad.txt:{line}" in str(info.value)


def test_load_text_missing_or_empty_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="cannot read"):
        load_text(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(TraceFormatError, match="no row ids"):
        load_text(tmp_path / "empty.txt")


def _meta_file(path: Path, per_table: list[list[list[int]]], gz: bool) -> None:
    """Write tables x samples bags in Meta's (indices, offsets, lengths) layout."""
    lengths = torch.tensor([[len(bag) for bag in table] for table in per_table])
    flat = [i for table in per_table for bag in table for i in bag]
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
    obj = (torch.tensor(flat, dtype=torch.int64), offsets, lengths)
    if gz:
        with gzip.open(path, "wb") as fh:
            torch.save(obj, fh)
    else:
        torch.save(obj, path)


@pytest.mark.parametrize("gz", [False, True])
def test_load_meta_round_trip(tmp_path: Path, gz: bool) -> None:
    path = tmp_path / ("t.pt.gz" if gz else "t.pt")
    _meta_file(path, [[[1, 2], [], [3]], [[9], [0, 0, 4], [5]]], gz)
    trace = load_meta(path)
    assert [ids.tolist() for ids in trace.ids] == [[1, 2, 3], [9, 0, 0, 4, 5]]
    assert trace.rows == (4, 10)
    assert load_meta(path, rows=[5, 20]).rows == (5, 20)
    assert resolve(path, tables=2).ids[1].tolist() == [9, 0, 0, 4, 5]


def _save(path: Path, obj: object) -> Path:
    torch.save(obj, path)
    return path


@pytest.mark.parametrize(
    ("obj", "field", "why"),
    [
        ((torch.arange(3), torch.tensor([0, 1, 2]), torch.tensor([[1, 1]])), "lengths", "sum"),
        ((torch.arange(3), torch.tensor([0, 3]), torch.tensor([[1, 2]])), "offsets", "[3]"),
        ((torch.arange(3), torch.tensor([0, 2, 3]), torch.tensor([[1, 2]])), "offsets", "step"),
        ((torch.arange(3), torch.tensor([0, 1, 3]), torch.tensor([1, 2])), "lengths", "2-D"),
        ((torch.ones(2, 2), torch.tensor([0, 1, 3]), torch.tensor([[1, 2]])), "indices", "int"),
        ((torch.tensor([0, -1]), torch.tensor([0, 2]), torch.tensor([[2]])), "indices", "neg"),
        ((torch.arange(3), torch.tensor([0, 3])), None, "3 tensors"),
    ],
)
def test_load_meta_rejects_malformed(
    tmp_path: Path, obj: object, field: str | None, why: str
) -> None:
    path = _save(tmp_path / "bad.pt", obj)
    with pytest.raises(TraceFormatError) as info:
        load_meta(path)
    assert (info.value.file, info.value.field) == (str(path), field)
    assert why in info.value.why


def test_load_meta_rejects_rows_too_small_and_non_torch_files(tmp_path: Path) -> None:
    path = tmp_path / "t.pt"
    _meta_file(path, [[[1, 7]]], gz=False)
    with pytest.raises(TraceFormatError, match="row id 7 >= rows 5"):
        load_meta(path, rows=5)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(TraceFormatError, match=r"not a torch\.save trace"):
        load_meta(junk)


def test_generators_are_seeded_and_in_range() -> None:
    assert torch.equal(uniform(100, 1000, 3), uniform(100, 1000, 3))
    assert not torch.equal(uniform(100, 1000, 3), uniform(100, 1000, 4))
    z = zipf(1000, 5000, 1.1, 7)
    assert torch.equal(z, zipf(1000, 5000, 1.1, 7))
    assert z.dtype == torch.int64 and int(z.min()) >= 0 and int(z.max()) < 1000
    # Hot rows are scattered by the permutation, not the ids 0, 1, 2 ...
    hottest = torch.bincount(z, minlength=1000).argsort(descending=True)[:5]
    assert hottest.tolist() != [0, 1, 2, 3, 4]


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 300), n=st.integers(1, 400), alpha=st.floats(0, 3), seed=st.integers(0))
def test_zipf_ids_always_in_range(rows: int, n: int, alpha: float, seed: int) -> None:
    z = zipf(rows, n, alpha, seed)
    assert z.numel() == n and int(z.min()) >= 0 and int(z.max()) < rows


def test_zipf_skew_grows_with_alpha() -> None:
    def top_share(alpha: float) -> float:
        counts = torch.bincount(zipf(10_000, 50_000, alpha, 0), minlength=10_000)
        return float(counts.sort(descending=True).values[:100].sum()) / 50_000

    assert top_share(0.0) < top_share(0.8) < top_share(1.2)


@pytest.mark.parametrize("name", ["uniform", "zipf:0.9", "reuse-high", "reuse-low"])
def test_resolve_generated(name: str) -> None:
    trace = resolve(name, rows=1000, tables=3, lookups=500, seed=1)
    assert trace.rows == (1000, 1000, 1000)
    assert [ids.numel() for ids in trace.ids] == [500, 500, 500]
    assert not torch.equal(trace.ids[0], trace.ids[1])
    again = resolve(name, rows=1000, tables=3, lookups=500, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(trace.ids, again.ids, strict=True))


def test_resolve_bundled_trace() -> None:
    trace = resolve("reuse-medium-500k")
    assert trace.name == "reuse-medium-500k"
    assert trace.rows == (500_000,)
    assert trace.ids[0].numel() == 429_951
    assert trace.ids[0][:3].tolist() == [31650, 359284, 222813]


def test_tiled_shares_locality_but_differs() -> None:
    base = resolve("zipf:1.1", rows=500, lookups=2000, seed=2)
    tiled = base.tiled(3, seed=5)
    assert tiled.tables == 3 and tiled.rows == (500,) * 3
    assert torch.equal(tiled.ids[0], base.ids[0])
    assert not torch.equal(tiled.ids[1], tiled.ids[2])
    counts = [torch.bincount(ids, minlength=500).sort().values for ids in tiled.ids]
    assert torch.equal(counts[0], counts[1]) and torch.equal(counts[0], counts[2])


@pytest.mark.parametrize(
    ("name", "error", "match"),
    [
        ("nope", ConfigError, "reuse-medium-500k"),
        ("zipf:x", ConfigError, "zipf:1.05"),
        ("zipf:-1", ConfigError, "alpha"),
        ("missing.txt", TraceFormatError, "cannot read"),
    ],
)
def test_resolve_rejects(name: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        resolve(name, rows=100, lookups=10)


def test_trace_validates_ids() -> None:
    with pytest.raises(ConfigError, match="row id 10 is outside"):
        _trace([1, 10])
    with pytest.raises(ConfigError, match="1-D int64"):
        Trace(name="t", ids=(torch.tensor([1.0]),), rows=(4,))
    with pytest.raises(ConfigError, match="one per table"):
        Trace(name="t", ids=(), rows=())


def test_batches_layout_offsets_and_wrap() -> None:
    trace = _trace([0, 1, 2, 3, 4], [5, 6, 7, 8, 9])
    it = batches(trace, batch_size=2, pooling_factor=2)
    indices, offsets = next(it)
    assert indices.tolist() == [0, 1, 2, 3, 5, 6, 7, 8]
    assert offsets.tolist() == [0, 2, 4, 6, 8]
    indices, _ = next(it)  # wraps around the 5-id streams
    assert indices.tolist() == [4, 0, 1, 2, 9, 5, 6, 7]
    third, _ = next(it)
    again, _ = next(batches(trace, batch_size=2, pooling_factor=2, start=2))
    assert torch.equal(third, again) and third.tolist() == [3, 4, 0, 1, 8, 9, 5, 6]
    assert indices.dtype == offsets.dtype == torch.int64


def test_batches_rejects_bad_sizes() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        next(batches(_trace([1]), batch_size=0, pooling_factor=1))
