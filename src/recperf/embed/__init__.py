"""DLRM inference embedding stage: access traces, their locality, kernels and benchmarks.

``EmbeddingBags`` (the drop-in module, ``recperf.embed.dropin``) is imported on first use, so
importing this package stays cheap."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recperf.embed.dropin import DropInConfig, EmbeddingBags

__all__ = ["DropInConfig", "EmbeddingBags"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from recperf.embed import dropin

        return getattr(dropin, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
