"""Hot-row remapping is exact and puts hot rows first; the running counter finds them; the L2
window sizing and the cuda-python call sequence are checked without a GPU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recperf.core.errors import ConfigError, RecperfError
from recperf.embed.kernels import KERNELS, Tables, l2pin, make_lookup
from recperf.embed.kernels.base import KernelCase, case_inputs, magnitude, mismatch
from recperf.embed.kernels.formats import ROW_FORMATS, SCALE_BIAS_BYTES
from recperf.embed.kernels.hotrows import HotRowCounter, HotRowKernel, HotRowRemap
from recperf.embed.kernels.rowbuffer import ALIGN


def _tables(rows: list[int], dim: int = 3, seed: int = 0) -> Tables:
    g = torch.Generator().manual_seed(seed)
    return Tables(weights=tuple(torch.randn(r, dim, generator=g) for r in rows))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), rows=st.lists(st.integers(1, 30), min_size=1, max_size=3))
def test_remap_is_exact_and_hot_rows_come_first(data: st.DataObject, rows: list[int]) -> None:
    tables = _tables(rows, seed=len(rows))
    hot = [
        torch.tensor(
            data.draw(st.permutations(range(r)))[: data.draw(st.integers(0, r))], dtype=torch.int64
        )
        for r in rows
    ]
    remap = HotRowRemap(tables, hot)
    lookup = make_lookup(tables, batch_size=3, pooling_factor=3, seed=data.draw(st.integers(0, 99)))
    new = remap.remap(lookup)
    # Every looked-up row of the permuted buffer is the original row, bit for bit.
    per_table = lookup.offsets[:: lookup.batch_size].tolist()
    for t in range(tables.num_tables):
        ids = lookup.indices[per_table[t] : per_table[t + 1]]
        got = remap.buffer[new.indices[per_table[t] : per_table[t + 1]]]
        assert torch.equal(got, tables.weights[t][ids])
    # Hot rows fill the front of the buffer by rank: every table's first, then every second...
    expected_front = torch.cat(
        [
            tables.weights[t][hot[t][k]][None]
            for k in range(max(h.numel() for h in hot))
            for t in range(tables.num_tables)
            if k < hot[t].numel()
        ]
        or [torch.empty(0, tables.dim)]
    )
    assert torch.equal(remap.hot_region, expected_front)
    assert remap.hot_count == sum(h.numel() for h in hot)
    assert remap.hot_bytes == remap.hot_count * tables.dim * 4
    # The remap is a permutation of all rows.
    everything = torch.cat(remap.remaps).sort().values
    assert torch.equal(everything, torch.arange(sum(rows)))
    assert torch.equal(new.offsets, lookup.offsets)


@pytest.mark.parametrize(
    ("hot", "match"),
    [
        ([torch.tensor([0, 5])], "hot_rows\\[0\\]"),
        ([torch.tensor([1, 1])], "distinct"),
        ([torch.tensor([0]), torch.tensor([0])], "hot_rows"),
    ],
)
def test_bad_hot_rows_are_config_errors(hot: list[torch.Tensor], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        HotRowRemap(_tables([5]), hot)


def test_a_prefix_of_the_hot_region_holds_every_tables_hottest_rows() -> None:
    # What an L2 window smaller than the region pins: 3 rows of 3 tables' 2 hot rows each.
    tables = _tables([6, 6, 6])
    hot = [torch.tensor([5, 4]), torch.tensor([0, 1]), torch.tensor([3, 2])]
    prefix = HotRowRemap(tables, hot).hot_region[:3]
    assert torch.equal(prefix, torch.stack([tables.weights[t][h[0]] for t, h in enumerate(hot)]))


def test_counter_finds_the_hottest_rows_most_first_and_decays() -> None:
    tables = _tables([10, 4])
    counter = HotRowCounter(tables)
    lookup = make_lookup(tables, batch_size=1, pooling_factor=0)  # empty bags
    object.__setattr__(lookup, "indices", torch.tensor([7, 7, 7, 2, 2, 9, 3, 3, 1]))
    object.__setattr__(lookup, "offsets", torch.tensor([0, 6, 9]))
    counter.observe(lookup)
    hot = counter.hottest(0.3)
    assert hot[0].tolist() == [7, 2, 9] and hot[1].tolist() == [3]
    assert int(counter.counts[7]) == 1  # halved from 3


def test_hot_kernel_refreshes_its_hot_set_and_stays_exact() -> None:
    tables = _tables([40, 20], dim=5)
    kernel = KERNELS.build("hot-l2", {"hot_fraction": 0.25, "refresh": "2"}, tables)
    assert isinstance(kernel, HotRowKernel)
    ref = KERNELS.build("torch", None, tables)
    for i in range(5):
        lookup = make_lookup(tables, batch_size=4, pooling_factor=4, seed=i, skew=1.5)
        torch.testing.assert_close(kernel(lookup), ref(lookup), rtol=1e-6, atol=1e-5)
        if i == 0:  # no refresh yet: nothing is hot
            assert kernel.remapper.hot_count == 0
    assert 0 < kernel.remapper.hot_count <= 10 + 5
    assert kernel.last_window is not None and kernel.last_window.active is False  # CPU: no-op


def test_static_hot_rows_are_used_as_given() -> None:
    tables = _tables([8, 3])
    hot = (torch.tensor([5, 1]), torch.tensor([2]))
    kernel = KERNELS.build("combined", {"prefetch": 2}, tables, hot_rows=hot)
    assert isinstance(kernel, HotRowKernel) and kernel.config.prefetch == 2
    assert kernel.counter is None  # given hot rows are never re-counted
    region = kernel.remapper.hot_region  # by rank: table 0's 5, table 1's 2, table 0's 1
    assert torch.equal(region, torch.stack([tables.weights[0][5], tables.weights[1][2],
                                            tables.weights[0][1]]))  # fmt: skip
    lookup = make_lookup(tables, batch_size=2, pooling_factor=3, seed=4, weighted=True)
    ref = KERNELS.build("torch", None, tables)(lookup)
    torch.testing.assert_close(kernel(lookup), ref, rtol=1e-6, atol=1e-5)


def _quantized(fmt: str, rows: tuple[int, ...] = (9, 1, 12), dim: int = 6) -> Tables:
    case = KernelCase(rows=rows, dim=dim, fmt=fmt, pooling="sum", batch_size=1, max_len=0,
                      weighted=False, seed=5)  # fmt: skip
    return case_inputs(case)[0]


@pytest.mark.parametrize("fmt", ROW_FORMATS)
def test_hot_first_layout_moves_scale_and_bias_with_their_rows(fmt: str) -> None:
    tables = _quantized(fmt)
    hot = [torch.tensor([4, 8]), torch.tensor([0]), torch.tensor([11, 2, 5])]
    remap = HotRowRemap(tables, hot)
    rows = remap.rows
    # Every position of the buffer holds its original row's data, and its scale and bias.
    old = torch.argsort(torch.cat(remap.remaps))  # position -> row of the concatenated tables
    data = torch.cat(tables.weights)
    assert torch.equal(rows.data, data[old])
    assert remap.hot_count == 6 and remap.hot_bytes == 6 * tables.row_bytes
    window = remap.hot_window
    assert window.is_contiguous() and window.numel() * window.element_size() == remap.hot_bytes
    if tables.scale_bias is None:
        assert torch.equal(window, rows.data[:6]) and rows.scale_bias is rows.data
        return
    sb = torch.cat(tables.scale_bias)[old]
    n, cols = rows.rows, int(data.shape[1])
    # The layout the kernel reads: row r's 4 bytes 4r before row 0's, codes from an aligned row 0.
    assert rows.codes_offset % ALIGN == 0
    raw = rows.storage
    for p in range(n):
        at = rows.codes_offset - SCALE_BIAS_BYTES * (p + 1)
        assert torch.equal(raw[at : at + SCALE_BIAS_BYTES], sb[p])
        assert torch.equal(raw[rows.codes_offset + p * cols :][:cols], data[old[p]])
    # The pinned window: the hot rows' scale and bias (last hot row first), then their codes.
    assert torch.equal(window[: 6 * SCALE_BIAS_BYTES].view(6, SCALE_BIAS_BYTES), sb[:6].flip(0))
    assert torch.equal(window[6 * SCALE_BIAS_BYTES :].view(6, cols), rows.data[:6])
    assert rows.scale_bias.dtype == torch.float16
    assert rows.scale_bias.data_ptr() == raw.data_ptr() + rows.codes_offset - SCALE_BIAS_BYTES


@pytest.mark.parametrize("fmt", ROW_FORMATS)
def test_hot_kernels_read_every_row_format(fmt: str) -> None:
    tables = _quantized(fmt, rows=(20, 3, 14), dim=10)
    ref = KERNELS.build("torch", None, tables)
    hot = (torch.tensor([3, 19, 0]), torch.tensor([2]), torch.tensor([13, 1]))
    given = KERNELS.build("combined", {"prefetch": 2, "block_n": 4}, tables, hot_rows=hot)
    counted = KERNELS.build("hot-l2", {"hot_fraction": 0.5, "refresh": 1}, tables)
    for seed in range(2):  # the counted kernel re-chooses its hot rows after each call
        lookup = make_lookup(tables, batch_size=3, pooling_factor=4, seed=seed, weighted=True)
        want, bound = ref(lookup), magnitude(tables, lookup)
        for kernel in (given, counted):
            assert mismatch(kernel(lookup), want, bound, fmt) == "", kernel.name
    assert isinstance(counted, HotRowKernel) and counted.remapper.hot_count > 0


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("hot-l2", {"hot_fraction": 1.5}, "hot_fraction = 1.5 is outside the allowed range (0, 1]"),
        ("hot-l2", {"hot_fraction": 0}, "hot_fraction = 0.0 is outside the allowed range (0, 1]"),
        ("hot-l2", {"refresh": 0}, "refresh = 0 is outside the allowed range [1, inf]"),
        ("combined", {"refresh": "x"}, "refresh: expected an integer, got 'x'"),
        ("combined", {"prefetch": 0}, "prefetch = 0 is not one of 1, 2"),
        (
            "hot-l2",
            {"hot_rows": 1},
            "unknown key 'hot_rows'; allowed: bags_per_program, block_d, block_n, hot_fraction, "
            "num_warps, refresh",
        ),
    ],
)
def test_bad_hot_options_are_one_line_config_errors(
    name: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        KERNELS.build(name, options, _tables([4]))
    assert str(err.value) == f"embedding kernel {name!r}: {message}"


@pytest.mark.parametrize(
    ("hot", "persisting", "window", "expected"),
    [
        (1000, 4096, 8192, 1000),  # the hot region fits
        (10_000, 4096, 8192, 4096),  # capped by the persisting set-aside
        (10_000, 65536, 2048, 2048),  # capped by the largest window
        (10_000, 0, 8192, 0),  # no persisting L2 (before Ampere): pin nothing
        (0, 4096, 8192, 0),
    ],
)
def test_window_bytes(hot: int, persisting: int, window: int, expected: int) -> None:
    assert l2pin.window_bytes(hot, persisting, window) == expected


def test_l2_window_is_a_noop_on_cpu() -> None:
    with l2pin.L2Window(torch.ones(10)) as window:
        assert window.active is False and window.num_bytes == 0
    assert window.active is False


class _FakeRuntime:
    """Stands in for cuda.bindings.runtime: records the calls ``pin``/``unpin`` make."""

    def __init__(self, persisting: int, window: int) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.limits = {"persist": persisting, "window": window}
        self.cudaDeviceAttr = SimpleNamespace(
            cudaDevAttrMaxPersistingL2CacheSize="persist",
            cudaDevAttrMaxAccessPolicyWindowSize="window",
        )
        self.cudaLimit = SimpleNamespace(cudaLimitPersistingL2CacheSize="persisting-limit")
        self.cudaAccessProperty = SimpleNamespace(
            cudaAccessPropertyNormal=0,
            cudaAccessPropertyStreaming=1,
            cudaAccessPropertyPersisting=2,
        )
        self.cudaStreamAttrID = SimpleNamespace(cudaStreamAttributeAccessPolicyWindow="apw")

    def cudaStreamAttrValue(self) -> SimpleNamespace:
        return SimpleNamespace(accessPolicyWindow=SimpleNamespace())

    def cudaDeviceGetAttribute(self, attr: str, device: int) -> tuple[int, int]:
        return 0, self.limits[attr]

    def cudaDeviceSetLimit(self, limit: str, value: int) -> tuple[int]:
        self.calls.append(("limit", limit, value))
        return (0,)

    def cudaStreamSetAttribute(self, stream: int, attr: str, value: Any) -> tuple[int]:
        w = value.accessPolicyWindow
        self.calls.append(
            ("window", stream, attr, w.base_ptr, w.num_bytes, w.hitRatio, w.hitProp, w.missProp)
        )
        return (0,)

    def cudaCtxResetPersistingL2Cache(self) -> tuple[int]:
        self.calls.append(("reset",))
        return (0,)


def test_pin_and_unpin_call_sequence() -> None:
    rt = _FakeRuntime(persisting=4096, window=8192)
    assert l2pin.pin(rt, 7, 0x1000, 10_000, device=0) == 4096
    l2pin.unpin(rt, 7)
    assert rt.calls == [
        ("limit", "persisting-limit", 4096),
        ("window", 7, "apw", 0x1000, 4096, 1.0, 2, 1),
        ("window", 7, "apw", 0, 0, 0.0, 0, 1),
        ("reset",),
    ]
    rt.calls.clear()
    l2pin.pin(rt, 7, 0x1000, 10_000, device=0)  # same size: the set-aside is not set again
    assert [c[0] for c in rt.calls] == ["window"]


def test_device_limits_are_queried_once_per_runtime_and_device() -> None:
    rt = _FakeRuntime(persisting=4096, window=8192)
    queries: list[str] = []
    real = rt.cudaDeviceGetAttribute

    def counted(attr: str, device: int) -> tuple[int, int]:
        queries.append(attr)
        return real(attr, device)

    rt.cudaDeviceGetAttribute = counted  # type: ignore[method-assign]
    for _ in range(3):
        l2pin.pin(rt, 7, 0x1000, 10_000, device=0)
    assert len(queries) == 2  # the two limits, once
    l2pin.pin(rt, 7, 0x1000, 10_000, device=1)
    assert len(queries) == 4


def test_pin_on_a_gpu_without_persisting_l2_sets_nothing() -> None:
    rt = _FakeRuntime(persisting=0, window=0)
    assert l2pin.pin(rt, 0, 0x1000, 100, device=1) == 0
    assert rt.calls == []


def test_cuda_errors_are_raised() -> None:
    rt = _FakeRuntime(persisting=4096, window=8192)
    rt.cudaCtxResetPersistingL2Cache = lambda: (700,)  # type: ignore[method-assign]
    with pytest.raises(RecperfError, match="cudaCtxResetPersistingL2Cache"):
        l2pin.unpin(rt, 0)


def test_missing_cuda_python_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_module(name: str) -> None:
        raise ImportError(name)

    monkeypatch.setattr(l2pin.importlib, "import_module", no_module)
    with pytest.raises(ConfigError, match="pip install cuda-python"):
        l2pin.load_runtime()


def test_real_cuda_python_bindings_accept_our_arguments() -> None:
    """Against the installed cuda-python with no driver: every call must reach CUDA and come back
    as an error code (a wrong argument type or attribute name raises before that)."""
    rt = pytest.importorskip("cuda.bindings.runtime")
    if torch.cuda.is_available():
        pytest.skip("a driver is present: test_pin_window_on_a_real_gpu covers this")
    with pytest.raises(RecperfError, match="query L2 size failed"):
        l2pin.device_limits(rt, 0)
    with pytest.raises(RecperfError, match="cudaStreamSetAttribute failed"):
        l2pin._set_window(rt, 0, 0x1000, 4096, "cudaAccessPropertyPersisting")
    with pytest.raises(RecperfError, match="cudaStreamSetAttribute failed"):
        l2pin.unpin(rt, 0)
    limit = rt.cudaLimit.cudaLimitPersistingL2CacheSize
    with pytest.raises(RecperfError, match="cudaDeviceSetLimit failed"):
        l2pin._check(rt.cudaDeviceSetLimit(limit, 4096), "cudaDeviceSetLimit")
    with pytest.raises(RecperfError, match="cudaCtxResetPersistingL2Cache failed"):
        l2pin._check(rt.cudaCtxResetPersistingL2Cache(), "cudaCtxResetPersistingL2Cache")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pin_window_on_a_real_gpu() -> None:
    rt = pytest.importorskip("cuda.bindings.runtime")
    region = torch.ones(1 << 20, device="cuda")  # 4 MiB
    stream = int(torch.cuda.current_stream().cuda_stream)
    names = ("cudaStreamAttributeAccessPolicyWindow", "cudaLaunchAttributeAccessPolicyWindow")
    attr = next(getattr(rt.cudaStreamAttrID, n) for n in names if hasattr(rt.cudaStreamAttrID, n))
    with l2pin.L2Window(region) as window:
        assert window.active and 0 < window.num_bytes <= region.numel() * 4
        value = l2pin._check(rt.cudaStreamGetAttribute(stream, attr), "get window")
        assert value.accessPolicyWindow.base_ptr == region.data_ptr()
        assert value.accessPolicyWindow.num_bytes == window.num_bytes
        region.mul_(2)
    value = l2pin._check(rt.cudaStreamGetAttribute(stream, attr), "get window")
    assert value.accessPolicyWindow.num_bytes == 0 and not window.active
    torch.cuda.synchronize()
