"""``recperf stalls export``: a measured profile in formats other tools read (so far Chakra
execution traces, for simulators such as ASTRA-sim)."""

from __future__ import annotations

from pathlib import Path

import typer

from recperf.cli.common import err_console, print_table
from recperf.cli.options import Settings, command
from recperf.cli.stalls_app import app
from recperf.core.errors import ConfigError

EXPORT_COLUMNS = ("rank", "iterations", "comp_nodes", "comm_nodes", "comm_bytes_per_iteration",
                  "compute_s_per_iteration")  # fmt: skip


@command(app, "export", writes="the exported files and export.json", out="required")
def export_cmd(
    settings: Settings,
    profile: Path = typer.Option(..., help="A profile directory (what `stalls profile` writes)."),
    chakra: bool = typer.Option(
        False, "--chakra", help="Chakra execution traces: PREFIX.RANK.et, one per rank."
    ),
    run: str | None = typer.Option(None, help="Run under PROFILE/runs (default: network, intra)."),
    prefix: str = typer.Option("recperf", help="File name prefix (files PREFIX.RANK.et)."),
) -> None:
    """Write a profile's communicating run as Chakra execution traces, one per rank.

    Each holds the timed iterations' forward, backward (cut at each gradient bucket's launch)
    and optimizer compute nodes and one ALL_REDUCE node per bucket, with measured durations,
    bytes and dependencies."""
    from recperf.stalls.trace.chakra import ExportConfig, export_chakra

    if not chakra:
        raise ConfigError("choose a format: --chakra (Chakra execution traces) is the one so far")
    config = ExportConfig(run=run, prefix=prefix)
    out = settings.out
    assert out is not None
    result = export_chakra(profile, out, config)  # milliseconds per rank: no progress bar
    data = result.to_json()
    settings.emit(data, "export.json")
    title = f"run {result.run}: {result.world_size} rank(s) on {result.nodes} machine(s)"
    print_table(title, data["ranks"], EXPORT_COLUMNS)
    last = f" .. {config.prefix}.{len(result.ranks) - 1}.et" if len(result.ranks) > 1 else ""
    err_console.print(
        f"wrote {out / config.prefix}.0.et{last} and {out / 'export.json'}", highlight=False
    )
