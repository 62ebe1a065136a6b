"""The ``recperf`` entry point: registers the command groups and the ``report`` command."""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path
from typing import NoReturn

import typer
from typer._click import exceptions as click_exceptions  # typer ships its own click

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


def main() -> None:
    """Run the app; SIGINT and SIGTERM unwind it like Ctrl-C (every ``finally`` and context
    manager cleans up: workers, shared memory, namespaces, temporary files), then print one
    line ``interrupted`` and exit 128 + the signal's number (130, 143)."""
    _catch_signals()
    try:
        rc = app(standalone_mode=False)
    except click_exceptions.UsageError as exc:  # a flag click cannot parse: one line, like ours
        _usage_error(exc)
    except KeyboardInterrupt:  # raised outside typer's own handling of it
        _interrupted()
    except SystemExit:
        if _received is not None:
            _interrupted()
        raise
    if _received is not None:  # typer turned the interrupt into exit code 130
        _interrupted()
    raise SystemExit(rc if isinstance(rc, int) else 0)


def _usage_error(exc: Exception) -> NoReturn:
    """``error: Invalid value for '--layers': ... (recperf stalls predict --help)``, one line;
    nothing more when click already printed the help (a group called without a command)."""
    message = " ".join(str(getattr(exc, "format_message", lambda: str(exc))()).split())
    if message:
        ctx = getattr(exc, "ctx", None)
        path = ctx.command_path.partition(" ")[2] if ctx is not None else ""
        hint = f" (recperf {path} --help)" if path else " (recperf --help)"
        sys.stderr.write(f"error: {message}{hint}\n")
    raise SystemExit(getattr(exc, "exit_code", 2))


_received: int | None = None
"""The first SIGINT or SIGTERM received, once one has been."""


def _on_signal(signum: int, frame: object) -> None:
    global _received
    if _received is not None:  # already unwinding: let the cleanups finish
        return
    _received = signum
    raise KeyboardInterrupt


def _catch_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # a shell's background job: keep ignoring
            signal.signal(sig, _on_signal)


def _interrupted() -> NoReturn:
    """One line on stderr and the shell's exit code for a death by that signal."""
    signum = _received or signal.SIGINT
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write("interrupted\n" if signum == signal.SIGINT else "interrupted (SIGTERM)\n")
        sys.stderr.flush()
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    main()
