"""Row formats of embedding tables: what one row's bytes hold and how they turn into float32.

- ``fp32``, ``fp16``, ``bf16``: the float dtypes, one element per column.
- ``fp8``: one byte per column, e4m3 (4 exponent bits, bias 7, no infinities), no scale: FBGEMM's
  ``SparseType.FP8`` with its default exponent bits and bias, stored as ``uint8`` (or torch's
  ``float8_e4m3fn``).
- ``int8``, ``int4``: FBGEMM's IntNBit rows (``IntNBitTableBatchedEmbeddingBagsCodegen``,
  ``torchrec.quant.EmbeddingBagCollection``): unsigned codes ``q`` with a per-row ``scale`` and
  ``bias`` (float16 each), the value is ``q * scale + bias``. ``int4`` packs two codes per byte,
  column ``2k`` in the low nibble. The codes are a ``uint8 [rows, D]`` (int4: ``[rows, D / 2]``)
  tensor and the scale and bias a ``uint8 [rows, 4]`` one (two float16, scale first), as
  FBGEMM's ``split_embedding_weights()`` returns them: views into its buffer, where the four
  scale-and-bias bytes lead each row, so a table quantized by FBGEMM or TorchRec is read where
  it lies, not copied."""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

from recperf.core.errors import ConfigError

RowFormat = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4"]
ROW_FORMATS: tuple[str, ...] = get_args(RowFormat)
FLOAT_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
"""The float formats and their dtypes."""
INTEGER_FORMATS = ("int8", "int4")
"""The formats with a per-row scale and bias."""
QUANTIZED_FORMATS = ("fp8", *INTEGER_FORMATS)
SCALE_BIAS_BYTES = 4
"""A row's float16 scale and bias, in FBGEMM's IntNBit layout."""
BITS = {"int8": 8, "int4": 4}
FP8_MAX = 448.0
"""The largest finite e4m3 value; larger ones are clamped to it when quantizing."""


def format_of(dtype: torch.dtype) -> str | None:
    """The row format a tensor of ``dtype`` is by itself (None: ``uint8``, which needs one)."""
    for name, dt in FLOAT_DTYPES.items():
        if dt == dtype:
            return name
    if dtype == torch.float8_e4m3fn:
        return "fp8"
    return None


def check_format(fmt: object, where: str = "dtype") -> str:
    """``fmt`` if it names a row format, else one ConfigError listing them."""
    if fmt not in ROW_FORMATS:
        raise ConfigError(
            f"{where}: {fmt!r} is not a row format; allowed: {', '.join(ROW_FORMATS)}"
        )
    return str(fmt)


def data_columns(fmt: str, dim: int) -> int:
    """Columns of a table's data tensor for rows of width ``dim`` (int4 packs two per byte)."""
    return dim // 2 if fmt == "int4" else dim


def dim_of(fmt: str, columns: int) -> int:
    """The row width a data tensor of ``columns`` columns holds."""
    return columns * 2 if fmt == "int4" else columns


def row_bytes(fmt: str, dim: int) -> int:
    """Bytes one row of width ``dim`` takes: its elements plus, for int8/int4, scale and bias."""
    check_format(fmt)
    if fmt in FLOAT_DTYPES:
        return dim * FLOAT_DTYPES[fmt].itemsize
    if fmt == "fp8":
        return dim
    return math.ceil(dim * BITS[fmt] / 8) + SCALE_BIAS_BYTES


def scales(scale_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``[rows]`` scale and bias of a ``uint8 [rows, 4]`` scale-and-bias tensor."""
    halves = scale_bias.contiguous().view(torch.float16).float()
    return halves[:, 0], halves[:, 1]


def dequantize(weight: torch.Tensor, scale_bias: torch.Tensor | None, fmt: str) -> torch.Tensor:
    """float32 ``[rows, D]`` values of a table's rows (a new tensor, but float32 rows as
    they are)."""
    if fmt in FLOAT_DTYPES:
        return weight.float()
    if fmt == "fp8":
        return fp8_view(weight).float()
    assert scale_bias is not None, "int8/int4 rows need their scale and bias"
    codes = weight
    if fmt == "int4":
        codes = torch.stack([weight & 0xF, weight >> 4], dim=2).reshape(weight.shape[0], -1)
    scale, bias = scales(scale_bias)
    return codes.float() * scale[:, None] + bias[:, None]


def fp8_view(weight: torch.Tensor) -> torch.Tensor:
    """fp8 rows as torch's ``float8_e4m3fn`` (a view of ``uint8`` ones)."""
    return weight if weight.dtype == torch.float8_e4m3fn else weight.view(torch.float8_e4m3fn)


def quantize(weight: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A float table's rows in ``fmt``: the data tensor and, for int8/int4, the scale and bias
    (FBGEMM's row-wise scheme: ``scale = (max - min) / (2^bits - 1)`` and ``bias = min``, both
    rounded to float16 first, codes rounded to nearest). New tensors; ``weight`` is untouched.
    Raises ConfigError (naming the field) for what the format cannot hold."""
    check_format(fmt)
    w = weight.detach()
    if not w.is_floating_point() or w.dim() != 2:
        raise ConfigError(f"weight: expected a 2-D float tensor, got {tuple(w.shape)} {w.dtype}")
    if not bool(torch.isfinite(w).all()):
        raise ConfigError("weight: holds NaN or infinite values, which no row format can scale")
    if fmt in FLOAT_DTYPES:
        return w.to(FLOAT_DTYPES[fmt]), None
    if fmt == "fp8":
        return w.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8), None
    if fmt == "int4" and w.shape[1] % 2:
        raise ConfigError(f"dim: int4 packs two columns per byte; {w.shape[1]} is odd")
    levels = (1 << BITS[fmt]) - 1
    x = w.float()
    lo, hi = x.min(dim=1).values, x.max(dim=1).values
    bias = lo.half()
    scale = ((hi - lo) / levels).half()
    if not bool(torch.isfinite(scale).all()):
        raise ConfigError("weight: a row's range is too wide for a float16 scale")
    safe = torch.where(scale == 0, torch.ones_like(scale), scale).float()
    codes = torch.round((x - bias.float()[:, None]) / safe[:, None]).clamp(0, levels)
    q = codes.to(torch.uint8)
    if fmt == "int4":
        q = q[:, 0::2] | (q[:, 1::2] << 4)
    sb = torch.stack([scale, bias], dim=1).contiguous().view(torch.uint8)
    return q.contiguous(), sb
