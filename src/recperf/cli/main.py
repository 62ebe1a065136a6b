"""The ``recperf`` entry point. Its signal handlers go in before anything heavy is imported, so
Ctrl-C, SIGTERM or a closed terminal (SIGHUP) at any moment, even while a command's modules are
still loading, unwinds the command and prints one line. Only the standard library is imported at
the top; the typer app lives in ``recperf.cli.app`` (``recperf.cli.main.app`` still names it)."""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import typer

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What unwinds a command like Ctrl-C: an interrupt, a kill(1) or batch system, a closed
terminal or ssh session."""


def main() -> None:
    """Run the app; SIGINT, SIGTERM and SIGHUP unwind it like Ctrl-C (every ``finally`` and
    context manager cleans up: workers, shared memory, namespaces, temporary files), then print
    one line ``interrupted`` and exit 128 + the signal's number (130, 143, 129)."""
    _catch_signals()
    try:
        try:
            rc = _run_app()
        finally:
            _ignore_signals()
    except KeyboardInterrupt:  # while importing, or raised outside typer's own handling of it
        _interrupted()
    except RuntimeError as exc:  # raised in a class body's __set_name__, which wraps it (3.11)
        if _received is not None and isinstance(exc.__cause__, KeyboardInterrupt):
            _interrupted()
        raise
    except SystemExit:
        if _received is not None:
            _interrupted()
        raise
    if _received is not None:  # typer turned the interrupt into exit code 130
        _interrupted()
    raise SystemExit(rc)


def _run_app() -> int:
    """Import the app (the handlers are in) and run it; its exit code."""
    from typer._click import exceptions as click_exceptions  # typer ships its own click

    from recperf.cli.app import app

    try:
        rc = app(standalone_mode=False)
    except click_exceptions.UsageError as exc:  # a flag click cannot parse: one line
        _usage_error(exc)
    return rc if isinstance(rc, int) else 0


def __getattr__(name: str) -> Any:
    """``recperf.cli.main.app``: the typer app, imported when first asked for."""
    if name == "app":
        from recperf.cli.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
"""The first of SIGNALS received, once one has been."""


def _on_signal(signum: int, frame: object) -> None:
    global _received
    if _received is not None:  # already unwinding: let the cleanups finish
        return
    _received = signum
    raise KeyboardInterrupt


def _catch_signals() -> None:
    for sig in SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup, a shell's background job: keep
            signal.signal(sig, _on_signal)


def _ignore_signals() -> None:
    """Past the command a signal has nothing left to stop: ignore it, so that neither a
    KeyboardInterrupt where nothing catches it nor the interpreter's shutdown (which restores
    the default action, death) turns a finished run into a killed one."""
    for sig in SIGNALS:
        if signal.getsignal(sig) is _on_signal:
            signal.signal(sig, signal.SIG_IGN)


def _interrupted() -> NoReturn:
    """One line on stderr and the shell's exit code for a death by that signal."""
    signum = _received or signal.SIGINT
    line = (
        "interrupted" if signum == signal.SIGINT else f"interrupted ({signal.Signals(signum).name})"
    )
    with contextlib.suppress(OSError, ValueError):  # a closed terminal: nothing to write to
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    _forget_unhandled_interrupt()
    raise SystemExit(128 + signum)


def _forget_unhandled_interrupt() -> None:
    """CPython remembers a KeyboardInterrupt that escaped code it ran from a string (an import
    may run some) and, under ``python -m``, then ends the process by SIGINT whatever the exit
    code; running an empty string clears that memory, so the exit code stands."""
    with contextlib.suppress(Exception):  # not CPython: nothing to clear
        import ctypes

        ctypes.pythonapi.PyRun_SimpleString(b"")


if TYPE_CHECKING:
    app: typer.Typer

if __name__ == "__main__":
    main()
