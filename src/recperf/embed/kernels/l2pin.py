"""Pin a hot region of device memory in the GPU's persisting L2 set-aside (Ampere and newer) with a
stream access-policy window, through cuda-python (imported only when a CUDA tensor is pinned).

``window_bytes`` (the size actually pinned) is pure; ``pin``/``unpin`` take the runtime module as
an argument so their call sequence can be checked without a GPU; ``L2Window`` is the context
manager kernels wrap around a launch, a no-op (``active`` stays False) for CPU tensors."""

from __future__ import annotations

import importlib
import weakref
from types import TracebackType
from typing import Any

import torch

from recperf.core.errors import ConfigError, RecperfError

# cudaDeviceAttr values (CUDA 11+): the largest persisting set-aside and access-policy window.
_ATTR_PERSISTING_MAX = "cudaDevAttrMaxPersistingL2CacheSize"
_ATTR_WINDOW_MAX = "cudaDevAttrMaxAccessPolicyWindowSize"
# The persisting set-aside last set per (runtime, device), so a repeated pin does not re-set it.
# Both keyed by the runtime module itself (weakly), then the device: an id() could be reused.
_LIMITS_SET: weakref.WeakKeyDictionary[Any, dict[int, int]] = weakref.WeakKeyDictionary()
_DEVICE_LIMITS: weakref.WeakKeyDictionary[Any, dict[int, tuple[int, int]]] = (
    weakref.WeakKeyDictionary()
)


def window_bytes(hot_bytes: int, persisting_max: int, window_max: int) -> int:
    """Bytes to pin: the hot region, capped by the device's persisting-L2 maximum and its largest
    access-policy window; 0 (pin nothing) when any of them is 0 or negative."""
    return max(0, min(hot_bytes, persisting_max, window_max))


def load_runtime() -> Any:
    """The cuda-python runtime module (``cuda.bindings.runtime``, or the older ``cuda.cudart``)."""
    for module in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            return importlib.import_module(module)
        except ImportError:
            continue
    raise ConfigError(
        "l2 pinning: cuda-python is not installed; run `pip install cuda-python` (or use the "
        "'triton' / 'triton-prefetch' kernels, which do not pin)"
    )


def _check(result: Any, what: str) -> Any:
    """cuda-python returns ``(err, *values)``: raise on an error, else return the first value."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RecperfError(f"l2 pinning: {what} failed with {err!r}")
    return values[0] if values else None


def device_limits(rt: Any, device: int) -> tuple[int, int]:
    """(max persisting L2 bytes, max access-policy window bytes) of ``device``; 0s before Ampere.
    Queried once per (runtime, device): they are fixed, and pinning runs once per kernel call."""
    known = _DEVICE_LIMITS.setdefault(rt, {})
    if device not in known:
        known[device] = _query_limits(rt, device)
    return known[device]


def _query_limits(rt: Any, device: int) -> tuple[int, int]:
    attrs = rt.cudaDeviceAttr
    persisting = _check(
        rt.cudaDeviceGetAttribute(getattr(attrs, _ATTR_PERSISTING_MAX), device), "query L2 size"
    )
    window = _check(
        rt.cudaDeviceGetAttribute(getattr(attrs, _ATTR_WINDOW_MAX), device), "query window size"
    )
    return int(persisting), int(window)


def _set_window(rt: Any, stream: int, ptr: int, num_bytes: int, hit_prop: str) -> None:
    value_cls = getattr(rt, "cudaStreamAttrValue", None) or rt.cudaLaunchAttributeValue
    value = value_cls()
    window = value.accessPolicyWindow
    window.base_ptr = ptr
    window.num_bytes = num_bytes
    window.hitRatio = 1.0 if num_bytes else 0.0
    window.hitProp = getattr(rt.cudaAccessProperty, hit_prop)
    window.missProp = rt.cudaAccessProperty.cudaAccessPropertyStreaming
    value.accessPolicyWindow = window
    # Older bindings name the attribute cudaStreamAttributeAccessPolicyWindow; cuda-python 13
    # keeps the cudaStreamAttrID enum but names that member as a launch attribute.
    ids = getattr(rt, "cudaStreamAttrID", None)
    names = ("cudaStreamAttributeAccessPolicyWindow", "cudaLaunchAttributeAccessPolicyWindow")
    attr = next((getattr(ids, n) for n in names if hasattr(ids, n)), None)
    if attr is None:
        attr = rt.cudaLaunchAttributeID.cudaLaunchAttributeAccessPolicyWindow
    _check(rt.cudaStreamSetAttribute(stream, attr, value), "cudaStreamSetAttribute")


def pin(rt: Any, stream: int, ptr: int, hot_bytes: int, device: int) -> int:
    """Set the persisting set-aside and ``stream``'s window over ``[ptr, ptr + n)``; return n (0:
    the device has no persisting L2 and nothing was set)."""
    n = window_bytes(hot_bytes, *device_limits(rt, device))
    if n == 0:
        return 0
    limits_set = _LIMITS_SET.setdefault(rt, {})
    if limits_set.get(device) != n:  # resizing the set-aside is not free: once
        limit = rt.cudaLimit.cudaLimitPersistingL2CacheSize
        _check(rt.cudaDeviceSetLimit(limit, n), "cudaDeviceSetLimit")
        limits_set[device] = n
    _set_window(rt, stream, ptr, n, "cudaAccessPropertyPersisting")
    return n


def unpin(rt: Any, stream: int, reset_cache: bool = True) -> None:
    """Clear ``stream``'s window; with ``reset_cache`` also demote persisting lines to normal."""
    _set_window(rt, stream, 0, 0, "cudaAccessPropertyNormal")
    if reset_cache:
        _check(rt.cudaCtxResetPersistingL2Cache(), "cudaCtxResetPersistingL2Cache")


class L2Window:
    """``with L2Window(region): launch()`` pins ``region`` (a contiguous CUDA tensor) in L2 on the
    current torch stream for the launches inside and unpins it afterwards; no-op on the CPU."""

    def __init__(self, region: torch.Tensor, *, reset_cache: bool = True) -> None:
        self.region = region
        self.reset_cache = reset_cache
        self.active = False
        self.num_bytes = 0
        self._rt: Any = None
        self._stream = 0

    def __enter__(self) -> L2Window:
        r = self.region
        hot = r.numel() * r.element_size()
        if r.device.type != "cuda" or hot == 0:
            return self
        if not r.is_contiguous():
            raise ConfigError("region: the pinned region must be contiguous")
        self._rt = load_runtime()
        device = r.device.index if r.device.index is not None else torch.cuda.current_device()
        self._stream = int(torch.cuda.current_stream(r.device).cuda_stream)
        self.num_bytes = pin(self._rt, self._stream, r.data_ptr(), hot, device)
        self.active = self.num_bytes > 0
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.active:
            unpin(self._rt, self._stream, self.reset_cache)
            self.active = False
