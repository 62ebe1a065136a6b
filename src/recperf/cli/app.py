"""The ``recperf`` typer app: the command groups and the ``report`` and ``version`` commands.
Each group module imports its capability inside its commands, so building this app (for
``--help`` or ``version``) imports no torch, pyarrow or pandas."""

from __future__ import annotations

from pathlib import Path

import typer

from recperf import __version__
from recperf.cli import cluster, embed, ingest, stalls
from recperf.cli.common import err_console
from recperf.cli.options import Settings, check_out_dir, command
from recperf.core.progress import progress_bar

app = typer.Typer(
    help="recperf: make DLRM inference, data ingestion and distributed training fast and cheap.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(cluster.app, name="cluster")
app.add_typer(ingest.app, name="ingest")
app.add_typer(stalls.app, name="stalls")
app.add_typer(embed.app, name="embed")


@command(
    app, "report", writes="report.html and report.json (default out/report)",
    json_help="Print report.json (every section's figures) to stdout.",
)  # fmt: skip
def report_cmd(settings: Settings) -> None:
    """Run every capability on its embedded default and write one self-contained HTML report."""
    from recperf.report import build_report

    out = settings.out or Path("out/report")
    check_out_dir(out)
    with progress_bar("building report") as bar:
        path = build_report(out, progress=bar)
    if settings.json:
        typer.echo((out / "report.json").read_text(encoding="utf-8"), nl=False)
    err_console.print(f"report written to {path.resolve()}", markup=False, highlight=False)


@app.command("version")
def version_cmd() -> None:
    """Print the recperf version."""
    typer.echo(__version__)
