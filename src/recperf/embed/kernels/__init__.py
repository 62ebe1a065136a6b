"""Embedding-bag kernels behind one contract (``base``): the ``torch`` reference, the Triton
table-batched kernels, and the hot-row / L2-pinning variants. ``KERNELS`` imports this package the
first time it is asked for a name, which registers them all (the Triton ones only where triton is
installed)."""

from recperf.embed.kernels import reference, torch_hot
from recperf.embed.kernels.base import (
    KERNELS,
    EmbeddingKernel,
    Lookup,
    Pooling,
    Tables,
    check_kernel,
    make_lookup,
)

try:
    from recperf.embed.kernels import hotrows, triton_tbe  # noqa: F401  (registers them)
except ModuleNotFoundError as exc:  # triton is optional: then only the torch kernels register
    if exc.name != "triton":
        raise

__all__ = [
    "KERNELS",
    "EmbeddingKernel",
    "Lookup",
    "Pooling",
    "Tables",
    "check_kernel",
    "make_lookup",
    "reference",
    "torch_hot",
]
