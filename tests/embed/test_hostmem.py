"""Rows a CPU kernel copies, laid in transparent huge pages (``kernels/hostmem.py``)."""

from __future__ import annotations

import gc
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from recperf.core.errors import ConfigError
from recperf.embed.kernels import KERNELS, Tables, hostmem, make_lookup
from recperf.embed.kernels.hostmem import HUGE_PAGE, empty_rows, stacked_rows, thp_mode

OFFERED = thp_mode() in ("always", "madvise")
needs_thp = pytest.mark.skipif(not OFFERED, reason="this kernel offers no transparent huge pages")


def _mapping(address: int) -> dict[str, str] | None:
    """The ``/proc/self/smaps`` entry of the mapping holding ``address``, or None."""
    entry: dict[str, str] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's first line: "start-end perms ..."
            if entry is not None:
                return entry
            lo, hi = (int(x, 16) for x in head.split("-"))
            entry = {} if lo <= address < hi else None
        elif entry is not None and ":" in head:
            entry[head.rstrip(":")] = line.split(":", 1)[1].strip()
    return entry


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("always [madvise] never\n", "madvise"),
        ("[always] madvise never", "always"),
        ("always madvise [never]", "never"),
        ("", ""),
    ],
)
def test_thp_mode_reads_the_bracketed_choice(tmp_path: Path, text: str, mode: str) -> None:
    setting = tmp_path / "enabled"
    setting.write_text(text)
    assert thp_mode(setting) == mode
    assert thp_mode(tmp_path / "absent") == ""


@needs_thp
def test_rows_over_a_huge_page_are_aligned_and_advised_then_unmapped() -> None:
    rows = empty_rows((3 * HUGE_PAGE // 256 + 5, 128), torch.bfloat16)
    assert rows.huge_pages and "huge pages" in rows.note
    assert rows.data.shape == (3 * HUGE_PAGE // 256 + 5, 128)
    assert rows.data.dtype == torch.bfloat16 and rows.data.is_contiguous()
    address = rows.data.data_ptr()
    assert address % HUGE_PAGE == 0
    rows.data.fill_(1.5)
    assert float(rows.data[-1, -1]) == 1.5
    smaps = _mapping(address)
    assert smaps is not None and smaps["THPeligible"] == "1"
    del rows
    gc.collect()
    assert _mapping(address) is None  # the mapping went with its last tensor


def test_small_rows_and_huge_pages_off_come_from_torch() -> None:
    small = empty_rows((10, 8), torch.float32)
    assert not small.huge_pages and small.note == ""
    off = empty_rows((HUGE_PAGE, 2), torch.float32, huge_pages=False)
    assert not off.huge_pages and off.data.shape == (HUGE_PAGE, 2)


def test_a_system_without_thp_gets_ordinary_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostmem, "thp_mode", lambda: "never")
    rows = empty_rows((HUGE_PAGE, 2), torch.float32)
    assert not rows.huge_pages


class _Refused:
    """An anonymous mapping whose kernel was built without transparent huge pages."""

    closed = False

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def madvise(self, option: int) -> None:
        raise OSError(22, "Invalid argument")

    def close(self) -> None:
        _Refused.closed = True


def test_a_kernel_refusing_the_advice_gets_ordinary_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    import mmap

    monkeypatch.setattr(hostmem, "thp_mode", lambda: "madvise")
    fake = SimpleNamespace(
        MAP_PRIVATE=mmap.MAP_PRIVATE, MAP_ANONYMOUS=mmap.MAP_ANONYMOUS, MADV_HUGEPAGE=14,
        mmap=_Refused,
    )  # fmt: skip
    monkeypatch.setattr(hostmem, "mmap", fake)
    rows = empty_rows((HUGE_PAGE, 2), torch.float32)
    assert not rows.huge_pages and rows.data.shape == (HUGE_PAGE, 2) and _Refused.closed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_stacked_rows_equal_torch_cat(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(r, 64, generator=g).to(dtype) for r in (20000, 1, 7000)]
    stacked = stacked_rows(weights)
    assert torch.equal(stacked.data, torch.cat(weights))
    assert stacked.huge_pages == OFFERED


@pytest.mark.parametrize("huge", [True, False])
def test_bag_concat_pools_the_same_from_either_layout_and_says_which(huge: bool) -> None:
    g = torch.Generator().manual_seed(1)
    tables = Tables(weights=tuple(torch.randn(r, 256, generator=g) for r in (3000, 2000)))
    lookup = make_lookup(tables, batch_size=8, pooling_factor=5, seed=3)
    ref = KERNELS.build("torch", None, tables)
    kernel = KERNELS.build("bag-concat", {"huge_pages": huge}, tables)
    assert torch.equal(kernel(lookup), ref(lookup))
    assert ("huge pages" in kernel.layout_note) == (huge and OFFERED)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["bag-concat", "fbgemm-tbe"])
def test_huge_pages_option_takes_a_bool_only(name: str) -> None:
    if name not in KERNELS:
        pytest.skip(f"{name} is not installed")
    tables = Tables(weights=(torch.zeros(4, 8), torch.zeros(3, 8)))
    with pytest.raises(ConfigError, match="huge_pages: expected true or false, got 'maybe'"):
        KERNELS.build(name, {"huge_pages": "maybe"}, tables)


def test_fbgemm_copies_rows_into_huge_pages() -> None:
    if "fbgemm-tbe" not in KERNELS:
        pytest.skip("fbgemm-tbe is not installed")
    g = torch.Generator().manual_seed(2)
    tables = Tables(weights=tuple(torch.randn(r, 128, generator=g) for r in (3000, 2000)))
    lookup = make_lookup(tables, batch_size=8, pooling_factor=5, seed=4)
    kernel = KERNELS.build("fbgemm-tbe", None, tables)
    assert not kernel.buffer.shared  # type: ignore[attr-defined]
    torch.testing.assert_close(kernel(lookup), KERNELS.build("torch", None, tables)(lookup))
    assert ("huge pages" in kernel.layout_note) == OFFERED  # type: ignore[attr-defined]


def test_the_drop_in_says_where_its_copy_lies() -> None:
    from torch import nn

    from recperf.embed.dropin import EmbeddingBags

    g = torch.Generator().manual_seed(5)
    bags = [
        nn.EmbeddingBag.from_pretrained(torch.randn(r, 256, generator=g), mode="sum")
        for r in (3000, 2000)
    ]
    module = EmbeddingBags.from_torch(bags, kernel="bag-concat").eval()
    ids = [torch.tensor([1, 2, 2999]), torch.tensor([0, 1999])]
    offsets = [torch.tensor([0, 1]), torch.tensor([0, 1])]
    with torch.no_grad():
        pooled = module(ids, offsets)
        for bag, out, i, o in zip(bags, pooled, ids, offsets, strict=True):
            assert torch.equal(out, bag(i, o))
    assert ("huge pages" in module.describe()[0]["note"]) == OFFERED
