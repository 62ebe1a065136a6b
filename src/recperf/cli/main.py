"""The ``recperf`` entry point: registers the command groups and the ``report`` command."""

from __future__ import annotations

from pathlib import Path

import typer

from recperf import __version__
from recperf.cli import cluster, embed, ingest, stalls
from recperf.cli.common import err_console, one_line_errors
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


@app.command("report")
@one_line_errors
def report_cmd(
    out: Path = typer.Option(Path("out/report"), help="Directory for report.html and report.json."),
) -> None:
    """Run every capability on its embedded default and write one self-contained HTML report."""
    from recperf.report import build_report

    with progress_bar("building report") as bar:
        path = build_report(out, progress=bar)
    err_console.print(f"report written to {path.resolve()}")


@app.command("version")
def version_cmd() -> None:
    """Print the recperf version."""
    typer.echo(__version__)


def main() -> None:
    app()
