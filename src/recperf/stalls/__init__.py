"""Distributed-training stalls: the profiler (differential runs and direct instrumentation),
emulated machines, the all-reduce model and the cloud cost advisor.

``Profiler``, ``WORKLOADS``, ``Workload``, ``check_workload``, ``ProfileConfig`` and ``profile``
are imported lazily (they pull in torch), as are ``trace_dir`` and ``trace_path``: where a
script run by ``recperf stalls launch`` writes its traces (``$RECPERF_TRACE_DIR``).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Profiler": "recperf.stalls.profiler",
    "WORKLOADS": "recperf.stalls.workloads",
    "Workload": "recperf.stalls.base",
    "check_workload": "recperf.stalls.base",
    "ProfileConfig": "recperf.stalls.profile",
    "profile": "recperf.stalls.profile",
    "trace_dir": "recperf.stalls.launch",
    "trace_path": "recperf.stalls.launch",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'recperf.stalls' has no attribute {name!r}")
