"""The ``recperf stalls`` typer app that ``stalls``, ``stalls_export`` and ``stalls_launch`` each
add their commands to (its own module, so none of them imports another)."""

from __future__ import annotations

import typer

__all__ = ["app"]

app = typer.Typer(
    help="Distributed-training stalls: profile, communication model, cloud advisor.",
    no_args_is_help=True,
)
