"""What a sweep gives: one row per run with one column set, the kept job rows as one table,
the summary grouped over the seeds, and the files that hold them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from recperf.cluster.sweep_backends import RUN_KEYS, RunOutcome
from recperf.core.results import write_json, write_parquet

if TYPE_CHECKING:
    from recperf.cluster.sweep import Sweep

GROUP_KEYS = ("trace", "cluster", "scheduler", "congestion")
GROUP_METRICS = ("makespan_s", "jct_mean_s", "jct_p95_s", "comm_overhead_frac")
"""The metrics summarised over the seeds of each group (mean and std), in table order."""


@dataclass(frozen=True)
class SweepResult:
    """Rows in the sweep's order with one column set, and all kept job rows as one table."""

    sweep: Sweep
    rows: list[dict[str, Any]]
    jobs: pa.Table | None

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] != "ok"]

    def groups(self) -> list[dict[str, Any]]:
        return summarize_groups(self.rows)


def uniform_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every row the same columns; a failed run's metrics are None (null in Parquet)."""
    columns = [*RUN_KEYS, "status", "error", "wall_s"]
    for row in rows:
        columns += [k for k in row if k not in columns]
    return [{c: row.get(c) for c in columns} for row in rows]


def jobs_table(outcomes: Sequence[RunOutcome]) -> pa.Table | None:
    tables = [pa.table(o.jobs) for o in outcomes if o.jobs is not None]
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="default")


def summarize_groups(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (trace, cluster, scheduler, congestion): runs ok/failed, and over the ok seeds the
    mean and sample std (ddof 1; NaN for one seed) of the main metrics and mean preemptions."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in GROUP_KEYS), []).append(row)
    out = []
    for key, members in groups.items():
        ok = [r for r in members if r["status"] == "ok"]
        group: dict[str, Any] = dict(zip(GROUP_KEYS, key, strict=True))
        group.update(runs_ok=len(ok), runs_failed=len(members) - len(ok))
        for metric in (*GROUP_METRICS, "preemptions"):
            vals = np.array([float(r[metric]) for r in ok], dtype=np.float64)
            group[f"{metric}_mean"] = float(vals.mean()) if vals.size else math.nan
            if metric != "preemptions":
                group[f"{metric}_std"] = float(vals.std(ddof=1)) if vals.size > 1 else math.nan
        out.append(group)
    return out


def write_sweep(out: str | Path, result: SweepResult) -> dict[str, Any]:
    """Write runs.parquet, jobs.parquet (if kept) and, last, sweep.json; return sweep.json."""
    out = Path(out)
    rows = result.rows
    write_parquet(out / "runs.parquet", {c: [r[c] for r in rows] for c in rows[0]})
    if result.jobs is not None:
        write_parquet(
            out / "jobs.parquet", {c: result.jobs.column(c) for c in result.jobs.schema.names}
        )
    else:
        (out / "jobs.parquet").unlink(missing_ok=True)  # a stale one would not match runs.parquet
    failed = result.failed
    summary = {
        "sweep": result.sweep.definition(),
        "runs_total": len(rows),
        "runs_ok": len(rows) - len(failed),
        "runs_failed": len(failed),
        "failures": [{**{k: r[k] for k in RUN_KEYS}, "error": r["error"]} for r in failed],
        "groups": result.groups(),
    }
    write_json(out / "sweep.json", summary)  # last: its presence marks a complete sweep
    return summary
