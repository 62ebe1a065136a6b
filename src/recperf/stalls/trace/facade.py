"""``StallAnalysis``: one run's traces loaded once (torch.profiler or recperf's own, one file per
rank), and a method per question, each a pandas DataFrame (Holistic Trace Analysis's shape):
the breakdown per rank x iteration, the per-iteration communication, the slowest ranks, the
data-wait timeline; the run's ``StallSummary``; and a figure on request."""

from __future__ import annotations

import importlib
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recperf.core.config import check_range
from recperf.core.errors import ConfigError
from recperf.stalls.result import StallBreakdown, StallSummary
from recperf.stalls.trace.breakdown import RankTrace, iteration_figures, summarise
from recperf.stalls.trace.files import find_traces
from recperf.stalls.trace.intervals import clip
from recperf.stalls.trace.kineto import load_rank_traces

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]  # (pandas ships no stubs here)

COMM_COLUMNS = ("rank", "step", "collectives", "allreduces", "comm_bytes", "allreduce_bytes",
                "comm_busy_s", "exposed_comm_s", "overlapped_comm_s")  # fmt: skip


def _pandas() -> Any:
    """pandas, imported on first use (it comes with Holistic Trace Analysis, not with recperf)."""
    try:
        return importlib.import_module("pandas")
    except ImportError:
        raise ConfigError("StallAnalysis's tables need pandas: pip install pandas") from None


class StallAnalysis:
    """The traces under ``trace_dir`` (a directory, a run directory with ``spec.json``, a file,
    or a list of them), read and checked to be one run's, their iterations' figures computed
    once. ``skip_steps`` drops each rank's first iterations; ``ranks_per_node`` says how the
    world is spread when the traces cannot tell."""

    def __init__(
        self,
        trace_dir: Path | str | Sequence[Path | str],
        *,
        skip_steps: int = 0,
        ranks_per_node: int | None = None,
    ) -> None:
        if ranks_per_node is not None:
            check_range("ranks_per_node", ranks_per_node, 1, None)
        check_range("skip_steps", skip_steps, 0, None)
        sources = [trace_dir] if isinstance(trace_dir, Path | str) else list(trace_dir)
        self.paths = find_traces([Path(s) for s in sources])
        self.traces: list[RankTrace] = load_rank_traces(self.paths)
        self.skip_steps, self.ranks_per_node = skip_steps, ranks_per_node
        self.iterations: list[list[StallBreakdown]] = []
        for t in self.traces:
            figs = iteration_figures(t, skip_steps)
            if not figs:
                raise ConfigError(f"{t.source}: --skip-steps {skip_steps} leaves none of its "
                                  f"{len(t.steps)} iteration(s)")  # fmt: skip
            self.iterations.append(figs)

    def summary(self) -> StallSummary:
        """The run's summary (what ``stalls analyze`` writes as summary.json)."""
        return summarise(self.traces, self.iterations, ranks_per_node=self.ranks_per_node,
                         skip_steps=self.skip_steps)  # fmt: skip

    def breakdown(self) -> pd.DataFrame:
        """One row per rank x iteration: every figure of ``StallBreakdown``."""
        pd = _pandas()
        rows = [{"rank": b.rank, **b.to_json()} for its in self.iterations for b in its]
        return pd.DataFrame(rows).sort_values(["rank", "step"], ignore_index=True)

    def comm(self) -> pd.DataFrame:
        """One row per rank x iteration: its collectives, their bytes, busy/exposed/overlapped."""
        return self.breakdown().loc[:, list(COMM_COLUMNS)]

    def slowest_ranks(self, count: int | None = None) -> pd.DataFrame:
        """Ranks by median iteration time, slowest first, with each one's margin over the
        median of the others' medians (seconds and fraction); the first ``count`` of them."""
        frame = self.breakdown()
        per = frame.groupby("rank").agg(
            iteration_median_s=("iteration_s", "median"), iteration_s=("iteration_s", "mean"),
            data_wait_s=("data_wait_s", "mean"), exposed_comm_s=("exposed_comm_s", "mean"),
            compute_s=("compute_s", "mean"), iterations=("step", "count"),
        )  # fmt: skip
        medians = per["iteration_median_s"].tolist()
        margins = []
        for rank_median in medians:
            rest = list(medians)
            rest.remove(rank_median)
            others = statistics.median(rest) if rest else rank_median
            margins.append(rank_median - others)
        per["margin_s"] = margins
        per["margin_frac"] = per["margin_s"] / (per["iteration_median_s"] - per["margin_s"])
        per = per.sort_values("iteration_median_s", ascending=False).reset_index()
        return per if count is None else per.head(count)

    def data_wait_timeline(self) -> pd.DataFrame:
        """Every data-iterator wait inside a timed iteration: rank, step, start and end (seconds
        from the earliest timed iteration's start across ranks) and length."""
        pd = _pandas()
        rows: list[dict[str, Any]] = []
        origin = min(t.steps[self.skip_steps].start for t in self.traces)
        for t in self.traces:
            for step in t.steps[self.skip_steps :]:
                for a, b in clip(t.data, step.start, step.end):
                    rows.append({"rank": t.rank, "step": step.index, "start_s": a - origin,
                                 "end_s": b - origin, "data_wait_s": b - a})  # fmt: skip
        columns = ["rank", "step", "start_s", "end_s", "data_wait_s"]
        return pd.DataFrame(rows, columns=columns)

    def breakdown_figure(self) -> Any:
        """A plotly Figure: per rank, the mean iteration split into compute, data wait and
        exposed communication (stacked bars)."""
        import plotly.graph_objects as go

        per = (
            self.breakdown().groupby("rank")[["compute_s", "data_wait_s", "exposed_comm_s"]].mean()
        )
        fig = go.Figure()
        for column, name in (("compute_s", "compute"), ("data_wait_s", "data wait"),
                             ("exposed_comm_s", "exposed communication")):  # fmt: skip
            fig.add_trace(go.Bar(x=[str(r) for r in per.index], y=per[column] * 1e3, name=name))
        fig.update_layout(barmode="stack", title="Mean iteration per rank",
                          xaxis_title="rank", yaxis_title="ms per iteration")  # fmt: skip
        return fig
