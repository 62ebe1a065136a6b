"""Distributed-training stalls: the profiler (differential runs and direct instrumentation),
emulated machines, the all-reduce model and the cloud cost advisor, in four subpackages:
``trace`` (read and check traces, stall figures, exports), ``run`` (workloads, profile and
launch runs, emulated machines, the rank hook), ``model`` (the communication model and its fit)
and ``cost`` (catalogs and the advisor); ``base`` is the workload plug-in contract.

Everything named in ``__all__`` is imported lazily (most of it pulls in torch or pandas), among
them ``trace_dir`` and ``trace_path``: where a script run by ``recperf stalls launch`` writes its
traces (``$RECPERF_TRACE_DIR``).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Profiler": "recperf.stalls.run.hook",
    "WORKLOADS": "recperf.stalls.run.workloads",
    "Workload": "recperf.stalls.base",
    "check_workload": "recperf.stalls.base",
    "ProfileConfig": "recperf.stalls.run.profile",
    "profile": "recperf.stalls.run.profile",
    "LaunchConfig": "recperf.stalls.run.launch",
    "launch": "recperf.stalls.run.launch",
    "trace_dir": "recperf.stalls.run.launch",
    "trace_path": "recperf.stalls.run.launch",
    "RunSpec": "recperf.stalls.run.spec",
    "StallAnalysis": "recperf.stalls.trace.facade",
    "StallBreakdown": "recperf.stalls.result",
    "StallSummary": "recperf.stalls.result",
    "Study": "recperf.stalls.study",
    "analyze_paths": "recperf.stalls.trace.kineto",
    "find_traces": "recperf.stalls.trace.kineto",
    "CommModel": "recperf.stalls.model.comm",
    "CommSample": "recperf.stalls.model.comm",
    "fit": "recperf.stalls.model.fit",
    "Advice": "recperf.stalls.cost.advisor",
    "AdvisorConfig": "recperf.stalls.cost.advisor",
    "ProfileSummary": "recperf.stalls.cost.advisor",
    "advise": "recperf.stalls.cost.advisor",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'recperf.stalls' has no attribute {name!r}")
