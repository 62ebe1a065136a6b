"""Embedding-bag kernels behind one contract (``base``): the ``torch`` reference, the Triton
table-batched kernels, and the hot-row / L2-pinning variants; importing this package registers
them all in ``KERNELS`` (the Triton ones only where triton is installed)."""

from recperf.embed.kernels import reference, torch_hot
from recperf.embed.kernels.base import (
    KERNELS,
    PARAM_SPACE,
    EmbeddingKernel,
    Lookup,
    Pooling,
    Tables,
    check_kernel,
    make_lookup,
)

try:
    from recperf.embed.kernels import hotrows, triton_tbe  # noqa: F401  (registers them)
except ModuleNotFoundError as exc:  # triton is optional: then only the reference is registered
    if exc.name != "triton":
        raise

__all__ = [
    "KERNELS",
    "PARAM_SPACE",
    "EmbeddingKernel",
    "Lookup",
    "Pooling",
    "Tables",
    "check_kernel",
    "make_lookup",
    "reference",
    "torch_hot",
]
