"""Every registered embedding kernel equals the torch reference (Triton in its CPU interpreter)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recperf.core.errors import ConfigError, ContractError
from recperf.embed.kernels import (
    KERNELS,
    Lookup,
    Tables,
    base,
    check_kernel,
    make_lookup,
    triton_tbe,
)
from recperf.embed.kernels.bagconcat import BagConcatConfig
from recperf.embed.kernels.base import (
    KernelCase,
    case_inputs,
    kernel_traits,
    magnitude,
    mismatch,
)
from recperf.embed.kernels.formats import ROW_FORMATS
from recperf.embed.kernels.hotrows import CombinedConfig, HotL2Config
from recperf.embed.kernels.peers import FbgemmTBEConfig
from recperf.embed.kernels.torch_hot import TorchHotConfig
from recperf.embed.kernels.triton_tbe import TritonConfig, TritonPrefetchConfig

NAMES = KERNELS.names()
TRITON = ["triton", "triton-prefetch", "hot-l2", "combined"]
LAUNCH = ["bags_per_program", "block_d", "block_n", "num_warps"]


def _fields(cls: type[Any] | None) -> list[str]:
    return sorted(f.name for f in dataclasses.fields(cls)) if cls is not None else []


def test_all_kernels_registered_with_their_config_and_space() -> None:
    assert NAMES == [
        "bag-concat",
        "bag-list",
        "combined",
        "fbgemm-tbe",
        "hot-l2",
        "torch",
        "torch-hot",
        "triton",
        "triton-prefetch",
    ]
    configs = {name: KERNELS.entry(name).config for name in NAMES}
    assert configs == {
        "bag-concat": BagConcatConfig,
        "bag-list": None,
        "fbgemm-tbe": FbgemmTBEConfig,
        "combined": CombinedConfig,
        "hot-l2": HotL2Config,
        "torch": None,
        "torch-hot": TorchHotConfig,
        "triton": TritonConfig,
        "triton-prefetch": TritonPrefetchConfig,
    }
    assert _fields(TritonConfig) == LAUNCH
    assert _fields(TritonPrefetchConfig) == sorted([*LAUNCH, "prefetch"])
    assert _fields(HotL2Config) == sorted([*LAUNCH, "hot_fraction", "refresh"])
    assert _fields(CombinedConfig) == sorted([*LAUNCH, "hot_fraction", "prefetch", "refresh"])
    assert _fields(TorchHotConfig) == ["hot_fraction"]
    spaces = {name: sorted(KERNELS.entry(name).space) for name in NAMES}
    assert spaces == {
        "bag-concat": [],
        "bag-list": [],
        "fbgemm-tbe": [],
        "combined": sorted([*LAUNCH, "prefetch"]),
        "hot-l2": LAUNCH,
        "torch": [],
        "torch-hot": [],
        "triton": LAUNCH,
        "triton-prefetch": sorted([*LAUNCH, "prefetch"]),
    }


@pytest.mark.parametrize("name", NAMES)
def test_check_kernel_passes(name: str) -> None:
    check_kernel(name, seed=1, cases=3)  # 3 random cases in each row format the kernel reads


@pytest.mark.parametrize("name", TRITON)
def test_triton_kernels_read_every_row_format(name: str) -> None:
    assert kernel_traits(name).formats == frozenset(ROW_FORMATS)


def _compare(name: str, case: KernelCase, options: dict[str, Any] | None = None) -> None:
    tables, lookup = case_inputs(case)
    out = KERNELS.build(name, options, tables)(lookup)
    ref = KERNELS.build("torch", None, tables)(lookup)
    assert mismatch(out, ref, magnitude(tables, lookup), tables.row_format) == ""


@settings(max_examples=15, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    rows=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    dim=st.sampled_from([1, 3, 8, 33]),
    pick=st.integers(0, len(ROW_FORMATS) - 1),
    mean=st.booleans(),
    batch=st.integers(1, 4),
    max_len=st.integers(0, 5),
    weighted=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_kernel_equals_reference_on_random_shapes(
    name: str,
    rows: list[int],
    dim: int,
    pick: int,
    mean: bool,
    batch: int,
    max_len: int,
    weighted: bool,
    seed: int,
) -> None:
    formats = [f for f in ROW_FORMATS if f in kernel_traits(name).formats]
    fmt = formats[pick % len(formats)]  # a row format the kernel reads
    case = KernelCase(
        rows=tuple(rows),
        dim=dim + 1 if fmt == "int4" and dim % 2 else dim,  # int4 packs two columns per byte
        fmt=fmt,
        pooling="mean" if mean else "sum",
        batch_size=batch,
        max_len=max_len,
        weighted=weighted,
        seed=seed,
    )
    _compare(name, case)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_empty_bags_one_row_tables_and_ragged_dim(name: str, pooling: str, weighted: bool) -> None:
    # Table 1 has one row; both bags of sample 0 are empty; D = 33 is not a multiple of 16.
    tables = Tables(weights=(torch.randn(5, 33), torch.randn(1, 33)), pooling=pooling)  # type: ignore[arg-type]
    lookup = Lookup(
        indices=torch.tensor([4, 0, 4, 0, 0]),
        offsets=torch.tensor([0, 0, 3, 3, 5]),
        batch_size=2,
        per_sample_weights=torch.tensor([0.5, -1.0, 2.0, 3.0, 0.25]) if weighted else None,
    )
    options = {"block_d": 16} if "block_d" in KERNELS.entry(name).space else {}
    out = KERNELS.build(name, options, tables)(lookup)
    ref = KERNELS.build("torch", None, tables)(lookup)
    assert torch.equal(out[0, 0], torch.zeros(33)) and torch.equal(out[0, 1], torch.zeros(33))
    w = lookup.per_sample_weights if weighted else torch.ones(5)
    assert w is not None
    rows0 = tables.weights[0][[4, 0, 4]] * w[:3, None]
    expected = rows0.sum(0) / (3 if pooling == "mean" else 1)
    torch.testing.assert_close(ref[1, 0], expected, rtol=1e-6, atol=1e-6)
    assert mismatch(out, ref, magnitude(tables, lookup), "fp32") == ""


PARAMS = [(n, p, v) for n in NAMES for p, vs in KERNELS.entry(n).space.items() for v in vs]


@pytest.mark.parametrize(("name", "param", "value"), PARAMS)
def test_every_tunable_value_is_accepted_and_correct(name: str, param: str, value: int) -> None:
    case = KernelCase(
        rows=(7, 3),
        dim=33,
        fmt="fp32",
        pooling="mean",
        batch_size=3,
        max_len=5,
        weighted=True,
        seed=value,
    )
    _compare(name, case, {param: value})


@pytest.mark.parametrize("name", ["triton", "combined"])  # no prefetch; prefetch 2, hot-first
@pytest.mark.parametrize("fmt", ROW_FORMATS)
def test_every_row_format_over_several_column_blocks_and_chunks(name: str, fmt: str) -> None:
    # D = 40 with block_d = 16: three column blocks, the last ragged (int4: 8 bytes a block, the
    # last masked at byte 20); block_n = 4 and bags of up to 9 ids: chunks, prefetched ones too.
    # (check_kernel's cases fit one column block.)
    case = KernelCase(
        rows=(30, 1, 17),
        dim=40,
        fmt=fmt,
        pooling="mean",
        batch_size=3,
        max_len=9,
        weighted=True,
        seed=11,
    )
    options: dict[str, Any] = {"block_d": 16, "block_n": 4, "bags_per_program": 2}
    if "prefetch" in KERNELS.entry(name).space:
        options["prefetch"] = 2
    _compare(name, case, options)


def test_every_fp8_byte_decodes_as_torch_does() -> None:
    # All 256 e4m3fn codes (zeros, subnormals, the largest 448, NaN at 0x7F and 0xFF) as 16 rows
    # of 16, one row per bag: the kernel's integer decode equals torch's float8_e4m3fn exactly.
    tables = Tables(weights=(torch.arange(256, dtype=torch.uint8).view(16, 16),), fmt="fp8")
    lookup = Lookup(indices=torch.arange(16), offsets=torch.arange(17), batch_size=16)
    out = KERNELS.build("triton", {"bags_per_program": 4}, tables)(lookup)
    want = tables.weights[0].view(torch.float8_e4m3fn).float()
    assert torch.isnan(want[7, 15]) and want[0, 1] == 2.0**-9 and want[7, 14] == 448.0
    assert want[8, 1] == -(2.0**-9) and torch.isnan(want[15, 15])
    torch.testing.assert_close(out[:, 0], want, rtol=0, atol=0, equal_nan=True)


def test_options_from_the_cli_are_strings_converted_by_the_config() -> None:
    tables = Tables(weights=(torch.randn(4, 8),))
    kernel = KERNELS.build("triton-prefetch", {"block_n": "32", "prefetch": "2"}, tables)
    assert isinstance(kernel, triton_tbe.TritonTBE)
    assert kernel.options == TritonPrefetchConfig(block_n=32, prefetch=2)
    assert kernel.config == triton_tbe.TBEConfig(block_d=16, block_n=32, prefetch=2)


ALLOWED_LAUNCH = "bags_per_program, block_d, block_n, num_warps"


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("triton", {"block_d": 24}, "block_d = 24 is not one of 16, 32, 64, 128, 256"),
        ("triton", {"block_n": 3}, "block_n = 3 is not one of 4, 8, 16, 32, 64"),
        ("triton", {"num_warps": "3"}, "num_warps = 3 is not one of 1, 2, 4, 8, 16"),
        ("triton", {"bags_per_program": 0}, "bags_per_program = 0 is outside the allowed range"),
        ("triton", {"block_n": "x"}, "block_n: expected an integer, got 'x'"),
        ("triton", {"prefetch": 1}, f"unknown key 'prefetch'; allowed: {ALLOWED_LAUNCH}"),
        ("triton-prefetch", {"prefetch": 3}, "prefetch = 3 is not one of 1, 2"),
        ("triton-prefetch", {"prefetch": 0}, "prefetch = 0 is not one of 1, 2"),
        ("combined", {"prefetch": 3}, "prefetch = 3 is not one of 1, 2"),
        ("hot-l2", {"block_n": 3}, "block_n = 3 is not one of 4, 8, 16, 32, 64"),
        (
            "torch-hot",
            {"hot_fraction": 0},
            "hot_fraction = 0.0 is outside the allowed range (0, 1]",
        ),
        ("torch-hot", {"block_n": 16}, "unknown key 'block_n'; allowed: hot_fraction"),
        ("torch", {"block_n": 16}, "takes no options (got block_n)"),
    ],
)
def test_bad_options_are_one_line_config_errors_from_build(
    name: str, options: dict[str, Any], message: str
) -> None:
    tables = Tables(weights=(torch.randn(4, 8),))
    with pytest.raises(ConfigError) as err:
        KERNELS.build(name, options, tables)
    assert str(err.value).startswith(f"embedding kernel {name!r}: {message}")
    assert "\n" not in str(err.value)


def test_check_kernel_takes_options_and_rejects_bad_ones() -> None:
    check_kernel("triton", cases=2, options={"block_d": "16", "num_warps": 1})
    with pytest.raises(ConfigError, match=r"^embedding kernel 'triton': block_n = 3 "):
        check_kernel("triton", cases=2, options={"block_n": 3})


@pytest.mark.parametrize("name", ["triton", "triton-prefetch", "hot-l2", "combined"])
def test_triton_kernels_on_cpu_need_the_interpreter(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ConfigError, match="TRITON_INTERPRET=1"):
        KERNELS.build(name, None, Tables(weights=(torch.randn(4, 8),)))


def test_check_kernel_catches_a_wrong_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    class OffByOne:
        name = "off-by-one"

        def __init__(self, tables: Tables) -> None:
            self.ref = KERNELS.build("torch", None, tables)

        def __call__(self, lookup: Lookup) -> torch.Tensor:
            out = self.ref(lookup)
            out[-1, -1, -1] += 1e-3 * (1 + out[-1, -1, -1].abs())
            return out

    registry = base.Registry[base.EmbeddingKernel]("embedding kernel")
    registry.register("torch")(KERNELS.factory("torch"))
    registry.register("off-by-one")(OffByOne)
    monkeypatch.setattr(base, "KERNELS", registry)
    with pytest.raises(ContractError, match=r"off-by-one.*reference"):
        base.check_kernel("off-by-one", cases=3)


def test_mismatch_reports_shape_dtype_and_nan() -> None:
    ref = torch.ones(2, 1, 3)
    bound = torch.ones(2, 1, 3)
    assert "shape" in mismatch(torch.ones(2, 3), ref, bound, "fp32")
    assert "dtype" in mismatch(ref.double(), ref, bound, "fp32")
    assert "[1, 0, 2]" in mismatch(
        torch.tensor([1.0, 1, 1, 1, 1, float("nan")]).view(2, 1, 3), ref, bound, "fp32"
    )
    assert mismatch(ref + 5e-7, ref, bound, "fp32") == ""
    assert mismatch(ref + 5e-4, ref, bound, "fp16") == ""
    assert mismatch(ref + 5e-6, ref, bound, "fp32") != ""


def test_make_lookup_shapes_lengths_and_ranges() -> None:
    tables = Tables(weights=(torch.randn(5, 4), torch.randn(1, 4), torch.randn(9, 4)))
    lookup = make_lookup(tables, batch_size=16, pooling_factor=2, seed=3, weighted=True)
    assert lookup.offsets.shape == (3 * 16 + 1,) and lookup.num_tables == 3
    lengths = lookup.offsets.diff()
    assert int(lengths.min()) == 0 and int(lengths.max()) <= 4
    base.validate_lookup(tables, lookup)
    again = make_lookup(tables, batch_size=16, pooling_factor=2, seed=3, weighted=True)
    assert torch.equal(lookup.indices, again.indices)


def test_make_lookup_skew_concentrates_on_few_rows() -> None:
    tables = Tables(weights=(torch.randn(1000, 2),))
    lookup = make_lookup(tables, batch_size=64, pooling_factor=20, seed=0, skew=1.2)
    top10 = torch.bincount(lookup.indices, minlength=1000).sort(descending=True).values[:10]
    assert int(top10.sum()) > 0.4 * lookup.indices.numel()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"weights": ()}, "weights"),
        ({"weights": (torch.randn(0, 4),)}, "weights"),
        ({"weights": (torch.randn(3, 4).double(),)}, "row format"),
        ({"weights": (torch.randn(3, 4), torch.randn(3, 5))}, "weights\\[1\\]"),
        ({"weights": (torch.randn(3, 4),), "pooling": "max"}, "pooling"),
    ],
)
def test_bad_tables_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        Tables(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"indices": torch.zeros(2, dtype=torch.int32)}, "indices"),
        ({"offsets": torch.tensor([0, 1, 2, 2])}, "offsets"),
        ({"batch_size": 0}, "batch_size"),
        ({"per_sample_weights": torch.ones(3)}, "per_sample_weights"),
    ],
)
def test_bad_lookup_names_the_field(kwargs: dict[str, object], field: str) -> None:
    good: dict[str, object] = {
        "indices": torch.zeros(2, dtype=torch.int64),
        "offsets": torch.tensor([0, 1, 2, 2, 2]),
        "batch_size": 2,
    }
    with pytest.raises(ConfigError, match=field):
        Lookup(**{**good, **kwargs})  # type: ignore[arg-type]


def test_lookup_for_other_tables_is_rejected() -> None:
    kernel = KERNELS.build("triton", None, Tables(weights=(torch.randn(4, 8),)))
    lookup = Lookup(
        indices=torch.zeros(0, dtype=torch.int64),
        offsets=torch.zeros(3, dtype=torch.int64),
        batch_size=1,
    )
    with pytest.raises(ConfigError, match="offsets"):
        kernel(lookup)


def test_default_block_d_covers_dim() -> None:
    assert [triton_tbe.default_block_d(d) for d in (1, 16, 33, 128, 1000)] == [16, 16, 64, 128, 128]


def test_torch_hot_puts_the_given_hot_rows_first_and_stays_exact() -> None:
    tables = Tables(weights=(torch.randn(6, 4), torch.randn(3, 4)))
    kernel = KERNELS.build(
        "torch-hot", None, tables, hot_rows=(torch.tensor([5, 2, 5]), torch.tensor([1]))
    )
    assert torch.equal(kernel._weights[0][:2], tables.weights[0][[5, 2]])
    assert torch.equal(kernel._weights[0][2:], tables.weights[0][[0, 1, 3, 4]])
    assert torch.equal(kernel._weights[1][0], tables.weights[1][1])
    lookup = make_lookup(tables, batch_size=3, pooling_factor=2, seed=4, weighted=True)
    assert (
        mismatch(
            kernel(lookup),
            KERNELS.build("torch", None, tables)(lookup),
            magnitude(tables, lookup),
            "fp32",
        )
        == ""
    )
    with pytest.raises(ConfigError, match=r"hot_rows: ids must lie in \[0, 3\)"):
        KERNELS.build("torch-hot", None, tables, hot_rows=(torch.tensor([0]), torch.tensor([3])))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", NAMES)
def test_every_kernel_matches_the_reference_on_cuda(name: str) -> None:
    """On a GPU, compiled (run with TRITON_INTERPRET=0: tests/conftest.py defaults to
    the interpreter), on random shapes in every row format the kernel reads, weights included
    (4 cases a format, as benchmarks/embed_gpu.py's device check: it finds them compiled)."""
    if not base.kernel_traits(name).gpu:
        pytest.skip(f"{name} runs on the CPU only")
    if triton_tbe._JIT_INTERPRETED and name not in ("torch", "torch-hot", "bag-concat"):
        pytest.skip("Triton is interpreted here; run the GPU tests with TRITON_INTERPRET=0")
    check_kernel(name, device="cuda", cases=4)
