"""``recperf stalls launch``: run the user's own training command as N ranks (as torchrun would),
on emulated machines with --nodes, and break its time down from the traces it writes."""

from __future__ import annotations

from typing import Any

import typer

from recperf.cli.common import err_console, print_table
from recperf.cli.options import Flag, Settings, command
from recperf.cli.stalls_app import app
from recperf.core.config import from_mapping
from recperf.core.progress import progress_bar
from recperf.stalls.result import FIGURES

LAUNCH_FLAGS = (
    Flag("ranks", "launch", int | None, "Rank processes (default 2)"),
    Flag("nodes", "launch", int | None,
         "Emulated machines (network namespaces; needs root); > 1 also runs at 1 node to "
         "measure the network stall by difference (default 1)"),
    Flag("bandwidth", "launch", str | None,
         "Per-machine link bandwidth, e.g. 500mbit (default 1gbit)"),
    Flag("threads", "launch", int | None, "OMP_NUM_THREADS per rank (default cores/ranks)"),
    Flag("timeout_s", "launch", float | None, "Time limit of each run, s (default 600)",
         ("--timeout",)),
    Flag("skip_steps", "launch", int | None,
         "Traced steps to leave out at the start of each trace (default 0)"),
)  # fmt: skip


@command(
    app, "launch", writes="summary.json and runs/ (traces, rank logs, exit codes)",
    out="required", flags=LAUNCH_FLAGS, scopes_help="launch (LaunchConfig)",
)  # fmt: skip
def launch_cmd(
    settings: Settings,
    cmd: list[str] | None = typer.Argument(
        None,
        metavar="-- COMMAND...",
        help="The training command, after --: e.g. -- python train.py --steps 20. Each rank "
        "gets torchrun's variables and RECPERF_TRACE_DIR, where it writes its trace "
        "(torch.profiler's tensorboard_trace_handler, or recperf.stalls.trace_path()).",
        show_default=False,
    ),
) -> None:
    """Run your own training script as N ranks and break its time down from its traces.

    Each rank gets torchrun's environment; with --nodes the ranks run on emulated machines.
    Compute, data and communication stalls come from the torch.profiler traces; with --nodes > 1
    the network stall comes by difference with a 1-node run and directly from the traces,
    cross-checked."""
    from recperf.stalls.run.launch import LaunchConfig, launch, resolve_command

    opts = settings.resolve(["launch"])["launch"]
    if cmd:
        opts["command"] = tuple(cmd)
    config = from_mapping(LaunchConfig, opts, "launch")
    resolve_command(config.command)  # a missing program fails before the progress line
    out = settings.out
    assert out is not None
    runs = 2 if config.nodes > 1 else 1
    with progress_bar(f"launching {config.ranks} rank(s), {runs} run(s)") as bar:
        summary = launch(config, out, progress=lambda f, _msg: bar(f)).to_json()
    settings.emit(summary, name=None)  # launch wrote summary.json
    _print(summary)
    err_console.print(f"summary written to {out / 'summary.json'}", highlight=False)


def _print(s: dict[str, Any]) -> None:
    rows = [
        {
            "name": k.removesuffix("_s"),
            "seconds": s[k],
            "fraction": s[k.removesuffix("_s") + "_frac"],
            "method": s["method"].get(k, ""),
        }
        for k in FIGURES
    ]
    title = f"{' '.join(s['command'])}: {s['iteration_s'] * 1e3:.1f} ms per iteration"
    print_table(title, rows, ["name", "seconds", "fraction", "method"])
    checks = [{"name": k, **v} for k, v in s["cross_check"].items()]
    if checks:
        print_table("cross-check", checks, ["name", "differential_s", "direct_s", "rel_diff"])
    slow = s.get("slowest_rank")
    if slow:
        err_console.print(
            f"slowest rank: {slow['rank']}, {slow['iteration_median_s'] * 1e3:.1f} ms median "
            f"iteration, {slow['margin_frac']:+.1%} over the others",
            highlight=False,
        )
    for run, why in s["skipped"].items():
        err_console.print(f"[yellow]skipped {run}:[/] {why}", highlight=False)
