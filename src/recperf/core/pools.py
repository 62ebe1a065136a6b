"""Process pools that survive nothing but their parent's own decision: multiprocessing's helper
processes started so that a closed terminal's hang-up does not kill them under a running pool."""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
from collections.abc import Callable, Iterator
from multiprocessing import forkserver, resource_tracker
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


def start_pool_helpers(method: str) -> None:
    """Start multiprocessing's resource tracker (and, for ``method`` forkserver, its fork
    server) with SIGHUP blocked. They ignore Ctrl-C and SIGTERM themselves, but not a hang-up,
    which a closed terminal sends the whole process group: a killed tracker is relaunched and
    prints a traceback for every semaphore it no longer knows. A blocked signal stays blocked
    across fork and exec, so they never see it, nor do the workers the fork server forks; the
    parent, unblocked again at once, gets its SIGHUP and shuts the pool down itself."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
        if method == "forkserver":
            forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def off_main_thread(work: Callable[[], T], stop: Callable[[], None]) -> T:
    """``work()``, run on a helper thread while the main thread only waits for it to end.

    The CLI turns SIGINT, SIGTERM and SIGHUP into a KeyboardInterrupt raised in the main thread
    at any bytecode, also between a lock's ``__enter__`` and the ``with`` block that would
    release it (CPython bpo-29988): ``concurrent.futures.as_completed`` takes every future's lock
    in a loop, and an interrupt there leaves some held, so the pool's manager thread blocks on
    them for good and ``shutdown`` never returns. The main thread here waits on a C-level queue
    the helper posts to when it ends (not ``Thread.join``: on 3.11 a join interrupted by a
    signal marks a running thread stopped). On an interrupt the main thread calls ``stop``
    (which must make ``work`` end soon, e.g. by terminating the pool's workers), waits for
    ``work`` to end, calls ``stop`` again (for what ``work`` started meanwhile) and re-raises;
    an exception of ``work`` is raised in the main thread."""
    out: list[T] = []
    err: list[BaseException] = []
    ended: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def run() -> None:
        try:
            out.append(work())
        except BaseException as exc:  # handed to the main thread
            err.append(exc)
        finally:
            ended.put(True)

    thread = threading.Thread(target=run, name="recperf-pool-driver", daemon=True)
    started = False
    try:
        with _signals_deferred():  # ``start`` waits on a lock of its own
            thread.start()
            started = True
        _wait(ended)
    except BaseException:
        stop()
        if started or thread.ident is not None:  # it runs (or is about to): wait for it
            _wait(ended)
            stop()
        raise
    if err:
        raise err[0]
    return out[0]


WAIT_POLL_S = 0.1
"""How often the main thread wakes while it waits for a helper thread."""


def _wait(ended: queue.SimpleQueue[bool]) -> None:
    """Until the helper posts that it ended, waking every WAIT_POLL_S: the kernel may deliver a
    signal sent to the process to any of its threads, and the main thread, asleep with no
    timeout, would then never run the Python handler (a test's SIGALRM hung it so once)."""
    while True:
        try:
            ended.get(timeout=WAIT_POLL_S)
            return
        except queue.Empty:
            continue


INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Inside: a signal whose handler is Python code is recorded, not handled; on the way out
    the first one recorded is handed to its handler (which may raise). Only the main thread
    handles signals, so elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old: dict[int, Callable[[int, FrameType | None], Any]] = {}
    try:
        for sig in INTERRUPTS:
            handler = signal.getsignal(sig)
            if callable(handler):
                old[int(sig)] = handler
                signal.signal(sig, lambda signum, frame: got.append(signum))
        yield
    finally:
        for num, handler in old.items():
            signal.signal(num, handler)
        if got:
            old[got[0]](got[0], None)
