"""Embedding-bag kernels behind one contract (``base``): the ``torch`` reference, the Triton
table-batched kernels, and the hot-row / L2-pinning variants. ``KERNELS`` imports this package the
first time it is asked for a name, which registers them all (the Triton ones only where triton is
installed)."""

import importlib

from recperf.embed.kernels import bagconcat, baglist, peers, reference, torch_hot
from recperf.embed.kernels.base import (
    KERNELS,
    EmbeddingKernel,
    Lookup,
    Pooling,
    Tables,
    check_kernel,
    make_lookup,
)

for _module in ("triton_tbe", "hotrows"):  # the kernels that need triton, which is optional
    try:
        importlib.import_module(f"{__name__}.{_module}")
    except ModuleNotFoundError as exc:  # then only the torch kernels register
        if exc.name != "triton":
            raise

__all__ = [
    "KERNELS",
    "EmbeddingKernel",
    "Lookup",
    "Pooling",
    "Tables",
    "bagconcat",
    "baglist",
    "check_kernel",
    "make_lookup",
    "peers",
    "reference",
    "torch_hot",
]
