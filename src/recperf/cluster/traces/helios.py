"""Helios (SenseTime) jobs in the Lucid JSON schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import numpy as np

from recperf.cluster.base import TRACE_LOADERS
from recperf.cluster.jobs import JobTable
from recperf.cluster.models import grad_bytes_for, iter_s_for
from recperf.cluster.network import calibrate_reference
from recperf.cluster.topology import Cluster
from recperf.cluster.traces.common import integer, read_trace, seconds
from recperf.core.errors import TraceFormatError


def _record_lines(text: str, count: int) -> list[int]:
    """Line (1-based) on which each top-level record of a JSON array starts, for error messages."""
    lines: list[int] = []
    depth = 0
    line = 1
    in_str = esc = False
    for ch in text:
        if ch == "\n":
            line += 1
        elif in_str:
            esc, in_str = (False, in_str) if esc else (ch == "\\", ch != '"')
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth == 2 and ch == "{":
                lines.append(line)
        elif ch in "]}":
            depth -= 1
    return lines + [0] * (count - len(lines))  # 0: unknown


@TRACE_LOADERS.register("helios")
class HeliosTrace:
    """GPU demand is ``max_parallelism``; ``duration`` is the run time at the tightest placement."""

    name: ClassVar[str] = "helios"
    default_cluster: ClassVar[str] = "helios"

    def load(self, source: Path | None, cluster: Cluster, rng: np.random.Generator) -> JobTable:
        path, text = read_trace(source, "helios/sense-500.json")
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(path, exc.lineno, None, f"invalid JSON: {exc.msg}") from None
        except RecursionError:
            raise TraceFormatError(path, None, None, "invalid JSON: nested too deeply") from None
        if not isinstance(records, list):
            raise TraceFormatError(path, 1, None, "expected a JSON array of job records")
        starts = _record_lines(text, len(records))
        names: list[str] = []
        models: list[str] = []
        gpus: list[int] = []
        arr: list[float] = []
        dur: list[float] = []
        for rec, start in zip(records, starts, strict=True):
            line = start or None
            if not isinstance(rec, dict):
                raise TraceFormatError(path, line, None, "a record is not a JSON object")
            for field in ("max_parallelism", "arrival_time", "duration", "model"):
                if field not in rec:
                    raise TraceFormatError(path, line, field, "is missing")
            gpus.append(integer(path, line, "max_parallelism", rec["max_parallelism"]))
            arr.append(seconds(path, line, "arrival_time", rec["arrival_time"], positive=False))
            dur.append(seconds(path, line, "duration", rec["duration"], positive=True))
            names.append(str(rec.get("job_id", len(names))))
            models.append(str(rec["model"]))
        gpus_arr = np.asarray(gpus, dtype=np.int64)
        # The schema's iteration counts are not physical (sub-millisecond iterations), so the
        # run time is re-cut into iterations of the model's typical length.
        iter_s = np.minimum([iter_s_for(m) for m in models], np.asarray(dur))
        it = np.asarray(dur) / iter_s
        grad = np.asarray([grad_bytes_for(m) for m in models])
        compute, grad = calibrate_reference(cluster, gpus_arr, iter_s, grad)
        return JobTable.build(
            name=names,
            model=models,
            arrival_s=arr,
            gpus=gpus_arr,
            total_iters=it,
            compute_s=compute,
            grad_bytes=grad,
        )
